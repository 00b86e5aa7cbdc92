"""MegDetRuns through the controller, against kmock and a real API server side by side.

The controller is the real one (kopf + our handlers + the official client + the in-process Helm
render) in its own spawned process, so its memory and CPU are its own. The API it talks to is

- ``kmock``: an in-memory Kubernetes API emulator (with the small extensions in
  tests/controller/kmock_helpers.py: resourceVersions, uids, generateName), served from this
  process; the specs are applied with the CRD's defaults filled in, as a server stores them;
- ``cluster``: a real control plane on this machine (bench/controller_cluster.py: etcd,
  kube-apiserver with RBAC and an audit log, controller-manager, scheduler, kwok fake 8-GPU
  nodes; the PyTorchJob, Trainer v2 and MegDetRun CRDs; the operator chart installed with Helm),
  the controller logged in with a token of the chart's ServiceAccount, the runs POSTed with the
  admin kubeconfig through the official client (the server defaults them);
- ``both`` (the default): kmock, then the cluster, in one invocation, and the ratios.

All runs are applied at once (a burst, the worst case for queueing), or with ``--paced`` one
after another, each once the previous one is reconciled (a reconcile without others competing
for the cores); in a mix of shapes: 8 GPUs, 16 GPUs with InfiniBand, 64 GPUs with gang
scheduling, 16 GPUs as a TrainJob (+ its TrainingRuntime). ``--namespaces K`` spreads the runs
over K namespaces (round robin).

Reported, for each API:
- total: first apply -> the last run's status carries its job (kmock: when the status write
  reaches the emulator; cluster: when the watch of this process delivers it);
- apply phase: first create sent -> last create answered (how fast this process applies; a
  burst is as fast as the API lets it be, so apply -> status compares only with this in view);
- reconcile latency: each create-reconcile handler's own duration (render, look up
  and create the job(s), write status), measured inside the controller; p50/p99/max;
- apply -> status latency per run (queueing included), from the moment the create returned;
- the pure part alone (plan_children: one render + adopt) timed in the controller process
  for the same specs right before the burst;
- controller CPU time (all its threads) from ready to stop, per run; the API side's CPU per
  run over the same span (kmock: this process, which serves kmock and applies the runs;
  cluster: kube-apiserver + etcd, with the other components and this process beside it);
- controller memory: VmRSS when ready (chart loaded), VmHWM (peak) and VmRSS at the end (all
  runs reconciled: what stays, against the peak's backlog of events and handlers in flight);
- cluster only: the controller's API requests per run, by verb and by call, from the API
  server's audit log (its ServiceAccount's requests between the first apply and its stop),
  and the status writes the server refused with 409.

The last status is followed by a 1 s settle before the controller is stopped, so kopf's trailing
writes (its progress annotations) land in the counts.

    .venv/bin/python -m bench.controller_reconcile [--api kmock|cluster|both] [--runs 200]
        [--nodes 4] [--namespaces 1] [--workers N] [--paced] [--json] [--keep-logs DIR]
        [--write-costs N] [--delete] [--tracemalloc]

``--delete``: once every run is reconciled, delete them all (and on kmock, which has no
garbage collector, what they own), wait until each is gone and the controller is quiet, and
read its memory again (does it come back?). ``--tracemalloc``: trace the
controller's allocations and report the files whose memory grew, and the served or owned
objects still alive in it, when reconciled and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing as mp
import os
import platform
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import harness
from bench.controller_runs import SPECS, cluster_body, namespace_of, run_name, served_spec
from megdet.controller.daemon import DEFAULT_WORKER_LIMIT

ROOT = Path(__file__).resolve().parents[1]
#: The controller's goals: reconcile p99, 1,000 runs reconciled within 60 s, controller memory,
#: and 200 runs within 20 s (judged for the 200-run default).
GOALS = {"p99_ms": 100.0, "runs": 1000, "runs_s": 60.0, "rss_mib": 300.0, "total_s": 20.0}
APIS = ("kmock", "cluster")
#: Cluster bursts: threads POSTing the runs (kmock's single loop applies 200 in under 1 s).
APPLY_THREADS = 8
#: Seconds after the last status before the controller is told to stop.
SETTLE_S = 1.0
#: With --delete: after the last run is released, the memory is read once the controller has
#: used under 5 % of a core for this many seconds in a row (the garbage collector's deletions
#: of the jobs still reach it after the runs are gone; the heap trimmer looks every 2 s and
#: trims at its first look below 20 % of a core), or after DELETE_QUIET_TIMEOUT_S.
DELETE_QUIET_S = 6.0
DELETE_QUIET_TIMEOUT_S = 300.0
#: Seconds the controller may take to stop and send its results (tracemalloc's snapshots and
#: their comparison take tens of seconds on a loaded machine).
RESULTS_TIMEOUT_S = 300.0
#: How the controller process runs (``--no-heap-trim``, ``--arena-max``, ``--python-malloc``):
#: the heap trimmer of controller/heap.py as ``megdet controller`` starts it, glibc's
#: ``MALLOC_ARENA_MAX`` (0: glibc's default, 8 per core; the operator chart sets 2) and
#: ``PYTHONMALLOC`` ("": Python's own small-object allocator, pymalloc); ``preload``: a C
#: allocator the child loads first (``LD_PRELOAD``: "jemalloc", "mimalloc"; "": glibc's);
#: ``worker_limit``: the
#: objects of a kind whose events are processed at once once the controller is indexed
#: (``--worker-limit``; ``megdet controller``'s default; 0: no limit, kopf's default);
#: ``idle_timeout``: kopf's ``settings.queueing.idle_timeout`` (0: the controller's, 1 s), how
#: long an object's worker waits for its next event.
#: --preload's allocators: the library the dynamic loader finds by name, and its Debian package
PRELOADS = {"jemalloc": "libjemalloc.so.2", "mimalloc": "libmimalloc.so.2"}
PRELOAD_PACKAGES = {"jemalloc": "libjemalloc2", "mimalloc": "libmimalloc2.0"}


def _preload_present(soname: str) -> bool:
    """Whether the dynamic loader knows ``soname`` (what LD_PRELOAD will ask it for); asks
    ldconfig's cache rather than loading an allocator into this process."""
    import ctypes.util

    return ctypes.util.find_library(soname.removeprefix("lib").split(".so")[0]) == soname


TUNING: dict[str, Any] = {
    "heap_trim": True,
    "worker_limit": DEFAULT_WORKER_LIMIT,
    "idle_timeout": 0.0,
    "arena_max": 0,
    "python_malloc": "",
    "preload": "",
    "job_cache": True,
    "lean_render": True,
    "sample": False,
    "rss_after_delete": (),
}


