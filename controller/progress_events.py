"""Milestone events from the run's watch: the old and the new ``status.progress``, both targets.

A Normal ``Evaluated`` event for each new evaluation and a Normal ``Checkpointed`` event every
K-th new checkpoint (:class:`Milestones`), through a per-run token bucket; posted by a kopf
event handler (:func:`register`), so on the replica kopf lets act. What the watch saw last is
the run's :class:`Milestones` in its record (controller/run_record.py). Why there and not where
reports arrive, and what a restart or failover announces: docs/controller.md, "Progress
reporting in detail".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.api import GROUP, PLURAL, VERSION

__all__ = [
    "EVENTS_PER_HOUR",
    "EVENT_BURST",
    "Milestones",
    "TokenBucket",
    "milestones_of",
    "register",
]

#: Per-run event budget: a bucket of EVENT_BURST tokens refilled at EVENTS_PER_HOUR.
EVENT_BURST = 3
EVENTS_PER_HOUR = 6


@dataclass
class TokenBucket:
    """``capacity`` tokens, refilled at ``per_hour`` an hour; :meth:`take` spends one."""

    capacity: float = EVENT_BURST
    per_hour: float = EVENTS_PER_HOUR
    tokens: float = EVENT_BURST
    at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_hour / 3600)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class Milestones:
    """Which progress deserves an event: each new evaluation (``Evaluated``, with AP and AP50)
    and every ``checkpoint_every``-th new checkpoint (``Checkpointed``), through a per-run
    :class:`TokenBucket`. One per run, for both targets; thread-safe."""

    checkpoint_every: int = 5
    #: The run's uid ("": not known): a run created again under the name starts anew.
    uid: str = ""
    eval_iteration: int | None = None
    checkpoint_iteration: int | None = None
    checkpoints: int = 0
    bucket: TokenBucket = field(default_factory=TokenBucket)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def from_written(
        cls, written: Mapping[str, Any], checkpoint_every: int, uid: str = ""
    ) -> Milestones:
        """Continue from a written ``status.progress`` (a restarted controller repeats none)."""
        return cls(
            checkpoint_every=checkpoint_every,
            uid=uid,
            eval_iteration=written.get("evalIteration"),
            checkpoint_iteration=written.get("checkpointIteration"),
        )

    def note(self, p: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
        with self._lock:
            return self._note(p, now)

    def _note(self, p: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
        events = []
        ev = p.get("evalIteration")
        if isinstance(ev, int) and (self.eval_iteration is None or ev > self.eval_iteration):
            self.eval_iteration = ev
            if p.get("ap") is not None and self.bucket.take(now):
                events.append(("Evaluated", f"evaluated at iteration {ev}: AP "
                               f"{_num(p.get('ap'))}, AP50 {_num(p.get('ap50'))}"))  # fmt: skip
        ck = p.get("checkpointIteration")
        if isinstance(ck, int) and (
            self.checkpoint_iteration is None or ck > self.checkpoint_iteration
        ):
            self.checkpoint_iteration = ck
            self.checkpoints += 1
            if self.checkpoints % self.checkpoint_every == 0 and self.bucket.take(now):
                when = p.get("checkpointTime")
                events.append(("Checkpointed", f"checkpoint at iteration {ck}"
                               + (f" ({when})" if when else "")))  # fmt: skip
        return events


def _num(value: Any) -> str:
    return "?" if value is None else f"{float(value):.2f}"


def milestones_of(
    records: Any, body: Mapping[str, Any], checkpoint_every: int, now: float
) -> list[tuple[str, str]]:
    """The events a run's watch event calls for: its ``status.progress`` compared with what
    its :class:`Milestones` in ``records`` (the operator's
    :class:`~megdet.controller.run_record.RunRecords`) saw before."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    progress = status.get("progress") if isinstance(status.get("progress"), Mapping) else {}
    uid = str(meta.get("uid") or "")

    def kept(known: Milestones | None) -> Milestones:
        if known is not None and known.uid in ("", uid):  # not an earlier run of the name
            return known
        return Milestones.from_written(progress, checkpoint_every, uid)

    seen = records.update((meta.get("namespace"), meta.get("name")), "milestones", kept)
    return seen.note(progress, now)


def register(registry: Any, records: Any, checkpoint_every: int) -> None:
    """A kopf event handler on ``registry`` that posts each run's milestone events from its
    watch (:func:`milestones_of`). Async and API-free but for the events: kopf posts them."""
    import kopf

    async def milestones(event: Any, body: Any, **_: Any) -> None:
        if event.get("type") == "DELETED":
            return  # its record goes with the run (Reconciler.forget)
        for reason, message in milestones_of(records, body, checkpoint_every, time.monotonic()):
            kopf.event(dict(body), type="Normal", reason=reason, message=message[:1000])

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="progress-milestones")(milestones)
