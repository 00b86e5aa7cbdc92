"""Progress reports -> ``status.progress`` writes and milestone events, never blocking.

A report only replaces the run's latest progress in memory (:class:`ProgressHub`; the first
report of a run after a start also reads the run once, to answer 404 for an unknown run and to
know what was written before). A flusher thread writes ``status.progress`` (a merge patch of
the status subresource, only that key) at most once per run every ``interval`` seconds, and
only when it changed: 1,000 reporting runs cost 1000/interval writes a second
(docs/operations.md, "Progress reporting").

The run's fabric, when a report carries it, sets the run's ``FabricDegraded`` condition
(``write_fabric``: :func:`megdet.controller.fabric_condition.condition_writer`) when it
changes, not on every report.

Events: a Normal ``Evaluated`` event for each new evaluation (AP, AP50, iteration) and a Normal
``Checkpointed`` event every K-th checkpoint (:class:`Milestones`), through a per-run token
bucket (at most :data:`EVENT_BURST` at once, :data:`EVENTS_PER_HOUR` an hour). The TrainJob
mirror (:mod:`megdet.controller.reconciler`) uses the same :class:`Milestones`.

Bounded: values outside their ranges are refused before they are kept (:func:`out_of_range`);
at most ``max_runs`` runs are held (:class:`HubFull` beyond); a run is forgotten when it is
deleted (:func:`register_forget`: a kopf handler for the run's DELETED event), and a run not
reported for ``idle_forget`` seconds is forgotten too (its next report reads it again). A
status write the API server refuses (400, 422) is dropped and counted, never retried
(``megdet_controller_progress_writes_total{result}``).
"""

from __future__ import annotations

import datetime
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller import metrics
from megdet.controller.api import GROUP, KIND, PLURAL, RUN_API_VERSION, VERSION
from megdet.fabric_report import FabricReport

__all__ = [
    "EVENTS_PER_HOUR",
    "EVENT_BURST",
    "MAX_INT64",
    "RANGES",
    "WRITE_RESULTS",
    "HubFull",
    "InvalidProgress",
    "Milestones",
    "ProgressHub",
    "TokenBucket",
    "UnknownRun",
    "kubernetes_event_poster",
    "out_of_range",
    "register_forget",
]

logger = logging.getLogger(__name__)

#: Per-run event budget: a bucket of EVENT_BURST tokens refilled at EVENTS_PER_HOUR.
EVENT_BURST = 3
EVENTS_PER_HOUR = 6

MAX_INT64 = 2**63 - 1
#: ``status.progress`` field -> (kind, lowest, highest) it may hold: what the CRD's schema
#: (``format: int64``, ``percent`` 0-100) and the field's meaning allow. AP is in percent.
RANGES: dict[str, tuple[type, float, float]] = {
    "iteration": (int, 0, MAX_INT64),
    "maxIter": (int, 0, MAX_INT64),
    "imagesSeen": (int, 0, MAX_INT64),
    "plannedImages": (int, 0, MAX_INT64),
    "evalIteration": (int, 0, MAX_INT64),
    "checkpointIteration": (int, 0, MAX_INT64),
    "etaSeconds": (int, 0, MAX_INT64),
    "percent": (int, 0, 100),
    "imagesPerSecond": (float, 0, float("inf")),
    "ap": (float, 0, 100),
    "ap50": (float, 0, 100),
}
#: Values of the ``result`` label of ``megdet_controller_progress_writes_total``.
WRITE_RESULTS = ("written", "refused", "error", "gone")


def out_of_range(progress: Mapping[str, Any]) -> list[str]:
    """What in a ``status.progress`` dict is outside its :data:`RANGES`, one message per
    field, naming it and the range ([] when all is well)."""
    problems = []
    for key, (kind, low, high) in RANGES.items():
        if key not in progress:
            continue
        value = progress[key]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            allowed = f"an integer {low}..{high}"
        else:
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and low <= value <= high
            )
            allowed = (
                f"a finite number {low:g}..{high:g}"
                if high != float("inf")
                else (f"a finite number >= {low:g}")
            )
        if not ok:
            text = repr(value)
            text = text if len(text) <= 40 else text[:37] + "..."
            problems.append(f"{key}: {text} is not {allowed}")
    return problems


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
    reported: float = 0.0
    #: The run's fabric as last reported, as last written to its condition, and when the
    #: write was last tried (controller/fabric_condition.py).
    fabric: FabricReport | None = None
    fabric_written: FabricReport | None = None
    fabric_tried: float | None = None


