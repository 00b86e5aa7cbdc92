"""GPU training throughput: R50-FPN Faster R-CNN at COCO resolution, per SyncBN scope, AMP on/off.

Each configuration (scope none / backbone / all x AMP off / on) is the model ``megdet train``
builds from ``megdet_R50_FPN_1x`` (``build_megdet_model``: SyncBN in the scope, then DDP; random
init, no weights download) driven by the trainer's ``MegDetTrainer.run_step`` on synthetic
800x1333 images with random boxes (no dataset). All configurations are built first, then take
turns in blocks of steps for several rounds (order rotated), so drift hits all alike. Timing:
``torch.cuda.synchronize()`` around each block. Printed: seconds per step and images/s per GPU.

    python -m bench.gpu_step                       # 1 GPU (world 1)
    python -m bench.gpu_step --num-gpus 8          # 8 local GPUs, spawned (NCCL)
    torchrun --nproc-per-node 8 -m bench.gpu_step  # or under torchrun / a PyTorchJob
    python -m bench.gpu_step --device cpu --tiny   # smoke run on CPU: tiny model, 2 steps

At world 1 the trainer converts no BN layer (there is no one to synchronize with), so the three
scopes run the same model there and their spread is the measurement noise. detectron2's own
``SimpleTrainer`` / ``AMPTrainer`` also runs on the same model at one scope (``--compare-scope``):
the overhead of our loop on a GPU. No CUDA device: exit code 2 with a message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness

SCOPES = ("none", "backbone", "all")


def synthetic_batches(
    count: int, images: int, height: int, width: int, classes: int, seed: int
) -> list[list[dict[str, Any]]]:
    """``count`` batches of detectron2 training inputs: random pixels and 1-8 random boxes."""
    import torch
    from detectron2.structures import Boxes, Instances

    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        batch = []
        for _ in range(images):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            wh = torch.rand(n, 2, generator=gen) * torch.tensor([width / 2, height / 2]) + 16
            xy = torch.rand(n, 2, generator=gen) * (torch.tensor([width, height]) - wh)
            instances = Instances((height, width))
            instances.gt_boxes = Boxes(torch.cat([xy, xy + wh], dim=1))
            instances.gt_classes = torch.randint(0, classes, (n,), generator=gen)
            image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=gen)
            batch.append({"image": image, "height": height, "width": width, "instances": instances})
        batches.append(batch)
    return batches


def _cycle(batches: list) -> Any:
    while True:
        yield from batches


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _detectron2_trainer(model, data, optimizer, amp: bool):
    """detectron2's bare loop: ``SimpleTrainer``, or ``AMPTrainer`` for mixed precision."""
    import torch
    from detectron2.engine import AMPTrainer, SimpleTrainer

    if amp:
        return AMPTrainer(model, data, optimizer, grad_scaler=torch.amp.GradScaler("cuda"))
    return SimpleTrainer(model, data, optimizer)


def gpu_worker(opts: dict[str, Any]) -> dict[str, Any]:
    """One rank: build every configuration, then interleave blocks of training steps."""
    import torch
    from detectron2.solver import build_optimizer
    from detectron2.utils import comm

    from megdet.trainer.config import plan_config
    from megdet.trainer.engine import MegDetTrainer, build_megdet_model, wrap_ddp
    from megdet.trainer.sync_bn import build_bn_process_group

    device = opts["device"]
    world = comm.get_world_size()
    base = harness.load_bench_config(opts["config"], tuple(opts["overrides"]), opts["output"])
    plan_config(base, world, comm.get_local_size())  # the LR of this world, as a run has it
    images = base.MEGDET.IMAGES_PER_GPU
    batches = synthetic_batches(
        4, images, opts["height"], opts["width"], base.MODEL.ROI_HEADS.NUM_CLASSES, comm.get_rank()
    )
    runs: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    for scope in SCOPES:
        for amp in opts["amp"]:
            cfg = base.clone()
            cfg.MEGDET.SYNC_BN = scope
            cfg.MEGDET.AMP = amp
            torch.manual_seed(0)
            model, converted = build_megdet_model(
                cfg, build_bn_process_group(cfg.MEGDET.BN_GROUP_SIZE)
            )
            optimizer = build_optimizer(cfg, model)
            model = wrap_ddp(model)
            scaler = torch.amp.GradScaler("cuda") if amp else None
            trainer = MegDetTrainer(model, _cycle(batches), optimizer, 1, scaler)
            suffix = f"{scope}/amp-{'on' if amp else 'off'}"
            name = f"megdet/{suffix}"
            runs[name] = harness.prepare(trainer, max_iter=10**9)
            row = {"trainer": "megdet", "scope": scope, "amp": amp}
            facts[name] = {**row, "sync_bn_layers": len(converted)}
            if scope == opts["compare_scope"]:
                # detectron2's own loop on the same model: the overhead of our run_step.
                d2 = _detectron2_trainer(model, _cycle(batches), optimizer, amp)
                runs[f"detectron2/{suffix}"] = harness.prepare(d2, max_iter=10**9)
                facts[f"detectron2/{suffix}"] = {**facts[name], "trainer": "detectron2"}
    for driven in runs.values():
        harness.step_block(driven, opts["warmup"])
    _sync(device)
    blocks: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(opts["rounds"]):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _sync(device)
            start = time.perf_counter()
            harness.step_block(runs[name], opts["block"])
            _sync(device)
            blocks[name].append((time.perf_counter() - start) / opts["block"])
    rows = []
    for name in names:
        step = harness.spread(blocks[name])
        rows.append(
            {
                **facts[name],
                "step_s": step,
                "images_per_s_per_gpu": images / step["median"],
            }
        )
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "world_size": world,
        "images_per_gpu": images,
        "image_size": [opts["height"], opts["width"]],
        "config": opts["config"],
        "rounds": opts["rounds"],
        "block": opts["block"],
        "warmup": opts["warmup"],
        "torch": torch.__version__,
        "rows": rows,
    }