def _rss_after_delete(pid: int, offsets: Sequence[float]) -> dict[str, float]:
    """The controller's RSS (MiB) ``offsets`` seconds after the deletion's quiet point (the
    later points show what an idle controller gives back: aiohttp closes an idle pooled
    connection after 15 s, its TLS buffers with it)."""
    start = time.perf_counter()
    found: dict[str, float] = {}
    for offset in sorted(offsets):
        time.sleep(max(0.0, start + offset - time.perf_counter()))
        status = Path(f"/proc/{pid}/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        found[f"{offset:g}"] = kib / 1024
    return found


def _kmock_helpers() -> Any:
    # The emulator extensions live with the controller tests; reuse them rather than copy.
    folder = str(ROOT / "tests" / "controller")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import kmock_helpers

    return kmock_helpers


def _memory_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


#: How ``_rss_by_mapping`` names the kinds of memory in /proc/<pid>/smaps.
MAPPING_KINDS = (
    "Go heap (Helm's engine, in process)",
    "brk heap (glibc's main arena)",
    "anonymous mmap (pymalloc's or jemalloc's arenas, glibc's other arenas, stacks)",
    "files (libraries, mapped data)",
)


def _rss_by_mapping(pid: int | str = "self") -> dict[str, float]:
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


def _top_growth(after: Any, before: Any, limit: int = 12) -> list[dict[str, Any]]:
    """The source files whose traced memory grew most from ``before`` to ``after``."""
    stats = after.compare_to(before, "filename")
    return [
        {
            "file": _short_path(stat.traceback[0].filename),
            "kib": stat.size_diff / 1024,
            "blocks": stat.count_diff,
        }
        for stat in stats[:limit]
    ]


def _short_path(filename: str) -> str:
    for marker in ("site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.relpath(filename, ROOT) if filename.startswith(str(ROOT)) else filename


class _Sampler:
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
                    key = f"{_short_path(code.co_filename)}:{code.co_name}"
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


def _held_bodies() -> dict[str, int]:
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


def _controller(
    target: dict[str, str],
    runs: int,
    workers: int | None,
    ready: Any,
    stop: Any,
    conn: Any,
    reconciled: Any,
    recorded: Any,
    trace: bool,
    handled: Any = None,
) -> None:
    """The controller process: warm up, time the pure part, then serve until told to stop.

    ``target``: ``{"api": "kmock", "url": ...}`` or ``{"api": "cluster", "kubeconfig": ...}``.
    ``reconciled`` is set by the benchmark once every run is reconciled (memory at that point;
    with ``--delete`` the runs are deleted after it). ``trace``: tracemalloc from the start, and
    the files whose memory grew most, ready -> reconciled and ready -> end.
    """
    import tracemalloc

    if trace:
        tracemalloc.start(1)
    import kopf
    from kubernetes import client as k8s

    from megdet.controller import metrics
    from megdet.controller.kubeapi import Backoff, Cluster
    from megdet.controller.operator import build_registry, configure, limit_workers
    from megdet.controller.planning import plan_children
    from megdet.controller.reconciler import Reconciler

    trimmer = None
    if target.get("heap_trim", True):
        from megdet.controller.heap import HeapTrimmer

        trimmer = HeapTrimmer().start()  # as `megdet controller` starts it
    if not target.get("lean_render", True):
        from megdet.controller.render import default_renderer

        default_renderer()._unchecked = None  # Helm's schema check and the NOTES, as before
    helpers = _kmock_helpers()
    bodies = [helpers.run_body(f"pure-{i:04d}", served_spec(i)) for i in range(runs)]
    plan_children(bodies[0])  # loads the chart once, as the first real reconcile would
    pure = []
    for body in bodies:
        started = time.perf_counter()
        plan_children(body)
        pure.append(time.perf_counter() - started)
    del bodies, body  # the memory figures are the controller's, not these copies
    from megdet.controller.render import default_renderer

    renderer = default_renderer()
    renders_before, prechecked_before = renderer.renders, renderer.prechecked

    config = k8s.Configuration()
    if target["api"] == "kmock":
        config.host = target["url"]
    else:
        from kubernetes import config as k8s_config

        # kopf's own login reads KUBECONFIG; the official client is given the same file.
        os.environ["KUBECONFIG"] = target["kubeconfig"]
        k8s_config.load_kube_config(config_file=target["kubeconfig"], client_configuration=config)
    api = k8s.ApiClient(config)
    api.user_agent = "megdet-controller"  # as `megdet controller` sets it

    durations: list[float] = []

    def observe(seconds: float) -> None:
        durations.append(seconds)
        if handled is not None:  # the parent's view of the reconciles so far (--restart)
            with handled.get_lock():
                handled.value += 1

    cluster = Cluster(api, timeout=10.0, cache=target.get("job_cache", True))
    reconciler = Reconciler(cluster, Backoff(base=0.05, cap=1.0), observe=observe)
    registry = build_registry(reconciler)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if target["api"] == "kmock":
            return kopf.ConnectionInfo(server=target["url"], insecure=True)
        return kopf.login_with_kubeconfig(**kwargs)

    settings = kopf.OperatorSettings()
    configure(settings, diffbase=reconciler.diffbase, peering=None, fast=True, workers=workers)
    if target.get("worker_limit"):  # as `megdet controller --worker-limit` sets it
        limit_workers(registry, settings, target["worker_limit"])
    if target.get("idle_timeout"):
        settings.queueing.idle_timeout = target["idle_timeout"]
    kopf_ready, kopf_stop = threading.Event(), threading.Event()

    sampler = _Sampler() if target.get("sample") else None

    def relay() -> None:
        kopf_ready.wait()
        if sampler is not None:
            sampler.start()
        if trace:
            snaps["ready"] = tracemalloc.take_snapshot()
        rss["ready"] = _memory_kib("VmRSS")
        kinds["ready"] = _rss_by_mapping()
        cpu[0] = time.process_time()
        ready.set()
        while not stop.is_set():
            if "reconciled" in rss:
                # Recorded: wait for the stop without spinning (a set Event's wait() returns at
                # once; looping on it kept a core busy, so the process never looked idle to
                # the heap trimmer and took the interpreter from the deletions).
                stop.wait(0.5)
                continue
            if reconciled.wait(0.05):
                if sampler is not None:
                    sampler.stop()
                rss["reconciled"] = _memory_kib("VmRSS")
                cpu.append(time.process_time())
                if trace:
                    snaps["reconciled"] = tracemalloc.take_snapshot()
                    held["reconciled"] = _held_bodies()
                recorded.set()
        cpu[1] = time.process_time()
        rss["end"] = _memory_kib("VmRSS")
        kinds["end"] = _rss_by_mapping()
        if trace:
            snaps["end"] = tracemalloc.take_snapshot()
            held["end"] = _held_bodies()
        kopf_stop.set()

    rss: dict[str, int] = {}
    kinds: dict[str, dict[str, float]] = {}
    snaps: dict[str, Any] = {}
    held: dict[str, dict[str, int]] = {}
    cpu = [0.0, 0.0]
    threading.Thread(target=relay, daemon=True).start()
    asyncio.run(
        kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            ready_flag=kopf_ready,
            stop_flag=kopf_stop,
        )
    )
    conn.send(
        {
            "reconcile_s": durations,
            "pure_s": pure,
            "rss_ready_kib": rss["ready"],
            "rss_reconciled_kib": rss.get("reconciled", 0),
            "rss_end_kib": rss["end"],
            "rss_peak_kib": _memory_kib("VmHWM"),
            "rss_by_mapping_mib": kinds,
            # ready -> every run reconciled (or -> stop when that was never marked)
            "cpu_s": (cpu[2] if len(cpu) > 2 else cpu[1]) - cpu[0],
            "cpu_after_reconciled_s": cpu[1] - cpu[2] if len(cpu) > 2 else 0.0,
            "held_bodies": held,
            "job_cache": None
            if cluster.cache is None
            else {
                "hits": cluster.cache.hits,
                "misses": cluster.cache.misses,
                "held": len(cluster.cache),
            },
            "renders": {
                "renders": renderer.renders - renders_before,
                "reused": renderer.reused,
                "prechecked": renderer.prechecked - prechecked_before,
            },
            # status writes' reads of their run: from its watch, from the server, stale views
            "run_reads": {
                source: metrics.sample("megdet_controller_run_reads_total", {"source": source})
                for source in ("watch", "server", "stale")
            },
            # what kopf ran with (--worker-limit, --idle-timeout)
            "queueing": [
                getattr(settings.queueing.worker_limit, "limit", None),
                settings.queueing.idle_timeout,
            ],
            "sampled": sampler.report() if sampler is not None else None,
            "heap_trims": None
            if trimmer is None
            else {
                "idle": trimmer.stats.idle,
                "settle": trimmer.stats.settle,
                "busy": trimmer.stats.busy,
                "released_mib": trimmer.stats.released_bytes / 2**20,
                "seconds": trimmer.stats.seconds,
            },
            "traced": {
                phase: _top_growth(snaps[phase], snaps["ready"])
                for phase in ("reconciled", "end")
                if phase in snaps
            },
        }
    )


class _ControllerProcess:
    """The spawned controller process, polled (so kmock keeps serving from this event loop)."""

    def __init__(
        self, target: dict[str, str], runs: int, workers: int | None, trace: bool = False
    ) -> None:
        ctx = mp.get_context("spawn")
        target = {**target, **TUNING}
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self._reconciled, self._recorded = ctx.Event(), ctx.Event()
        #: reconciles (handler calls) the process has made so far
        self.handled = ctx.Value("q", 0)
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_controller,
            args=(
                target,
                *(runs, workers, self.ready, self.stop, child),
                *(self._reconciled, self._recorded, trace, self.handled),
            ),
            daemon=True,
        )
        # glibc reads MALLOC_ARENA_MAX and Python PYTHONMALLOC when the process starts: the
        # spawned child's environment.
        child_env = {
            "MALLOC_ARENA_MAX": str(TUNING["arena_max"]) if TUNING.get("arena_max") else None,
            "PYTHONMALLOC": TUNING.get("python_malloc") or None,
            "LD_PRELOAD": PRELOADS.get(TUNING.get("preload") or ""),
        }
        saved = {key: os.environ.get(key) for key in child_env}
        for key, value in child_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            self.proc.start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def is_ready(self) -> bool:
        if self.ready.is_set():
            return True
        if not self.proc.is_alive():
            raise RuntimeError("the controller process died during start-up")
        return False

    def mark_reconciled(self, timeout: float = 120) -> None:
        """Every run is reconciled: the controller notes its memory (and tracemalloc snapshot)
        now; returns once it has."""
        self._reconciled.set()
        if not self._recorded.wait(timeout):
            raise RuntimeError("the controller did not record its memory after the runs")

    def results(self) -> dict[str, Any] | None:
        """Ask it to stop; its measurements once it has sent them, else None (poll again)."""
        self.stop.set()
        if self.parent.poll():
            return self.parent.recv()
        if not self.proc.is_alive():
            raise RuntimeError("the controller process sent no results")
        return None

    def close(self) -> None:
        self.stop.set()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


