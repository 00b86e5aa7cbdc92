"""Hand the heap a burst of runs freed back to the operating system (:class:`HeapTrimmer`).

When it trims, what a trim can give back and why the image runs on jemalloc:
docs/capacity.md, "What a run costs" (the heap trimmer); measured in docs/benchmarks.md, "Does
the memory come back?" and "The controller on jemalloc".
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HeapTrimmer", "TrimStats", "find_trim", "rss_bytes"]

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def find_trim() -> tuple[str, Callable[[], object]] | None:
    """This process's C allocator and its call that gives free pages back to the OS:
    ``("jemalloc", purge)`` where jemalloc is the process's malloc (the controller image
    preloads it), ``("glibc", malloc_trim(0))`` on glibc's, None where the C library has
    neither (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    mallctl = getattr(libc, "mallctl", None)
    if mallctl is not None:
        void = ctypes.c_void_p
        mallctl.argtypes = [ctypes.c_char_p, void, void, void, ctypes.c_size_t]
        mallctl.restype = ctypes.c_int
        # "arena.<i>.purge" with i = MALLCTL_ARENAS_ALL (4096): every arena, and before that the
        # calling thread's cache goes back to its arena.
        return "jemalloc", lambda: (
            mallctl(b"thread.tcache.flush", None, None, None, 0),
            mallctl(b"arena.4096.purge", None, None, None, 0),
        )
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return "glibc", lambda: trim(0)


@dataclass
class TrimStats:
    """What the trimmer did: trims (idle / while busy), bytes of RSS they returned, seconds."""

    idle: int = 0
    busy: int = 0
    settle: int = 0
    released_bytes: int = 0
    seconds: float = 0.0


class HeapTrimmer:
    """Trim the C heap when a burst is over, and while one grows it (docs/capacity.md).

    ``trim``, ``rss``, ``cpu`` and ``clock`` are seams for the tests (default: the process's
    allocator's trim, :func:`find_trim`; :func:`rss_bytes`, ``time.process_time``,
    ``time.monotonic``).
    """

    def __init__(
        self,
        interval: float = 2.0,
        *,
        idle_cpu: float = 0.2,
        min_work_s: float = 2.0,
        growth_mib: float = 64.0,
        min_gap_s: float = 30.0,
        settle_s: float = 20.0,
        trim: Callable[[], object] | None = None,
        rss: Callable[[], int] = rss_bytes,
        cpu: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval={interval}: must be > 0 seconds")
        self.interval = interval
        self.idle_cpu = idle_cpu
        self.min_work_s = min_work_s
        self.growth = int(growth_mib * 2**20)
        self.min_gap_s = min_gap_s
        self.settle_s = settle_s
        self._settle_at: float | None = None
        found = ("given", trim) if trim is not None else find_trim()
        #: the allocator it trims: "jemalloc", "glibc" ("given": the tests'; "": none)
        self.allocator = found[0] if found else ""
        self._trim = found[1] if found else None
        self._rss, self._cpu, self._clock = rss, cpu, clock
        self.stats = TrimStats()
        now, used = clock(), cpu()
        self._last_check, self._last_cpu = now, used
        self._trimmed_at, self._cpu_at_trim, self._rss_after = now - min_gap_s, used, rss()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Whether this process's allocator can trim (jemalloc, glibc)."""
        return self._trim is not None

    def check(self) -> str | None:
        """One look at the process: trim if it is due. Returns ``"idle"``, ``"settle"`` or
        ``"busy"`` for the trim it made, None for none."""
        now, used = self._clock(), self._cpu()
        elapsed = now - self._last_check
        load = (used - self._last_cpu) / elapsed if elapsed > 0 else 1.0
        self._last_check, self._last_cpu = now, used
        if self._trim is None:
            return None
        if load < self.idle_cpu and used - self._cpu_at_trim >= self.min_work_s:
            gc.collect()
            self._do_trim(now, "idle")
            self._settle_at = now + self.settle_s if self.settle_s > 0 else None
            return "idle"
        if self._settle_at is not None and now >= self._settle_at and load < self.idle_cpu:
            self._settle_at = None
            gc.collect()
            self._do_trim(now, "settle")
            return "settle"
        if now - self._trimmed_at >= self.min_gap_s and self._rss() - self._rss_after >= (
            self.growth
        ):
            self._do_trim(now, "busy")
            return "busy"
        return None

    def _do_trim(self, now: float, kind: str) -> None:
        before = self._rss()
        started = time.perf_counter()
        self._trim()  # type: ignore[misc]
        self.stats.seconds += time.perf_counter() - started
        after = self._rss()
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self.stats.released_bytes += max(0, before - after)
        self._trimmed_at, self._cpu_at_trim, self._rss_after = now, self._cpu(), after
        logger.debug("heap trim (%s): RSS %d -> %d MiB", kind, before >> 20, after >> 20)

    def start(self) -> HeapTrimmer:
        """Check every ``interval`` seconds in a daemon thread (a no-op without a trim)."""
        if self._trim is None or self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._loop, name="heap-trim", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # never take the controller down for a trim
                logger.exception("heap trim failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 1)
            self._thread = None
