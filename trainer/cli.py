"""`megdet train`, `megdet eval`, `megdet make-shapes` and `megdet demo`.

``register`` only adds parsers (no torch import), so `megdet --help` stays fast and works
without the ``[train]`` extra; the handlers import the training stack.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from megdet.cli import whole_number

SHIPPED_CONFIGS = ("megdet_R50_FPN_1x.yaml", "megdet_tiny_cpu.yaml")


_positive = whole_number(1)
_non_negative = whole_number(0)


def _add_data_flags(parser: argparse.ArgumentParser, train: bool) -> None:
    if train:
        parser.add_argument("--train-json", help="COCO annotation JSON (MEGDET.DATA.TRAIN_JSON)")
        parser.add_argument("--train-images", help="image folder (MEGDET.DATA.TRAIN_IMAGES)")
    parser.add_argument("--val-json", help="COCO annotation JSON (MEGDET.DATA.VAL_JSON)")
    parser.add_argument("--val-images", help="image folder (MEGDET.DATA.VAL_IMAGES)")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help=f"a config YAML path or a shipped config name ({', '.join(SHIPPED_CONFIGS)})",
    )
    parser.add_argument("--output", help="output folder (OUTPUT_DIR); default from the config")
    parser.add_argument(
        "opts",
        nargs=argparse.REMAINDER,
        metavar="KEY VALUE",
        help="config overrides, e.g. MEGDET.SYNC_BN all SOLVER.MAX_ITER 1000 (put them last)",
    )


def register(subparsers: Any) -> None:
    """Add the trainer's subcommands to the `megdet` parser."""
    train = subparsers.add_parser(
        "train",
        help="train a detector (spawns local workers, or runs as one torchrun rank)",
        description="Train with partial SyncBN and the LR planned for the actual world size. "
        "Resumes from the last complete checkpoint in the output folder. Exit codes: 0 done, "
        "1 failed, 2 bad input, 143 stopped by SIGTERM after saving a checkpoint.",
    )
    _add_config_flags(train)
    train.add_argument(
        "--num-workers",
        type=_positive,
        default=1,
        help="worker processes to spawn on this machine (gloo on CPU, NCCL on GPUs); "
        "ignored under torchrun, which starts the workers itself",
    )
    _add_data_flags(train, train=True)
    train.add_argument(
        "--no-resume", action="store_true", help="start from iteration 0 even if checkpoints exist"
    )
    train.set_defaults(handler=run_train)

    ev = subparsers.add_parser("eval", help="evaluate weights with the COCO evaluator")
    _add_config_flags(ev)
    ev.add_argument("--weights", required=True, help="a checkpoint (.pth) to evaluate")
    _add_data_flags(ev, train=False)
    ev.set_defaults(handler=run_eval)

    shapes = subparsers.add_parser(
        "make-shapes", help="write a synthetic COCO dataset of simple shapes"
    )
    shapes.add_argument("--out", required=True, help="folder to write the dataset into")
    shapes.add_argument("--train", type=_positive, default=256, help="training images (256)")
    shapes.add_argument("--val", type=_non_negative, default=32, help="validation images (32)")
    shapes.add_argument("--seed", type=_non_negative, default=0, help="random seed (0)")
    shapes.set_defaults(handler=run_make_shapes)

    demo = subparsers.add_parser(
        "demo", help="train a small detector on 2 CPU workers on shapes and show that it learned"
    )
    demo.add_argument("--output", default="output/demo", help="output folder (output/demo)")
    demo.set_defaults(handler=run_demo)


def _load(args: argparse.Namespace, command: str):
    """The config with flags applied, or UsageError naming the key."""
    from megdet.cli import UsageError
    from megdet.trainer.config import ConfigError, load_config

    overrides = list(args.opts or [])
    for flag, key in (
        ("train_json", "MEGDET.DATA.TRAIN_JSON"),
        ("train_images", "MEGDET.DATA.TRAIN_IMAGES"),
        ("val_json", "MEGDET.DATA.VAL_JSON"),
        ("val_images", "MEGDET.DATA.VAL_IMAGES"),
        ("output", "OUTPUT_DIR"),
    ):
        value = getattr(args, flag, None)
        if value:
            overrides += [key, str(value)]
    try:
        cfg = load_config(args.config, overrides)
        _check_environment(cfg)
        _check_data(cfg, need_train=command == "train")
    except ConfigError as err:
        raise UsageError(str(err)) from None
    return cfg


