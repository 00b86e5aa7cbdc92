"""MegDetRun status: what a run's status should be (:func:`desired_status`), from the run, its
job and what a handler decided (a :data:`Decision`). Pure. The conditions and phases it sets:
docs/controller.md, "Status mapping".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megdet.controller.conditions import condition_of, conditions_in, had_job, set_condition
from megdet.controller.fabric_condition import trainjob_fabric, with_fabric
from megdet.controller.job_state import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    JobState,
    count_of,
    job_state,
    trainjob_progress,
)
from megdet.controller.ownership import is_runs_job
from megdet.controller.pod_problems import CONDITION as PODS_STARTED
from megdet.controller.resize import with_segments

if TYPE_CHECKING:
    from megdet.controller.planning import Planned

__all__ = [
    "CHILDREN_READY",
    "CHILD_REFUSED",
    "FOREIGN_JOB",
    "JOB_DELETED",
    "JOB_PRESENT",
    "JOB_REFUSED",
    "NOT_CREATED_BY_CONTROLLER",
    "PODS_STARTED",
    "POD_STARTED",
    "POLICY_DENIED",
    "RETRYING",
    "Created",
    "Decision",
    "Foreign",
    "JobGone",
    "NotCreated",
    "Observed",
    "PodStart",
    "Refused",
    "SpecInvalid",
    "condition_of",
    "conflict_message",
    "desired_status",
    "finished",
    "had_job",
    "next_status",
    "refused_at",
    "set_condition",
]

#: Condition type added (status False, reason :data:`JOB_DELETED`) when the run's job vanished
#: after it had been created: the operator's TTL after finishing, or a delete by hand.
JOB_PRESENT = "JobPresent"
#: Reason of ``JobPresent=False`` and, for a run that had not finished, of ``Failed=True``.
JOB_DELETED = "JobDeleted"
#: Reason of ``Created=False`` (and ``Failed=True``) when the API server refused the job (4xx).
JOB_REFUSED = "JobRefused"
#: Condition type of the run's other objects (the TrainingRuntime, the NetworkPolicy) once its
#: job exists: False while one of them is not as the spec says (reason :data:`CHILD_REFUSED`:
#: final until the spec changes), True again once they match.
CHILDREN_READY = "ChildrenReady"
CHILD_REFUSED = "ChildRefused"
#: Reason of ``Created=False`` (or ``ChildrenReady=False``) while a create the API server
#: refused for a reason that heals (quota, an admission check's cache, the controller's RBAC)
#: is retried with backoff.
RETRYING = "Retrying"
#: Condition type set True (reason :data:`NOT_CREATED_BY_CONTROLLER`) while a job that is not
#: the one this controller created (``status.jobUID``) holds the job's name and names the run.
FOREIGN_JOB = "ForeignJob"
NOT_CREATED_BY_CONTROLLER = "NotCreatedByController"
#: The Valid condition's reason (and the event's) for a run outside the cluster's policy.
POLICY_DENIED = "PolicyDenied"
#: Reason of ``PodsStarted=True`` (:data:`PODS_STARTED`; False: the kubelet's reason).
POD_STARTED = "Started"


def next_status(
    old: Mapping[str, Any], state: JobState, now: str, generation: int | None
) -> dict[str, Any]:
    """The status fields that change when the owned job is in ``state`` (a patch for status).

    ``restarts`` counts the times this controller saw the run enter Restarting. The condition
    of the current phase turns True; those of other mirrored phases that exist turn False
    (they are not added until they first happen, as the Kubeflow operator does).
    """
    restarts = count_of(old, "restarts")
    if state.phase == "Restarting" and old.get("phase") != "Restarting":
        restarts += 1
    if state.phase == "Restarting":  # which restart, of which of the run's jobs
        why = f"restart {restarts} of attempt {count_of(old, 'attempt') or 1}: {state.message}"
        state = JobState(state.phase, state.reason, why, state.start_time, state.completion_time)
    conditions = _phase_conditions(conditions_in(old), state, state.phase, now, generation)
    patch: dict[str, Any] = {"phase": state.phase, "conditions": conditions, "restarts": restarts}
    start = old.get("startTime") or state.start_time
    if start is None and state.phase not in ("Pending", "Suspended"):
        start = now
    if start is not None:
        patch["startTime"] = start
    if state.phase in TERMINAL_PHASES:
        patch["completionTime"] = old.get("completionTime") or state.completion_time or now
    return patch


def refused_at(status: Mapping[str, Any]) -> Any:
    """The generation at which the API server refused the run's job (None: not refused)."""
    created = condition_of(status, "Created")
    if created is None or created.get("status") != "False" or created.get("reason") != JOB_REFUSED:
        return None
    return created.get("observedGeneration")


