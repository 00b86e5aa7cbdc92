"""The controller process of the benchmark: the real controller (kopf, our handlers, the official
client, the in-process Helm render) spawned on its own, so its memory and CPU are its own.

It times the pure part (``plan_children``) for the benchmark's specs, serves until told to stop
and sends back its measurements; :class:`ControllerProcess` is its handle in the benchmark's
process, and :func:`restart` times a second one resuming every run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import threading
import time
from typing import Any

from bench.controller_runs import served_spec
from bench.reconcile import kmock_helpers, memory
from bench.reconcile.options import PRELOADS, Options

#: Seconds the controller may take to stop and send its results (tracemalloc's snapshots and
#: their comparison take tens of seconds on a loaded machine).
RESULTS_TIMEOUT_S = 300.0


def _controller(
    target: dict[str, str],
    options: Options,
    ready: Any,
    stop: Any,
    conn: Any,
    reconciled: Any,
    recorded: Any,
    trace: bool,
    handled: Any = None,
) -> None:
    """The controller process: warm up, time the pure part, then serve until told to stop.

    ``target``: ``{"api": "kmock", "url": ...}`` or ``{"api": "cluster", "kubeconfig": ...}``;
    ``options``: its runs (the pure part is timed for as many specs), kopf's handler threads and
    the tuning (:meth:`Options.tuning`).
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
    if options.heap_trim:
        from megdet.controller.heap import HeapTrimmer

        trimmer = HeapTrimmer().start()  # as `megdet controller` starts it
    if not options.lean_render:
        from megdet.controller.render import default_renderer

        default_renderer()._unchecked = None  # Helm's schema check and the NOTES, as before
    helpers = kmock_helpers()
    bodies = [helpers.run_body(f"pure-{i:04d}", served_spec(i)) for i in range(options.runs)]
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

    cluster = Cluster(api, timeout=10.0, cache=options.job_cache)
    reconciler = Reconciler(cluster, Backoff(base=0.05, cap=1.0), observe=observe)
    registry = build_registry(reconciler)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if target["api"] == "kmock":
            return kopf.ConnectionInfo(server=target["url"], insecure=True)
        return kopf.login_with_kubeconfig(**kwargs)

    settings = kopf.OperatorSettings()
    configure(
        settings, diffbase=reconciler.diffbase, peering=None, fast=True, workers=options.workers
    )
    if options.worker_limit:  # as `megdet controller --worker-limit` sets it
        limit_workers(registry, settings, options.worker_limit)
    if options.idle_timeout:
        settings.queueing.idle_timeout = options.idle_timeout
    kopf_ready, kopf_stop = threading.Event(), threading.Event()

    sampler = memory.Sampler() if options.sample else None

    def relay() -> None:
        kopf_ready.wait()
        if sampler is not None:
            sampler.start()
        if trace:
            snaps["ready"] = tracemalloc.take_snapshot()
        rss["ready"] = memory.memory_kib("VmRSS")
        kinds["ready"] = memory.rss_by_mapping()
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
                rss["reconciled"] = memory.memory_kib("VmRSS")
                cpu.append(time.process_time())
                if trace:
                    snaps["reconciled"] = tracemalloc.take_snapshot()
                    held["reconciled"] = memory.held_bodies()
                recorded.set()
        cpu[1] = time.process_time()
        rss["end"] = memory.memory_kib("VmRSS")
        kinds["end"] = memory.rss_by_mapping()
        if trace:
            snaps["end"] = tracemalloc.take_snapshot()
            held["end"] = memory.held_bodies()
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
            "rss_peak_kib": memory.memory_kib("VmHWM"),
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
                phase: memory.top_growth(snaps[phase], snaps["ready"])
                for phase in ("reconciled", "end")
                if phase in snaps
            },
        }
    )


def _set_environment(values: dict[str, str | None]) -> dict[str, str | None]:
    """Set (a value) or unset (None) these environment variables; returns what they were."""
    before = {key: os.environ.get(key) for key in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return before


class ControllerProcess:
    """The spawned controller process, polled (so kmock keeps serving from this event loop)."""

    def __init__(self, target: dict[str, str], options: Options, trace: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self._reconciled, self._recorded = ctx.Event(), ctx.Event()
        #: reconciles (handler calls) the process has made so far
        self.handled = ctx.Value("q", 0)
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_controller,
            args=(
                target,
                *(options, self.ready, self.stop, child),
                *(self._reconciled, self._recorded, trace, self.handled),
            ),
            daemon=True,
        )
        # glibc reads MALLOC_ARENA_MAX and Python PYTHONMALLOC when the process starts: the
        # spawned child's environment.
        saved = _set_environment(
            {
                "MALLOC_ARENA_MAX": str(options.arena_max) if options.arena_max else None,
                "PYTHONMALLOC": options.python_malloc or None,
                "LD_PRELOAD": PRELOADS.get(options.preload),
            }
        )
        try:
            self.proc.start()
        finally:
            _set_environment(saved)

    def is_ready(self) -> bool:
        if self.ready.is_set():
            return True
        if not self.proc.is_alive():
            raise RuntimeError("the controller process died during start-up")
        return False

    async def wait_ready(self, timeout: float | None, who: str = "the controller") -> None:
        """Until it is ready (``timeout``: at most so many seconds). Polls with asyncio so that
        kmock, served from the calling loop, keeps answering."""
        started = time.perf_counter()
        while not self.is_ready():
            if timeout is not None and time.perf_counter() - started > timeout:
                raise RuntimeError(f"{who} did not get ready in {timeout:g} s")
            await asyncio.sleep(0.05)

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

    async def collect(self, who: str = "the controller process") -> dict[str, Any]:
        """Ask it to stop and wait for its measurements (RESULTS_TIMEOUT_S at most)."""
        deadline = time.perf_counter() + RESULTS_TIMEOUT_S
        while (child := self.results()) is None:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{who} sent no results")
            await asyncio.sleep(0.05)
        return child

    def close(self) -> None:
        self.stop.set()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


async def restart(target: dict[str, str], options: Options) -> dict[str, Any]:
    """A second controller process started where ``options.runs`` runs exist (a new version, a
    failover, an OOM restart): how long until it has resumed every one (kopf's resume handler,
    one reconcile each) and its memory meanwhile. Polls with asyncio so that kmock, served from
    the calling loop, keeps answering."""
    runs, timeout = options.runs, options.timeout
    started = time.perf_counter()
    controller = ControllerProcess(target, options)
    try:
        await controller.wait_ready(180, "the restarted controller")
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
        child = await controller.collect("the restarted controller")
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
