"""Training on cores that are already taken: torch's default of a thread per core against one.

    .venv/bin/python -m bench.busy_threads                   # 2 rounds, 20 iterations a run
    .venv/bin/python -m bench.busy_threads --rounds 1 --iterations 4

`make test` runs three pytest-xdist workers and the real node's pods on two cores, so whatever a
test trains shares cores that are never free. This bench makes that situation on purpose: two
one-process ``megdet train`` runs of the tiny CPU config side by side, each with as many intra-op
threads as the machine has cores (torch's default), then the same pair at one thread each
(``OMP_NUM_THREADS``, which tests/conftest.py sets for the suite); the two ways take turns.
Each run's driver prints the threads torch trains with, so a run that did not get them fails
instead of being reported under the wrong way.

Reported per way: each run's seconds per iteration (detectron2's "Overall training speed"
line), the pair's wall time and its CPU time (user + system of both processes, from
``getrusage`` of the finished children), the medians, and the ratios one thread / default.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import children_cpu_s, emit, machine_load, scratch_dir
from megdet.cli import whole_number

#: The driver's line naming the intra-op threads torch trains with.
THREADS = "megdet-bench: torch threads "
DRIVER = f"""\
import sys
import torch
print({THREADS!r} + str(torch.get_num_threads()), file=sys.stderr, flush=True)
from megdet.cli import main
main(sys.argv[1:])
"""
#: detectron2's last line of a training run: "... (0.7156 s / it)". Its IterationTimer leaves
#: out the first iterations, and writes no such line for a run of fewer than MIN_ITERATIONS.
SPEED = re.compile(r"Overall training speed: .*\(([0-9.]+) s / it\)")
MIN_ITERATIONS = 4
#: Runs side by side.
PAIR = 2


def ways() -> dict[str, int]:
    """The two ways: torch's default (a thread per core) and one thread."""
    return {"default": os.cpu_count() or 1, "one": 1}


def thread_env(threads: int) -> dict[str, str]:
    """This process's environment with torch's default intra-op threads set to ``threads``."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


def _command(shapes: dict[str, Path], output: Path, iterations: int) -> list[str]:
    schedule = ["SOLVER.MAX_ITER", str(iterations), "SOLVER.STEPS", "()"]
    schedule += ["SOLVER.WARMUP_ITERS", "0", "SOLVER.CHECKPOINT_PERIOD", "100000"]
    return [
        sys.executable, "-c", DRIVER,
        "train", "--config", "megdet_tiny_cpu", "--no-resume", "--output", str(output),
        "--train-json", str(shapes["train_json"]), "--train-images", str(shapes["train_images"]),
        *schedule,
    ]  # fmt: skip


def _pair(
    way: str, threads: int, shapes: dict[str, Path], folder: Path, iterations: int, pair: int
) -> dict:
    """``pair`` runs of ``threads`` threads side by side; their speeds, the pair's wall and
    CPU."""
    env = thread_env(threads)
    outputs = [folder / f"{way}-{n}" for n in range(pair)]
    cpu, start = children_cpu_s(), time.perf_counter()
    command = [_command(shapes, out, iterations) for out in outputs]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        for cmd in command
    ]
    stderr = [proc.communicate(timeout=1800)[1] for proc in procs]
    wall, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    speeds = []
    for proc, err, out in zip(procs, stderr, outputs, strict=True):
        if proc.returncode:
            raise RuntimeError(f"a {way} run failed ({proc.returncode}): {err[-2000:]}")
        said = [line[len(THREADS) :] for line in err.splitlines() if line.startswith(THREADS)]
        if said != [str(threads)]:
            raise RuntimeError(f"a {way} run trained on {said or 'no'} threads, not {threads}")
        found = SPEED.search((out / "log.txt").read_text())
        if not found:
            raise RuntimeError(f"{out / 'log.txt'}: no 'Overall training speed' line")
        speeds.append(float(found.group(1)))
    return {"way": way, "threads": threads, "s_per_iter": speeds, "wall_s": wall, "cpu_s": cpu}


def run(rounds: int = 2, iterations: int = 20, pair: int = PAIR) -> dict:
    """``rounds`` pairs of each way, taking turns; every pair and the medians. ``pair``: the
    runs side by side (1 makes it a smoke run of each way, not the measurement)."""
    from megdet.trainer.shapes import make_shapes

    chosen = ways()
    with scratch_dir("busy-threads") as tmp:
        shapes = make_shapes(Path(tmp) / "shapes", train=16, val=0, seed=0)
        pairs = [
            _pair(way, threads, shapes, Path(tmp) / f"round{n}", iterations, pair)
            for n in range(rounds)
            for way, threads in chosen.items()
        ]
    medians = {}
    for way in chosen:
        mine = [p for p in pairs if p["way"] == way]
        medians[way] = {
            "s_per_iter": statistics.median(s for p in mine for s in p["s_per_iter"]),
            "wall_s": statistics.median(p["wall_s"] for p in mine),
            "cpu_s": statistics.median(p["cpu_s"] for p in mine),
        }
    ratios = (
        {key: medians["one"][key] / medians["default"][key] for key in medians["one"]}
        if {"one", "default"} <= set(medians)
        else {}
    )
    return {
        "rounds": rounds,
        "iterations": iterations,
        "pair": pair,
        "cores": os.cpu_count(),
        "threads": chosen,
        "load": machine_load(),
        "pairs": pairs,
        "medians": medians,
        "one_over_default": ratios,
    }


def print_report(result: dict) -> None:
    print(
        f"{result['pair']} one-process megdet train runs side by side on {result['cores']} cores, "
        f"{result['iterations']} iterations each, {result['rounds']} rounds (load {result['load']})"
    )
    for p in result["pairs"]:
        speeds = ", ".join(f"{s:.2f}" for s in p["s_per_iter"])
        print(
            f"  {p['way']:7s} ({p['threads']} threads)  s/it {speeds}  "
            f"pair wall {p['wall_s']:6.1f} s  cpu {p['cpu_s']:6.1f} s"
        )
    for way, m in result["medians"].items():
        print(
            f"median {way:7s}  s/it {m['s_per_iter']:.2f}  wall {m['wall_s']:6.1f} s  "
            f"cpu {m['cpu_s']:6.1f} s"
        )
    if r := result["one_over_default"]:
        print(
            f"one / default: s/it {r['s_per_iter']:.2f}, wall {r['wall_s']:.2f}, "
            f"cpu {r['cpu_s']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.busy_threads", description=__doc__)
    parser.add_argument("--rounds", type=whole_number(1), default=2, help="pairs of each way (2)")
    parser.add_argument(
        "--iterations",
        type=whole_number(MIN_ITERATIONS),
        default=20,
        help=f"training iterations per run (20, at least {MIN_ITERATIONS})",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead")
    args = parser.parse_args(argv)
    emit(run(args.rounds, args.iterations), args.json, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