def finished(status: Mapping[str, Any]) -> bool:
    """A run that is done for good: Succeeded or Failed after it had its job (a run whose job
    the API server refused is ``Failed`` too, but a change of its spec tries again)."""
    if not isinstance(status, Mapping):
        return False
    return status.get("phase") in TERMINAL_PHASES and refused_at(status) is None


def conflict_message(kind: str, name: str) -> str:
    return (
        f"{kind} {name} already exists and is not owned by this MegDetRun; "
        "the controller never overwrites it: delete or rename that object"
    )


# ------------------------------------------------------------------------------------------
# What a handler decided, and the status that follows from it.


@dataclass(frozen=True)
class SpecInvalid:
    """The spec failed validation (``InvalidSpec``) or the cluster's policy
    (:data:`POLICY_DENIED`): ``Valid=False``, phase Invalid unless finished or ``keep_phase``
    (a denied change of a run whose job exists)."""

    problems: tuple[str, ...]
    reason: str = "InvalidSpec"
    keep_phase: bool = False


@dataclass(frozen=True)
class NotCreated:
    """A valid run whose objects could not be created (yet): ``Created=False`` with ``reason``,
    Pending (``ChildrenReady=False`` for a run that has its job)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Refused:
    """The API server refused the run's job: phase Failed, ``Created=False`` and ``Failed=True``
    (reason ``JobRefused``), not :func:`finished` (``ChildrenReady=False`` for a run that has
    its job)."""

    message: str


@dataclass(frozen=True)
class Created:
    """The run's job exists: the plan's fields, ``Valid`` and ``Created`` True, the job's phase,
    and ``ChildrenReady`` for ``children`` ((reason, message) of each other object not as the
    spec says)."""

    planned: Planned
    children: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Observed:
    """The job mirror: the job's phase (and a TrainJob's progress) folded into the status, once
    the run's reconcile wrote its first status (phase and ``jobUID``)."""


@dataclass(frozen=True)
class JobGone:
    """The run's job ``kind``/``name`` is gone after it had been created: ``JobPresent=False``
    (reason ``JobDeleted``), and Failed unless it finished (the job given, its last state,
    counts first)."""

    kind: str
    name: str


@dataclass(frozen=True)
class Foreign:
    """The job given holds the run's job name and names the run as its controller but is not
    the one the controller created: ``ForeignJob`` True, or False once gone (``present``)."""

    present: bool


@dataclass(frozen=True)
class PodStart:
    """A pod of the run's job (``pod``, its name): ``problem`` (the kubelet's reason and
    message) sets ``PodsStarted=False``; None sets it True again if this pod is the one it
    names."""

    problem: tuple[str, str] | None
    pod: str


Decision = SpecInvalid | NotCreated | Refused | Created | Observed | JobGone | Foreign | PodStart


def desired_status(
    run: Mapping[str, Any],
    job: Mapping[str, Any] | None,
    decision: Decision,
    now: str,
    generation: Any = None,
) -> dict[str, Any]:
    """The status ``run`` (as just read) should hold after ``decision``, given its ``job`` as
    just read (None: none); a run being deleted keeps its status. ``generation``: the one the
    decision was made for (default: the run's)."""
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    old = run.get("status") if isinstance(run.get("status"), Mapping) else {}
    if generation is None:
        generation = meta.get("generation")
    if meta.get("deletionTimestamp"):
        return dict(old)
    return {**old, **_changes(old, meta.get("uid"), job, decision, now, generation)}