async def _restart(
    target: dict[str, str], runs: int, workers: int | None, timeout: float
) -> dict[str, Any]:
    """A second controller process started where ``runs`` runs exist (a new version, a
    failover, an OOM restart): how long until it has resumed every one (kopf's resume handler,
    one reconcile each) and its memory meanwhile. Polls with asyncio so that kmock, served from
    the calling loop, keeps answering."""
    started = time.perf_counter()
    controller = _ControllerProcess(target, runs, workers)
    try:
        while not controller.is_ready():
            if time.perf_counter() - started > 180:
                raise RuntimeError("the restarted controller did not get ready in 180 s")
            await asyncio.sleep(0.05)
        ready_s = time.perf_counter() - started
        while controller.handled.value < runs:
            if time.perf_counter() - started > timeout:
                raise RuntimeError(
                    f"the restarted controller resumed {controller.handled.value} of {runs} "
                    f"runs in {timeout} s"
                )
            await asyncio.sleep(0.05)
        resumed_s = time.perf_counter() - started
        await asyncio.to_thread(controller.mark_reconciled)
        deadline = time.perf_counter() + RESULTS_TIMEOUT_S
        while (child := controller.results()) is None:
            if time.perf_counter() > deadline:
                raise RuntimeError("the restarted controller sent no results")
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(controller.close)
    return {
        # from the process's start: the benchmark's own timing of the pure part (one render
        # per run, before the controller says ready) is in ready_s, not in the resume
        "ready_s": ready_s,
        "resumed_s": resumed_s,
        "resumed_after_ready_s": resumed_s - ready_s,
        "reconciles": len(child["reconcile_s"]),
        "rss_ready_mib": child["rss_ready_kib"] / 1024,
        "rss_resumed_mib": child["rss_reconciled_kib"] / 1024,
        "rss_peak_mib": child["rss_peak_kib"] / 1024,
        "cpu_s": child["cpu_s"],
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(seconds: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(seconds, 0.5) * 1e3,
        "p99_ms": percentile(seconds, 0.99) * 1e3,
        "max_ms": max(seconds) * 1e3,
        "n": len(seconds),
    }


def _result(
    api: str,
    runs: int,
    paced: bool,
    namespaces: int,
    applied: dict[Any, float],
    status_seen: dict[Any, float],
    started: float,
    child: dict[str, Any],
    jobs: int,
    refused: int,
) -> dict[str, Any]:
    e2e = [status_seen[key] - applied[key] for key in applied]
    reconcile, pure = child["reconcile_s"], child["pure_s"]
    return {
        "api": api,
        "runs": runs,
        "paced": paced,
        "namespaces": namespaces,
        "jobs_created": jobs,
        "status_writes_refused": refused,
        "total_s": max(status_seen.values()) - started,
        # first create sent -> last create answered: how fast this process could apply
        "apply_s": max(applied.values()) - started,
        "reconcile": summary(reconcile),
        "apply_to_status": summary(e2e),
        "pure_part": summary(pure),
        "pure_share_of_reconcile_median": percentile(pure, 0.5) / percentile(reconcile, 0.5),
        "controller_cpu_s": child["cpu_s"],
        "controller_cpu_per_run_ms": child["cpu_s"] / runs * 1e3,
        "rss_ready_mib": child["rss_ready_kib"] / 1024,
        "rss_peak_mib": child["rss_peak_kib"] / 1024,
        "rss_reconciled_mib": child["rss_reconciled_kib"] / 1024,
        "cpu_after_reconciled_s": child["cpu_after_reconciled_s"],
        "traced_growth": child["traced"],
        "held_bodies": child["held_bodies"],
        "heap_trims": child.get("heap_trims"),
        "sampled": child.get("sampled"),
        "job_cache": child.get("job_cache"),
        "renders": child.get("renders"),
        "run_reads": child.get("run_reads"),
        "queueing": child.get("queueing"),
        "tuning": dict(TUNING),
        "rss_end_mib": child["rss_end_kib"] / 1024,
        "rss_by_mapping_mib": child.get("rss_by_mapping_mib", {}),
        "machine": f"{platform.machine()}, Python {platform.python_version()}, load {_load()}",
    }


# --- kmock ----------------------------------------------------------------------------------


async def _delete_all_kmock(api: Any, helpers: Any, timeout: float) -> float:
    """Delete every run and (as the garbage collector would) what it owns; wait until every run
    is gone (runs carry no finalizer: at once, unless an earlier controller's is still being
    removed). Returns the seconds it took."""
    import kmock

    started = time.perf_counter()
    owned = (helpers.PYTORCHJOBS, helpers.TRAINJOBS, helpers.RUNTIMES, helpers.NETWORKPOLICIES)
    for resource in (helpers.RUNS, *owned):
        group_version, plural = resource.rsplit("/", 1)
        prefix = "/api/v1" if "/" not in group_version else f"/apis/{group_version}"
        for res, ns, name in [k for k, obj in api.objects.items() if not obj.deleted]:
            if res == kmock.resource(resource):
                await api.delete(f"{prefix}/namespaces/{ns}/{plural}/{name}")
    runs_resource = kmock.resource(helpers.RUNS)
    while any(res == runs_resource and not obj.deleted for (res, _, _), obj in api.objects.items()):
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"runs still not released {timeout} s after their deletion")
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


