"""Progress reports -> ``status.progress`` writes, coalesced per run, never blocking: why, and the
bounds, docs/controller.md, "Progress reporting in detail".
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.progress_binding import RunRef
from megdet.fabric_report import FabricReport

__all__ = [
    "ATTEMPTS",
    "MAX_INT64",
    "RANGES",
    "WRITE_RESULTS",
    "HubFull",
    "InvalidProgress",
    "ProgressHub",
    "UnknownRun",
    "out_of_range",
]

logger = logging.getLogger(__name__)

#: Tries of one conditional write (each after a 409 reads the run again).
ATTEMPTS = 3

MAX_INT64 = 2**63 - 1
INF = float("inf")
#: ``status.progress`` field -> (kind, lowest, highest) that the CRD's schema, the protocol and
#: the field's meaning allow (AP in percent).
RANGES: dict[str, tuple[type, float, float]] = {
    "iteration": (int, 0, MAX_INT64),
    "maxIter": (int, 0, MAX_INT64),
    "imagesSeen": (int, 0, MAX_INT64),
    "plannedImages": (int, 0, MAX_INT64),
    "evalIteration": (int, 0, MAX_INT64),
    "checkpointIteration": (int, 0, MAX_INT64),
    "etaSeconds": (int, 0, MAX_INT64),
    "percent": (int, 0, 100),
    "imagesPerSecond": (float, 0, INF),
    "ap": (float, 0, 100),
    "ap50": (float, 0, 100),
    # The final report's run totals (megdet.progress.REPORT_METRICS), as the trainer sends them.
    **{
        name: (int, 0, protocol.MAX_INT32) if name in protocol.INT_METRICS else (float, 0, INF)
        for name in protocol.REPORT_METRICS
    },
}
#: Values of the ``result`` label of ``megdet_controller_progress_writes_total``.
#: ``superseded``: the run held this report or a newer one already (another replica's write).
WRITE_RESULTS = ("written", "superseded", "refused", "error", "gone")


def out_of_range(progress: Mapping[str, Any]) -> list[str]:
    """One message per field of ``progress`` outside its :data:`RANGES`, naming the range."""
    problems = []
    for key, (kind, low, high) in RANGES.items():
        if key not in progress:
            continue
        value = progress[key]
        ok = isinstance(value, kind if kind is int else int | float) and not isinstance(value, bool)
        if ok and low <= value <= high and math.isfinite(value):
            continue
        text = repr(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        if kind is int:
            problems.append(f"{key}: {text} is not an integer {low}..{high}")
        else:
            bound = f"{low:g}..{high:g}" if high != INF else f">= {low:g}"
            problems.append(f"{key}: {text} is not a finite number {bound}")
    return problems


def _time(progress: Mapping[str, Any] | None) -> Any:
    return protocol.parse_time((progress or {}).get("updatedTime"))


def older(progress: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """Whether ``progress`` was reported before ``than`` (by ``updatedTime``; none is oldest)."""
    mine, theirs = _time(progress), _time(than)
    return theirs is not None and (mine is None or mine < theirs)


@dataclass
class _Run:
    latest: dict[str, Any] | None = None
    #: What the run holds of ``latest`` (written by this replica, or found there or newer).
    written: dict[str, Any] | None = None
    last_write: float | None = None
    reported: float = 0.0
    #: The run's fabric as last reported, as last written to its condition, and when the
    #: write was last tried (controller/fabric_condition.py).
    fabric: FabricReport | None = None
    fabric_written: FabricReport | None = None
    fabric_tried: float | None = None


class UnknownRun(Exception):
    """The run does not exist, is being deleted, or is not served here (404)."""


class HubFull(Exception):
    """The hub holds ``max_runs`` runs already (503: the reporter retries later)."""


class InvalidProgress(ValueError):
    """A value outside its range (:func:`out_of_range`); the message names them."""


#: (namespace, name) -> the run as the watch saw it (``view``) or as read now (``read``).
RunFn = Callable[[str, str], RunRef | None]
#: (namespace, name, status patch, resourceVersion) -> None; raises ApiException-like
#: (``.status``) errors.
PatchStatusFn = Callable[[str, str, Mapping[str, Any], str | None], Any]
#: (namespace, name, the run's fabric) -> whether the run's condition holds it now.
WriteFabricFn = Callable[[str, str, FabricReport], bool]


@dataclass(eq=False)
class ProgressHub:
    """The latest progress per run, and the rate-limited, conditional ``status.progress`` writer."""

    view: RunFn
    read: RunFn
    patch_status: PatchStatusFn
    _: KW_ONLY
    interval: float = 30.0
    clock: Callable[[], float] = time.monotonic
    max_runs: int = 10_000
    idle_forget: float = 3600.0
    write_fabric: WriteFabricFn | None = None
    runs: dict[tuple[str, str], _Run] = field(init=False, default_factory=dict)
    lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)
    writes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {self.max_runs}")
        if not self.idle_forget > 0 or not self.interval > 0:
            raise ValueError(
                f"idle_forget and interval must be > 0, got {self.idle_forget}, {self.interval}"
            )

    def report(
        self,
        namespace: str,
        name: str,
        progress: Mapping[str, Any],
        fabric: FabricReport | None = None,
    ) -> None:
        """Keep ``progress`` and ``fabric`` as the run's latest unless a newer report is held.
        Raises :class:`InvalidProgress`, :class:`UnknownRun` or :class:`HubFull`."""
        outside = out_of_range(progress)
        if outside:
            raise InvalidProgress("; ".join(outside))
        known = self.view(namespace, name)
        if known is None or known.deleting:
            raise UnknownRun(f"MegDetRun {namespace}/{name} not found (or being deleted)")
        key = (namespace, name)
        with self.lock:
            run = self.runs.get(key)
            if run is None:
                if len(self.runs) >= self.max_runs:
                    raise HubFull(f"progress of {self.max_runs} runs held already; retry later")
                run = self.runs[key] = _Run()
            if run.latest is None or not older(progress, run.latest):
                run.latest = {**(run.latest or {}), **progress}
            run.fabric = fabric or run.fabric
            run.reported = self.clock()

    def due(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The (namespace, name, progress) that may be written now."""
        now = self.clock()
        out = []
        with self.lock:
            for (namespace, name), run in self.runs.items():
                if run.latest is None or run.latest == run.written:
                    continue
                # A new stage (megdet.progress.STAGES: an evaluation starting) goes out at once.
                same = run.latest.get("stage") == (run.written or {}).get("stage")
                if same and run.last_write is not None and now - run.last_write < self.interval:
                    continue
                out.append((namespace, name, dict(run.latest)))
        return out

    def _write(self, namespace: str, name: str, progress: dict[str, Any]) -> str:
        """Write ``progress`` unless the run holds it or a newer report: a :data:`WRITE_RESULTS`."""
        run = self.view(namespace, name)
        for _attempt in range(ATTEMPTS):
            if run is None:
                return "gone"
            if older(progress, run.progress) or {**run.progress, **progress} == run.progress:
                return "superseded"
            try:
                self.patch_status(namespace, name, {"progress": progress}, run.version or None)
                return "written"
            except Exception as err:
                if getattr(err, "status", None) != 409:
                    raise
            run = self.read(namespace, name)  # written since the view: compare with that
        return "error"

    def flush(self) -> int:
        """Write every due run's progress; returns the writes made."""
        done = 0
        for namespace, name, progress in self.due():
            try:
                result = self._write(namespace, name, progress)
            except Exception as err:
                code = getattr(err, "status", None)
                result = "gone" if code == 404 else "refused" if code in (400, 422) else "error"
                if result != "gone":
                    logger.warning("progress: status write of %s/%s %s: %s", namespace, name,
                                   "refused, dropped" if result == "refused" else "failed",
                                   str(err)[:500])  # fmt: skip
            metrics.PROGRESS_WRITES.labels(result).inc()
            if result == "gone":
                self.forget(namespace, name)
                continue
            with self.lock:
                run = self.runs.get((namespace, name))
                if run is None:
                    continue
                run.last_write = self.clock()  # an error: tried again after a full interval
                if result == "refused":  # never sent again, nor merged into the next report
                    run.latest = run.written = None
                elif result != "error":
                    run.written = progress  # written, or the run holds it or a newer one
                if result == "written":
                    done += 1
                    self.writes += 1
        self._write_fabrics()
        now = self.clock()
        with self.lock:
            for key in [
                key
                for key, run in self.runs.items()
                if now - run.reported > self.idle_forget
                and run.latest == run.written
                and run.fabric == run.fabric_written
            ]:
                del self.runs[key]
        return done

    def _write_fabrics(self) -> None:
        """Set ``FabricDegraded`` on each run whose reported fabric changed."""
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
        """Drop everything held for the run (deleted: one created again starts clean)."""
        with self.lock:
            self.runs.pop((namespace, name), None)
