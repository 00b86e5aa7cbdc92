"""SyncBN scope none / backbone / all: collectives per iteration and step time, side by side.

In 2 gloo processes (the trainer's ``run_workers``), for each scope the benchmark builds the trainer
``megdet train`` builds and

* counts the collectives of a few iterations exactly (calls and payload bytes, split into BN
  statistics forward/backward, DDP gradient all-reduce, the trainer's per-step stop check and
  detectron2's metrics gather); the counts depend only on the model's layers, not on images;
* times steps with the three trainers taking turns in blocks in the same processes (several
  rounds, order rotated), and reports each scope's median block time relative to ``none``.

Models: the tiny CPU config; the same with BN in the FPN and box head ("normed heads", where
``all`` differs from ``backbone``); and, with ``--r50``, R50-FPN (counts only, small input).

    .venv/bin/python -m bench.sync_bn_scope [--rounds 6 --block 4] [--r50] [--quick] [--json]
"""

from __future__ import annotations

from typing import Any

from bench import harness

SCOPES = ("none", "backbone", "all")

#: name -> (shipped config, overrides): the models whose collectives are counted.
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tiny": ("megdet_tiny_cpu", ()),
    "tiny+normed-heads": ("megdet_tiny_cpu", harness.TINY_NORMED_HEADS),
    "R50-FPN": ("megdet_R50_FPN_1x", harness.R50_SMALL_INPUT),
    "R50-FPN+normed-heads": (
        "megdet_R50_FPN_1x",
        (*harness.R50_SMALL_INPUT, *harness.NORMED_HEADS),
    ),
}


def _model_facts(bundle) -> dict[str, Any]:
    model = getattr(bundle.model, "module", bundle.model)
    channels = [model.get_submodule(name).num_features for name in bundle.sync_bn_layers]
    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "sync_bn_layers": len(bundle.sync_bn_layers),
        "sync_bn_layer_names": bundle.sync_bn_layers,
        "sync_bn_channels": sum(channels),
        "trainable_params": sum(p.numel() for p in params),
        "trainable_param_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def count_scope(cfg, scope: str, iterations: int) -> dict[str, Any]:
    """Exact collectives of ``iterations`` steps of the trainer with this scope (every rank)."""
    cfg = cfg.clone()
    cfg.MEGDET.SYNC_BN = scope
    bundle, plan = harness.build_bench_trainer(cfg)
    facts = _model_facts(bundle)
    harness.count_ddp_buckets(bundle.model)
    driven = harness.prepare(bundle.trainer, plan.max_iter)
    counter = harness.CollectiveCounter()
    with counter.active():
        snapshots = [counter.snapshot()]
        for _ in range(iterations):
            harness.step_block(driven, 1)
            snapshots.append(counter.snapshot())
    harness.finish(driven)
    steps = harness.per_iteration(snapshots)
    # DDP rebuilds its gradient buckets after the first iteration; later ones are the steady
    # state, and they must all be equal (anything else would not be a per-iteration count).
    steady = steps[1:] or steps
    constant = all(s == steady[0] for s in steady)
    return {
        **facts,
        "first_iteration": steps[0],
        "per_iteration": steady[0],
        "constant_after_first": constant,
        "iterations_counted": len(steady),
    }


def time_scopes(cfg, rounds: int, block: int, warmup: int) -> dict[str, Any]:
    """Median block step time per scope, the three trainers interleaved in these processes."""
    driven = {}
    for scope in SCOPES:
        scoped = cfg.clone()
        scoped.MEGDET.SYNC_BN = scope
        bundle, plan = harness.build_bench_trainer(scoped)
        driven[scope] = harness.prepare(bundle.trainer, plan.max_iter)
    blocks = harness.interleaved(driven, rounds, block, warmup)[0]
    ratios = {
        scope: harness.spread([b / n for b, n in zip(blocks[scope], blocks["none"], strict=True)])
        for scope in SCOPES
    }
    return {
        "step_s": {scope: harness.spread(blocks[scope]) for scope in SCOPES},
        "ratio_to_none": ratios,
        "rounds": rounds,
        "block": block,
        "warmup": warmup,
    }


