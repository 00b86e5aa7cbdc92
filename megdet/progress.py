"""Training progress in Kubeflow Trainer's runtime-status protocol, for both sides.

The trainer (``trainer/progress_reporter.py``) turns what it knows into a :class:`Progress`
and POSTs :func:`to_request` of it; the controller turns the ``trainerStatus`` it receives (its
own status endpoint for ``target: pytorchjob``) or reads (``TrainJob.status.trainerStatus`` for
``target: trainjob``) into ``MegDetRun.status.progress`` with :func:`to_status`. Stdlib only.

What Kubeflow Trainer v2.3.0's status server accepts (module cache
``~/go/pkg/mod/github.com/kubeflow/trainer/v2@v2.3.0``):

* ``pkg/statusserver/server.go``: ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/
  trainjobs/{name}/status`` over TLS, ``Authorization: Bearer <token>``; body at most 64 KiB,
  decoded with ``encoding/json`` into ``UpdateTrainJobStatusRequest``; 403 for a token that is not
  allowed, 422 for a body that does not decode or that the API server's validation refuses, 404
  for a TrainJob that does not exist. The answer to a good request is the request, 200.
* ``pkg/apis/trainer/v1alpha1/trainjob_types.go`` (``TrainerStatus``, ``Metric``,
  ``UpdateTrainJobStatusRequest``): ``{"trainerStatus": {"progressPercentage": int32 0..100,
  "estimatedRemainingSeconds": int32 >= 0, "metrics": [{"name": 1..64 chars, "value": 1..64
  chars}] (at most 256, listType atomic), "lastUpdatedTime": RFC 3339}}``; ``lastUpdatedTime`` is
  required whenever ``trainerStatus`` is present (a CEL rule).
* ``pkg/statusserver/utils.go``: the token audience
  ``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` and the path above;
  ``pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go`` puts the full URL (service +
  path) in ``KUBEFLOW_TRAINER_SERVER_URL`` and the CA and token *file paths* in the other two
  variables (the token is a projected ServiceAccount token the kubelet rotates: read the file for
  every post).

The MegDet controller serves the same protocol for ``target: pytorchjob`` at
:func:`run_status_path` with the audience :func:`run_audience` (the run's uid in it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from megdet.fabric_report import FabricReport, to_metrics

__all__ = [
    "ENV_CA_CERT",
    "ENV_TOKEN",
    "ENV_URL",
    "INT_METRICS",
    "MAX_INT32",
    "MAX_METRICS",
    "MAX_METRIC_LENGTH",
    "METRIC_NAMES",
    "NUMBER_METRICS",
    "REPORT_METRICS",
    "STAGES",
    "TIME_METRICS",
    "Progress",
    "format_time",
    "parse_time",
    "run_audience",
    "run_status_path",
    "to_request",
    "to_status",
]

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"  # full URL of the status endpoint (service + path)
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"  # path of the PEM CA bundle to verify it with
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # path of the bearer token file (re-read per post)

#: Trainer's limits (``TrainerStatus`` / ``Metric`` kubebuilder markers).
MAX_METRICS = 256
MAX_METRIC_LENGTH = 64
MAX_INT32 = 2**31 - 1

#: Metric name -> ``status.progress`` field, by the type its value carries.
INT_METRICS = {
    "iteration": "iteration",
    "maxIter": "maxIter",
    "imagesSeen": "imagesSeen",
    "plannedImages": "plannedImages",
    "evalIteration": "evalIteration",
    "checkpointIteration": "checkpointIteration",
    **{name: name for name in ("attempts", "wallSeconds", "setupSeconds", "stepsSeconds",
                               "hooksSeconds", "evaluationSeconds")},
}  # fmt: skip
#: The final report's run totals, from the run's report (trainer/report.py: the attempts in
#: rank 0's log, their wall time by part in whole seconds): each at most MAX_INT32.
REPORT_METRICS = ("attempts", "wallSeconds", "setupSeconds", "stepsSeconds", "hooksSeconds",
                  "evaluationSeconds", "stepsImagesPerSecond")  # fmt: skip
NUMBER_METRICS = {
    "imagesPerSecond": "imagesPerSecond",
    "ap": "ap",
    "ap50": "ap50",
    "stepsImagesPerSecond": "stepsImagesPerSecond",
}
TIME_METRICS = {
    "checkpointTime": "checkpointTime",
    "stageTime": "stageTime",
    "worldTime": "worldTime",
    "loadedTime": "loadedTime",
    "firstIterationTime": "firstIterationTime",
}
#: Where this attempt of the trainer is (metric ``stage``, since ``stageTime``): ``loading``
#: (the world formed at ``worldTime``; building the model and data, loading the checkpoint),
#: ``firstIteration`` (model and data ready at ``loadedTime``), ``training`` (its first
#: iteration done at ``firstIterationTime``), ``evaluating``, ``finished`` (training and the
#: final evaluation done).
STAGES = ("loading", "firstIteration", "training", "evaluating", "finished")
#: Every metric name :func:`to_request` writes, in the order it writes them.
METRIC_NAMES = (
    "iteration",
    "maxIter",
    "imagesSeen",
    "plannedImages",
    "imagesPerSecond",
    "ap",
    "ap50",
    "evalIteration",
    "checkpointIteration",
    "checkpointTime",
    "stage",
    "stageTime",
    "worldTime",
    "loadedTime",
    "firstIterationTime",
    *REPORT_METRICS,
)

#: Each time metric and the :class:`Progress` field it carries.
_TIME_FIELDS = {
    "checkpointTime": "checkpoint_time",
    "stageTime": "stage_time",
    "worldTime": "world_time",
    "loadedTime": "loaded_time",
    "firstIterationTime": "first_iteration_time",
}

#: Decimal places a float metric keeps (images/s, AP in percent): plenty, and short.
FLOAT_DIGITS = 4


def run_audience(namespace: str, name: str, uid: str) -> str:
    """The token audience the MegDet controller's status endpoint accepts for one run.

    The run's ``metadata.uid`` is part of it (the API server assigns it; no author chooses
    it): a run deleted and created again under the same name has a new uid, so the old run's
    tokens are not valid for it.
    """
    return f"megdet.io/v1alpha1/namespaces/{namespace}/megdetruns/{name}/status/{uid}"


def run_status_path(namespace: str, name: str) -> str:
    """The path of one run's status endpoint on the MegDet controller (same shape as Trainer's)."""
    return f"/apis/megdet.io/v1alpha1/namespaces/{namespace}/megdetruns/{name}/status"


# RFC 3339 date-time as Go's time.RFC3339 parses it (metav1.Time): upper-case T, Z or an offset.
_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})\Z")


def format_time(when: datetime | float) -> str:
    """``when`` (an aware datetime or a POSIX timestamp) as RFC 3339 UTC, whole seconds.

    Whole seconds because that is what ``metav1.Time`` keeps and writes back.
    """
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(float(when), UTC)
    elif when.tzinfo is None:
        raise ValueError(f"{when!r} has no time zone")
    u = when.astimezone(UTC)
    return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}Z"


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 date-time string as an aware UTC datetime, or None if it is not one."""
    if not isinstance(text, str):
        return None
    m = _RFC3339.match(text)
    if not m:
        return None
    date, clock, fraction, zone = m.groups()
    micro = (fraction or "")[:6].ljust(6, "0")
    try:
        parsed = datetime.fromisoformat(
            f"{date}T{clock}.{micro}{'+00:00' if zone == 'Z' else zone}"
        )
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _check_count(name: str, value: Any, *, required: bool) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"Progress.{name} must be an integer >= 0, not {value!r}")


