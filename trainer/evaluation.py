"""COCO evaluation with detectron2's COCOEvaluator (pycocotools) and the metrics file."""

from __future__ import annotations

import json
import logging
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from detectron2.config import CfgNode
from detectron2.data import build_detection_test_loader
from detectron2.evaluation import COCOEvaluator, inference_on_dataset, print_csv_format
from detectron2.utils import comm

# metrics.json: named once, in the module that reads the output folder without torch.
from megdet.trainer.report import METRICS_FILE

logger = logging.getLogger(__name__)

#: The box metrics reported (COCO's bbox AP family, in percent as detectron2 reports them).
BOX_METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def evaluate_model(cfg: CfgNode, model: torch.nn.Module, dataset_name: str) -> dict[str, Any]:
    """Box AP of ``model`` on a registered dataset; every rank calls it, rank 0 gets results."""
    evaluator = COCOEvaluator(
        dataset_name,
        tasks=("bbox",),
        distributed=True,
        output_dir=os.path.join(cfg.OUTPUT_DIR, "inference"),
    )
    loader = build_detection_test_loader(cfg, dataset_name)
    results = inference_on_dataset(model, loader, evaluator)
    if comm.is_main_process() and results:
        print_csv_format(results)
    return results or {}


def _finite_or_none(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def write_metrics(output_dir: str | Path, results: dict[str, Any], **extra: Any) -> Path:
    """Write ``metrics.json``: the box metrics (NaN, e.g. no detections at all, becomes null)."""
    box = results.get("bbox", {})
    data: dict[str, Any] = dict(extra)
    data["bbox"] = OrderedDict((k, _finite_or_none(box.get(k))) for k in BOX_METRICS)
    per_class = {k[3:]: _finite_or_none(v) for k, v in box.items() if k.startswith("AP-")}
    if per_class:
        data["bbox_per_class_AP"] = per_class
    path = Path(output_dir) / METRICS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