async def _run_kmock(
    runs: int,
    workers: int | None,
    paced: bool,
    namespaces: int,
    timeout: float,
    delete: bool = False,
    trace: bool = False,
    restart: bool = False,
) -> dict[str, Any]:
    import kmock

    helpers = _kmock_helpers()
    applied: dict[tuple[str, str], float] = {}
    status_seen: dict[tuple[str, str], float] = {}
    refused = [0]  # status writes answered 409 (none since writes carry no precondition)

    class StampingEmulator(helpers.Emulator):
        # kmock keeps every request for test assertions and matches each new request against
        # its reactions by scanning that history: quadratic in the number of requests, which
        # made kmock, not the controller, the bottleneck (cProfile: 2/3 of the time in kmock's
        # filtering at 30 runs). The benchmark keeps only the request being served, and stamps
        # status writes here rather than in a reaction.
        async def _handle(self, request: Any) -> Any:
            del self._requests[:-1]
            path = request.url.path
            stamped = None
            if request.method == "PATCH" and path.endswith("/status") and "/megdetruns/" in path:
                parts = path.split("/")
                key = (parts[-4], parts[-2])  # .../namespaces/<ns>/megdetruns/<name>/status
                status = (request.data or {}).get("status") or {}
                if status.get("jobName") and key not in status_seen:
                    status_seen[key] = time.perf_counter()
                    stamped = key
            try:
                return await super()._handle(request)
            except kmock.KubernetesError as err:
                if getattr(err, "status", None) == 409 and path.endswith("/status"):
                    refused[0] += 1
                    if stamped is not None:
                        del status_seen[stamped]  # that write did not land
                raise

    async with StampingEmulator() as api, kmock.Server(api):
        helpers.declare_resources(api)
        controller = _ControllerProcess({"api": "kmock", "url": str(api.url)}, runs, workers, trace)
        deleted_s = deleted_quiet_s = restarted = None
        rss_later: dict[str, float] = {}
        try:
            while not controller.is_ready():
                await asyncio.sleep(0.05)

            started = time.perf_counter()
            own_cpu = time.process_time()
            for i in range(runs):
                key = (namespace_of(i, namespaces), run_name(i, runs))
                body = helpers.run_body(key[1], served_spec(i), namespace=key[0])
                await helpers.apply(api, body)
                applied[key] = time.perf_counter()
                while paced and key not in status_seen:
                    if time.perf_counter() - started > timeout:
                        raise RuntimeError(f"{key} not reconciled in {timeout} s")
                    await asyncio.sleep(0.002)
            last_report = time.perf_counter()
            while len(status_seen) < runs:
                now = time.perf_counter()
                if now - started > timeout:
                    raise RuntimeError(
                        f"only {len(status_seen)} of {runs} reconciled in {timeout} s"
                    )
                if now - last_report > 10:
                    print(
                        f"  [kmock] ... {len(status_seen)}/{runs} reconciled",
                        file=sys.stderr,
                        flush=True,
                    )
                    last_report = now
                await asyncio.sleep(0.01)
            await asyncio.sleep(SETTLE_S)
            jobs = sum(
                1
                for (resource, _ns, _name), obj in list(api.objects.items())
                if resource
                in (kmock.resource(helpers.PYTORCHJOBS), kmock.resource(helpers.TRAINJOBS))
                and not obj.deleted
            )
            await asyncio.to_thread(controller.mark_reconciled)
            if delete:
                deleted_s = await _delete_all_kmock(api, helpers, timeout)
                deleted_quiet_s = await asyncio.to_thread(
                    harness.wait_quiet, [controller.proc.pid], DELETE_QUIET_S,
                    timeout=DELETE_QUIET_TIMEOUT_S,
                )  # fmt: skip
                rss_later = await asyncio.to_thread(
                    _rss_after_delete, controller.proc.pid, TUNING["rss_after_delete"]
                )
            deadline = time.perf_counter() + RESULTS_TIMEOUT_S
            while (child := controller.results()) is None:
                if time.perf_counter() > deadline:
                    raise RuntimeError("the controller process sent no results")
                await asyncio.sleep(0.05)
            own_cpu = time.process_time() - own_cpu
            if restart:
                await asyncio.to_thread(controller.close)
                target = {"api": "kmock", "url": str(api.url)}
                restarted = await _restart(target, runs, workers, timeout)
        finally:
            await asyncio.to_thread(controller.close)

    result = _result(
        "kmock", runs, paced, namespaces, applied, status_seen, started, child, jobs, refused[0]
    )
    result.update(delete_s=deleted_s, delete_quiet_s=deleted_quiet_s, restart=restarted)
    if delete:
        result["rss_after_delete_mib"] = rss_later
    # kmock serves from this process, which also applies the runs: its CPU is the API's side.
    result["api_cpu_per_run_ms"] = own_cpu / runs * 1e3
    result["other_cpu_per_run_ms"] = {"this process (kmock + client)": own_cpu / runs * 1e3}
    return result


# --- a real API server ----------------------------------------------------------------------


