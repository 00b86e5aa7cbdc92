"""The events a change of a run's status posts, derived from the old and the new status. Pure.

:class:`~megdet.controller.status_writer.StatusWriter` posts them after each write it makes
(:func:`events`); the status itself is decided in :mod:`megdet.controller.status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megdet.controller.conditions import condition_of
from megdet.controller.resize import events as resize_events
from megdet.controller.status import (
    CHILDREN_READY,
    FOREIGN_JOB,
    JOB_PRESENT,
    JOB_REFUSED,
    PODS_STARTED,
    POLICY_DENIED,
)

__all__ = ["WARNING_CONDITIONS", "Event", "events"]


@dataclass(frozen=True)
class Event:
    """One event on the run: ``source`` is "phase" for a phase change (a job's transition,
    counted), else the type of the condition whose change it reports."""

    type: str
    reason: str
    message: str
    source: str


#: The conditions whose arrival is news (a Warning event), each with the status it warns in.
WARNING_CONDITIONS = {
    "Created": "False",
    CHILDREN_READY: "False",
    "Valid": "False",
    JOB_PRESENT: "False",
    FOREIGN_JOB: "True",
    PODS_STARTED: "False",
}
#: The condition that says why a run is in a phase (the phase's own for the mirrored ones).
_CAUSE = {"Invalid": "Valid", "Pending": "Created"}


def _episode(cond: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells one episode of a condition from the next: its status and reason; for a
    refusal also the generation (each refused spec is news), for a foreign job its message
    (each foreign object, by its uid, is news); for pods that cannot start only the status (the
    kubelet alternates ``ErrImagePull`` and ``ImagePullBackOff``: one Warning per episode)."""
    if cond.get("type") == FOREIGN_JOB:
        return cond.get("status"), cond.get("message")
    if cond.get("type") == PODS_STARTED:
        return (cond.get("status"),)
    if cond.get("reason") == JOB_REFUSED:
        return cond.get("status"), cond.get("reason"), cond.get("observedGeneration")
    return cond.get("status"), cond.get("reason")


def events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """The events the change from ``old`` to ``new`` posts: a Warning for each condition of
    :data:`WARNING_CONDITIONS` that enters its warning status or a new episode of it (``Valid``
    only for :data:`POLICY_DENIED`: an invalid spec is said by its phase), and one event per
    phase change (Warning for Failed and Invalid, else Normal) unless a Warning already says
    why (its reason is that of the phase's cause: a refused job, a deleted one, a denied
    spec, a job not created). None when nothing changed."""
    out: list[Event] = []
    for kind, warns in WARNING_CONDITIONS.items():
        cond = condition_of(new, kind)
        if cond is None or cond.get("status") != warns:
            continue
        if kind == "Valid" and cond.get("reason") != POLICY_DENIED:
            continue
        before = condition_of(old, kind)
        if before is not None and _episode(before) == _episode(cond):
            continue
        reason = FOREIGN_JOB if kind == FOREIGN_JOB else str(cond.get("reason"))
        out.append(Event("Warning", reason, str(cond.get("message") or "")[:1000], kind))
    was, phase = old.get("phase"), new.get("phase")
    if phase is not None and phase != was:
        cause = condition_of(new, _CAUSE.get(phase, phase)) or {}
        if cause.get("reason") not in {e.reason for e in out}:
            message = str(cause.get("message") or "")
            text = f"phase {was or 'None'} -> {phase}" + (f": {message}" if message else "")
            kind = "Warning" if phase in ("Failed", "Invalid") else "Normal"
            out.insert(0, Event(kind, phase, text[:1000], "phase"))

    out += [Event("Normal", r, m[:1000], "resize") for r, m in resize_events(old, new)]
    return out
