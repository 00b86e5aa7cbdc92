"""Datasets: invalid boxes dropped and counted once, clear errors naming the file, shapes."""

from __future__ import annotations

import json
import logging

import pytest


def _coco(tmp_path, annotations, name="ann.json"):
    data = {
        "images": [{"id": 1, "file_name": "a.png", "width": 100, "height": 80}],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
    }
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _ann(i, bbox):
    return {"id": i, "image_id": 1, "category_id": 1, "bbox": bbox, "area": 1, "iscrowd": 0}


def test_invalid_boxes_are_dropped_and_counted_in_one_warning(tmp_path, caplog, captured_warnings):
    from megdet.trainer.data import load_validated_coco_json

    path = _coco(
        tmp_path,
        [
            _ann(1, [10, 10, 20, 20]),  # fine
            _ann(2, [10, 10, 0, 20]),  # zero width
            _ann(3, [10, 10, 20, -5]),  # negative height
            _ann(4, [90, 10, 30, 20]),  # leaves the image on the right
            _ann(5, [-30, -30, 10, 10]),  # entirely outside
            _ann(6, [0.0, 0.0, 100.5, 80.0]),  # overshoots by rounding only: kept
        ],
    )
    with captured_warnings("megdet.trainer.data"):
        dicts = load_validated_coco_json(str(path), str(tmp_path), "t_invalid_boxes")
    kept = [a["bbox"] for a in dicts[0]["annotations"]]
    assert kept == [[10, 10, 20, 20], [0.0, 0.0, 100.5, 80.0]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "dropped 4 invalid boxes" in warnings[0]
    assert "2 non-positive size" in warnings[0] and "2 outside the image" in warnings[0]
    assert str(path) in warnings[0]


def test_clean_annotations_give_no_warning(tmp_path, caplog, captured_warnings):
    from megdet.trainer.data import load_validated_coco_json

    path = _coco(tmp_path, [_ann(1, [1, 2, 3, 4])])
    with captured_warnings("megdet.trainer.data"):
        dicts = load_validated_coco_json(str(path), str(tmp_path), "t_clean")
    assert len(dicts[0]["annotations"]) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ('{"images": [', "is not valid JSON"),
        ("[1, 2, 3]", "not in COCO instances format"),
        ('{"images": []}', "not in COCO instances format"),
    ],
)
def test_broken_annotation_files_are_clear_errors_naming_the_file(tmp_path, content, expected):
    from megdet.trainer.data import DatasetError, load_validated_coco_json

    path = tmp_path / "broken.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError) as err:
        load_validated_coco_json(str(path), str(tmp_path), "t_broken")
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_make_shapes_is_deterministic_by_seed_with_exact_boxes(tmp_path):
    import numpy as np
    from PIL import Image

    from megdet.trainer.shapes import CLASSES, make_shapes

    a = make_shapes(tmp_path / "a", train=6, val=2, seed=3)
    b = make_shapes(tmp_path / "b", train=6, val=2, seed=3)
    c = make_shapes(tmp_path / "c", train=6, val=2, seed=4)
    assert a["train_json"].read_text() == b["train_json"].read_text()
    for name in ("000001.png", "000006.png"):
        assert (a["train_images"] / name).read_bytes() == (b["train_images"] / name).read_bytes()
    assert a["train_json"].read_text() != c["train_json"].read_text()

    data = json.loads(a["train_json"].read_text())
    assert [c["name"] for c in data["categories"]] == list(CLASSES)
    assert len(data["images"]) == 6 and data["annotations"]
    for ann in data["annotations"]:
        image = np.asarray(Image.open(a["train_images"] / f"{ann['image_id']:06d}.png"), int)
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x + w <= 128 and y + h <= 128
        # Exact: every edge row/column of the box holds shape pixels (far from the noisy
        # plain background, whose colour is the image's median).
        background = np.median(image.reshape(-1, 3), axis=0)
        far = np.abs(image - background).sum(axis=2) > 60
        box = far[y : y + h, x : x + w]
        assert box[0].any() and box[-1].any() and box[:, 0].any() and box[:, -1].any()
