"""A job's status (a Kubeflow ``PyTorchJob`` or a Trainer v2 ``TrainJob``) -> :class:`JobState`,
in MegDetRun terms. Pure. The mapping and its upstream sources: docs/controller.md, "Status
mapping".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megdet.controller.conditions import conditions_in
from megdet.progress import to_status as progress_from_trainer_status

__all__ = [
    "ACTIVE_PHASES",
    "PHASES",
    "TERMINAL_PHASES",
    "JobState",
    "count_of",
    "job_state",
    "pytorchjob_state",
    "trainjob_progress",
    "trainjob_state",
]

#: MegDetRun ``status.phase`` values (the CRD's enum).
PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Invalid")
#: Phases after which the job does nothing more.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Phases mirrored from the job, each with a run condition of the same name.
ACTIVE_PHASES = ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
#: A TrainJob's conditions that decide its phase, in order, and the phase each means.
TRAINJOB_PHASES = {"Failed": "Failed", "Complete": "Succeeded", "Suspended": "Suspended"}


@dataclass(frozen=True)
class JobState:
    """What a job's status says, in MegDetRun terms."""

    phase: str
    reason: str
    message: str
    start_time: str | None = None
    completion_time: str | None = None


def _true_condition(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping | None:
    for cond in conditions:
        if isinstance(cond, Mapping) and cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _from_condition(phase: str, cond: Mapping[str, Any], **times: str | None) -> JobState:
    return JobState(
        phase=phase,
        reason=str(cond.get("reason") or phase),
        message=str(cond.get("message") or ""),
        **times,
    )


def pytorchjob_state(job: Mapping[str, Any]) -> JobState:
    """The state of a ``kubeflow.org/v1`` PyTorchJob from its ``status.conditions``, in the
    operator's own precedence (docs/controller.md, "Status mapping")."""
    status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
    times = {
        "start_time": _str_or_none(status.get("startTime")),
        "completion_time": _str_or_none(status.get("completionTime")),
    }
    conditions = conditions_in(job.get("status"))
    for kind in ("Failed", "Succeeded", "Suspended", "Restarting", "Running"):
        cond = _true_condition(conditions, kind)
        if cond is not None:
            return _from_condition(kind, cond, **times)
    created = _true_condition(conditions, "Created")
    if created is not None:
        return _from_condition("Pending", created, **times)
    return JobState("Pending", "JobPending", "the job has no status yet", **times)


def trainjob_state(job: Mapping[str, Any]) -> JobState:
    """The state of a ``trainer.kubeflow.org/v1alpha1`` TrainJob: its conditions
    (:data:`TRAINJOB_PHASES`), else its child Jobs' counts in ``status.jobsStatus`` (a failed
    one: JobSet recreates them, Restarting; every one ready: Running)."""
    conditions = conditions_in(job.get("status"))
    for kind, phase in TRAINJOB_PHASES.items():
        cond = _true_condition(conditions, kind)
        if cond is not None:
            time = _str_or_none(cond.get("lastTransitionTime"))
            return _from_condition(
                phase, cond, completion_time=time if phase in TERMINAL_PHASES else None
            )
    status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
    children = [c for c in status.get("jobsStatus") or [] if isinstance(c, Mapping)]
    if any(count_of(c, "failed") > 0 for c in children):
        failed = sorted(str(c.get("name")) for c in children if count_of(c, "failed") > 0)
        return JobState("Restarting", "JobsFailed", f"child jobs failed: {', '.join(failed)}")
    if children and all(count_of(c, "ready") + count_of(c, "succeeded") > 0 for c in children):
        return JobState("Running", "JobsReady", "every child job is ready")
    return JobState("Pending", "JobsNotReady", "waiting for the child jobs' pods")


def job_state(job: Mapping[str, Any]) -> JobState:
    """:func:`pytorchjob_state` or :func:`trainjob_state`, by the job's ``kind``."""
    if job.get("kind") == "TrainJob":
        return trainjob_state(job)
    return pytorchjob_state(job)


def trainjob_progress(job: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``status.progress`` mirrored from a TrainJob's ``status.trainerStatus`` (what Trainer
    v2.3.0's status server stores from the trainer's reports) and the problems found in it;
    None when the TrainJob has no trainerStatus (nothing reported yet: leave the run's as is)."""
    status = job.get("status")
    trainer = status.get("trainerStatus") if isinstance(status, Mapping) else None
    if trainer is None:
        return None, []
    return progress_from_trainer_status(trainer)


def count_of(mapping: Mapping[str, Any], key: str) -> int:
    """``mapping[key]`` when it is an integer (not a bool), else 0."""
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
