"""A run's conditions, read and written the Kubernetes way. Pure, and imported by every module
that sets a condition (status, planning, resize, fabric_condition, lifecycle), so it imports none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["condition_of", "conditions_in", "had_job", "set_condition"]


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
        when = cond.get("lastTransitionTime") if cond.get("status") == text else now
        out.append(_condition(kind, text, reason, message, when, generation))
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


def conditions_in(status: Any) -> list[Mapping[str, Any]]:
    """The conditions of a status (a run's or a job's) that are objects."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []


def condition_of(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in a run's status, if any."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def had_job(status: Mapping[str, Any]) -> bool:
    """Whether the controller created (or found) this run's job once: ``Created=True``; such a
    run never gets a second job (:class:`megdet.controller.status.JobGone`)."""
    created = condition_of(status, "Created")
    return created is not None and created.get("status") == "True"