@dataclass(frozen=True)
class Progress:
    """What the trainer knows about a run at one moment. All but the first two are optional.

    ``ap`` / ``ap50`` are COCO box AP in percent, as detectron2 reports them; ``eval_iteration``
    is the iteration they were measured at. ``checkpoint_time`` and ``updated_time`` are RFC
    3339 (:func:`format_time`). ``eta_seconds`` is the estimated time to ``max_iter``.
    ``stage`` is one of :data:`STAGES`, entered at ``stage_time``; ``world_time``,
    ``loaded_time`` and ``first_iteration_time`` are this attempt's start-up moments.
    """

    iteration: int
    max_iter: int
    images_seen: int | None = None
    planned_images: int | None = None
    images_per_second: float | None = None
    eta_seconds: int | None = None
    ap: float | None = None
    ap50: float | None = None
    eval_iteration: int | None = None
    checkpoint_iteration: int | None = None
    checkpoint_time: str | None = None
    updated_time: str = ""
    stage: str | None = None
    stage_time: str | None = None
    world_time: str | None = None
    loaded_time: str | None = None
    first_iteration_time: str | None = None
    #: The run's fabric (megdet/fabric_report.py), sent as its own metrics.
    fabric: FabricReport | None = None
    #: The final report's run totals: :data:`REPORT_METRICS` name -> whole number >= 0
    #: (``stepsImagesPerSecond``: a number).
    totals: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        _check_count("iteration", self.iteration, required=True)
        _check_count("max_iter", self.max_iter, required=True)
        for name in (
            "images_seen",
            "planned_images",
            "eta_seconds",
            "eval_iteration",
            "checkpoint_iteration",
        ):
            _check_count(name, getattr(self, name), required=False)
        for name in ("images_per_second", "ap", "ap50"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ValueError(f"Progress.{name} must be a number, not {value!r}")
        for name in _TIME_FIELDS.values():
            value = getattr(self, name)
            if value is not None and parse_time(value) is None:
                raise ValueError(f"Progress.{name} {value!r} is not RFC 3339")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"Progress.stage {self.stage!r} is not one of {', '.join(STAGES)}")
        if parse_time(self.updated_time) is None:
            raise ValueError(f"Progress.updated_time {self.updated_time!r} is not RFC 3339")
        for name, value in (self.totals or {}).items():
            if name not in REPORT_METRICS:
                raise ValueError(f"Progress.totals: {name!r} is not one of {REPORT_METRICS}")
            if name in NUMBER_METRICS:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"Progress.totals[{name!r}] must be a number, not {value!r}")
            else:
                _check_count(f"totals[{name!r}]", value, required=True)

    @property
    def percent(self) -> int | None:
        """Whole percent of ``max_iter`` done, rounded down, 0..100; None without a max_iter."""
        return _percent(self.iteration, self.max_iter)


