"""What the two hook-overhead benchmarks (``exporter_overhead``, ``progress_overhead``) share.

Each builds one tiny trainer in 2 gloo processes (``harness.run_world``) on a shapes dataset and
lets conditions take turns on it in blocks of steps, several rounds, the order rotated each round
(two conditions: alternated). A benchmark says only what differs: its conditions (a hook list
each), what it times besides, its report. The schedule (rounds, block, warm-up, calls) and the
command line (``--quick``, ``--rounds``, ``--block``, ``--json``) are the same for both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import harness

#: A smoke run's trainer: one image per process.
QUICK_OVERRIDES = ("MEGDET.IMAGES_PER_GPU", "1")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How much each condition runs: ``rounds`` rounds of ``block`` steps after ``warmup``
    steps; ``calls``: repetitions of each directly timed call; ``overrides``: config overrides
    of the trainer."""

    rounds: int
    block: int
    warmup: int
    calls: int
    overrides: tuple[str, ...] = ()

    @classmethod
    def of(cls, quick: bool, rounds: int, block: int, warmup: int, calls: int, quick_calls: int):
        """The schedule asked for; ``quick``: 1 round of 1 unwarmed step, ``quick_calls``."""
        if quick:
            return cls(1, 1, 0, quick_calls, QUICK_OVERRIDES)
        return cls(rounds, block, warmup, calls)


@dataclasses.dataclass
class Interleaved:
    """Per condition: the mean step time of each block (``blocks``), every step's time
    (``steps``) and the process's CPU seconds per step of each block (``cpu``: all its threads,
    what a hook adds; unlike wall time it barely moves when other jobs take the cores)."""

    blocks: dict[str, list[float]]
    steps: dict[str, list[float]]
    cpu: dict[str, list[float]]


def interleave(
    names: Sequence[str],
    block_of: Callable[[str, int], list[float]],
    schedule: Schedule,
    during: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> Interleaved:
    """Warm every condition up, then ``schedule.rounds`` rounds of one block each, the order
    rotated by one each round. ``block_of(name, steps)`` runs ``steps`` steps of condition
    ``name`` and returns their times; ``during(name)`` wraps each timed block (a load beside
    it) outside its CPU count."""
    for name in names:
        block_of(name, schedule.warmup)
    out = Interleaved({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names})
    for r in range(schedule.rounds):
        shift = r % len(names)
        for name in (*names[shift:], *names[:shift]):
            with during(name) if during is not None else contextlib.nullcontext():
                start = time.process_time()
                times = block_of(name, schedule.block)
                cpu = (time.process_time() - start) / schedule.block
            out.blocks[name].append(sum(times) / len(times))
            out.steps[name].extend(times)
            out.cpu[name].append(cpu)
    return out


def time_calls(fn: Callable[[], Any], calls: int) -> list[float]:
    """The wall time of each of ``calls`` calls of ``fn``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def free_port(host: str) -> int:
    """A port nothing listens on at ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def described(cfg: Any, schedule: Schedule) -> dict[str, Any]:
    """What every result of a rank starts with: the world, the trainer's images and the
    schedule."""
    import torch
    from detectron2.utils import comm

    return {
        "world_size": comm.get_world_size(),
        "threads_per_process": torch.get_num_threads(),
        "images_per_process": cfg.MEGDET.IMAGES_PER_GPU,
        "rounds": schedule.rounds,
        "block": schedule.block,
        "warmup": schedule.warmup,
    }


def run_ranks(prefix: str, worker: Callable[..., dict], schedule: Schedule, *args: Any) -> dict:
    """``worker(data, out, schedule, *args)`` in 2 gloo processes on a 32-image shapes dataset
    in a scratch folder; rank 0's result with the machine's load."""
    return harness.run_on_shapes(prefix, 2, 32, worker, schedule, *args)


def print_header(title: str, result: dict[str, Any], per: str) -> None:
    """The report's first line: the world, the images and the schedule (``per``: steps per
    what, each round)."""
    print(
        f"{title}: {result['world_size']} gloo processes x "
        f"{result['threads_per_process']} thread(s), {result['images_per_process']} images per "
        f"process; {result['rounds']} rounds x {result['block']} steps per {per} after "
        f"{result['warmup']} warm-up steps; load average {result['load_average']}"
    )


def smoke_run(result: dict[str, Any]) -> bool:
    """Whether ``result`` is a smoke run (no warm-up); says so in the report."""
    if result["warmup"] == 0:
        print("  (smoke run: unwarmed single steps, not a measurement)")
        return True
    return False


def main(
    doc: str,
    run: Callable[..., dict],
    print_report: Callable[[dict], None],
    per: str,
    argv: list[str] | None = None,
) -> None:
    """The command line of either benchmark: ``run(quick, rounds, block)`` and its report."""
    parser = harness.round_parser(doc, rounds=10, block_help=f"steps per {per} per round")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, rounds=args.rounds, block=args.block)
    harness.emit(result, args.json, print_report)