def _changes(
    old: Mapping[str, Any],
    uid: Any,
    job: Mapping[str, Any] | None,
    decision: Decision,
    now: str,
    gen: Any,
) -> dict[str, Any]:
    conditions = conditions_in(old)
    match decision:
        case SpecInvalid(problems, reason, keep_phase):
            message = "; ".join(problems)
            out = {
                "conditions": set_condition(conditions, "Valid", False, reason, message, now, gen),
                "observedGeneration": gen,
            }
            if not keep_phase and not finished(old):
                out["phase"] = "Invalid"
            return out
        case NotCreated() | Refused() if had_job(old):
            # About another of its objects: the job and the phase (the job's) stay.
            reason = decision.reason if isinstance(decision, NotCreated) else CHILD_REFUSED
            problem = (reason, decision.message)
            return {"conditions": _children(conditions, [problem], now, gen)}
        case NotCreated(reason, message):
            conditions = set_condition(conditions, "Created", False, reason, message, now, gen)
            phase = old.get("phase") or "Pending"
            if phase in TERMINAL_PHASES:  # refused before: Pending again while it waits
                phase = "Pending"
                conditions = _phase_conditions(conditions, None, "Pending", now, gen)
            return {"phase": phase, "conditions": conditions, "observedGeneration": gen}
        case Refused(message):
            conditions = set_condition(conditions, "Created", False, JOB_REFUSED, message, now, gen)
            failed = JobState("Failed", JOB_REFUSED, message)
            conditions = _phase_conditions(conditions, failed, "Failed", now, gen)
            return {"phase": "Failed", "conditions": conditions, "observedGeneration": gen}
        case Created(planned, children):
            if job is None or not is_runs_job(job, uid, old):
                return {}  # deleted (or replaced) meanwhile: the job's mirror records that
            status: dict[str, Any] = dict(planned.rendered.status_plan())
            status["jobName"] = planned.job["metadata"]["name"]
            recorded = old.get("jobUID") or (job.get("metadata") or {}).get("uid")
            if recorded:
                status["jobUID"] = recorded
            status["target"] = planned.target
            status["observedGeneration"] = gen
            conditions = set_condition(
                conditions, "Valid", True, "SpecValid", "the spec passed validation", now, gen
            )
            what = f"{planned.job['kind']} {status['jobName']}"
            conditions = set_condition(conditions, "Created", True, "JobCreated", what, now, gen)
            conditions = _children(conditions, children, now, gen)
            pending = JobState("Pending", "JobCreated", "job created")
            state = job_state(job) if job.get("status") else pending
            status.update(next_status({**old, "conditions": conditions}, state, now, gen))
            status["conditions"] = _started_by_job(status["conditions"], state.phase, now, gen)
            return with_segments(old, status, job, planned, now, gen)
        case Observed():
            if old.get("phase") in (None, "Invalid") or not old.get("jobUID"):
                return {}  # the run's own reconcile writes its first status (and jobUID)
            if job is None or not job.get("status") or not is_runs_job(job, uid, old):
                return {}  # gone (its DELETED event records that), or not the run's
            out = next_status(old, job_state(job), now, gen)
            out["conditions"] = _started_by_job(out["conditions"], out["phase"], now, gen)
            progress = trainjob_progress(job)[0] if job.get("kind") == "TrainJob" else None
            if progress is not None:  # what the trainer reported to Trainer's status server
                out["progress"] = progress
                out["conditions"] = with_fabric(out["conditions"], trainjob_fabric(job), now, gen)
            return out
        case JobGone(kind, name):
            return _job_gone(old, job, kind, name, now, gen)
        case Foreign(present):
            return _foreign(old, job or {}, present, now, gen)
        case PodStart(problem, pod):
            return _pod_start(old, problem, pod, now, gen)
    raise TypeError(f"not a decision: {decision!r}")


def _phase_conditions(
    conditions: list[dict[str, Any]], state: JobState | None, phase: str, now: str, gen: Any
) -> list[dict[str, Any]]:
    """The mirrored phases' conditions for ``phase``: its own True (``state``'s reason), the
    others that are True turned False (``state`` None: none turned True)."""
    for kind in ACTIVE_PHASES:
        if state is not None and kind == state.phase:
            conditions = set_condition(
                conditions, kind, True, state.reason, state.message, now, gen
            )
        elif any(
            c.get("type") == kind and (state is not None or c.get("status") == "True")
            for c in conditions
        ):
            conditions = set_condition(
                conditions, kind, False, f"Not{kind}", f"phase is {phase}", now, gen
            )
    return conditions


def _children(
    conditions: list[Any], problems: Sequence[tuple[str, str]], now: str, gen: Any
) -> list[dict[str, Any]]:
    """``ChildrenReady`` False for ``problems``, True once there are none (it appears with the
    first problem, as the mirrored phases appear when they first happen)."""
    if problems:
        reasons = {reason for reason, _ in problems}
        reason = reasons.pop() if len(reasons) == 1 else "ChildrenNotReady"
        message = "; ".join(message for _, message in problems)
        return set_condition(conditions, CHILDREN_READY, False, reason, message, now, gen)
    if condition_of({"conditions": conditions}, CHILDREN_READY) is None:
        return [dict(c) for c in conditions]
    message = "every object of the run matches its spec"
    return set_condition(conditions, CHILDREN_READY, True, CHILDREN_READY, message, now, gen)


