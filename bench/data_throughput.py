"""Data loading throughput vs what the training step consumes, side by side in one run.

In each process of a 2-process gloo world (as ``megdet demo`` trains), the trainer is built as
``megdet train`` builds it (tiny CPU config, shapes dataset, backbone SyncBN). Blocks of

* ``loader``: batches taken from the trainer's own detectron2 train loader (a second iterator
  over ``build_detection_train_loader``'s loader, with the config's ``DATALOADER.NUM_WORKERS``)
  and nothing else: images/s the input pipeline delivers to one process;
* ``train``: training steps (hooks included): images/s one process consumes. The trainer's
  own ``data_time`` (time waiting for the batch inside ``run_step``) is subtracted to give the
  model's compute-only rate,

alternate for several rounds. Reported per process: both rates, their ratio, and the share of
a step spent waiting for data.

    .venv/bin/python -m bench.data_throughput [--rounds 5 --block 4] [--world 2] [--quick]
"""

from __future__ import annotations

import time
from typing import Any

from bench import harness


def throughput_worker(
    data: dict[str, str], out: str, rounds: int, block: int, warmup: int, overrides: tuple
) -> dict[str, Any]:
    """One rank: alternate loader-only blocks and training blocks."""
    import torch
    from detectron2.utils import comm

    cfg, bundle, plan = harness.build_tiny_trainer(data, out, overrides)
    images = cfg.MEGDET.IMAGES_PER_GPU
    trainer = bundle.trainer
    batches = iter(trainer.data_loader)
    driven = harness.prepare(trainer, plan.max_iter)
    for _ in range(warmup):
        next(batches)
    harness.step_block(driven, warmup)

    loader_rate, step_rate, model_rate, wait_share = [], [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(block):
            batch = next(batches)
            assert len(batch) == images
        loader_rate.append(block * images / (time.perf_counter() - start))

        times = harness.step_block(driven, block)
        step_rate.append(block * images / sum(times))
        if comm.is_main_process():
            # run_step's own data wait, max over ranks, as detectron2 logs it.
            waits = [v for v, _ in driven.storage.history("data_time").values()[-block:]]
            model_rate.append(block * images / (sum(times) - sum(waits)))
            wait_share.append(sum(waits) / sum(times))
    harness.finish(driven)
    if not comm.is_main_process():
        return {}  # the data wait is logged on rank 0 (max over ranks); rank 0 reports
    ratios = [a / b for a, b in zip(loader_rate, model_rate, strict=True)]
    return {
        "world_size": comm.get_world_size(),
        "threads_per_process": torch.get_num_threads(),
        "dataloader_workers": cfg.DATALOADER.NUM_WORKERS,
        "images_per_process": images,
        "image_size": list(cfg.INPUT.MIN_SIZE_TRAIN),
        "rounds": rounds,
        "block": block,
        "warmup": warmup,
        "loader_images_per_s": harness.spread(loader_rate),
        "step_images_per_s": harness.spread(step_rate),
        "model_images_per_s": harness.spread(model_rate),
        "data_wait_share_of_step": harness.spread(wait_share),
        "loader_to_model_ratio": harness.spread(ratios),
    }


def run(
    quick: bool = False, world: int = 2, rounds: int = 5, block: int = 4, warmup: int = 2
) -> dict[str, Any]:
    """Run the benchmark in ``world`` gloo processes; returns rank 0's results."""
    overrides: tuple[str, ...] = ()
    if quick:
        world, rounds, block, warmup = 1, 1, 1, 0
        overrides = ("MEGDET.IMAGES_PER_GPU", "1")
    return harness.run_on_shapes(
        "data", world, 64, throughput_worker, rounds, block, warmup, overrides
    )


def print_report(result: dict[str, Any]) -> None:
    print(
        f"Data throughput: {result['world_size']} process(es) x "
        f"{result['threads_per_process']} thread(s), DataLoader workers "
        f"{result['dataloader_workers']}, {result['images_per_process']} images of "
        f"{result['image_size']} px per process per step; {result['rounds']} rounds x "
        f"{result['block']} batches/steps; load average {result['load_average']}"
    )
    rows = (
        ("loader alone", "loader_images_per_s", "images/s"),
        ("training step", "step_images_per_s", "images/s"),
        ("model (step - data wait)", "model_images_per_s", "images/s"),
        ("loader / model", "loader_to_model_ratio", "x"),
        ("data wait / step", "data_wait_share_of_step", ""),
    )
    for label, key, unit in rows:
        s = result[key]
        print(
            f"  {label:<26} median {s['median']:8.2f} {unit:<8} "
            f"(min {s['min']:.2f}, max {s['max']:.2f}) per process"
        )


def main(argv: list[str] | None = None) -> None:
    parser = harness.round_parser(
        __doc__,
        rounds=5,
        block_help="batches/steps per block",
        quick_help="1 process, 1 round: a smoke run",
    )
    parser.add_argument("--world", type=int, default=2, choices=(1, 2))
    args = parser.parse_args(argv)
    result = run(quick=args.quick, world=args.world, rounds=args.rounds, block=args.block)
    harness.emit(result, args.json, print_report)


if __name__ == "__main__":
    main()
