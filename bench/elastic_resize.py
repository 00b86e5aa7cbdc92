"""What a resize costs a run on CPU, and a picture of a resized run against wall time.

A seeded run of the tiny detector is trained with real ``megdet train`` processes twice: once on
2 workers from start to end, once 2 -> 1 -> 2 workers (SIGTERM after a checkpoint, as the kubelet
stops a pod, then the same command on another number of workers). For each resize the
benchmark times its parts:

- ``stop``: SIGTERM to the process's exit (the workers finish their step, save a checkpoint
  and exit 143);
- ``start``: the new command's launch to its first training iteration (Python and torch
  imports, the plan, the model, the checkpoint read, the data loader), from the log's
  timestamps (whole seconds);
- ``lost``: images trained before the SIGTERM that the next segment trains again (none when
  the checkpoint is the SIGTERM's own).

It writes the learning rate and the images seen against wall time (``--plot PNG``), with the
segments the run's plan.json records. The numbers are in docs/benchmarks.md.

    .venv/bin/python -m bench.elastic_resize [--max-iter 40] [--plot docs/img/elastic-resize.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import machine_load, make_dataset, scratch_dir
from megdet.plan import plan_continuation

#: log.txt's timestamp, logger and level (detectron2's file format), and its iteration lines.
_STAMP = re.compile(r"^\[(\d\d/\d\d \d\d:\d\d:\d\d)\] ([\w.]+) (\w+): (.*)$")
_ITER = re.compile(r"\biter: (\d+)\b")


def _command(data: dict[str, str], out: Path, workers: int, max_iter: int) -> list[str]:
    steps = f"({int(max_iter * 0.75)}, {int(max_iter * 0.875)})"
    return [
        sys.executable, "-m", "megdet", "train", "--config", "megdet_tiny_cpu",
        "--num-workers", str(workers), "--output", str(out),
        "--train-json", data["train_json"], "--train-images", data["train_images"],
        "SOLVER.MAX_ITER", str(max_iter), "SOLVER.STEPS", steps,
        "SOLVER.WARMUP_ITERS", str(max_iter // 4), "SOLVER.CHECKPOINT_PERIOD", "10", "SEED", "3",
    ]  # fmt: skip


def _attempt(cmd: list[str], out: Path, stop_at: str | None) -> dict[str, float]:
    """One ``megdet train``; with ``stop_at``, SIGTERM once that checkpoint exists."""
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sent = None
    try:
        while stop_at is not None and not (out / stop_at).exists():
            if proc.poll() is not None:
                raise SystemExit(f"elastic_resize: training ended early:\n{proc.stderr.read()}")
            time.sleep(0.1)
        if stop_at is not None:
            sent = time.time()
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != (143 if stop_at else 0):
        raise SystemExit(f"elastic_resize: exit {proc.returncode}:\n{stderr[-3000:]}")
    ended = time.time()
    return {"launched": launched, "sigterm": sent or ended, "ended": ended}


def _log_events(out: Path) -> list[tuple[float, str]]:
    """(epoch seconds, message) of each rank-0 log line, the year taken from now."""
    year = datetime.now().year
    events = []
    for line in (out / "log.txt").read_text().splitlines():
        match = _STAMP.match(line)
        if match:
            stamp = datetime.strptime(f"{year}/{match.group(1)}", "%Y/%m/%d %H:%M:%S")
            events.append((stamp.timestamp(), match.group(4)))
    return events


def _points(out: Path) -> list[tuple[float, int]]:
    """(wall time, iteration) where the log places them: each segment's first iteration and
    detectron2's periodic ``iter:`` lines, in each segment's own iteration count."""
    points, segment = [], -1
    for stamp, message in _log_events(out):
        if message.startswith("Starting training from iteration"):
            segment += 1
            points.append((stamp, segment, int(message.rsplit(" ", 1)[1])))
        elif segment >= 0 and (match := _ITER.search(message)):
            points.append((stamp, segment, int(match.group(1)) + 1))
    return points


def _segment_plans(out: Path, recipe: dict[str, Any]) -> list:
    segments = json.loads((out / "plan.json").read_text())["segments"]
    plans, batch = [], None
    for seg in segments:
        plans.append(
            plan_continuation(
                {**recipe, "gpus": seg["world_size"]}, seg["images_start"], run_batch=batch
            )
        )
        batch = batch or seg["global_batch"]
    return plans


def run(max_iter: int = 40, plot: str | None = None) -> dict[str, Any]:
    recipe = {"images_per_gpu": 4, "reference_batch": 8, "base_lr": 0.01, "max_iter": max_iter}
    recipe |= {
        "steps": (int(max_iter * 0.75), int(max_iter * 0.875)),
        "warmup_iters": max_iter // 4,
    }
    with scratch_dir("elastic") as tmp:
        data = make_dataset(Path(tmp) / "data")
        fixed_out, resized_out = Path(tmp) / "fixed", Path(tmp) / "resized"
        fixed = _attempt(_command(data, fixed_out, 2, max_iter), fixed_out, None)
        attempts = []
        for workers, stop_at in ((2, "model_0000009.pth"), (1, "model_0000019.pth"), (2, None)):
            cmd = _command(data, resized_out, workers, max_iter)
            attempts.append(_attempt(cmd, resized_out, stop_at))
        starts = [s for s, m in _log_events(resized_out) if m.startswith("Starting training")]
        segments = json.loads((resized_out / "plan.json").read_text())["segments"]
        resizes = []
        for n in (1, 2):
            before, after = attempts[n - 1], attempts[n]
            stopped = segments[n - 1]
            resizes.append(
                {
                    "from": segments[n - 1]["world_size"],
                    "to": segments[n]["world_size"],
                    "stop_s": before["ended"] - before["sigterm"],
                    "start_s": starts[n] - after["launched"],
                    "lost_images": stopped["images_end"] - segments[n]["images_start"],
                }
            )
        result = {
            "max_iter": max_iter,
            "fixed_s": fixed["ended"] - fixed["launched"],
            "resized_s": attempts[-1]["ended"] - attempts[0]["launched"],
            "resizes": resizes,
            "segments": segments,
            "load": machine_load(),
        }
        if plot:
            _plot(resized_out, recipe, attempts[0]["launched"], Path(plot))
            result["plot"] = plot
    return result


def _plot(out: Path, recipe: dict[str, Any], t0: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plans = _segment_plans(out, recipe)
    fig, (lr_ax, img_ax) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True)
    by_segment: dict[int, list[tuple[float, int]]] = {}
    for stamp, segment, iteration in _points(out):
        by_segment.setdefault(segment, []).append((stamp - t0, iteration))
    for segment, points in sorted(by_segment.items()):
        plan = plans[segment]
        label = f"{plan.world_size} worker(s), batch {plan.global_batch}"
        times = [t for t, _ in points]
        img_ax.plot(times, [plan.images_at(i) for _, i in points], marker="o", label=label)
        # The LR between logged points, iteration by iteration, placed by linear time.
        for (ta, ia), (tb, ib) in itertools.pairwise(points):
            its = list(range(ia, max(ia + 1, ib)))
            ts = [ta + (tb - ta) * (i - ia) / max(1, ib - ia) for i in its]
            lr_ax.step(ts, [plan.lr_at(i) for i in its], where="post", color=f"C{segment}")
    lr_ax.set_ylabel("learning rate")
    img_ax.set_ylabel("images seen")
    img_ax.set_xlabel("wall time (s)")
    img_ax.legend(loc="lower right", fontsize="small")
    lr_ax.set_title("a run resized 2 -> 1 -> 2 workers (keep-batch), tiny detector on CPU")
    for ax in (lr_ax, img_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def print_report(result: dict[str, Any]) -> None:
    print(f"elastic_resize: {result['max_iter']} iterations of batch 8, load {result['load']}")
    fixed, resized = result["fixed_s"], result["resized_s"]
    print(f"  fixed 2 workers: {fixed:.1f} s; resized 2 -> 1 -> 2: {resized:.1f} s")
    print(f"  ratio resized / fixed: {resized / fixed:.2f}")
    for r in result["resizes"]:
        print(
            f"  {r['from']} -> {r['to']} workers: stop (SIGTERM to exit, checkpoint included) "
            f"{r['stop_s']:.1f} s; start (launch to first iteration) {r['start_s']:.0f} s; "
            f"images trained again {r['lost_images']}"
        )
    print_segments(result["segments"])
    if "plot" in result:
        print(f"  plot: {result['plot']}")


def print_segments(segments: list[dict[str, Any]]) -> None:
    """The run's segments as plan.json records them, one line each."""
    for s in segments:
        print(
            f"  segment: {s['world_size']} workers, batch {s['global_batch']} "
            f"(accumulation {s['accumulation_steps']}), iterations {s['first_iter']}-"
            f"{s['last_iter']}, images {s['images_start']}-{s['images_end']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-iter", type=int, default=40, help="reference iterations (>= 30)")
    parser.add_argument("--plot", metavar="PNG", help="write LR and images against wall time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.max_iter < 30:
        parser.error("--max-iter: must be >= 30 (the run stops after checkpoints 9 and 19)")
    result = run(args.max_iter, args.plot)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
