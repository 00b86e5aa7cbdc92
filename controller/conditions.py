"""A run's conditions, read and written the Kubernetes way. Pure, and imported by everything
that sets a condition (:mod:`megdet.controller.status`, :mod:`megdet.controller.planning`,
:mod:`megdet.controller.resize`, :mod:`megdet.controller.fabric_condition`,
:mod:`megdet.controller.lifecycle`), so it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["condition_of", "had_job", "set_condition"]


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
    ``ttlSecondsAfterFinished`` or a ``kubectl delete``), see
    :class:`megdet.controller.status.JobGone`.
    """
    created = condition_of(status, "Created")
    return created is not None and created.get("status") == "True"
