"""Milestone events (``Evaluated``, ``Checkpointed``) from the run's watch, both targets:
docs/controller.md, "Progress reporting in detail".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.api import GROUP, PLURAL, VERSION
from megdet.controller.tokenauth import TokenBucket

__all__ = [
    "EVENTS_PER_HOUR",
    "EVENT_BURST",
    "Milestones",
    "milestones_of",
    "register",
]

#: Per-run event budget: a bucket of EVENT_BURST tokens refilled at EVENTS_PER_HOUR.
EVENT_BURST = 3
EVENTS_PER_HOUR = 6


@dataclass
class Milestones:
    """What a run's watch saw of its progress, and which new progress deserves an event: each
    new evaluation and every ``checkpoint_every``-th new checkpoint, within a per-run
    :class:`TokenBucket`. Thread-safe."""

    checkpoint_every: int = 5
    #: The run's uid ("": not known): a run created again under the name starts anew.
    uid: str = ""
    eval_iteration: int | None = None
    checkpoint_iteration: int | None = None
    checkpoints: int = 0
    bucket: TokenBucket = field(
        default_factory=lambda: TokenBucket(EVENT_BURST, EVENTS_PER_HOUR, EVENT_BURST)
    )
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
        """The events that the progress ``p`` calls for, noted as seen."""
        with self._lock:
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
    """The events a run's watch event calls for, from its :class:`Milestones` in ``records``
    (:class:`~megdet.controller.run_record.RunRecords`)."""
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
    """A kopf event handler on ``registry`` that posts each run's milestone events."""
    import kopf

    async def milestones(event: Any, body: Any, **_: Any) -> None:
        if event.get("type") == "DELETED":
            return  # its record goes with the run (Reconciler.forget)
        for reason, message in milestones_of(records, body, checkpoint_every, time.monotonic()):
            kopf.event(dict(body), type="Normal", reason=reason, message=message[:1000])

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="progress-milestones")(milestones)