def _run_cluster(
    runs: int,
    workers: int | None,
    paced: bool,
    namespaces: int,
    nodes: int,
    timeout: float,
    keep_logs: Path | None = None,
    write_costs: int = 0,
    delete: bool = False,
    trace: bool = False,
    training_operator: bool = False,
    restart: bool = False,
) -> dict[str, Any]:
    from bench.controller_cluster import CONTROLLER_USER, BenchCluster, RunClient
    from bench.controller_cluster import write_costs as measure_write_costs

    bench = BenchCluster(nodes, training_operator=training_operator)
    started_up = time.perf_counter()
    try:
        bench.start()
        startup_s = time.perf_counter() - started_up
        bench.create_namespaces(sorted({namespace_of(i, namespaces) for i in range(runs)}))
        client = RunClient(bench.kube.kubeconfig)
        client.start_watch()
        target = {"api": "cluster", "kubeconfig": str(bench.controller_kubeconfig)}
        controller = _ControllerProcess(target, runs, workers, trace)
        deleted_s = deleted_quiet_s = restarted = None
        try:
            deadline = time.perf_counter() + 180
            while not controller.is_ready():
                if time.perf_counter() > deadline:
                    raise RuntimeError("the controller did not get ready in 180 s")
                time.sleep(0.05)
            time.sleep(0.5)  # lets the controller's first lists and watches settle
            wall_start = time.time()
            started = time.perf_counter()
            own_cpu, cpu_before = time.process_time(), bench.component_cpu_s()
            operator_before = bench.operator_requests()
            if paced:
                created = []
                for i in range(runs):
                    body = cluster_body(i, runs, namespaces)
                    created.append(client.create(body))
                    key = (body["metadata"]["namespace"], body["metadata"]["name"])
                    client.wait_for(
                        lambda key=key: key in client.status_seen,
                        timeout - (time.perf_counter() - started),
                        f"{key} reconciled",
                    )
            else:
                # POSTs from several threads: one after another, each waits ~10 ms for the API
                # server (100 ms once the controller loads the 2 cores), and the burst would
                # become a trickle that the controller keeps up with.
                bodies = [cluster_body(i, runs, namespaces) for i in range(runs)]
                with concurrent.futures.ThreadPoolExecutor(APPLY_THREADS) as pool:
                    created = list(pool.map(client.create, bodies))
            specs_as_kmock = all(
                created[i]["spec"] == served_spec(i) for i in range(min(runs, len(SPECS)))
            )
            client.wait_for(
                lambda: len(client.status_seen) >= runs,
                timeout - (time.perf_counter() - started),
                f"all {runs} runs reconciled",
            )
            time.sleep(SETTLE_S)
            quiet_s = pods_s = None
            if training_operator:
                # The anchor: until the training operator has made every PyTorchJob's pods, then
                # until it (statuses) and the controller (their mirror) are both quiet.
                pods_s = bench.wait_for_pods(bench.expected_pods(), timeout)
                pids = [bench.kube.state()["pids"]["training-operator"], controller.proc.pid]
                quiet_s = pods_s + bench.wait_quiet(pids, timeout=timeout)
            # The reconcile phase ends here: its requests and CPU are counted up to this point.
            wall_end = time.time()
            own_cpu = time.process_time() - own_cpu
            cpu_after = bench.component_cpu_s()
            operator_after = bench.operator_requests()
            by_kind = bench.jobs_by_kind()  # before any deletion lets the garbage collector in
            pods = bench.count_pods() if training_operator else {}  # the same
            jobs = sum(by_kind.values())
            controller.mark_reconciled()
            if delete:
                deleted_s = client.delete_all(timeout)
                deleted_quiet_s = harness.wait_quiet(
                    [controller.proc.pid], DELETE_QUIET_S, timeout=DELETE_QUIET_TIMEOUT_S
                )
                rss_later = _rss_after_delete(controller.proc.pid, TUNING["rss_after_delete"])
            deadline = time.perf_counter() + RESULTS_TIMEOUT_S
            while (child := controller.results()) is None:
                if time.perf_counter() > deadline:
                    raise RuntimeError("the controller process sent no results")
                time.sleep(0.05)
            if restart:
                controller.close()
                restarted = asyncio.run(_restart(target, runs, workers, timeout))
        finally:
            controller.close()
            client.stop()
        requests = bench.controller_requests(wall_start, wall_end)
        refused = sum(
            n for call, n in requests["non_2xx"].items() if call == "patch megdetruns/status 409"
        )
        result = _result(
            "cluster",
            runs,
            paced,
            namespaces,
            client.applied,
            client.status_seen,
            started,
            child,
            jobs,
            refused,
        )
        cpu = {
            name: (cpu_after[name] - cpu_before.get(name, 0.0)) / runs * 1e3 for name in cpu_after
        }
        cpu["this process (client + watch)"] = own_cpu / runs * 1e3
        result.update(
            api_cpu_per_run_ms=cpu.get("kube-apiserver", 0.0) + cpu.get("etcd", 0.0),
            other_cpu_per_run_ms=cpu,
            nodes=nodes,
            specs_as_kmock=specs_as_kmock,
            cluster_startup_s=startup_s,
            api_requests=requests,
            api_requests_per_run={
                "total": requests["total"] / runs,
                **{verb: n / runs for verb, n in requests["by_verb"].items()},
            },
            controller_login=f"ServiceAccount token ({CONTROLLER_USER})",
            delete_s=deleted_s,
            delete_quiet_s=deleted_quiet_s,
            rss_after_delete_mib=rss_later if delete else None,
            restart=restarted,
            # statuses first seen by a list, after the watch was told 410 Gone (their
            # apply -> status is read late by up to one watch window)
            watch_relists=client.relists,
        )
        if training_operator:
            result["anchor"] = _anchor(
                result,
                by_kind,
                operator_after,
                operator_before,
                (
                    cpu_after.get("training-operator", 0.0)
                    - cpu_before.get("training-operator", 0.0)
                ),
                quiet_s,
                pods,
            )
        if write_costs:
            result["write_costs"] = measure_write_costs(bench, client, write_costs)
        return result
    finally:
        bench.stop(keep_logs=keep_logs)


def _anchor(
    result: dict[str, Any],
    by_kind: dict[str, int],
    requests_after: dict[str, float],
    requests_before: dict[str, float],
    operator_cpu_s: float,
    quiet_s: float | None,
    pods: dict[str, int],
) -> dict[str, Any]:
    """Our controller beside the Kubeflow training operator (Go, controller-runtime) over the
    same span and the same PyTorchJobs: CPU and API requests, per run and per job."""
    jobs = by_kind.get("PyTorchJob", 0) or 1
    made = {k: v - requests_before.get(k, 0.0) for k, v in requests_after.items()}
    made = {k: v for k, v in sorted(made.items(), key=lambda kv: -kv[1]) if v}
    per_job_ms = operator_cpu_s / jobs * 1e3
    ours = result["controller_cpu_per_run_ms"]
    operator_requests = sum(made.values()) / jobs
    return {
        "pytorchjobs": by_kind.get("PyTorchJob", 0),
        "pods": pods,
        "quiet_after_s": quiet_s,
        "operator_cpu_per_job_ms": per_job_ms,
        "controller_cpu_per_run_ms": ours,
        "cpu_ratio_controller_over_operator": ours / per_job_ms if per_job_ms else float("nan"),
        "operator_requests_per_job": operator_requests,
        "operator_requests_by_method_code": made,
        "controller_requests_per_run": result["api_requests_per_run"]["total"],
        "requests_ratio": result["api_requests_per_run"]["total"] / operator_requests
        if operator_requests
        else float("nan"),
    }