def scope_worker(
    data: dict[str, str],
    out: str,
    models: list[str],
    count_iters: int,
    timed_model: str,
    rounds: int,
    block: int,
    warmup: int,
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One rank: count collectives for each model and scope, then time the scopes."""
    import torch
    from detectron2.utils import comm

    result: dict[str, Any] = {
        "world_size": comm.get_world_size(),
        "threads_per_process": torch.get_num_threads(),
        "counts": {},
    }
    for name in models:
        config, extra = MODELS[name]
        full = (*harness.data_overrides(data), *harness.NO_CHECKPOINTS, *extra, *overrides)
        cfg = harness.load_bench_config(config, full, f"{out}/{name}")
        result["counts"][name] = {scope: count_scope(cfg, scope, count_iters) for scope in SCOPES}
    if rounds:
        config, extra = MODELS[timed_model]
        full = (*harness.data_overrides(data), *harness.NO_CHECKPOINTS, *extra, *overrides)
        cfg = harness.load_bench_config(config, full, f"{out}/timed")
        result["timing"] = {"model": timed_model, **time_scopes(cfg, rounds, block, warmup)}
    return result


def run(
    quick: bool = False,
    r50: bool = False,
    rounds: int = 6,
    block: int = 4,
    warmup: int = 2,
    timed_model: str = "tiny+normed-heads",
) -> dict[str, Any]:
    """Run the benchmark in 2 gloo processes; returns rank 0's results."""
    models = ["tiny", "tiny+normed-heads"]
    if r50:
        models += ["R50-FPN", "R50-FPN+normed-heads"]
    count_iters = 3
    overrides: tuple[str, ...] = ()
    if quick:
        # The counts do not depend on the batch: 1 image per process keeps the smoke run short.
        overrides = ("MEGDET.IMAGES_PER_GPU", "1")
        # One model that has all three scopes distinct, one steady iteration, one timed step.
        models, count_iters, rounds, block, warmup = ["tiny+normed-heads"], 2, 1, 1, 0
    return harness.run_on_shapes(
        "syncbn",
        2,
        32,
        scope_worker,
        models,
        count_iters,
        timed_model,
        rounds,
        block,
        warmup,
        overrides,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def print_report(result: dict[str, Any]) -> None:
    print(
        f"SyncBN scope: {result['world_size']} gloo processes, "
        f"{result['threads_per_process']} thread(s) each; load average {result['load_average']}"
    )
    print("Collectives per iteration (steady state; calls / payload bytes per rank):")
    header = (
        f"  {'model':<21} {'scope':<9} {'BN layers':>9} {'BN fwd':>16} {'BN bwd':>16} "
        f"{'grad all-reduce':>22} {'other':>12}"
    )
    print(header)
    for name, scopes in result["counts"].items():
        for scope, c in scopes.items():
            calls, size = c["per_iteration"]["calls"], c["per_iteration"]["bytes"]
            other_calls = calls["stop_signal"] + calls["metrics"] + calls["other"]
            print(
                f"  {name:<21} {scope:<9} {c['sync_bn_layers']:>9} "
                f"{calls['bn_forward']:>4} / {_mib(size['bn_forward']):>9} "
                f"{calls['bn_backward']:>4} / {_mib(size['bn_backward']):>9} "
                f"{calls['grad_allreduce']:>3} / {_mib(size['grad_allreduce']):>16} "
                f"{other_calls:>12}"
            )
    timing = result.get("timing")
    if timing:
        print(
            f"Step time, {timing['model']}, interleaved: {timing['rounds']} rounds x "
            f"{timing['block']} steps per scope (after {timing['warmup']} warm-up steps)"
        )
        for scope in SCOPES:
            s, r = timing["step_s"][scope], timing["ratio_to_none"][scope]
            print(
                f"  {scope:<9} {harness.spread_text(s, ' s/step')}; ratio to none: "
                f"{harness.spread_text(r)}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = harness.round_parser(__doc__, rounds=6, block_help="steps per scope per round")
    parser.add_argument("--r50", action="store_true", help="also count R50-FPN (about 1 min)")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, r50=args.r50, rounds=args.rounds, block=args.block)
    harness.emit(result, args.json, print_report)


if __name__ == "__main__":
    main()