class UnknownRun(Exception):
    """The run does not exist (404), is being deleted, or is not served here (target
    trainjob)."""


class HubFull(Exception):
    """The hub holds ``max_runs`` runs already (503: the reporter retries later)."""


class InvalidProgress(ValueError):
    """A value outside its range (:func:`out_of_range`); the message names them."""


#: (namespace, name) -> the run object, or None.
GetRunFn = Callable[[str, str], Mapping[str, Any] | None]
#: (namespace, name, status patch) -> None; raises ApiException-like (``.status``) errors.
PatchStatusFn = Callable[[str, str, Mapping[str, Any]], Any]
#: (namespace, name, uid, reason, message) -> None.
PostEventFn = Callable[[str, str, str, str, str], Any]
#: (namespace, name, the run's fabric) -> whether the run's condition holds it now.
WriteFabricFn = Callable[[str, str, FabricReport], bool]


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
        max_runs: int = 10_000,
        idle_forget: float = 3600.0,
        write_fabric: WriteFabricFn | None = None,
    ) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs}")
        if idle_forget <= 0:
            raise ValueError(f"idle_forget must be > 0, got {idle_forget}")
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
        self.max_runs = max_runs
        self.idle_forget = idle_forget
        self.write_fabric = write_fabric
        self.runs: dict[tuple[str, str], _Run] = {}
        self.lock = threading.Lock()
        self.writes = 0
        # Bumped by every forget: a report that read its run before a forget reads it again.
        self._forgets = 0

    def report(
        self,
        namespace: str,
        name: str,
        progress: Mapping[str, Any],
        fabric: FabricReport | None = None,
    ) -> None:
        """Remember ``progress`` (a ``status.progress`` dict) and ``fabric`` (when the report
        has one) as the run's latest. Raises
        :class:`UnknownRun` for a run that does not exist, is being deleted or is not ``target:
        pytorchjob``, :class:`InvalidProgress` for a value out of its range, :class:`HubFull`
        when ``max_runs`` other runs are held."""
        outside = out_of_range(progress)
        if outside:
            raise InvalidProgress("; ".join(outside))
        key = (namespace, name)
        for _attempt in range(3):
            with self.lock:
                run = self.runs.get(key)
                forgets = self._forgets
            if run is None:
                with self.lock:
                    full = len(self.runs) >= self.max_runs
                if full:
                    raise HubFull(f"progress of {self.max_runs} runs held already; retry later")
                run = self._load(namespace, name)
            with self.lock:
                if key not in self.runs and self._forgets != forgets:
                    continue  # forgotten while it was read: perhaps deleted; read it again
                if key not in self.runs and len(self.runs) >= self.max_runs:
                    raise HubFull(f"progress of {self.max_runs} runs held already; retry later")
                run = self.runs.setdefault(key, run)
                merged = {**(run.latest or run.written), **progress}
                run.latest = merged
                run.fabric = fabric or run.fabric
                run.reported = self.clock()
                self._note_events(run, merged)
                return
        raise UnknownRun(f"MegDetRun {namespace}/{name} is being deleted")

    def _load(self, namespace: str, name: str) -> _Run:
        body = self.get_run(namespace, name)
        if body is None:
            raise UnknownRun(f"MegDetRun {namespace}/{name} not found")
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            raise UnknownRun(f"MegDetRun {namespace}/{name} is being deleted")
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
                # A new stage (megdet.progress.STAGES: an evaluation starting) goes out at once.
                same = run.latest.get("stage") == run.written.get("stage")
                if same and run.last_write is not None and now - run.last_write < self.interval:
                    continue
                patch: dict[str, Any] = dict(run.latest)
                for gone in set(run.written) - set(run.latest):
                    patch[gone] = None  # a merge patch deletes a key with null
                out.append((namespace, name, patch))
        return out

    def flush(self) -> int:
        """Write every due run's progress and post queued events; returns the writes made.

        A write the API server refuses (400, 422: the value can never be stored) is dropped
        and counted, never retried; the next report starts again from what was written. A
        404 forgets the run; any other failure is tried again after a full interval."""
        done = 0
        for namespace, name, patch in self.due():
            try:
                self.patch_status(namespace, name, {"progress": patch})
            except Exception as err:
                code = getattr(err, "status", None)
                if code == 404:
                    metrics.PROGRESS_WRITES.labels("gone").inc()
                    self.forget(namespace, name)
                    continue
                refused = code in (400, 422)
                metrics.PROGRESS_WRITES.labels("refused" if refused else "error").inc()
                logger.warning(
                    "progress: status write of %s/%s %s: %s",
                    namespace,
                    name,
                    "refused, dropped" if refused else "failed",
                    str(err)[:500],
                )
                with self.lock:  # try again after a full interval, not in a tight loop
                    run = self.runs.get((namespace, name))
                    if run is not None:
                        run.last_write = self.clock()
                        if refused:
                            run.latest = None  # never written again
                continue
            done += 1
            metrics.PROGRESS_WRITES.labels("written").inc()
            with self.lock:
                self.writes += 1
                run = self.runs.get((namespace, name))
                if run is not None:
                    run.written = {k: v for k, v in patch.items() if v is not None}
                    run.last_write = self.clock()
        self._write_fabrics()
        with self.lock:
            pending = [
                (ns, name, run.uid, events)
                for (ns, name), run in self.runs.items()
                for events in [run.events]
                if events
            ]
            for run in self.runs.values():
                run.events = []
            now = self.clock()
            idle = [
                key
                for key, run in self.runs.items()
                if now - run.reported > self.idle_forget
                and (run.latest is None or run.latest == run.written)
                and run.fabric == run.fabric_written
            ]
            for key in idle:
                del self.runs[key]
        for namespace, name, uid, events in pending:
            for reason, message in events:
                try:
                    self.post_event(namespace, name, uid, reason, message)
                except Exception as err:
                    logger.warning("progress: event %s for %s/%s: %s", reason, namespace, name, err)
        return done

    def _write_fabrics(self) -> None:
        """Set ``FabricDegraded`` on each run whose reported fabric changed (a failed write is
        tried again after a full interval)."""
        if self.write_fabric is None:
            return
        now = self.clock()
        with self.lock:
            due = [
                (key, run.fabric)
                for key, run in self.runs.items()
                if run.fabric is not None
                and run.fabric != run.fabric_written
                and (run.fabric_tried is None or now - run.fabric_tried >= self.interval)
            ]
        for (namespace, name), fabric in due:
            try:
                done = self.write_fabric(namespace, name, fabric)
            except Exception as err:
                logger.warning("progress: fabric condition of %s/%s: %s", namespace, name, err)
                done = False
            with self.lock:
                run = self.runs.get((namespace, name))
                if run is not None:
                    run.fabric_tried = now
                    if done:
                        run.fabric_written = fabric

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything held for the run (it was deleted): a run re-created under the same
        name starts clean, with its own uid, progress and milestones."""
        with self.lock:
            self.runs.pop((namespace, name), None)
            self._forgets += 1


def register_forget(registry: Any, hub: ProgressHub) -> None:
    """A kopf handler on ``registry`` that forgets a run in ``hub`` when it is deleted (its
    watch's DELETED event). An event handler: no finalizer of
    its own, no annotation written, and async, so it costs no thread per event."""
    import kopf

    async def forget(event: Mapping[str, Any], name: str, namespace: str, **_: Any) -> None:
        if event.get("type") == "DELETED":
            hub.forget(namespace, name)

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="progress-forget")(forget)


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
