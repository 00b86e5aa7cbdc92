"""COCO-format datasets registered from a path, with annotation validation.

``register_coco_dataset`` is detectron2's ``register_coco_instances`` seam with a loader that
validates what it loads: boxes with non-positive size or outside the image are dropped and
counted in one warning; a missing or malformed annotation file is a :class:`DatasetError` that
names the file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json
from detectron2.structures import BoxMode

__all__ = [
    "DatasetError",
    "check_annotation_file",
    "load_validated_coco_json",
    "register_coco_dataset",
]

logger = logging.getLogger(__name__)

#: How far (pixels) a box may reach past the image border before it counts as outside: COCO's
#: own boxes overshoot by rounding.
BORDER_TOLERANCE = 1.0


class DatasetError(ValueError):
    """A dataset that cannot be loaded; the message names the file."""


def check_annotation_file(json_file: str | Path, key: str = "annotation file") -> None:
    """Fail early, naming the file and the key, if the annotation file is missing."""
    path = Path(json_file)
    if not path.is_file():
        raise DatasetError(f"{key}: {path} does not exist or is not a file")


def _box_problem(box: list[float], width: float, height: float) -> str | None:
    if len(box) != 4:
        return "malformed"
    x, y, w, h = (float(v) for v in box)
    if not (w > 0 and h > 0):
        return "non-positive size"
    t = BORDER_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return "outside the image"
    return None


def filter_invalid_boxes(dicts: list[dict], source: str) -> list[dict]:
    """Drop annotations whose box has non-positive size or leaves the image; warn once."""
    dropped: dict[str, int] = {}
    for record in dicts:
        kept = []
        for ann in record.get("annotations", []):
            box = ann.get("bbox", [])
            if ann.get("bbox_mode", BoxMode.XYWH_ABS) != BoxMode.XYWH_ABS:
                box = BoxMode.convert(list(box), ann["bbox_mode"], BoxMode.XYWH_ABS)
            problem = _box_problem(list(box), record["width"], record["height"])
            if problem is None:
                kept.append(ann)
            else:
                dropped[problem] = dropped.get(problem, 0) + 1
        record["annotations"] = kept
    if dropped:
        detail = ", ".join(f"{n} {why}" for why, n in sorted(dropped.items()))
        logger.warning("%s: dropped %d invalid boxes (%s)", source, sum(dropped.values()), detail)
    return dicts


def load_validated_coco_json(json_file: str, image_root: str, dataset_name: str) -> list[dict]:
    """detectron2's ``load_coco_json`` with clear file errors and invalid boxes dropped."""
    check_annotation_file(json_file)
    try:
        dicts = load_coco_json(json_file, image_root, dataset_name)
    except json.JSONDecodeError as err:
        raise DatasetError(f"annotation file: {json_file} is not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise DatasetError(f"annotation file: {json_file} is not JSON text: {err}") from None
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as err:
        raise DatasetError(
            f"annotation file: {json_file} is not in COCO instances format "
            f"(images, annotations, categories): {type(err).__name__}: {err}"
        ) from None
    return filter_invalid_boxes(dicts, json_file)


def register_coco_dataset(name: str, json_file: str, image_root: str) -> None:
    """Register a COCO-format dataset (annotation JSON + image folder) under ``name``.

    Loading is lazy, as in detectron2; the evaluator scores against the validated records
    (converted to COCO format in the output folder), so dropped boxes are dropped there too.
    """
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, lambda: load_validated_coco_json(json_file, image_root, name))
    MetadataCatalog.get(name).set(image_root=image_root, evaluator_type="coco")
