"""A run's conditions, read and written the Kubernetes way. Pure, and imported by everything
that sets a condition (:mod:`megdet.controller.status`, :mod:`megdet.controller.planning`,
:mod:`megdet.controller.resize`, :mod:`megdet.controller.fabric_condition`,
:mod:`megdet.controller.lifecycle`), so it imports none of them.
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

    def condition(when: Any) -> dict[str, Any]:
        cond = {"type": kind, "status": text, "reason": reason, "message": message}
        cond["lastTransitionTime"] = when
        if generation is not None:
            cond["observedGeneration"] = generation
        return cond

    out = [
        dict(c)
        if c.get("type") != kind
        else condition(c.get("lastTransitionTime") if c.get("status") == text else now)
        for c in conditions
    ]
    if not any(c.get("type") == kind for c in conditions):
        out.append(condition(now))
    return out


def conditions_in(status: Any) -> list[Mapping[str, Any]]:
    """The conditions of a status (a run's or a job's) that are objects."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []


def condition_of(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in a run's status, if any."""
    return next((c for c in conditions_in(status) if c.get("type") == kind), None)


def had_job(status: Mapping[str, Any]) -> bool:
    """Whether the controller created (or found) this run's job once: ``Created=True``; such a
    run never gets a second job (:class:`megdet.controller.status.JobGone`)."""
    created = condition_of(status, "Created")
    return created is not None and created.get("status") == "True"
