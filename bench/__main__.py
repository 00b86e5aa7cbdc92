"""Run every CPU benchmark in turn and print each result table (what `make bench` runs).

    .venv/bin/python -m bench            # full runs: a few minutes each on 2 cores
    .venv/bin/python -m bench --quick    # smoke runs: seconds each, numbers not meaningful

The GPU benchmark (``python -m bench.gpu_step``) needs a CUDA device and is not run here.
controller_reconcile's full run also starts a real control plane (``make cluster``'s binaries)
beside kmock when those are built.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bench import (
    busy_threads,
    chart_render,
    controller_reconcile,
    controller_validation,
    data_throughput,
    exporter_overhead,
    progress_endpoint,
    progress_overhead,
    step_overhead,
    sync_bn_scope,
    worker_start,
)


def _chart_render(quick: bool) -> None:
    # chart_render.main() reads its options from sys.argv.
    argv = sys.argv
    sys.argv = ["bench/chart_render.py", "--repeats", "20" if quick else "300"]
    try:
        chart_render.main()
    finally:
        sys.argv = argv


def _step_overhead(quick: bool) -> None:
    step_overhead.print_report(step_overhead.run(quick=quick))


def _sync_bn_scope(quick: bool) -> None:
    sync_bn_scope.print_report(sync_bn_scope.run(quick=quick, r50=not quick))


def _data_throughput(quick: bool) -> None:
    data_throughput.print_report(data_throughput.run(quick=quick))


def _controller_validation(quick: bool) -> None:
    controller_validation.print_report(controller_validation.run(repeats=5 if quick else 100))


def _controller_reconcile(quick: bool) -> None:
    # Full runs: kmock and a real API server side by side, when the control plane is built.
    from bench.controller_cluster import available

    why_not = None if quick else available()
    api = "kmock" if quick or why_not else "both"
    if why_not:
        print(f"controller_reconcile: kmock only ({why_not})")
    options = controller_reconcile.Options(api=api, runs=8 if quick else 200, workers=2)
    controller_reconcile.print_report(controller_reconcile.compare(options))


def _exporter_overhead(quick: bool) -> None:
    exporter_overhead.print_report(exporter_overhead.run(quick=quick))


def _progress_overhead(quick: bool) -> None:
    progress_overhead.print_report(progress_overhead.run(quick=quick))


def _progress_endpoint(quick: bool) -> None:
    # After only: a side-by-side needs a worktree of the code before (--before-tree).
    progress_endpoint.print_report(progress_endpoint.run(quick=quick))


def _worker_start(quick: bool) -> None:
    repeats, iterations = (1, 1) if quick else (3, 2)
    worker_start.print_report(worker_start.run(repeats=repeats, iterations=iterations))


def _busy_threads(quick: bool) -> None:
    rounds, iterations = (1, busy_threads.MIN_ITERATIONS) if quick else (2, 20)
    busy_threads.print_report(busy_threads.run(rounds=rounds, iterations=iterations))


BENCHMARKS: dict[str, Callable[[bool], None]] = {
    "chart_render": _chart_render,
    "step_overhead": _step_overhead,
    "sync_bn_scope": _sync_bn_scope,
    "data_throughput": _data_throughput,
    "exporter_overhead": _exporter_overhead,
    "progress_overhead": _progress_overhead,
    "progress_endpoint": _progress_endpoint,
    "controller_validation": _controller_validation,
    "controller_reconcile": _controller_reconcile,
    "worker_start": _worker_start,
    "busy_threads": _busy_threads,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke runs of each")
    parser.add_argument(
        "--only", choices=sorted(BENCHMARKS), action="append", help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        print("--quick: smoke runs of a step or two; their numbers are not measurements\n")
    for name in args.only or BENCHMARKS:
        print(f"== {name} ==", flush=True)
        start = time.perf_counter()
        BENCHMARKS[name](args.quick)
        print(f"({name}: {time.perf_counter() - start:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()