def _check_environment(cfg) -> None:
    import torch

    from megdet.trainer.config import ConfigError

    on_cuda = cfg.MODEL.DEVICE.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        raise ConfigError(
            f"MODEL.DEVICE: {cfg.MODEL.DEVICE!r} but no CUDA device is available; "
            "use MODEL.DEVICE cpu (allowed: cpu, cuda)"
        )
    if cfg.MEGDET.AMP and not on_cuda:
        raise ConfigError("MEGDET.AMP: True needs MODEL.DEVICE cuda (mixed precision is CUDA-only)")


def _check_data(cfg, need_train: bool) -> None:
    from megdet.trainer.config import ConfigError

    data = cfg.MEGDET.DATA
    pairs = [("VAL_JSON", "VAL_IMAGES")]
    if need_train:
        pairs.insert(0, ("TRAIN_JSON", "TRAIN_IMAGES"))
        if not data.TRAIN_JSON and not cfg.DATASETS.TRAIN:
            raise ConfigError("MEGDET.DATA.TRAIN_JSON: required (or --train-json)")
    for json_key, images_key in pairs:
        json_file, images = data[json_key], data[images_key]
        if not json_file:
            continue
        if not Path(json_file).is_file():
            raise ConfigError(
                f"MEGDET.DATA.{json_key}: {json_file} does not exist or is not a file"
            )
        if not images or not Path(images).is_dir():
            raise ConfigError(f"MEGDET.DATA.{images_key}: {images!r} is not a folder")


def _check_launch_env() -> None:
    """Refuse an operator's pod env without torchrun (it would give the wrong world)."""
    from megdet.cli import UsageError
    from megdet.trainer.workers import bare_pod_problem

    problem = bare_pod_problem()
    if problem:
        raise UsageError(problem)


def _world(num_workers: int) -> tuple[int, int]:
    from megdet.cli import UsageError
    from megdet.trainer.workers import env_world, in_torchrun

    _check_launch_env()
    if in_torchrun():
        if num_workers > 1:
            raise UsageError(
                "--num-workers: not allowed under torchrun (WORLD_SIZE is set); torchrun "
                "already started one process per worker"
            )
        return env_world()
    return num_workers, num_workers


def _preflight(cfg, world: int, local: int) -> None:
    """Plan once before starting workers so a bad recipe is exit 2, not N worker crashes."""
    import torch

    from megdet.cli import UsageError
    from megdet.trainer.config import ConfigError, plan_config

    try:
        plan_config(cfg.clone(), world, local)
        size = cfg.MEGDET.BN_GROUP_SIZE
        if size and world % size:
            raise ConfigError(
                f"MEGDET.BN_GROUP_SIZE: {size} must be 0 (the whole world) or divide the "
                f"world size {world}"
            )
    except ConfigError as err:
        raise UsageError(str(err)) from None
    if cfg.MODEL.DEVICE.startswith("cuda") and local > torch.cuda.device_count():
        raise UsageError(
            f"--num-workers: {local} workers but only {torch.cuda.device_count()} GPUs here"
        )


def run_train(args: argparse.Namespace) -> int:
    from megdet.trainer.train import WorkerTask, train_worker
    from megdet.trainer.workers import run_workers, start_method

    cfg = _load(args, "train")
    world, local = _world(args.num_workers)
    _preflight(cfg, world, local)
    task = WorkerTask(cfg=cfg, resume=not args.no_resume, command="train")
    use_cuda = cfg.MODEL.DEVICE.startswith("cuda")
    # Nothing above ran a tensor op or started a thread: the workers may be forked.
    return run_workers(train_worker, task, args.num_workers, use_cuda, start_method(use_cuda))


def run_eval(args: argparse.Namespace) -> int:
    from megdet.cli import UsageError
    from megdet.trainer.config import weights_problem
    from megdet.trainer.train import WorkerTask, eval_worker
    from megdet.trainer.workers import run_workers

    if not Path(args.weights).is_file():
        raise UsageError(f"--weights: {args.weights} does not exist or is not a file")
    _check_launch_env()
    cfg = _load(args, "eval")
    if not cfg.MEGDET.DATA.VAL_JSON:
        raise UsageError("MEGDET.DATA.VAL_JSON: required for evaluation (or --val-json)")
    problem = weights_problem(args.weights, cfg.MEGDET.ALLOW_UNSAFE_WEIGHTS)
    if problem:
        raise UsageError(f"--weights: {problem}")
    task = WorkerTask(cfg=cfg, command="eval", weights=args.weights)
    return run_workers(eval_worker, task, 1, cfg.MODEL.DEVICE.startswith("cuda"))


def run_make_shapes(args: argparse.Namespace) -> int:
    from megdet.trainer.shapes import make_shapes

    paths = make_shapes(args.out, train=args.train, val=args.val, seed=args.seed)
    for key, path in paths.items():
        print(f"{key}: {path}")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from megdet.trainer.demo import train_demo

    return train_demo(Path(args.output))
