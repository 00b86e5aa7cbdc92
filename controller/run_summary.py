"""``status.summary``: what a finished run did, from what the controller holds. Pure. What it
holds: docs/operations.md, "What a run did"; how it is written: docs/controller.md, "The
controller in detail".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from megdet.controller.conditions import condition_of
from megdet.fabric_report import CONDITION as FABRIC_CONDITION
from megdet.progress import parse_time

__all__ = [
    "FIELDS",
    "MAX_SEGMENTS",
    "MAX_TEXT",
    "NUMBER_FIELDS",
    "SEGMENT_FIELDS",
    "SUMMARY",
    "TEXT_FIELDS",
    "TIME_FIELDS",
    "build_summary",
    "summary_stale",
    "with_summary",
]

#: The status field.
SUMMARY = "summary"
#: Segments kept: the first and the newest ones (``status.segments`` keeps two).
MAX_SEGMENTS = 4
#: Characters a string field keeps.
MAX_TEXT = 256

#: ``status.progress`` fields copied as they are: (summary field, progress field).
_FROM_PROGRESS = (
    ("ap", "ap"),
    ("ap50", "ap50"),
    ("evalIteration", "evalIteration"),
    ("iteration", "iteration"),
    ("maxIter", "maxIter"),
    ("imagesSeen", "imagesSeen"),
    ("plannedImages", "plannedImages"),
    ("imagesPerSecond", "imagesPerSecond"),
    ("trainerAttempts", "attempts"),
    ("wallSeconds", "wallSeconds"),
    ("setupSeconds", "setupSeconds"),
    ("stepsSeconds", "stepsSeconds"),
    ("hooksSeconds", "hooksSeconds"),
    ("evaluationSeconds", "evaluationSeconds"),
    ("stepsImagesPerSecond", "stepsImagesPerSecond"),
)
#: Status fields copied as they are (the plan the run ended with, its jobs, its times).
_FROM_STATUS = (
    "target",
    "gpus",
    "worldSize",
    "nodes",
    "globalBatch",
    "lr",
    "attempt",
    "restarts",
    "startTime",
    "completionTime",
)
#: A segment's fields the summary keeps, each a whole number.
SEGMENT_FIELDS = {
    "attempt": "The attempt this job was.",
    "gpus": "GPUs of the job.",
    "globalBatch": "Global batch of the job as planned.",
}
#: The summary's fields by type; every other field but ``phase`` and ``segments`` is a whole
#: number (the CRD's schema: megdet/api/crd.py).
TEXT_FIELDS = frozenset({"reason", "target", "fabric"})
NUMBER_FIELDS = frozenset({"ap", "ap50", "imagesPerSecond", "stepsImagesPerSecond", "lr"})
TIME_FIELDS = frozenset({"startTime", "completionTime"})

#: Every summary field and what it says (the CRD's descriptions: megdet/api/crd.py).
FIELDS: dict[str, str] = {
    "phase": "The phase summarized: Succeeded or Failed.",
    "reason": "The reason of the phase's condition (e.g. JobDeleted for a job deleted before "
    "it finished).",
    "ap": "COCO box AP of the trainer's last reported evaluation, in percent.",
    "ap50": "COCO box AP50 of the trainer's last reported evaluation, in percent.",
    "evalIteration": "Iteration of that evaluation (the final one when it equals maxIter).",
    "iteration": "Iterations done, as the trainer last reported.",
    "maxIter": "Iterations planned, as the trainer last reported.",
    "imagesSeen": "Training images seen, as the trainer last reported.",
    "plannedImages": "Training images planned.",
    "imagesPerSecond": "Training throughput the trainer last measured (its last 50 steps), "
    "images per second.",
    "trainerAttempts": "Attempts in the trainer's log (each start of the trainer, restarts "
    "within a job included), from its final report.",
    "wallSeconds": "Seconds of the trainer's attempts, summed, from its final report.",
    "setupSeconds": "Of them, each attempt's start to its training loop (model, data, "
    "checkpoint), summed.",
    "stepsSeconds": "Of them, the timed training steps, summed (detectron2's timer).",
    "hooksSeconds": "Of them, the hooks: checkpoints, evaluations, writers, summed.",
    "evaluationSeconds": "Of them, evaluation inference, summed.",
    "stepsImagesPerSecond": "Images per second over the timed training steps of all attempts.",
    "target": "Kind of job: pytorchjob or trainjob.",
    "gpus": "GPUs of the run's last job.",
    "worldSize": "Planned world size of the run's last job.",
    "nodes": "Planned nodes of the run's last job.",
    "globalBatch": "Global batch of the run's last job.",
    "lr": "Planned peak learning rate of the run's last job.",
    "attempt": "Jobs the controller created for the run (one more per resize).",
    "restarts": "Times the controller saw a job restart its pods.",
    "segments": f"The run's jobs (the first and the newest, at most {MAX_SEGMENTS}): attempt, "
    "GPUs, global batch.",
    "startTime": "When the first job started running.",
    "completionTime": "When the job succeeded or failed.",
    "durationSeconds": "startTime to completionTime, in seconds.",
    "startupSeconds": "The newest attempt's start, its Workload (else its first pod) created to "
    "its first iteration (status.startup.totalSeconds).",
    "trainingSeconds": "The trainer's last attempt, its first iteration to its end of training "
    "and final evaluation, in seconds.",
    "finishingSeconds": "The trainer's end of training to the job's completion, in seconds.",
    "fabric": "The FabricDegraded condition's reason (FabricAsRequested, SocketFallback, "
    "NotNCCL), when the trainer reported its fabric.",
}


def _seconds(start: Any, end: Any) -> int | None:
    a, b = parse_time(start), parse_time(end)
    return None if a is None or b is None or b < a else round((b - a).total_seconds())


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(field: str, value: Any) -> bool:
    """Whether ``value`` is of the type the schema gives ``field`` (the API server refuses the
    whole status write otherwise)."""
    if field in TEXT_FIELDS:
        return isinstance(value, str) and 0 < len(value) <= MAX_TEXT
    if field in TIME_FIELDS:
        return parse_time(value) is not None
    if field in NUMBER_FIELDS and isinstance(value, float):
        return math.isfinite(value)
    return _whole(value) and -(2**63) <= value < 2**63  # the API server's int64


def _clip(value: Any) -> Any:
    return value[:MAX_TEXT] if isinstance(value, str) else value


def _segments(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = status.get("segments")
    listed = raw if isinstance(raw, list) else []
    kept = [
        {k: s[k] for k in SEGMENT_FIELDS if _fits(k, s.get(k))}
        for s in listed
        if isinstance(s, Mapping)
    ]
    kept = [s for s in kept if s]
    return kept if len(kept) <= MAX_SEGMENTS else kept[:1] + kept[1 - MAX_SEGMENTS :]


def build_summary(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The summary of a run whose status is ``status``; None unless it finished with a job."""
    # Here, not at the top: status.py brings kopf (resize.py), and the CRD generator
    # (megdet/api/crd.py) reads this module's fields without the operator.
    from megdet.controller.status import finished

    if not isinstance(status, Mapping) or not finished(status) or not status.get("jobUID"):
        return None
    phase = status["phase"]
    progress = status.get("progress") if isinstance(status.get("progress"), Mapping) else {}
    startup = status.get("startup") if isinstance(status.get("startup"), Mapping) else {}
    found: dict[str, Any] = {
        "reason": (condition_of(status, phase) or {}).get("reason"),
        **{field: progress.get(key) for field, key in _FROM_PROGRESS},
        **{key: status.get(key) for key in _FROM_STATUS},
        "segments": _segments(status),
        "durationSeconds": _seconds(status.get("startTime"), status.get("completionTime")),
        "startupSeconds": startup.get("totalSeconds"),
        "fabric": (condition_of(status, FABRIC_CONDITION) or {}).get("reason"),
    }
    if progress.get("stage") == "finished":  # the trainer's last attempt trained to its end
        end = progress.get("stageTime")
        found["trainingSeconds"] = _seconds(progress.get("firstIterationTime"), end)
        found["finishingSeconds"] = _seconds(end, status.get("completionTime"))
    out: dict[str, Any] = {"phase": phase}
    for field in FIELDS:  # the schema's order; a field no source gave stays out
        value = _clip(found.get(field))
        if (field == "segments" and value) or (
            field not in ("phase", "segments") and value is not None and _fits(field, value)
        ):
            out[field] = value
    return out


def with_summary(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` with ``summary`` set as :func:`build_summary` says (None, which a merge patch
    removes, where the status holds one that no longer applies: a refused run tried again)."""
    summary = build_summary(status)
    if summary is not None:
        status[SUMMARY] = summary
    elif status.get(SUMMARY) is not None:
        status[SUMMARY] = None
    return status


def summary_stale(status: Mapping[str, Any]) -> bool:
    """Whether the run's ``summary`` differs from what its status says it should be."""
    return build_summary(status) != (status.get(SUMMARY) or None)