# --- both -----------------------------------------------------------------------------------

#: (label, path into a result, unit) of the compared figures; lower is better for all.
ROWS = [
    ("total", ("total_s",), "s"),
    ("apply phase (creates)", ("apply_s",), "s"),
    ("reconcile p50", ("reconcile", "p50_ms"), "ms"),
    ("reconcile p99", ("reconcile", "p99_ms"), "ms"),
    ("reconcile max", ("reconcile", "max_ms"), "ms"),
    ("apply -> status p50", ("apply_to_status", "p50_ms"), "ms"),
    ("apply -> status p99", ("apply_to_status", "p99_ms"), "ms"),
    ("pure part p50", ("pure_part", "p50_ms"), "ms"),
    ("controller CPU per run", ("controller_cpu_per_run_ms",), "ms"),
    ("API server CPU per run", ("api_cpu_per_run_ms",), "ms"),
    ("controller RSS ready", ("rss_ready_mib",), "MiB"),
    ("controller RSS peak", ("rss_peak_mib",), "MiB"),
    ("controller RSS reconciled", ("rss_reconciled_mib",), "MiB"),
    ("controller RSS at the end", ("rss_end_mib",), "MiB"),
]


def _get(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value[key]
    return float(value)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """cluster / kmock for every compared figure (when both ran)."""
    if not all(api in results for api in APIS):
        return {}
    out = {}
    for label, path, _unit in ROWS:
        base = _get(results["kmock"], path)
        out[label] = _get(results["cluster"], path) / base if base else float("nan")
    return out


def goals(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's goals for one API's result: measured value and met / not met / not judged."""
    p99 = result["reconcile"]["p99_ms"]
    peak = result["rss_peak_mib"]
    runs, total = result["runs"], result["total_s"]
    out: dict[str, dict[str, Any]] = {
        "reconcile p99 < 100 ms": {"value": f"{p99:.1f} ms", "met": p99 < GOALS["p99_ms"]},
        "controller RSS < 300 MiB": {
            "value": f"{peak:.0f} MiB peak",
            "met": peak < GOALS["rss_mib"],
        },
    }
    if runs == 200 and not result["paced"]:
        out["200 runs in < 20 s"] = {
            "value": f"{total:.1f} s",
            "met": total < GOALS["total_s"],
        }
    rate = runs / total if total else float("inf")
    if runs >= GOALS["runs"] and not result["paced"]:
        out["1,000 runs in < 60 s"] = {
            "value": f"{runs} runs in {total:.1f} s",
            "met": total < GOALS["runs_s"],
        }
    else:
        out["1,000 runs in < 60 s"] = {
            "value": f"{runs} runs{' paced' if result['paced'] else ''} in {total:.1f} s "
            f"({rate:.1f} runs/s; the goal needs {GOALS['runs'] / GOALS['runs_s']:.1f} runs/s "
            "for a burst of 1,000)",
            "met": None,
        }
    return out


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f} on {os.cpu_count()} cores"


def run(
    runs: int = 200,
    workers: int | None = None,
    paced: bool = False,
    api: str = "kmock",
    namespaces: int = 1,
    nodes: int = 4,
    timeout: float = 600,
    keep_logs: Path | None = None,
    write_costs: int = 0,
    delete: bool = False,
    trace: bool = False,
    training_operator: bool = False,
    restart: bool = False,
) -> dict[str, Any]:
    """One API's measurements (``workers``: kopf's handler threads; ``paced``: apply each run
    only after the previous one's status names its job; ``delete``: then delete every run and
    read the memory once they are gone; ``trace``: tracemalloc's view of where it grew;
    ``restart``: then stop the controller and time a new one resuming every run)."""
    if delete and restart:
        raise ValueError("delete and restart: choose one (a restart needs the runs to exist)")
    if api == "kmock":
        return asyncio.run(
            _run_kmock(runs, workers, paced, namespaces, timeout, delete, trace, restart)
        )
    if api == "cluster":
        return _run_cluster(
            *(runs, workers, paced, namespaces, nodes, timeout, keep_logs, write_costs),
            *(delete, trace, training_operator, restart),
        )
    raise ValueError(f"api {api!r}: want one of {', '.join(APIS)}")


def compare(
    apis: tuple[str, ...] = APIS,
    runs: int = 200,
    workers: int | None = None,
    paced: bool = False,
    namespaces: int = 1,
    nodes: int = 4,
    timeout: float = 600,
    keep_logs: Path | None = None,
    write_costs: int = 0,
    delete: bool = False,
    trace: bool = False,
    training_operator: bool = False,
    restart: bool = False,
) -> dict[str, Any]:
    """Each API in turn (kmock first), in one invocation, with the cluster/kmock ratios."""
    results: dict[str, dict[str, Any]] = {}
    for api in apis:
        print(f"  [{api}] {runs} runs ...", file=sys.stderr, flush=True)
        results[api] = run(
            *(runs, workers, paced, api, namespaces, nodes, timeout, keep_logs, write_costs),
            delete=delete,
            trace=trace,
            training_operator=training_operator,
            restart=restart,
        )
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "results": results,
        "ratios_cluster_over_kmock": ratios(results),
        "goals": {api: goals(r) for api, r in results.items()},
    }


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:.1f} ms"


def print_report(result: dict[str, Any]) -> None:
    if "results" not in result:  # one API's result, from run()
        result = {
            "results": {result["api"]: result},
            "ratios_cluster_over_kmock": {},
            "goals": {result["api"]: goals(result)},
        }
    results = result["results"]
    apis = list(results)
    first = results[apis[0]]
    how = "one at a time (paced)" if first["paced"] else "at once (burst)"
    spread = f" over {first['namespaces']} namespaces" if first["namespaces"] > 1 else ""
    print(f"{first['runs']} MegDetRuns applied {how}{spread}; APIs: {', '.join(apis)}")
    if "cluster" in results:
        c = results["cluster"]
        print(
            f"cluster: {c['nodes']} kwok nodes x 8 GPUs, up in {c['cluster_startup_s']:.0f} s; "
            f"controller logged in with a {c['controller_login']}; server-defaulted specs equal "
            f"kmock's: {c['specs_as_kmock']}"
        )
    ratio = result["ratios_cluster_over_kmock"]
    header = f"{'':<26}" + "".join(f"{api:>13}" for api in apis)
    print(header + (f"{'cluster/kmock':>15}" if ratio else ""))
    for label, path, unit in ROWS:
        line = f"{label:<26}" + "".join(f"{_fmt(_get(results[a], path), unit):>13}" for a in apis)
        if ratio:
            line += f"{ratio[label]:>15.2f}"
        print(line)
    for label, key in (
        ("jobs created", "jobs_created"),
        ("status writes refused 409", "status_writes_refused"),
    ):
        print(f"{label:<26}" + "".join(f"{results[a][key]:>13}" for a in apis))
    print(
        "API server CPU: kmock = this process (emulator and client); cluster = kube-apiserver + "
        "etcd. CPU per run of each process:"
    )
    for api in apis:
        parts = results[api].get("other_cpu_per_run_ms", {})
        print(f"  {api}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in parts.items()))
    if "cluster" in results:
        per_run = results["cluster"]["api_requests_per_run"]
        cells = lambda v: "".join(  # noqa: E731
            f"{v:>13.2f}" if a == "cluster" else f"{'-':>13}" for a in apis
        )
        print(f"{'API requests per run':<26}" + cells(per_run["total"]))
        for verb, value in per_run.items():
            if verb != "total":
                print(f"{'  ' + verb:<26}" + cells(value))
        calls = results["cluster"]["api_requests"]["by_call"]
        runs = results["cluster"]["runs"]
        print(
            "  by call (per run): "
            + ", ".join(f"{call} {n / runs:.2f}" for call, n in calls.items())
        )
        if results["cluster"]["api_requests"]["non_2xx"]:
            print(f"  non-2xx answers: {results['cluster']['api_requests']['non_2xx']}")
    anchor = results.get("cluster", {}).get("anchor")
    if anchor:
        print(
            f"anchor: the training operator over the same span ({anchor['pytorchjobs']} "
            f"PyTorchJobs, pods {anchor['pods']}, quiet {anchor['quiet_after_s']:.0f} s after "
            f"the last status):\n"
            f"  controller CPU per run {anchor['controller_cpu_per_run_ms']:.1f} ms; training "
            f"operator CPU per PyTorchJob {anchor['operator_cpu_per_job_ms']:.1f} ms; ratio "
            f"{anchor['cpu_ratio_controller_over_operator']:.2f}\n"
            f"  API requests: controller {anchor['controller_requests_per_run']:.2f} per run, "
            f"training operator {anchor['operator_requests_per_job']:.2f} per PyTorchJob "
            f"({anchor['operator_requests_by_method_code']}); ratio "
            f"{anchor['requests_ratio']:.2f}"
        )
    costs = results.get("cluster", {}).get("write_costs")
    if costs:
        print("requests alone (no controller), per request: wall, kube-apiserver CPU, etcd CPU")
        for label, c in costs.items():
            print(
                f"  {label:<28} n={c['n']:<4} {c['wall_ms']:6.1f} ms "
                f"{c['apiserver_cpu_ms']:6.1f} ms {c['etcd_cpu_ms']:6.1f} ms"
            )
    for api in apis:
        r = results[api]
        if r.get("delete_s") is not None:
            idle = r["rss_ready_mib"]
            print(
                f"{api}: all runs deleted and released in {r['delete_s']:.1f} s, the controller "
                f"quiet {r['delete_quiet_s']:.1f} s later; RSS at the end "
                f"{r['rss_end_mib']:.0f} MiB = {r['rss_end_mib'] / idle:.2f} x ready ({idle:.0f} "
                f"MiB); controller CPU after the runs were reconciled "
                f"{r['cpu_after_reconciled_s']:.1f} s"
            )
            for offset, mib in (r.get("rss_after_delete_mib") or {}).items():
                print(f"  RSS {offset} s after that: {mib:.0f} MiB = {mib / idle:.2f} x ready")
        kinds = r.get("rss_by_mapping_mib") or {}
        if "ready" in kinds and "end" in kinds:
            print(f"{api}: controller RSS by mapping (/proc smaps), ready -> at the end:")
            for kind in MAPPING_KINDS:
                before, after = kinds["ready"].get(kind, 0.0), kinds["end"].get(kind, 0.0)
                print(f"  {kind:<58} {before:6.1f} -> {after:6.1f} MiB")
        if r.get("restart"):
            again = r["restart"]
            print(
                f"{api}: a new controller started where the {r['runs']} runs exist: ready in "
                f"{again['ready_s']:.1f} s (the benchmark's pure-part timing included), every "
                f"run resumed {again['resumed_after_ready_s']:.1f} s after that "
                f"({again['reconciles']} reconciles, {again['cpu_s']:.1f} s of CPU); "
                f"RSS ready {again['rss_ready_mib']:.0f} MiB, peak {again['rss_peak_mib']:.0f} MiB"
            )
        if r.get("watch_relists"):
            print(
                f"{api}: the benchmark's run watch was told 410 Gone {r['watch_relists']} times "
                "and listed again (statuses it then found count as seen at that list)"
            )
        trims = r.get("heap_trims")
        tuning = r.get("tuning") or {}
        print(
            f"{api}: job cache {'on' if tuning.get('job_cache', True) else 'off'}; "
            f"MALLOC_ARENA_MAX {tuning.get('arena_max') or 'unset'}; "
            f"PYTHONMALLOC {tuning.get('python_malloc') or 'unset'}; "
            f"C allocator {tuning.get('preload') or 'glibc'}; "
            f"kopf worker limit {tuning.get('worker_limit') or 'none'}, idle timeout "
            f"{tuning.get('idle_timeout') or 1.0:g} s; heap trimmer "
            + (
                "off"
                if not trims
                else f"{trims['idle']} idle + {trims.get('settle', 0)} settle + "
                f"{trims['busy']} busy trims, "
                f"{trims['released_mib']:.0f} MiB returned in {trims['seconds'] * 1e3:.0f} ms"
            )
        )
        cache, renders = r.get("job_cache"), r.get("renders") or {}
        print(
            f"{api}: job reads from the cache "
            + (
                f"{cache['hits']}, from the server {cache['misses']}; held at the end "
                f"{cache['held']}"
                if cache
                else "off"
            )
            + f"; renders {renders.get('renders')}, reused {renders.get('reused')}, lean (values "
            f"schema checked in process, no NOTES) {renders.get('prechecked')}"
        )
        reads = r.get("run_reads")
        if reads:
            print(
                f"{api}: status writes' run reads from the watch {reads['watch']:.0f}, from the "
                f"server {reads['server']:.0f} (of which stale views, 409: {reads['stale']:.0f})"
            )
        sampled = r.get("sampled")
        if sampled:
            print(f"{api}: {sampled['samples']} stack samples of running threads; own time:")
            for key, share in sampled["own"]:
                print(f"    {share * 100:5.1f} %  {key}")
            print(f"{api}: inclusive:")
            for key, share in sampled["inclusive"]:
                print(f"    {share * 100:5.1f} %  {key}")
        for phase, kinds in r.get("held_bodies", {}).items():
            listed = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())) or "none"
            print(f"{api}: objects still held by the controller when {phase}: {listed}")
        for phase, rows in r.get("traced_growth", {}).items():
            print(f"{api}: tracemalloc, ready -> {phase}, largest growth by file:")
            for row in rows:
                print(f"    {row['kib']:>10.0f} KiB {row['blocks']:>9} blocks  {row['file']}")
    print("goals:")
    for api in apis:
        for goal, verdict in result["goals"][api].items():
            met = {True: "met", False: "NOT met", None: "not judged"}[verdict["met"]]
            print(f"  {api:<8} {goal:<26} {met:<11} ({verdict['value']})")
    for api in apis:
        print(f"machine after {api}: {results[api]['machine']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--api",
        choices=("kmock", "cluster", "both"),
        default="both",
        help="the API server: kmock (emulator), cluster (a real control plane) or both, "
        "side by side (default)",
    )
    parser.add_argument("--runs", type=int, default=200, help="MegDetRuns to apply (default 200)")
    parser.add_argument(
        "--nodes", type=int, default=4, help="cluster: fake 8-GPU kwok nodes (default 4)"
    )
    parser.add_argument(
        "--namespaces", type=int, default=1, help="spread the runs over this many (default 1)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="kopf handler threads (default: kopf's)"
    )
    parser.add_argument(
        "--paced",
        action="store_true",
        help="apply each run after the previous one is reconciled (latency without a queue)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds for all runs to be reconciled"
    )
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="cluster: copy its logs (audit.log) here"
    )
    parser.add_argument(
        "--write-costs",
        type=int,
        default=0,
        metavar="N",
        help="cluster: afterwards, time N requests of each kind a reconcile makes, alone "
        "(the API server's CPU per request; default 0: skip)",
    )
    parser.add_argument(
        "--delete",
        action="store_true",
        help="after the runs are reconciled, delete them all and read the controller's memory "
        "once they are gone (does it come back?)",
    )
    parser.add_argument(
        "--rss-after-delete",
        default="",
        metavar="S[,S...]",
        help="with --delete: also read the controller's RSS these many seconds after the "
        "deletion's quiet point, e.g. 0,15,30,60 (what an idle controller gives back later)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="once every run is reconciled, stop the controller and start a new one where "
        "they all exist (an upgrade, a failover): time until it has resumed every run, and "
        "its memory (not with --delete)",
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the controller's allocations and report the files whose memory grew most "
        "(slows it down: no timings from such a run)",
    )
    parser.add_argument(
        "--training-operator",
        action="store_true",
        help="cluster: run the Kubeflow training operator too (it makes the PyTorchJobs' pods "
        "on the kwok nodes) and report its CPU and API requests per job beside the "
        "controller's per run (the anchor)",
    )
    parser.add_argument(
        "--heap-trim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the controller's heap trimmer (controller/heap.py) as `megdet controller` "
        "does (default: on; --no-heap-trim: the controller before it)",
    )
    parser.add_argument(
        "--arena-max",
        type=int,
        default=0,
        metavar="N",
        help="MALLOC_ARENA_MAX for the controller process (default 0: glibc's own; the operator "
        "chart sets 2)",
    )
    parser.add_argument(
        "--python-malloc",
        choices=("pymalloc", "malloc"),
        default=None,
        help="PYTHONMALLOC for the controller process (default: unset, Python's pymalloc; "
        "malloc: every allocation from the C library, which the heap trimmer can give back)",
    )
    parser.add_argument(
        "--preload",
        choices=sorted(PRELOADS),
        default=None,
        help="load this C allocator into the controller process first (LD_PRELOAD of its "
        "Debian package's library; default: glibc's malloc). Only Python's allocations that "
        "go to the C library use it: pair with --python-malloc malloc",
    )
    parser.add_argument(
        "--worker-limit",
        type=int,
        default=DEFAULT_WORKER_LIMIT,
        metavar="N",
        help="at most N objects of a kind handled at once once the controller has listed them "
        "(megdet controller --worker-limit; the others' events wait in their queues; default: "
        f"the controller's, {DEFAULT_WORKER_LIMIT}; 0: no limit, kopf's default)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="kopf's settings.queueing.idle_timeout: an object's worker exits after S seconds "
        "without events (default: the controller's, 1 s; kopf's own default is 5 s)",
    )
    parser.add_argument(
        "--job-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="answer the controller's job reads from its watch (controller/kubeapi.py JobCache; "
        "default: on; --no-job-cache: every read asks the API server, as before)",
    )
    parser.add_argument(
        "--lean-render",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check a run's values against the chart's schema in process and, when they pass, "
        "render the chart's copy without its schema and NOTES.txt (controller/render.py; "
        "default: on; --no-lean-render: every render runs Helm's schema check and renders the "
        "NOTES, as before)",
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample every thread of the controller's stacks every 5 ms, ready -> reconciled, "
        "and report where its running time goes (slows it a little)",
    )
    parser.add_argument("--json", action="store_true", help="print raw JSON")
    args = parser.parse_args(argv)
    if args.delete and args.restart:
        parser.error("--delete and --restart: choose one (a restart needs the runs to exist)")
    try:
        later = tuple(float(x) for x in args.rss_after_delete.split(",") if x.strip())
    except ValueError:
        later = (-1.0,)
    if not all(0 <= x <= 3600 for x in later):
        parser.error(
            f"--rss-after-delete {args.rss_after_delete!r}: seconds from 0 to 3600, "
            "separated by commas (e.g. 0,15,30,60)"
        )
    if later and not args.delete:
        parser.error("--rss-after-delete needs --delete (it reads the memory once runs are gone)")
    if args.preload and not _preload_present(PRELOADS[args.preload]):
        parser.error(
            f"--preload {args.preload}: {PRELOADS[args.preload]} is not installed "
            f"(apt-get install {PRELOAD_PACKAGES[args.preload]})"
        )
    if args.arena_max < 0:
        parser.error("--arena-max must be 0 (glibc's default) or more")
    if args.worker_limit < 0:
        parser.error("--worker-limit must be 0 (no limit, kopf's default) or more")
    if not args.idle_timeout >= 0:
        parser.error("--idle-timeout must be 0 (the controller's 1 s) or more seconds")
    TUNING.update(
        heap_trim=args.heap_trim,
        arena_max=args.arena_max,
        python_malloc=args.python_malloc or "",
        preload=args.preload or "",
        worker_limit=args.worker_limit,
        idle_timeout=args.idle_timeout,
        job_cache=args.job_cache,
        lean_render=args.lean_render,
        sample=args.sample,
        rss_after_delete=later,
    )
    if args.runs < 1 or args.nodes < 1 or args.namespaces < 1:
        parser.error("--runs, --nodes and --namespaces must be at least 1")
    apis = APIS if args.api == "both" else (args.api,)
    result = compare(
        apis,
        args.runs,
        args.workers,
        args.paced,
        args.namespaces,
        args.nodes,
        args.timeout,
        args.keep_logs,
        args.write_costs,
        delete=args.delete,
        trace=args.tracemalloc,
        training_operator=args.training_operator,
        restart=args.restart,
    )
    harness.emit(result, args.json, print_report)


if __name__ == "__main__":
    main()