def _percent(iteration: int, max_iter: int) -> int | None:
    if max_iter <= 0:
        return None
    return max(0, min(100, iteration * 100 // max_iter))


def _float_text(value: float) -> str | None:
    """A float metric value: finite, rounded, ``float()`` reads it back; None if not finite."""
    value = float(value)
    if not math.isfinite(value):
        return None
    return repr(round(value, FLOAT_DIGITS) + 0.0)  # + 0.0 turns -0.0 into 0.0


def to_request(p: Progress) -> dict[str, Any]:
    """The body to POST: ``{"trainerStatus": {...}}`` exactly as Trainer's status server accepts.

    Percent is rounded down and clamped to 0..100, the ETA clamped to 0..int32; a metric whose
    value is unknown, not finite or longer than 64 characters is left out (never sent invalid).
    The fabric's metrics (megdet/fabric_report.py) come after the progress metrics.
    """
    values: dict[str, str | None] = {
        "iteration": str(p.iteration),
        "maxIter": str(p.max_iter),
        "imagesSeen": None if p.images_seen is None else str(p.images_seen),
        "plannedImages": None if p.planned_images is None else str(p.planned_images),
        "imagesPerSecond": None
        if p.images_per_second is None
        else _float_text(p.images_per_second),
        "ap": None if p.ap is None else _float_text(p.ap),
        "ap50": None if p.ap50 is None else _float_text(p.ap50),
        "evalIteration": None if p.eval_iteration is None else str(p.eval_iteration),
        "checkpointIteration": None
        if p.checkpoint_iteration is None
        else str(p.checkpoint_iteration),
        "stage": p.stage,
        **{
            metric: None if getattr(p, name) is None else format_time(parse_time(getattr(p, name)))
            for metric, name in _TIME_FIELDS.items()
        },
        **{name: _total_text(name, (p.totals or {}).get(name)) for name in REPORT_METRICS},
    }
    status: dict[str, Any] = {}
    percent = p.percent
    if percent is not None:
        status["progressPercentage"] = percent
    if p.eta_seconds is not None:
        status["estimatedRemainingSeconds"] = max(0, min(MAX_INT32, p.eta_seconds))
    status["metrics"] = [
        {"name": name, "value": values[name]}
        for name in METRIC_NAMES
        if values[name] is not None and 0 < len(values[name]) <= MAX_METRIC_LENGTH
    ]
    if p.fabric is not None:
        status["metrics"] += to_metrics(p.fabric)
    status["lastUpdatedTime"] = format_time(parse_time(p.updated_time))
    return {"trainerStatus": status}


def _total_text(name: str, value: float | None) -> str | None:
    """A run total's metric value (a whole number clamped to 0..int32, or a float)."""
    if value is None:
        return None
    if name in NUMBER_METRICS:
        return _float_text(value)
    return str(max(0, min(MAX_INT32, value)))


def _int_value(text: str) -> int | None:
    if not re.fullmatch(r"\d{1,19}", text):
        return None
    return int(text)


def _number_value(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def to_status(trainer_status: Mapping) -> tuple[dict[str, Any], list[str]]:
    """``status.progress`` for a ``trainerStatus`` object, and the problems found in it.

    Never raises, whatever it is given. Each problem names the field and why it was left out
    of the progress; everything valid is kept. The first kind of problem (not an object, a
    field of the wrong type or out of Trainer's bounds, too many metrics, a name or value
    outside 1..64 characters, no ``lastUpdatedTime``) is what Trainer's own status server would
    refuse with 422; the second (a known metric whose value does not parse, or a duplicate
    name) Trainer would store as it is. Metric names this module does not know are ignored:
    other reporters may add their own.

    ``percent`` comes from ``progressPercentage``, or from ``iteration`` / ``maxIter`` when
    that is absent; ``etaTime`` is ``lastUpdatedTime`` + ``estimatedRemainingSeconds``.
    """
    progress: dict[str, Any] = {}
    problems: list[str] = []
    try:
        _to_status(trainer_status, progress, problems)
    except Exception as err:  # defensive: a bug here must not break a reconcile loop
        problems.append(f"trainerStatus: could not be read ({type(err).__name__})")
    return progress, problems


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _to_status(ts: Any, progress: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(ts, Mapping):
        problems.append(f"trainerStatus: must be an object, not {type(ts).__name__}")
        return

    pct = ts.get("progressPercentage")
    if pct is not None:
        if isinstance(pct, int) and not isinstance(pct, bool) and 0 <= pct <= 100:
            progress["percent"] = pct
        else:
            problems.append(
                f"trainerStatus.progressPercentage: {_describe(pct)} is not an integer 0..100"
            )

    eta = ts.get("estimatedRemainingSeconds")
    if eta is not None:
        if isinstance(eta, int) and not isinstance(eta, bool) and 0 <= eta <= MAX_INT32:
            progress["etaSeconds"] = eta
        else:
            problems.append(
                f"trainerStatus.estimatedRemainingSeconds: {_describe(eta)} is not an integer "
                f"0..{MAX_INT32}"
            )

    updated_raw = ts.get("lastUpdatedTime")
    updated = parse_time(updated_raw)
    if updated is not None:
        progress["updatedTime"] = format_time(updated)
    elif updated_raw is None:
        problems.append("trainerStatus.lastUpdatedTime: required")
    else:
        problems.append(
            f"trainerStatus.lastUpdatedTime: {_describe(updated_raw)} is not an RFC 3339 time"
        )

    metrics = ts.get("metrics")
    if metrics is not None:
        _read_metrics(metrics, progress, problems)

    if "percent" not in progress and "iteration" in progress and "maxIter" in progress:
        derived = _percent(progress["iteration"], progress["maxIter"])
        if derived is not None:
            progress["percent"] = derived
    if updated is not None and "etaSeconds" in progress:
        try:
            progress["etaTime"] = format_time(updated + timedelta(seconds=progress["etaSeconds"]))
        except (OverflowError, ValueError):
            problems.append("trainerStatus.estimatedRemainingSeconds: ends past year 9999")


def _read_metrics(metrics: Any, progress: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(metrics, list | tuple):
        problems.append(f"trainerStatus.metrics: must be a list, not {type(metrics).__name__}")
        return
    if len(metrics) > MAX_METRICS:
        problems.append(
            f"trainerStatus.metrics: {len(metrics)} items, at most {MAX_METRICS}; "
            f"read the first {MAX_METRICS}"
        )
        metrics = metrics[:MAX_METRICS]
    seen: set[str] = set()
    for i, item in enumerate(metrics):
        where = f"trainerStatus.metrics[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where}: must be an object, not {type(item).__name__}")
            continue
        name, value = item.get("name"), item.get("value")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_METRIC_LENGTH:
            problems.append(
                f"{where}.name: {_describe(name)} is not a string of 1..{MAX_METRIC_LENGTH} "
                "characters"
            )
            continue
        if not isinstance(value, str) or not 0 < len(value) <= MAX_METRIC_LENGTH:
            problems.append(
                f"{where}.value ({name}): {_describe(value)} is not a string of "
                f"1..{MAX_METRIC_LENGTH} characters"
            )
            continue
        if name in seen:
            problems.append(f"{where}: {name!r} appears more than once; kept the first")
            continue
        if name in INT_METRICS:
            parsed: Any = _int_value(value)
            kind = "a whole number >= 0"
            if name in REPORT_METRICS:  # no range check after this one (the endpoint's RANGES)
                parsed = parsed if parsed is not None and parsed <= MAX_INT32 else None
                kind = f"a whole number 0..{MAX_INT32}"
            field = INT_METRICS[name]
        elif name in NUMBER_METRICS:
            parsed = _number_value(value)
            kind = "a finite number"
            field = NUMBER_METRICS[name]
        elif name == "stage":
            parsed = value if value in STAGES else None
            kind = f"one of {', '.join(STAGES)}"
            field = "stage"
        elif name in TIME_METRICS:
            when = parse_time(value)
            parsed = None if when is None else format_time(when)
            kind = "an RFC 3339 time"
            field = TIME_METRICS[name]
        else:
            continue  # someone else's metric
        seen.add(name)
        if parsed is None:
            problems.append(f"{where}.value ({name}): {_describe(value)} is not {kind}")
            continue
        progress[field] = parsed
