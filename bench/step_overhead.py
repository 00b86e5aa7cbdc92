"""Our training step vs a bare detectron2 ``SimpleTrainer`` loop: same model, data, world.

In 2 gloo processes (the trainer's ``run_workers``) one trainer is built as ``megdet train`` builds
it (tiny CPU config, shapes dataset, backbone SyncBN, DDP). Three loops then share its model,
optimizer and data loader and take turns in blocks of steps, several rounds, order rotated:

* ``megdet``: the built ``MegDetTrainer`` with all its hooks (timer, LR schedule, writers,
  SIGTERM check; checkpoint period beyond the run), accumulation 1: what a run executes;
* ``megdet-step``: a ``MegDetTrainer`` without hooks: our ``run_step`` alone;
* ``simple``: detectron2's ``SimpleTrainer`` without hooks: the bare loop.

Reported: each loop's median seconds per step, the per-round ratios to ``simple`` (median,
min, max) and the ratio of the medians of all timed steps. Goal: ``megdet`` / ``simple`` <= 1.03.

    .venv/bin/python -m bench.step_overhead [--rounds 10 --block 4] [--quick] [--json]
"""

from __future__ import annotations

from typing import Any

from bench import harness

LOOPS = ("megdet", "megdet-step", "simple")
GOAL = 1.03


def overhead_worker(
    data: dict[str, str], out: str, rounds: int, block: int, warmup: int, overrides: tuple
) -> dict[str, Any]:
    """One rank: build the trainer, then interleave the three loops on its model."""
    import torch
    from detectron2.engine import SimpleTrainer
    from detectron2.utils import comm

    from megdet.trainer.engine import MegDetTrainer

    cfg, bundle, plan = harness.build_tiny_trainer(data, out, overrides)
    ours = bundle.trainer
    assert ours.accumulation_steps == 1
    loops = {
        "megdet": ours,
        "megdet-step": MegDetTrainer(bundle.model, ours.data_loader, ours.optimizer),
        "simple": SimpleTrainer(bundle.model, ours.data_loader, ours.optimizer),
    }
    driven = {name: harness.prepare(loops[name], plan.max_iter) for name in LOOPS}
    blocks, steps = harness.interleaved(driven, rounds, block, warmup)
    return {
        "world_size": comm.get_world_size(),
        "threads_per_process": torch.get_num_threads(),
        "images_per_process": cfg.MEGDET.IMAGES_PER_GPU,
        "sync_bn": cfg.MEGDET.SYNC_BN,
        "sync_bn_layers": len(bundle.sync_bn_layers),
        "hooks": [type(h).__name__ for h in ours._hooks],
        "rounds": rounds,
        "block": block,
        "warmup": warmup,
        **harness.side_by_side(
            {n: blocks[n] for n in LOOPS}, {n: steps[n] for n in LOOPS}, "simple"
        ),
    }


def run(quick: bool = False, rounds: int = 10, block: int = 4, warmup: int = 2) -> dict[str, Any]:
    """Run the benchmark in 2 gloo processes; returns rank 0's results."""
    overrides: tuple[str, ...] = ()
    if quick:
        rounds, block, warmup = 1, 1, 0
        overrides = ("MEGDET.IMAGES_PER_GPU", "1")
    return harness.run_on_shapes(
        "overhead", 2, 32, overhead_worker, rounds, block, warmup, overrides
    )


def print_report(result: dict[str, Any]) -> None:
    print(
        f"Step overhead: {result['world_size']} gloo processes x "
        f"{result['threads_per_process']} thread(s), {result['images_per_process']} images per "
        f"process, SyncBN {result['sync_bn']!r} ({result['sync_bn_layers']} layers) in all "
        f"loops; {result['rounds']} rounds x {result['block']} steps per loop after "
        f"{result['warmup']} warm-up steps; load average {result['load_average']}"
    )
    print(f"  megdet hooks: {', '.join(result['hooks'])}")
    for name in LOOPS:
        s, r = result["step_s"][name], result["ratio_to_simple"][name]
        print(
            f"  {name:<12} {harness.spread_text(s, ' s/step')}; ratio to simple: "
            f"{harness.spread_text(r)}; ratio of step medians "
            f"{result['ratio_of_step_medians'][name]:.3f}"
        )
    ratio = result["ratio_to_simple"]["megdet"]["median"]
    if result["warmup"] == 0:
        print("  (smoke run: unwarmed single steps, not a measurement)")
        return
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"  megdet / simple median ratio {ratio:.3f} {verdict} the goal of <= {GOAL}")


def main(argv: list[str] | None = None) -> None:
    parser = harness.round_parser(__doc__, rounds=10, block_help="steps per loop per round")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, rounds=args.rounds, block=args.block)
    harness.emit(result, args.json, print_report)


if __name__ == "__main__":
    main()