def _pod_start(
    old: Mapping[str, Any], problem: tuple[str, str] | None, pod: str, now: str, gen: Any
) -> dict[str, Any]:
    if finished(old) or old.get("phase") in (None, "Invalid") or not old.get("jobUID"):
        return {}  # done for good, or its reconcile has not recorded its job yet
    current = condition_of(old, PODS_STARTED) or {}
    status, message = current.get("status"), current.get("message")
    if problem is not None:
        if (status, current.get("reason"), message) == ("False", *problem):
            return {}
        conditions = set_condition(conditions_in(old), PODS_STARTED, False, *problem, now, gen)
        return {"conditions": conditions}
    if status != "False" or not str(message or "").startswith(f"pod {pod}, "):
        return {}  # not said to be stuck, or another pod is
    message = f"pod {pod} started"
    conditions = set_condition(
        conditions_in(old), PODS_STARTED, True, POD_STARTED, message, now, gen
    )
    return {"conditions": conditions}


def _started_by_job(
    conditions: list[dict[str, Any]], phase: str, now: str, gen: Any
) -> list[dict[str, Any]]:
    """``PodsStarted`` True once the job is Running or Succeeded (its pods did start)."""
    current = condition_of({"conditions": conditions}, PODS_STARTED)
    if current is None or current.get("status") != "False" or phase not in ("Running", "Succeeded"):
        return conditions
    message = f"the job is {phase}"
    return set_condition(conditions, PODS_STARTED, True, POD_STARTED, message, now, gen)


def _job_gone(
    old: Mapping[str, Any],
    job: Mapping[str, Any] | None,
    kind: str,
    name: str,
    now: str,
    gen: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    final = job_state(job) if job is not None and job.get("status") else None
    if final is not None and final.phase in TERMINAL_PHASES and not finished(old):
        out = next_status(old, final, now, gen)
    merged = {**old, **out}
    present = condition_of(merged, JOB_PRESENT)
    if present is not None and present.get("status") == "False":
        return out  # recorded already
    phase = merged.get("phase")
    if phase in TERMINAL_PHASES:  # the result stands
        message = (
            f"{kind} {name} was deleted after the run ended (the training operator's "
            "ttlSecondsAfterFinished, or a delete by hand); the run's result stands and the "
            "controller does not run it again: delete and re-create the MegDetRun to train again"
        )
    else:
        message = (
            f"{kind} {name} was deleted while the run was {phase or 'starting'}; the controller "
            "does not re-create it (that would take the GPUs again): delete and re-create the "
            "MegDetRun to run again (it resumes from the last checkpoint in its output folder)"
        )
    conditions = conditions_in(merged)
    out["conditions"] = set_condition(
        conditions, JOB_PRESENT, False, JOB_DELETED, message, now, gen
    )
    if phase not in TERMINAL_PHASES:
        failed = JobState("Failed", JOB_DELETED, message)
        out.update(next_status({**merged, **out}, failed, now, gen))
        if merged.get("startTime") is None:
            out.pop("startTime", None)  # it never ran as far as the controller saw
    return out


def _foreign(
    old: Mapping[str, Any], job: Mapping[str, Any], present: bool, now: str, gen: Any
) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    kind, name, uid = job.get("kind"), meta.get("name"), meta.get("uid")
    current = condition_of(old, FOREIGN_JOB) or {}
    if present:
        message = (
            f"{kind} {name} (uid {uid}) names this MegDetRun as its controller but is not the "
            f"job the controller created (status.jobUID {old.get('jobUID')}): someone else "
            "created it under the job's name. The controller neither adopts it nor mirrors its "
            "status, and never creates a second job for the run; delete that object"
        )
        reason = NOT_CREATED_BY_CONTROLLER
    elif current.get("status") != "True":
        return {}  # never said to be there
    else:
        message = f"{kind} {name} (uid {uid}), not created by the controller, was deleted"
        reason = "ForeignJobDeleted"
    if (current.get("status"), current.get("message")) == (str(present), message):
        return {}  # said already
    conditions = set_condition(conditions_in(old), FOREIGN_JOB, present, reason, message, now, gen)
    return {"conditions": conditions}
