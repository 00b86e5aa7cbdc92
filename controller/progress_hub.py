"""Progress reports -> ``status.progress`` writes and milestone events, never blocking.

A report only replaces the run's latest progress in memory (:class:`ProgressHub`; the first
report of a run after a start also reads the run once, to answer 404 for an unknown run and to
know what was written before). A flusher thread writes ``status.progress`` (a merge patch of
the status subresource, only that key) at most once per run every ``interval`` seconds, and
only when it changed: 1,000 reporting runs cost 1000/interval writes a second
(docs/operations.md, "Progress reporting").

Events: a Normal ``Evaluated`` event for each new evaluation (AP, AP50, iteration) and a Normal
``Checkpointed`` event every K-th checkpoint (:class:`Milestones`), through a per-run token
bucket (at most :data:`EVENT_BURST` at once, :data:`EVENTS_PER_HOUR` an hour). The TrainJob
mirror (:mod:`megdet.controller.reconciler`) uses the same :class:`Milestones`.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.api import KIND, RUN_API_VERSION

__all__ = [
    "EVENTS_PER_HOUR",
    "EVENT_BURST",
    "Milestones",
    "ProgressHub",
    "TokenBucket",
    "UnknownRun",
    "kubernetes_event_poster",
]

logger = logging.getLogger(__name__)

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
    """Which reports deserve an event: each new evaluation (``Evaluated``, with AP and AP50)
    and every ``checkpoint_every``-th new checkpoint (``Checkpointed``), through a per-run
    :class:`TokenBucket`. One per run, for both targets (the TrainJob mirror uses it too)."""

    checkpoint_every: int = 5
    eval_iteration: int | None = None
    checkpoint_iteration: int | None = None
    checkpoints: int = 0
    bucket: TokenBucket = field(default_factory=TokenBucket)

    @classmethod
    def from_written(cls, written: Mapping[str, Any], checkpoint_every: int) -> Milestones:
        """Continue from a written ``status.progress`` (a restarted controller repeats none)."""
        return cls(
            checkpoint_every=checkpoint_every,
            eval_iteration=written.get("evalIteration"),
            checkpoint_iteration=written.get("checkpointIteration"),
        )

    def note(self, p: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
        events = []
        ev = p.get("evalIteration")
        if isinstance(ev, int) and (self.eval_iteration is None or ev > self.eval_iteration):
            self.eval_iteration = ev
            if p.get("ap") is not None and self.bucket.take(now):
                events.append(
                    (
                        "Evaluated",
                        f"evaluated at iteration {ev}: AP {_num(p.get('ap'))}, "
                        f"AP50 {_num(p.get('ap50'))}",
                    )
                )
        ck = p.get("checkpointIteration")
        if isinstance(ck, int) and (
            self.checkpoint_iteration is None or ck > self.checkpoint_iteration
        ):
            self.checkpoint_iteration = ck
            self.checkpoints += 1
            if self.checkpoints % self.checkpoint_every == 0 and self.bucket.take(now):
                when = p.get("checkpointTime")
                events.append(
                    (
                        "Checkpointed",
                        f"checkpoint at iteration {ck}" + (f" ({when})" if when else ""),
                    )
                )
        return events


@dataclass
class _Run:
    uid: str
    milestones: Milestones
    latest: dict[str, Any] | None = None
    written: dict[str, Any] = field(default_factory=dict)
    last_write: float | None = None
    events: list[tuple[str, str]] = field(default_factory=list)


class UnknownRun(Exception):
    """The run does not exist (404), or is not served here (target trainjob)."""


#: (namespace, name) -> the run object, or None.
GetRunFn = Callable[[str, str], Mapping[str, Any] | None]
#: (namespace, name, status patch) -> None; raises ApiException-like (``.status``) errors.
PatchStatusFn = Callable[[str, str, Mapping[str, Any]], Any]
#: (namespace, name, uid, reason, message) -> None.
PostEventFn = Callable[[str, str, str, str, str], Any]


class ProgressHub:
    """The latest progress per run, and the rate-limited writer of ``status.progress``."""

    def __init__(
        self,
        get_run: GetRunFn,
        patch_status: PatchStatusFn,
        post_event: PostEventFn,
        *,
        interval: float = 30.0,
        checkpoint_every: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.get_run = get_run
        self.patch_status = patch_status
        self.post_event = post_event
        self.interval = interval
        self.checkpoint_every = checkpoint_every
        self.clock = clock
        self.runs: dict[tuple[str, str], _Run] = {}
        self.lock = threading.Lock()
        self.writes = 0

    def report(self, namespace: str, name: str, progress: Mapping[str, Any]) -> None:
        """Remember ``progress`` (a ``status.progress`` dict) as the run's latest. Raises
        :class:`UnknownRun` for a run that does not exist or is not ``target: pytorchjob``."""
        key = (namespace, name)
        with self.lock:
            run = self.runs.get(key)
        if run is None:
            run = self._load(namespace, name)
        with self.lock:
            run = self.runs.setdefault(key, run)
            merged = {**(run.latest or run.written), **progress}
            run.latest = merged
            self._note_events(run, merged)

    def _load(self, namespace: str, name: str) -> _Run:
        body = self.get_run(namespace, name)
        if body is None:
            raise UnknownRun(f"MegDetRun {namespace}/{name} not found")
        spec = body.get("spec") or {}
        if spec.get("target") == "trainjob":
            raise UnknownRun(
                f"MegDetRun {namespace}/{name} has target trainjob: its pods report to "
                "Kubeflow Trainer's status server"
            )
        status = body.get("status") or {}
        written = status.get("progress") if isinstance(status.get("progress"), Mapping) else {}
        return _Run(
            uid=str((body.get("metadata") or {}).get("uid") or ""),
            milestones=Milestones.from_written(written, self.checkpoint_every),
            written=dict(written),
        )

    def _note_events(self, run: _Run, p: Mapping[str, Any]) -> None:
        run.events.extend(run.milestones.note(p, self.clock()))

    def due(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The (namespace, name, merge patch of status.progress) that may be written now."""
        now = self.clock()
        out = []
        with self.lock:
            for (namespace, name), run in self.runs.items():
                if run.latest is None or run.latest == run.written:
                    continue
                if run.last_write is not None and now - run.last_write < self.interval:
                    continue
                patch: dict[str, Any] = dict(run.latest)
                for gone in set(run.written) - set(run.latest):
                    patch[gone] = None  # a merge patch deletes a key with null
                out.append((namespace, name, patch))
        return out

    def flush(self) -> int:
        """Write every due run's progress and post queued events; returns the writes made."""
        done = 0
        for namespace, name, patch in self.due():
            try:
                self.patch_status(namespace, name, {"progress": patch})
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    with self.lock:
                        self.runs.pop((namespace, name), None)
                    continue
                logger.warning("progress: status write of %s/%s failed: %s", namespace, name, err)
                with self.lock:  # try again after a full interval, not in a tight loop
                    run = self.runs.get((namespace, name))
                    if run is not None:
                        run.last_write = self.clock()
                continue
            done += 1
            with self.lock:
                self.writes += 1
                run = self.runs.get((namespace, name))
                if run is not None:
                    run.written = {k: v for k, v in patch.items() if v is not None}
                    run.last_write = self.clock()
        with self.lock:
            pending = [
                (ns, name, run.uid, events)
                for (ns, name), run in self.runs.items()
                for events in [run.events]
                if events
            ]
            for run in self.runs.values():
                run.events = []
        for namespace, name, uid, events in pending:
            for reason, message in events:
                try:
                    self.post_event(namespace, name, uid, reason, message)
                except Exception as err:
                    logger.warning("progress: event %s for %s/%s: %s", reason, namespace, name, err)
        return done

    def forget(self, namespace: str, name: str) -> None:
        with self.lock:
            self.runs.pop((namespace, name), None)


def _num(value: Any) -> str:
    return "?" if value is None else f"{float(value):.2f}"


def kubernetes_event_poster(api_client: Any, timeout: float, instance: str) -> PostEventFn:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def post(namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": RUN_API_VERSION,
                "kind": KIND,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Normal",
            "source": {"component": "megdet-controller"},
            "reportingComponent": "megdet-controller",
            "reportingInstance": instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        core.create_namespaced_event(namespace, body, _request_timeout=timeout)

    return post
