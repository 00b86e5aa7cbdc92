"""What the controller process reads of itself: its memory by kind, tracemalloc's growth by file,
the objects it still holds, and a sampling profiler of its threads."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.reconcile import ROOT


def rss_after_delete(pid: int, offsets: Sequence[float]) -> dict[str, float]:
    """The controller's RSS (MiB) ``offsets`` seconds after the deletion's quiet point (the
    later points show what an idle controller gives back: aiohttp closes an idle pooled
    connection after 15 s, its TLS buffers with it)."""
    start = time.perf_counter()
    found: dict[str, float] = {}
    for offset in sorted(offsets):
        time.sleep(max(0.0, start + offset - time.perf_counter()))
        found[f"{offset:g}"] = memory_kib("VmRSS", pid) / 1024
    return found


def memory_kib(field: str, pid: int | str = "self") -> int:
    """A memory figure (KiB) of /proc/<pid>/status: VmRSS, VmHWM (the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


#: How ``rss_by_mapping`` names the kinds of memory in /proc/<pid>/smaps.
MAPPING_KINDS = (
    "Go heap (Helm's engine, in process)",
    "brk heap (glibc's main arena)",
    "anonymous mmap (pymalloc's or jemalloc's arenas, glibc's other arenas, stacks)",
    "files (libraries, mapped data)",
)


def rss_by_mapping(pid: int | str = "self") -> dict[str, float]:
    """The process's resident memory (MiB) by kind of mapping, from /proc/<pid>/smaps. The Go
    runtime inside Helm's shared library reserves its heap at a hint of its own, below the
    executable (seen here: 0x84e59400000), where the kernel's mmap and brk put nothing else:
    anonymous mappings below the executable are counted as Go's heap (so is mimalloc's heap,
    under ``--preload mimalloc``: it reserves its segments there too)."""
    found = dict.fromkeys(MAPPING_KINDS, 0.0)
    rows: list[tuple[int, str, float]] = []
    start, path = 0, ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        first = line.split(maxsplit=5)
        if "-" in first[0] and not first[0].endswith(":"):
            start = int(first[0].split("-")[0], 16)
            path = first[5] if len(first) > 5 else ""
        elif first[0] == "Rss:":
            rows.append((start, path, int(first[1]) / 1024))
    executable = min((s for s, p, _ in rows if p.startswith("/") or p == "[heap]"), default=0)
    for start, path, mib in rows:
        if path == "[heap]":
            found[MAPPING_KINDS[1]] += mib
        elif path.startswith("/"):
            found[MAPPING_KINDS[3]] += mib
        elif not path and start < executable:
            found[MAPPING_KINDS[0]] += mib
        else:
            found[MAPPING_KINDS[2]] += mib
    return found


def top_growth(after: Any, before: Any, limit: int = 12) -> list[dict[str, Any]]:
    """The source files whose traced memory grew most from ``before`` to ``after``."""
    stats = after.compare_to(before, "filename")
    return [
        {
            "file": short_path(stat.traceback[0].filename),
            "kib": stat.size_diff / 1024,
            "blocks": stat.count_diff,
        }
        for stat in stats[:limit]
    ]


def short_path(filename: str) -> str:
    for marker in ("site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.relpath(filename, ROOT) if filename.startswith(str(ROOT)) else filename


class Sampler:
    """A sampling profiler for every thread of the process (``--sample``): every ``period``
    seconds, each thread's stack from ``sys._current_frames()``; reported as the functions
    most often on top of a stack (own time) and anywhere in it (inclusive), by file:function.
    Threads that only wait (the asyncio selector, condition waits, idle pool workers) are left
    out, so the shares are of the time a thread was running Python."""

    WAITING = ("select", "wait", "_worker", "poll", "sleep", "_wait_for_tstate_lock", "acquire")

    def __init__(self, period: float = 0.005) -> None:
        import collections

        self.period = period
        self.own: collections.Counter[str] = collections.Counter()
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.period):
            for ident, frame in sys._current_frames().items():
                if ident == me or frame.f_code.co_name in self.WAITING:
                    continue
                self.samples += 1
                seen = set()
                top = True
                while frame is not None:
                    code = frame.f_code
                    key = f"{short_path(code.co_filename)}:{code.co_name}"
                    if top:
                        self.own[key] += 1
                        top = False
                    if key not in seen:
                        self.inclusive[key] += 1
                        seen.add(key)
                    frame = frame.f_back

    def report(self, limit: int = 25) -> dict[str, Any]:
        total = self.samples or 1
        return {
            "samples": self.samples,
            "own": [(k, n / total) for k, n in self.own.most_common(limit)],
            "inclusive": [(k, n / total) for k, n in self.inclusive.most_common(limit * 2)],
        }


def held_bodies() -> dict[str, int]:
    """Kubernetes objects (as decoded dicts) of the kinds the controller serves or owns that are
    still alive in this process, by kind: after every run is deleted, what should be none."""
    import collections
    import gc

    gc.collect()
    groups = ("megdet.io/", "kubeflow.org/", "trainer.kubeflow.org/", "networking.k8s.io/")
    held: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        if (
            isinstance(obj, dict)
            and str(obj.get("apiVersion", "")).startswith(groups)
            and isinstance(obj.get("metadata"), dict)
        ):
            held[str(obj.get("kind"))] += 1
    return dict(held)
