"""How ``megdet train --num-workers 2`` starts its local workers: forked against spawned.

    .venv/bin/python -m bench.worker_start                  # 3 runs of each, 2 iterations
    .venv/bin/python -m bench.worker_start --repeats 1 --iterations 1

Each run is the whole command (``python -m megdet train`` of the tiny CPU config on a small
shapes dataset, no evaluation), so the numbers are what a user waits for and pays: the parent's
imports and plan, the workers' start, their model and data, a few iterations, the exit. The two
ways take turns (spawn, fork, spawn, fork, ...) on the same machine in the same minutes. The
CLI chooses ``fork`` itself on CPU (:func:`megdet.trainer.workers.start_method`); for the spawned
runs the bench's driver replaces that choice with ``spawn`` and runs the same CLI.

Reported per way: the median wall time and the median CPU time of the command and every
process it started (user + system, from ``getrusage`` of the finished children), and the ratios
fork/spawn of both.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import children_cpu_s, emit, machine_load, scratch_dir
from megdet.cli import whole_number

METHODS = ("spawn", "fork")
#: The driver's line naming the start method torch was given.
STARTED = "megdet-bench: workers started by "
#: Runs the CLI with ``start_method`` answering ``sys.argv[1]``; the rest is ``megdet``'s argv.
#: Prints the start method torch was given, so a run that did not start its workers the way
#: it is reported under fails instead.
DRIVER = f"""\
import sys
import torch.multiprocessing as mp
from megdet.trainer import workers
method = sys.argv.pop(1)
workers.start_method = lambda use_cuda: method
start_processes = mp.start_processes
def started(*args, **kwargs):
    print({STARTED!r} + str(kwargs.get("start_method")), file=sys.stderr, flush=True)
    return start_processes(*args, **kwargs)
mp.start_processes = started
from megdet.cli import main
main(sys.argv[1:])
"""


def _command(method: str, shapes: dict[str, Path], output: Path, iterations: int) -> list[str]:
    schedule = ["SOLVER.MAX_ITER", str(iterations), "SOLVER.STEPS", "()"]
    schedule += ["SOLVER.WARMUP_ITERS", "0", "SOLVER.CHECKPOINT_PERIOD", "1000"]
    return [
        sys.executable, "-c", DRIVER, method,
        "train", "--config", "megdet_tiny_cpu", "--num-workers", "2", "--no-resume",
        "--output", str(output),
        "--train-json", str(shapes["train_json"]), "--train-images", str(shapes["train_images"]),
        *schedule,
    ]  # fmt: skip


def _one(method: str, shapes: dict[str, Path], output: Path, iterations: int) -> dict:
    cpu, start = children_cpu_s(), time.perf_counter()
    done = subprocess.run(
        _command(method, shapes, output, iterations), capture_output=True, text=True, timeout=900
    )
    wall, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode:
        raise RuntimeError(f"{method} run failed ({done.returncode}): {done.stderr[-2000:]}")
    said = [line[len(STARTED) :] for line in done.stderr.splitlines() if line.startswith(STARTED)]
    if said != [method]:
        raise RuntimeError(f"a {method} run started its workers by {said or 'nothing'}")
    return {"method": method, "started_by": said[0], "wall_s": wall, "cpu_s": cpu}


def run(repeats: int = 3, iterations: int = 2) -> dict:
    """Alternate the two ways ``repeats`` times each; every run and the medians."""
    from megdet.trainer.shapes import make_shapes

    with scratch_dir("worker-start") as tmp:
        shapes = make_shapes(Path(tmp) / "shapes", train=16, val=0, seed=0)
        runs = [
            _one(method, shapes, Path(tmp) / f"{method}-{n}", iterations)
            for n in range(repeats)
            for method in METHODS
        ]
    medians = {
        method: {
            key: statistics.median(r[key] for r in runs if r["method"] == method)
            for key in ("wall_s", "cpu_s")
        }
        for method in METHODS
    }
    ratios = {key: medians["fork"][key] / medians["spawn"][key] for key in ("wall_s", "cpu_s")}
    return {
        "repeats": repeats,
        "iterations": iterations,
        "load": machine_load(),
        "runs": runs,
        "medians": medians,
        "fork_over_spawn": ratios,
    }


def print_report(result: dict) -> None:
    print(
        f"megdet train --num-workers 2, {result['iterations']} iterations, "
        f"{result['repeats']} runs each way (load {result['load']})"
    )
    for r in result["runs"]:
        print(f"  {r['method']:5s}  wall {r['wall_s']:6.1f} s  cpu {r['cpu_s']:6.1f} s")
    for method, m in result["medians"].items():
        print(f"median {method:5s}  wall {m['wall_s']:6.1f} s  cpu {m['cpu_s']:6.1f} s")
    ratio = result["fork_over_spawn"]
    print(f"fork / spawn: wall {ratio['wall_s']:.2f}, cpu {ratio['cpu_s']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_start", description=__doc__)
    parser.add_argument("--repeats", type=whole_number(1), default=3, help="runs of each way (3)")
    parser.add_argument(
        "--iterations", type=whole_number(1), default=2, help="training iterations per run (2)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead")
    args = parser.parse_args(argv)
    emit(run(args.repeats, args.iterations), args.json, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
