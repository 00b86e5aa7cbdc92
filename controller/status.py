"""Job status -> MegDetRun status: pure functions, no I/O.

A MegDetRun's ``status.phase`` is one of :data:`PHASES`. The controller reads the job it owns
(a Kubeflow ``PyTorchJob`` or a Trainer v2 ``TrainJob``), turns the job's status into a
:class:`JobState` here, and :func:`next_status` folds that into the run's status (phase,
conditions, restarts, start and completion times). Everything here is deterministic given
``now``, so it is tested without an API server.

Upstream semantics this follows (read from the source, not guessed):

- PyTorchJob, kubeflow/trainer branch ``release-1.9`` (commit 3a3a1da8):
  ``pkg/apis/kubeflow.org/v1/common_types.go`` defines the condition types Created, Running,
  Restarting, Succeeded, Suspended, Failed and ``JobStatus`` (conditions, replicaStatuses,
  startTime, completionTime). ``pkg/util/status.go`` keeps Running and Restarting mutually
  exclusive (setting one filters out the other), sets Running to False when the job Succeeded or
  Failed, and freezes the conditions once Failed is True; ``IsSucceeded``/``IsFailed``/
  ``IsSuspended`` test ``status == "True"`` of one type. ``pkg/controller.v1/common/job.go``
  sets Suspended True (reason ``<Kind>Suspended``) and Running False on suspend, and Suspended
  False (reason ``<Kind>Resumed``) on resume.
- TrainJob, kubeflow/trainer tag ``v2.3.0`` (commit 658725bd):
  ``pkg/apis/trainer/v1alpha1/trainjob_types.go`` defines the condition types Suspended,
  Complete, Failed (``metav1.Condition``; reasons Suspended, Resumed, DeadlineExceeded, ...),
  ``status.jobsStatus[]`` with per-child-Job counts (ready, succeeded, failed, active,
  suspended) and ``spec.suspend``. TrainJob has no Running or Restarting condition and no
  start time, so those are read from ``jobsStatus`` (see :func:`trainjob_state`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megdet.progress import to_status as progress_from_trainer_status

__all__ = [
    "ACTIVE_PHASES",
    "CONDITION_TYPES",
    "JOB_DELETED",
    "JOB_PRESENT",
    "JOB_REFUSED",
    "PHASES",
    "TERMINAL_PHASES",
    "JobState",
    "condition_of",
    "finished",
    "had_job",
    "invalid_status",
    "job_deleted_status",
    "job_state",
    "next_status",
    "progress_patch",
    "pytorchjob_state",
    "refused_at",
    "refused_status",
    "set_condition",
    "trainjob_progress",
    "trainjob_state",
]

#: MegDetRun ``status.phase`` values (the CRD's enum).
PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Invalid")
#: Phases after which the job does nothing more.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Phases mirrored from the job, each with a run condition of the same name.
ACTIVE_PHASES = ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
#: Condition type added (status False, reason :data:`JOB_DELETED`) when the run's job vanished
#: after it had been created: the operator's TTL after finishing, or a delete by hand.
JOB_PRESENT = "JobPresent"
#: Reason of ``JobPresent=False`` and, for a run that had not finished, of ``Failed=True``.
JOB_DELETED = "JobDeleted"
#: Reason of ``Created=False`` (and ``Failed=True``) when the API server refused the job (4xx).
JOB_REFUSED = "JobRefused"
#: Every condition type a MegDetRun can carry: Valid (the spec passed validation), Created
#: (the controller created, or found, its job), one per mirrored phase, and JobPresent (only
#: once the job has gone).
CONDITION_TYPES = ("Valid", "Created", *ACTIVE_PHASES, JOB_PRESENT)


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


def _conditions(job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []


def _from_condition(phase: str, cond: Mapping[str, Any], **times: str | None) -> JobState:
    return JobState(
        phase=phase,
        reason=str(cond.get("reason") or phase),
        message=str(cond.get("message") or ""),
        **times,
    )


def pytorchjob_state(job: Mapping[str, Any]) -> JobState:
    """The state of a ``kubeflow.org/v1`` PyTorchJob from its ``status.conditions``.

    Precedence follows the operator's own: Failed and Succeeded are final (the operator stops
    changing conditions after Failed), then Suspended, then Restarting/Running (exclusive
    upstream), else the job exists but no pod runs yet: Pending.
    """
    status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
    times = {
        "start_time": _str_or_none(status.get("startTime")),
        "completion_time": _str_or_none(status.get("completionTime")),
    }
    conditions = _conditions(job)
    for kind in ("Failed", "Succeeded", "Suspended", "Restarting", "Running"):
        cond = _true_condition(conditions, kind)
        if cond is not None:
            return _from_condition(kind, cond, **times)
    created = _true_condition(conditions, "Created")
    if created is not None:
        return _from_condition("Pending", created, **times)
    return JobState("Pending", "JobPending", "the job has no status yet", **times)


def trainjob_state(job: Mapping[str, Any]) -> JobState:
    """The state of a ``trainer.kubeflow.org/v1alpha1`` TrainJob.

    Conditions Failed, Complete and Suspended decide first (``Complete`` is this project's
    ``Succeeded``). Without one of them the child-Job counts in ``status.jobsStatus`` decide:
    a failed child Job while the TrainJob has not failed means JobSet is recreating its Jobs
    under its failure policy (Restarting); every child Job ready means Running; else Pending.
    """
    conditions = _conditions(job)
    for kind, phase in (
        ("Failed", "Failed"),
        ("Complete", "Succeeded"),
        ("Suspended", "Suspended"),
    ):
        cond = _true_condition(conditions, kind)
        if cond is not None:
            time = _str_or_none(cond.get("lastTransitionTime"))
            return _from_condition(
                phase, cond, completion_time=time if phase in TERMINAL_PHASES else None
            )
    status = job.get("status") if isinstance(job.get("status"), Mapping) else {}
    children = [c for c in status.get("jobsStatus") or [] if isinstance(c, Mapping)]
    if any(_count(c, "failed") > 0 for c in children):
        failed = sorted(str(c.get("name")) for c in children if _count(c, "failed") > 0)
        return JobState("Restarting", "JobsFailed", f"child jobs failed: {', '.join(failed)}")
    if children and all(_count(c, "ready") + _count(c, "succeeded") > 0 for c in children):
        return JobState("Running", "JobsReady", "every child job is ready")
    return JobState("Pending", "JobsNotReady", "waiting for the child jobs' pods")


def job_state(job: Mapping[str, Any]) -> JobState:
    """:func:`pytorchjob_state` or :func:`trainjob_state`, by the job's ``kind``."""
    if job.get("kind") == "TrainJob":
        return trainjob_state(job)
    return pytorchjob_state(job)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` set; ``lastTransitionTime`` moves only when its status flips."""
    text = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != kind:
            out.append(dict(cond))
            continue
        found = True
        same = cond.get("status") == text
        out.append(
            _condition(
                kind,
                text,
                reason,
                message,
                cond.get("lastTransitionTime") if same else now,
                generation,
            )
        )
    if not found:
        out.append(_condition(kind, text, reason, message, now, generation))
    return out


def _condition(
    kind: str, status: str, reason: str, message: str, when: Any, generation: int | None
) -> dict[str, Any]:
    cond = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def next_status(
    old: Mapping[str, Any], state: JobState, now: str, generation: int | None
) -> dict[str, Any]:
    """The status fields that change when the owned job is in ``state`` (a patch for status).

    ``restarts`` counts the times this controller saw the run enter Restarting. The condition
    of the current phase turns True; those of other mirrored phases that exist turn False
    (they are not added until they first happen, as the Kubeflow operator does).
    """
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    for kind in ACTIVE_PHASES:
        if kind == state.phase:
            conditions = set_condition(
                conditions, kind, True, state.reason, state.message, now, generation
            )
        elif any(c.get("type") == kind for c in conditions):
            conditions = set_condition(
                conditions, kind, False, f"Not{kind}", f"phase is {state.phase}", now, generation
            )
    patch: dict[str, Any] = {"phase": state.phase, "conditions": conditions}
    restarts = _count(old, "restarts")
    if state.phase == "Restarting" and old.get("phase") != "Restarting":
        restarts += 1
    patch["restarts"] = restarts
    start = old.get("startTime") or state.start_time
    if start is None and state.phase not in ("Pending", "Suspended"):
        start = now
    if start is not None:
        patch["startTime"] = start
    if state.phase in TERMINAL_PHASES:
        patch["completionTime"] = old.get("completionTime") or state.completion_time or now
    return patch


def invalid_status(
    old: Mapping[str, Any],
    problems: Sequence[str],
    now: str,
    generation: int | None,
    reason: str = "InvalidSpec",
) -> dict[str, Any]:
    """Status for a spec that failed validation (or the cluster's policy: ``reason``
    ``PolicyDenied``): phase Invalid, condition Valid=False."""
    message = "; ".join(problems)
    conditions = set_condition(
        [c for c in old.get("conditions") or [] if isinstance(c, Mapping)],
        "Valid",
        False,
        reason,
        message,
        now,
        generation,
    )
    return {"phase": "Invalid", "conditions": conditions, "observedGeneration": generation}


def condition_of(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in a run's status, if any."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def had_job(status: Mapping[str, Any]) -> bool:
    """Whether the controller created (or found) this run's job once: ``Created=True``.

    Such a run never gets a second job: if the job is gone, it was deleted (the operator's
    ``ttlSecondsAfterFinished`` or a ``kubectl delete``), see :func:`job_deleted_status`.
    """
    created = condition_of(status, "Created")
    return created is not None and created.get("status") == "True"


def refused_at(status: Mapping[str, Any]) -> Any:
    """The generation at which the API server refused the run's job (None: not refused)."""
    created = condition_of(status, "Created")
    if created is None or created.get("status") != "False" or created.get("reason") != JOB_REFUSED:
        return None
    return created.get("observedGeneration")


def finished(status: Mapping[str, Any]) -> bool:
    """A run that is done for good: Succeeded or Failed after it had its job.

    A run whose job the API server refused is ``Failed`` too, but not finished: a change of its
    spec tries again. Nothing makes a job for a finished run.
    """
    return (
        isinstance(status, Mapping)
        and status.get("phase") in TERMINAL_PHASES
        and refused_at(status) is None
    )


def job_deleted_status(
    old: Mapping[str, Any], kind: str, name: str, now: str, generation: int | None
) -> dict[str, Any] | None:
    """Status for a run whose job is gone after it had been created; None if already recorded.

    A finished run keeps its phase (its result stands) and gains ``JobPresent=False``. A run
    that had not finished becomes ``Failed`` (reason ``JobDeleted``): the controller never
    re-creates a job behind the user's back, since that would start training again.
    """
    present = condition_of(old, JOB_PRESENT)
    if present is not None and present.get("status") == "False":
        return None
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    phase = old.get("phase")
    if phase in TERMINAL_PHASES:
        message = (
            f"{kind} {name} was deleted after the run ended (the training operator's "
            "ttlSecondsAfterFinished, or a delete by hand); the run's result stands and the "
            "controller does not run it again: delete and re-create the MegDetRun to train again"
        )
        return {
            "conditions": set_condition(
                conditions, JOB_PRESENT, False, JOB_DELETED, message, now, generation
            )
        }
    message = (
        f"{kind} {name} was deleted while the run was {phase or 'starting'}; the controller "
        "does not re-create it (that would take the GPUs again): delete and re-create the "
        "MegDetRun to run again (it resumes from the last checkpoint in its output folder)"
    )
    conditions = set_condition(
        conditions, JOB_PRESENT, False, JOB_DELETED, message, now, generation
    )
    patch = next_status(
        {**old, "conditions": conditions}, JobState("Failed", JOB_DELETED, message), now, generation
    )
    if old.get("startTime") is None:
        patch.pop("startTime", None)  # it never ran as far as the controller saw
    return patch


def refused_status(
    old: Mapping[str, Any], message: str, now: str, generation: int | None
) -> dict[str, Any]:
    """Status for a run whose job the API server refused: phase Failed, ``Created=False``.

    ``Failed=True`` (reason ``JobRefused``) goes with the phase, as for every mirrored phase; no
    start or completion time, since nothing ran. Not :func:`finished`: a spec change retries.
    """
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    conditions = set_condition(conditions, "Created", False, JOB_REFUSED, message, now, generation)
    for kind in ACTIVE_PHASES:
        if kind == "Failed":
            conditions = set_condition(
                conditions, kind, True, JOB_REFUSED, message, now, generation
            )
        elif any(c.get("type") == kind for c in conditions):
            conditions = set_condition(
                conditions, kind, False, f"Not{kind}", "phase is Failed", now, generation
            )
    return {"phase": "Failed", "conditions": conditions, "observedGeneration": generation}


def trainjob_progress(job: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``status.progress`` mirrored from a TrainJob's ``status.trainerStatus`` (what Trainer
    v2.3.0's status server stores from the trainer's reports) and the problems found in it;
    None when the TrainJob has no trainerStatus (nothing reported yet: leave the run's as is)."""
    status = job.get("status")
    trainer = status.get("trainerStatus") if isinstance(status, Mapping) else None
    if trainer is None:
        return None, []
    return progress_from_trainer_status(trainer)


def progress_patch(old: Any, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``status.progress`` that turns ``old`` into ``new`` (a field ``new``
    lacks is set to null, which removes it); None when they are equal: nothing to write."""
    before = old if isinstance(old, Mapping) else {}
    if dict(before) == dict(new) and (isinstance(old, Mapping) or not new):
        return None
    return {**{key: None for key in before if key not in new}, **new}


def _count(mapping: Mapping[str, Any], key: str) -> int:
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
