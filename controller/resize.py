"""Resizing a live elastic run: record the resize and delete the job (:func:`start`), create it
again at the new size once it and its pods are gone (:func:`finish`), record the new attempt
(:func:`with_segments`). Why and how: docs/elastic.md, "How the controller resizes a run".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import kopf

from megdet.controller.conditions import condition_of, set_condition
from megdet.controller.job_state import TERMINAL_PHASES, count_of
from megdet.controller.kubeapi import Backoff, api_call
from megdet.plan import plan_continuation

if TYPE_CHECKING:
    from megdet.controller.planning import Planned

__all__ = [
    "MAX_SEGMENTS",
    "RESIZED",
    "RESIZING",
    "current_gpus",
    "events",
    "finish",
    "is_stopped_job",
    "pending",
    "restop",
    "start",
    "wanted",
    "with_segments",
]

logger = logging.getLogger(__name__)

#: The condition (True while a resize runs) and the reason of the event that starts one.
RESIZING = "Resizing"
#: The reason of the condition once done, and of the Normal event per resize.
RESIZED = "Resized"
#: Segments kept in the status (the first and the newest; ``attempt`` keeps counting).
MAX_SEGMENTS = 32
#: How long the job mirror keeps trying to finish a resize (then the next reconcile does).
FINISH_SECONDS = 600.0
#: How often the job mirror looks again whether the stopped job's pods are gone.
POLL_SECONDS = 1.0
#: How a resize deletes the job (a TrainJob in the background: docs/elastic.md).
PROPAGATION = {"PyTorchJob": "Foreground", "TrainJob": "Background"}


def _status(run: Mapping[str, Any]) -> Mapping[str, Any]:
    status = run.get("status")
    return status if isinstance(status, Mapping) else {}


def _uid(obj: Mapping[str, Any] | None) -> Any:
    return ((obj or {}).get("metadata") or {}).get("uid")


def pending(status: Any) -> Mapping[str, Any] | None:
    """The resize in progress (``status.resize``), if any."""
    resize = status.get("resize") if isinstance(status, Mapping) else None
    return resize if isinstance(resize, Mapping) and resize.get("jobUID") else None


def is_stopped_job(status: Any, job: Mapping[str, Any] | None) -> bool:
    """Whether ``job`` is the one a resize in progress stops (its uid is recorded)."""
    resize = pending(status)
    return resize is not None and job is not None and _uid(job) == resize.get("jobUID")


def current_gpus(status: Mapping[str, Any]) -> int | None:
    """The GPUs of the job the controller created last (``status.gpus``; a run from before
    that field: its planned world size)."""
    for key in ("gpus", "worldSize"):
        value = status.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _elastic(spec: Any) -> tuple[int, int, str]:
    elastic = spec.get("elastic") if isinstance(spec, Mapping) else None
    elastic = elastic if isinstance(elastic, Mapping) else {}
    low, high = elastic.get("minGpus") or 0, elastic.get("maxGpus") or 0
    return int(low), int(high), str(elastic.get("resize") or "keep-batch")


def wanted(run: Mapping[str, Any], planned: Planned, job: Mapping[str, Any]) -> int | None:
    """The GPU count to resize the run's ``job`` to, or None: the spec asks for the size the
    job has, the run is not elastic (its gpus cannot change: the CRD's rule), it has finished,
    a resize is already stopping the job, or someone else is deleting the job (its DELETED
    event fails the run as before)."""
    status = _status(run)
    low, high, _mode = _elastic(run.get("spec"))
    gpus, have = planned.rendered.plan.world_size, current_gpus(status)
    if high <= 0 or have is None or gpus == have or not low <= gpus <= high:
        return None
    if status.get("phase") in TERMINAL_PHASES or pending(status) is not None:
        return None
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return None
    return gpus


def start(
    writer: Any, run: Mapping[str, Any], job: Mapping[str, Any], gpus: int, retry: int
) -> None:
    """Record the resize of ``run`` to ``gpus`` (the status first), then delete its ``job``
    (:func:`restop`). ``writer``: the :class:`~megdet.controller.status_writer.StatusWriter`;
    its write carries no diff base for kopf, so kopf retries a failed delete."""
    kind, name, uid = job["kind"], job["metadata"]["name"], job["metadata"].get("uid")
    generation = (run.get("metadata") or {}).get("generation")

    def compute(current: Mapping[str, Any]) -> dict[str, Any]:
        status = dict(_status(current))
        if pending(status) is not None:
            return status  # recorded already (a retried reconcile)
        have = current_gpus(status)
        now = writer.now()
        message = (
            f"from {have} to {gpus} GPUs: stopping {kind} {name} (its pods save a checkpoint "
            "on SIGTERM), then creating it at the new size"
        )
        status["resize"] = {"fromGpus": have, "toGpus": gpus, "jobUID": uid, "requestTime": now}
        conditions = status.get("conditions") or []
        status["conditions"] = set_condition(
            conditions, RESIZING, True, RESIZING, message, now, generation
        )
        return status

    written = writer.write(run, compute, retry, kind)
    if written is None or not is_stopped_job(written[1], job):
        return  # the run is gone, or another resize is under way
    restop(writer.backoff, writer.cluster, job, retry)


def restop(backoff: Backoff, cluster: Any, job: Mapping[str, Any], retry: int) -> None:
    """Delete the job a recorded resize stops (that incarnation, :data:`PROPAGATION`), unless
    it is being deleted already; also for a controller that stopped between the status write
    and the delete."""
    meta = job["metadata"]
    if meta.get("deletionTimestamp"):
        return  # its DELETED event finishes the resize
    api_call(
        f"delete {job['kind']} {meta['name']}",
        lambda: cluster.delete(
            job["apiVersion"],
            job["kind"],
            meta["namespace"],
            meta["name"],
            meta.get("uid"),
            propagation=PROPAGATION.get(job["kind"], "Foreground"),
        ),
        backoff,
        retry,
    )


def finish(
    get_run: Callable[[], Mapping[str, Any] | None],
    reconcile: Callable[[dict[str, Any], int], None],
    uid: str | None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    pods_left: Callable[[], bool] = lambda: False,
) -> None:
    """Finish the resize of a run whose stopped job is gone (its DELETED event): once no pod of
    the run is left (``pods_left``), read the run and reconcile it, which creates the job at
    the size its spec asks for now; a try that fails for a reason that heals is tried again
    here for up to :data:`FINISH_SECONDS` (docs/elastic.md: kopf retries no event handler)."""
    deadline = clock() + FINISH_SECONDS
    retry = 0
    while True:
        try:
            run = get_run()
            if run is None or _uid(run) != uid or pending(_status(run)) is None:
                return  # gone, another incarnation, or finished by a reconcile meanwhile
            if not pods_left():
                reconcile(dict(run), retry)
                return
            why, delay = "the stopped job's pods are still there", POLL_SECONDS
        except kopf.TemporaryError as err:
            why, delay = str(err), float(err.delay or 1.0)
            retry += 1
        if clock() + delay > deadline:
            logger.warning(
                "a resize's job is not created yet (%s); the run's next reconcile creates it", why
            )
            return
        sleep(delay)


def _segment(
    attempt: int, gpus: int, batch: Any, job: Mapping[str, Any], when: Any, reason: str
) -> dict[str, Any]:
    segment = {
        "attempt": attempt,
        "gpus": gpus,
        "globalBatch": batch,
        "jobUID": _uid(job),
        "startTime": when,
        "reason": reason,
    }
    return {key: value for key, value in segment.items() if value is not None}


def _plan_fields(planned: Planned, run_batch: int | None) -> dict[str, Any]:
    """The status plan of the job: for a resized run, the rest of the run as the trainer
    plans it (:func:`~megdet.plan.plan_continuation`, the first job's global batch kept or
    not by ``elastic.resize``), counted from the start in its global batch."""
    fields = planned.rendered.status_plan()
    if run_batch is None:
        return fields
    _low, _high, mode = _elastic(planned.rendered.values)
    plan = plan_continuation(planned.rendered.plan.spec, 0, run_batch=run_batch, resize=mode)
    return {
        **fields,
        "globalBatch": plan.global_batch,
        "lr": plan.lr,
        "maxIter": plan.max_iter,
        "steps": list(plan.steps),
        "warmupIters": plan.warmup_iters,
    }


def with_segments(
    old: Mapping[str, Any],
    status: dict[str, Any],
    job: Mapping[str, Any],
    planned: Planned,
    now: str,
    gen: Any,
) -> dict[str, Any]:
    """The status of a run whose job ``job`` exists (the ``Created`` decision), with what
    follows from the jobs the run had: ``gpus``, ``attempt`` and ``segments`` (the first job:
    attempt 1; the job of a resize in progress: the next attempt, its uid recorded, the
    resize done), and the plan fields of the job that runs (not of a spec whose resize has not
    happened: a finished run's, say)."""
    gpus = planned.rendered.plan.world_size
    attempt = count_of(old, "attempt")
    segments = [dict(s) for s in old.get("segments") or [] if isinstance(s, Mapping)]
    first = segments[0].get("globalBatch") if segments else None
    fields = _plan_fields(planned, first if isinstance(first, int) else None)
    resize = pending(old)
    if resize is not None and _uid(job) != resize.get("jobUID"):
        attempt = max(attempt, 1) + 1
        segments.append(_segment(attempt, gpus, fields["globalBatch"], job, now, RESIZED))
        status["jobUID"] = _uid(job)
        status["resize"] = None
        message = f"from {resize.get('fromGpus')} to {gpus} GPUs: attempt {attempt}"
        conditions = status.get("conditions") or []
        status["conditions"] = set_condition(
            conditions, RESIZING, False, RESIZED, message, now, gen
        )
    elif attempt == 0:  # the run's first job (or one created by an earlier controller)
        attempt = 1
        gpus = current_gpus(old) or gpus
        batch = old.get("globalBatch") or fields["globalBatch"]
        segments = [_segment(1, gpus, batch, job, old.get("startTime") or now, "Created")]
    else:
        gpus = current_gpus(old) or gpus
    status["attempt"] = attempt
    # The first segment stays (its global batch is the one keep-batch keeps).
    status["segments"] = segments[:1] + segments[1:][1 - MAX_SEGMENTS :]
    status["gpus"] = gpus
    if gpus != planned.rendered.plan.world_size:
        # The spec asks for another size that this job does not have (yet): keep its plan.
        status.update({key: old[key] for key in fields if key in old})
    elif len(segments) > 1:
        status.update(fields)
    return status


def events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of the Normal events a status change posts: one when a resize
    starts, one when its job is created."""
    out: list[tuple[str, str]] = []
    started, done = pending(new), count_of(new, "attempt") > count_of(old, "attempt") > 0
    if started is not None and pending(old) is None:
        out.append((RESIZING, str((condition_of(new, RESIZING) or {}).get("message") or "")))
    if done:
        segment = (new.get("segments") or [{}])[-1]
        was = (old.get("resize") or {}).get("fromGpus") or current_gpus(old)
        message = (
            f"from {was} to {segment.get('gpus')} GPUs: {new.get('jobName')} created again "
            f"(attempt {new.get('attempt')}); the trainer continues from its last checkpoint"
        )
        out.append((RESIZED, message))
    return out