def print_report(result: dict[str, Any]) -> None:
    print(
        f"GPU step: {result['config']} on {result['world_size']} x {result['device']}, "
        f"{result['images_per_gpu']} images of {result['image_size'][0]}x"
        f"{result['image_size'][1]} per GPU per step; {result['rounds']} rounds x "
        f"{result['block']} steps after {result['warmup']} warm-up; torch {result['torch']}"
    )
    base = {
        r["amp"]: r["step_s"]["median"]
        for r in result["rows"]
        if r["scope"] == "none" and r["trainer"] == "megdet"
    }
    print(
        f"  {'trainer':<10} {'scope':<9} {'AMP':<4} {'BN synced':>9} {'s/step':>8} "
        f"{'images/s/GPU':>13} {'vs megdet none':>15}"
    )
    for r in result["rows"]:
        median = r["step_s"]["median"]
        print(
            f"  {r['trainer']:<10} {r['scope']:<9} {'on' if r['amp'] else 'off':<4} "
            f"{r['sync_bn_layers']:>9} {median:>8.4f} {r['images_per_s_per_gpu']:>13.2f} "
            f"{median / base[r['amp']]:>15.3f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny CPU model, 128 px, 2 steps")
    parser.add_argument("--num-gpus", type=int, default=1, help="local GPUs to spawn on")
    parser.add_argument("--images-per-gpu", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=10, help="steps per configuration per round")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--amp", choices=("both", "on", "off"), default="both")
    parser.add_argument(
        "--normed-heads", action="store_true", help="BN in the FPN and a 4conv1fc box head"
    )
    parser.add_argument(
        "--compare-scope",
        choices=(*SCOPES, "off"),
        default="backbone",
        help="scope at which detectron2's own trainer also runs on the same model",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser.parse_args(argv)


def options(args: argparse.Namespace, output: str) -> dict[str, Any]:
    """The worker's options from the command line (CUDA checked already)."""
    amp = {"both": [False, True], "on": [True], "off": [False]}[args.amp]
    if args.tiny:
        config, height, width = "megdet_tiny_cpu", 128, 128
        overrides = ["MODEL.DEVICE", args.device]
        heads = harness.TINY_NORMED_HEADS
        rounds, block, warmup = 1, 2, 0
    else:
        config, height, width = "megdet_R50_FPN_1x", 800, 1333
        overrides = ["MODEL.WEIGHTS", "", "MODEL.DEVICE", args.device]
        heads = harness.NORMED_HEADS
        rounds, block, warmup = args.rounds, args.block, args.warmup
    overrides += ["MEGDET.IMAGES_PER_GPU", str(args.images_per_gpu)]
    overrides += ["MEGDET.DATA.TRAIN_JSON", "", "MEGDET.DATA.VAL_JSON", ""]
    if args.normed_heads:
        overrides += list(heads)
    if args.device == "cpu":
        amp = [False]  # the trainer's mixed precision is CUDA-only
    return {
        "config": config,
        "overrides": overrides,
        "output": output,
        "device": args.device,
        "height": height,
        "width": width,
        "amp": amp,
        "rounds": rounds,
        "block": block,
        "warmup": warmup,
        "compare_scope": args.compare_scope,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_step: error: no CUDA device is available (torch.cuda.is_available() is False). "
            "Run it on a GPU machine, or use --device cpu --tiny for a CPU smoke run.",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu" and not args.tiny:
        print(
            "gpu_step: error: --device cpu needs --tiny (R50 at 800x1333 on a CPU takes hours)",
            file=sys.stderr,
        )
        return 2
    if args.device == "cuda" and args.num_gpus > torch.cuda.device_count():
        print(
            f"gpu_step: error: --num-gpus {args.num_gpus}: only {torch.cuda.device_count()} "
            "CUDA device(s) visible",
            file=sys.stderr,
        )
        return 2
    with harness.scratch_dir("gpu") as tmp:
        result = harness.run_world(
            args.num_gpus, gpu_worker, options(args, tmp), use_cuda=args.device == "cuda"
        )
    if result is None:  # not rank 0 under torchrun: rank 0 reports
        return 0
    print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
