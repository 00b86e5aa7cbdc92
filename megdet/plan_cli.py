"""`megdet plan`: preview what a run on N GPUs will do before spending GPU hours."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megdet.cli import whole_number
from megdet.plan import Plan, RunSpec, Scaling, Schedule, SpecError, plan_run

# Bounds are the plan module's to check, so its error names the field and the rule.
_whole = whole_number()


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The RunSpec fields as flags; defaults come from RunSpec itself."""
    fields = RunSpec.model_fields
    parser.add_argument("--gpus", type=_whole, required=True, help="total GPUs")
    for flag, dest, kind in (
        ("--gpus-per-node", "gpus_per_node", _whole),
        ("--images-per-gpu", "images_per_gpu", _whole),
        ("--accumulation-steps", "accumulation_steps", _whole),
        ("--base-lr", "base_lr", _number),
        ("--reference-batch", "reference_batch", _whole),
        ("--max-iter", "max_iter", _whole),
        ("--warmup-iters", "warmup_iters", _whole),
    ):
        parser.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=None,
            help=f"{fields[dest].description} (default {fields[dest].default})",
        )
    parser.add_argument(
        "--steps",
        type=_whole,
        nargs="*",
        default=None,
        help="reference LR decay iterations (default 60000 80000)",
    )
    parser.add_argument(
        "--scaling",
        choices=[s.value for s in Scaling],
        default=None,
        help="LR scaling rule (default linear)",
    )
    parser.add_argument(
        "--schedule",
        choices=[s.value for s in Schedule],
        default=None,
        help="LR curve: step (warmup + steps) or three-stage (default step)",
    )


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """A RunSpec from parsed flags; flags left unset keep RunSpec's defaults."""
    from megdet.plan import parse_spec

    data = {
        name: getattr(args, name)
        for name in RunSpec.model_fields
        if getattr(args, name, None) is not None
    }
    return parse_spec(data)


def format_plan(plan: Plan) -> str:
    """A small human-readable table."""
    s = plan.summary()
    rows = [
        ("world size", f"{s['world_size']} ({s['nodes']} node(s) x {s['procs_per_node']})"),
        (
            "global batch",
            f"{s['global_batch']} = {s['world_size']} GPUs x {s['images_per_gpu']} images"
            f" x {s['accumulation_steps']} accumulation",
        ),
        ("scale vs reference", f"{s['scale']:g}x batch {plan.spec.reference_batch}"),
        ("learning rate", f"{s['lr']:.6g} ({s['scaling']} from {plan.spec.base_lr:g})"),
        ("schedule", s["schedule"]),
        ("max iterations", str(s["max_iter"])),
    ]
    if plan.schedule is Schedule.STEP:
        rows.append(("LR steps", ", ".join(map(str, s["steps"])) or "-"))
        rows.append(("warmup iterations", str(s["warmup_iters"])))
    else:
        a, b = s["stage_boundaries"]
        rows.append(("stage boundaries", f"{a}, {b}"))
    rows.append(("images seen", f"{s['images_seen']:,} (reference {s['reference_images_seen']:,})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def plot_lr(plan: Plan, path: Path) -> None:
    """Write a PNG of the learning rate over iterations."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # controller-only installs have no matplotlib
        raise SpecError("plot", "needs matplotlib; install megdet[train]") from None
    n = min(plan.max_iter, 2000)
    xs = [plan.max_iter * i / n for i in range(n + 1)]
    ys = [plan.lr_at(x) for x in xs]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    ax.plot(xs, ys)
    ax.set_xlabel("iteration")
    ax.set_ylabel("learning rate")
    ax.set_title(
        f"{plan.spec.schedule.value} schedule, {plan.world_size} GPUs, "
        f"global batch {plan.global_batch}"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_plan(args: argparse.Namespace) -> int:
    from megdet.cli import UsageError

    try:
        plan = plan_run(spec_from_args(args))
        if args.plot:
            plot_lr(plan, Path(args.plot))
    except SpecError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"--plot: cannot write {args.plot}: {err.strerror}") from None
    if args.json:
        json.dump(plan.summary(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_plan(plan))
        if args.plot:
            print(f"\nlearning-rate curve written to {args.plot}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show world size, global batch, LR and schedule for a run",
        description="Plan a run: world size, nodes, global batch, learning rate and schedule.",
    )
    add_spec_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--plot", metavar="PNG", help="write the LR curve to this PNG file")
    parser.set_defaults(handler=run_plan)
