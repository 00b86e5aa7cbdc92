"""`megdet demo`: shapes dataset, 2 CPU workers with backbone SyncBN, evaluation, a report.

The demo is `megdet train` on the tiny CPU config plus what a user wants to see afterwards:
the plan, the loss going down, the final AP, and a PNG of the loss and learning-rate curves.
Re-running it with the same output folder resumes (or, when finished, re-evaluates).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

DEMO_WORKERS = 2
DEMO_CONFIG = "megdet_tiny_cpu.yaml"
CURVES_FILE = "curves.png"


def read_events(path: Path) -> list[dict[str, Any]]:
    """detectron2's JSON-lines events; a resumed run's repeated iterations keep the last."""
    by_iter: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if "iteration" in event:
            by_iter.setdefault(event["iteration"], {}).update(event)
    return [by_iter[k] for k in sorted(by_iter)]


def plot_curves(events: list[dict[str, Any]], path: Path) -> Path:
    """Total loss and learning rate against iteration, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loss = [(e["iteration"], e["total_loss"]) for e in events if "total_loss" in e]
    lr = [(e["iteration"], e["lr"]) for e in events if "lr" in e]
    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_loss.plot(*zip(*loss, strict=True), color="tab:blue")
    ax_loss.set_ylabel("total loss (median of 20 iters)")
    ax_loss.grid(alpha=0.3)
    ax_lr.plot(*zip(*lr, strict=True), color="tab:orange")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("iteration")
    ax_lr.grid(alpha=0.3)
    fig.suptitle("megdet demo: 2 CPU workers, backbone SyncBN")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def train_demo(output: Path) -> int:
    """Run the demo into ``output``; returns the exit code."""
    from megdet.cli import UsageError
    from megdet.trainer.config import ConfigError, load_config, plan_config
    from megdet.trainer.engine import EVENTS_FILE
    from megdet.trainer.evaluation import METRICS_FILE
    from megdet.trainer.report import REPORT_HTML, REPORT_JSON
    from megdet.trainer.shapes import make_shapes
    from megdet.trainer.train import WorkerTask, train_worker
    from megdet.trainer.workers import run_workers, start_method

    started = time.perf_counter()
    output.mkdir(parents=True, exist_ok=True)
    data_dir = output / "shapes"
    if not (data_dir / "val.json").is_file():
        print(f"Writing the shapes dataset to {data_dir} ...", flush=True)
    paths = make_shapes(data_dir, train=256, val=32, seed=0)
    overrides = [
        "MEGDET.DATA.TRAIN_JSON", str(paths["train_json"]),
        "MEGDET.DATA.TRAIN_IMAGES", str(paths["train_images"]),
        "MEGDET.DATA.VAL_JSON", str(paths["val_json"]),
        "MEGDET.DATA.VAL_IMAGES", str(paths["val_images"]),
        "OUTPUT_DIR", str(output),
    ]  # fmt: skip
    try:
        cfg = load_config(DEMO_CONFIG, overrides)
        plan = plan_config(cfg.clone(), DEMO_WORKERS, DEMO_WORKERS)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    print("The plan for 2 CPU workers (megdet.plan):")
    for key, value in plan.summary().items():
        print(f"  {key}: {value}")
    print(f"Training {plan.max_iter} iterations with {DEMO_WORKERS} gloo workers ...", flush=True)
    # Nothing above ran a tensor op or started a thread: the workers may be forked.
    code = run_workers(train_worker, WorkerTask(cfg=cfg), DEMO_WORKERS, False, start_method(False))
    if code:
        return code

    events = read_events(output / EVENTS_FILE)
    losses = [(e["iteration"], e["total_loss"]) for e in events if "total_loss" in e]
    print("\nLoss going down (total loss, median of the last 20 iterations):")
    shown = losses[:: max(1, len(losses) // 8)] + losses[-1:]
    for iteration, loss in dict(shown).items():
        print(f"  iter {iteration + 1:5d}: {loss:.3f}")
    curves = plot_curves(events, output / CURVES_FILE)
    metrics = json.loads((output / METRICS_FILE).read_text())
    box = metrics["bbox"]
    print("\nFinal box AP on the 32 validation images (pycocotools, percent):")
    print("  " + "  ".join(f"{k} {v:.1f}" if v is not None else f"{k} n/a" for k, v in box.items()))
    print(f"\nOutputs in {output}: {METRICS_FILE}, {CURVES_FILE}, {REPORT_HTML}, {REPORT_JSON},")
    print(f"  config.yaml, plan.json, {EVENTS_FILE}, log.txt, model_final.pth  "
          f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    print(f"Curves: {curves}")
    print(f"Report: {output / REPORT_HTML} (a browser opens it), or `megdet report {output}`")
    return 0
