"""MegDetRun status: conditions and the status each reconcile outcome writes. Pure, no I/O.

:func:`next_status` folds a job's :class:`~megdet.controller.job_state.JobState` into the
run's status (phase, conditions, restarts, start and completion times); the other builders
give the status of a run that is invalid, planned, not created, refused or whose job is gone.
Everything here is deterministic given ``now``, so it is tested without an API server.
Conditions follow the Kubernetes conventions, as the Kubeflow operators set theirs (see
:mod:`megdet.controller.job_state` for the upstream semantics read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from megdet.controller.job_state import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    JobState,
    count_of,
    job_state,
)

if TYPE_CHECKING:
    from megdet.controller.planning import Planned

__all__ = [
    "CHILDREN_READY",
    "CHILD_REFUSED",
    "CONDITION_TYPES",
    "FOREIGN_JOB",
    "JOB_DELETED",
    "JOB_PRESENT",
    "JOB_REFUSED",
    "NOT_CREATED_BY_CONTROLLER",
    "RETRYING",
    "children_conditions",
    "condition_of",
    "conflict_message",
    "conflict_status",
    "finished",
    "foreign_job_status",
    "had_job",
    "invalid_status",
    "job_deleted_status",
    "next_status",
    "not_created_status",
    "planned_status",
    "progress_patch",
    "refused_at",
    "refused_status",
    "set_condition",
]

#: Condition type added (status False, reason :data:`JOB_DELETED`) when the run's job vanished
#: after it had been created: the operator's TTL after finishing, or a delete by hand.
JOB_PRESENT = "JobPresent"
#: Reason of ``JobPresent=False`` and, for a run that had not finished, of ``Failed=True``.
JOB_DELETED = "JobDeleted"
#: Reason of ``Created=False`` (and ``Failed=True``) when the API server refused the job (4xx).
JOB_REFUSED = "JobRefused"
#: Condition type of the run's other objects (the TrainingRuntime, the NetworkPolicy): added
#: False when one of them could not be created or brought to the spec while the run's job
#: exists (the job is not touched: ``Created`` stays True and the phase follows the job), True
#: again once they match. Reasons: :data:`CHILD_REFUSED` (final until the spec changes),
#: ``Retrying``, ``JobNameConflict``, ``JobKindNotInstalled``; ``ChildrenReady`` when True.
CHILDREN_READY = "ChildrenReady"
CHILD_REFUSED = "ChildRefused"
#: Reason of ``Created=False`` (or ``ChildrenReady=False``) while a create the API server
#: refused for a reason that heals (quota, an admission check's cache, the controller's RBAC)
#: is retried with backoff.
RETRYING = "Retrying"
#: Condition type set True (reason :data:`NOT_CREATED_BY_CONTROLLER`) while an object that is
#: not the job this controller created (``status.jobUID``) holds the job's name and names the
#: run as its controller: a namespace user's job, never adopted nor mirrored.
FOREIGN_JOB = "ForeignJob"
NOT_CREATED_BY_CONTROLLER = "NotCreatedByController"
#: Every condition type a MegDetRun can carry: Valid (the spec passed validation), Created
#: (the controller created, or found, its job), one per mirrored phase, and JobPresent (only
#: once the job has gone).
CONDITION_TYPES = (
    "Valid",
    "Created",
    *ACTIVE_PHASES,
    JOB_PRESENT,
    CHILDREN_READY,
    FOREIGN_JOB,
)


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
    restarts = count_of(old, "restarts")
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


def foreign_job_status(
    old: Mapping[str, Any],
    kind: str,
    name: str,
    uid: Any,
    present: bool,
    now: str,
    generation: int | None,
) -> dict[str, Any] | None:
    """``ForeignJob`` for a job under the run's job name, controlled (it says) by the run, that
    is not the job the controller created (``status.jobUID``); ``present=False``: it is gone.
    None when the status already says so (or, for a gone one, never said it was there)."""
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    current = condition_of(old, FOREIGN_JOB)
    if present:
        message = (
            f"{kind} {name} (uid {uid}) names this MegDetRun as its controller but is not the "
            f"job the controller created (status.jobUID {old.get('jobUID')}): someone else "
            "created it under the job's name. The controller neither adopts it nor mirrors its "
            "status, and never creates a second job for the run; delete that object"
        )
        reason = NOT_CREATED_BY_CONTROLLER
    else:
        if current is None or current.get("status") != "True":
            return None
        message = f"{kind} {name} (uid {uid}), not created by the controller, was deleted"
        reason = "ForeignJobDeleted"
    if (
        current is not None
        and current.get("status") == ("True" if present else "False")
        and current.get("message") == message
    ):
        return None
    return {
        "conditions": set_condition(
            conditions, FOREIGN_JOB, present, reason, message, now, generation
        )
    }


def children_conditions(
    old: Mapping[str, Any],
    problems: Sequence[tuple[str, str]],
    now: str,
    generation: int | None,
) -> list[dict[str, Any]] | None:
    """The run's conditions with ``ChildrenReady`` for ``problems`` ((reason, message) of each
    object of the run, other than its job, that is not as the spec says); None when nothing
    changes: no problem and no ``ChildrenReady`` yet (the condition appears with the first
    problem, as the mirrored phases appear when they first happen)."""
    conditions = [c for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    if problems:
        reasons = {reason for reason, _ in problems}
        reason = reasons.pop() if len(reasons) == 1 else "ChildrenNotReady"
        message = "; ".join(message for _, message in problems)
        return set_condition(conditions, CHILDREN_READY, False, reason, message, now, generation)
    if condition_of(old, CHILDREN_READY) is None:
        return None
    return set_condition(
        conditions,
        CHILDREN_READY,
        True,
        "ChildrenReady",
        "every object of the run matches its spec",
        now,
        generation,
    )


def _children_only(
    old: Mapping[str, Any], reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any]:
    """A refusal or failure while the run's job exists: about one of its other objects, so it
    goes to ``ChildrenReady``; ``Created`` and the phase (the job's) are left as they are."""
    return {"conditions": children_conditions(old, [(reason, message)], now, generation)}


def refused_status(
    old: Mapping[str, Any], message: str, now: str, generation: int | None
) -> dict[str, Any]:
    """Status for a run whose job the API server refused: phase Failed, ``Created=False``.

    ``Failed=True`` (reason ``JobRefused``) goes with the phase, as for every mirrored phase; no
    start or completion time, since nothing ran. Not :func:`finished`: a spec change retries.
    A run that has its job (``Created=True``) keeps it recorded: the refusal was of another of
    its objects, ``ChildrenReady=False`` (reason ``ChildRefused``).
    """
    if had_job(old):
        return _children_only(old, CHILD_REFUSED, message, now, generation)
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


def planned_status(
    old: Mapping[str, Any],
    planned: Planned,
    job: Mapping[str, Any] | None,
    now: str,
    generation: Any,
    job_uid: str | None = None,
    children: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Status for a run whose job exists (``job``) or was just created (``job=None``);
    ``job_uid``: the job's ``metadata.uid``, recorded as ``status.jobUID`` (the first one
    recorded stays: the mirror follows only that job); ``children``: (reason, message) of each
    other object of the run that is not as the spec says (``ChildrenReady``)."""
    status: dict[str, Any] = dict(planned.rendered.status_plan())
    status["jobName"] = planned.job["metadata"]["name"]
    recorded = old.get("jobUID") or job_uid
    if recorded:
        status["jobUID"] = recorded
    status["target"] = planned.target
    status["observedGeneration"] = generation
    conditions = set_condition(
        old.get("conditions") or [],
        "Valid",
        True,
        "SpecValid",
        "the spec passed validation",
        now,
        generation,
    )
    conditions = set_condition(
        conditions,
        "Created",
        True,
        "JobCreated",
        f"{planned.job['kind']} {status['jobName']}",
        now,
        generation,
    )
    conditions = (
        children_conditions({"conditions": conditions}, children, now, generation) or conditions
    )
    state = job_state(job) if job is not None else JobState("Pending", "JobCreated", "job created")
    status.update(next_status({**old, "conditions": conditions}, state, now, generation))
    return status


def not_created_status(
    old: Mapping[str, Any], reason: str, message: str, now: str, generation: Any
) -> dict[str, Any]:
    """Status for a valid run whose objects could not be created: ``Created=False``.

    A run with no job is Pending; one that was Failed because its job was refused (the only
    way a run without a job gets a terminal phase) is Pending again while it waits. A run that
    has its job (``Created=True``) keeps it recorded: ``ChildrenReady=False`` says the rest.
    """
    if had_job(old):
        return _children_only(old, reason, message, now, generation)
    conditions = set_condition(
        old.get("conditions") or [], "Created", False, reason, message, now, generation
    )
    phase = old.get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        phase = "Pending"
        for kind in ACTIVE_PHASES:
            if any(c.get("type") == kind and c.get("status") == "True" for c in conditions):
                conditions = set_condition(
                    conditions, kind, False, f"Not{kind}", "phase is Pending", now, generation
                )
    return {"phase": phase, "conditions": conditions, "observedGeneration": generation}


def conflict_status(
    old: Mapping[str, Any], kind: str, name: str, now: str, generation: Any
) -> dict[str, Any]:
    """Status for a run whose job name is taken by an object it does not own."""
    return not_created_status(old, "JobNameConflict", conflict_message(kind, name), now, generation)


def conflict_message(kind: str, name: str) -> str:
    return (
        f"{kind} {name} already exists and is not owned by this MegDetRun; "
        "the controller never overwrites it: delete or rename that object"
    )


def progress_patch(old: Any, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``status.progress`` that turns ``old`` into ``new`` (a field ``new``
    lacks is set to null, which removes it); None when they are equal: nothing to write."""
    before = old if isinstance(old, Mapping) else {}
    if dict(before) == dict(new) and (isinstance(old, Mapping) or not new):
        return None
    return {**{key: None for key in before if key not in new}, **new}
