"""`megdet plan`: preview what a run on N GPUs will do before spending GPU hours."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megdet.cli import whole_number
from megdet.plan import (
    Plan,
    Resize,
    RunSpec,
    Scaling,
    Schedule,
    SpecError,
    parse_spec,
    plan_continuation,
    plan_run,
)

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
    data = {
        name: getattr(args, name)
        for name in RunSpec.model_fields
        if getattr(args, name, None) is not None
    }
    return parse_spec(data)


def format_plan(plan: Plan, before: Plan | None = None) -> str:
    """A small human-readable table; for a continuation, what changed since ``before``."""
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
    if plan.images_done:
        rows.append(("continues at", _continuation_row(plan)))
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
    return table + (f"\n\n{what_changed(plan, before)}" if plan.resize is not None else "")


def _continuation_row(plan: Plan) -> str:
    left = plan.max_iter - plan.start_iter
    ahead = [s for s in plan.steps if s > plan.start_iter]
    return (
        f"iteration {plan.start_iter} after {plan.images_done:,} images; {left} iterations left"
        f" ({plan.images_seen - plan.images_done:,} images); LR steps ahead: "
        + (", ".join(map(str, ahead)) or "none")
    )


def what_changed(plan: Plan, before: Plan | None = None) -> str:
    """One sentence: how a continuation differs from the run before it, and why."""
    was = ""
    if before is not None:
        was = f" (was {before.world_size}, global batch {before.global_batch}, lr {before.lr:.6g})"
    return (
        f"On {plan.world_size} GPUs{was}: global batch {plan.global_batch}, "
        f"lr {plan.lr:.6g}, {plan.spec.accumulation_steps} accumulation step(s); "
        f"{plan.resize_reason}. The schedule stays in images: the run ends after "
        f"{plan.images_seen:,} images (planned {plan.reference_images_seen:,})."
    )


def _curve(plan: Plan, first: int, last: int, points: int = 2000) -> tuple[list, list]:
    """(images seen, learning rate) along iterations ``first..last`` of a plan."""
    n = max(1, min(last - first, points))
    its = [first + (last - first) * i / n for i in range(n + 1)]
    return [plan.images_at(0) + i * plan.global_batch for i in its], [plan.lr_at(i) for i in its]


def plot_lr(plan: Plan, path: Path, before: Plan | None = None) -> None:
    """Write a PNG of the learning rate against images seen; for a continuation, the run
    before it up to the images done, and where the run would have gone without the change."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # controller-only installs have no matplotlib
        raise SpecError("plot", "needs matplotlib; install megdet[train]") from None
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    label = f"{plan.world_size} GPUs, global batch {plan.global_batch}"
    if before is not None:
        done = round(plan.images_done / before.global_batch)
        ax.plot(*_curve(before, 0, done), color="C0", label=f"{before.world_size} GPUs so far")
        rest = _curve(before, done, before.max_iter)
        ax.plot(*rest, color="C0", linestyle=":", label="without the change")
        ax.axvline(plan.images_done, color="grey", linewidth=0.8)
    ax.plot(*_curve(plan, plan.start_iter, plan.max_iter), color="C1", label=label)
    ax.set_xlabel("images seen")
    ax.set_ylabel("learning rate")
    ax.set_title(f"{plan.spec.schedule.value} schedule, {label}")
    ax.grid(alpha=0.3)
    if before is not None:
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plan_from_args(args: argparse.Namespace) -> tuple[Plan, Plan | None]:
    """The plan the flags ask for and, for a continuation, the run's plan before it."""
    spec = spec_from_args(args)
    if args.images_done is None:
        for flag, value in (("--from-gpus", args.from_gpus), ("--resize", args.resize)):
            if value is not None:
                raise SpecError(flag, "needs --images-done (the images the run has seen)")
        return plan_run(spec), None
    # The batch to keep is the one the run trained at: its spec on --from-gpus.
    before = plan_run(parse_spec({**spec.model_dump(), "gpus": args.from_gpus or spec.gpus}))
    plan = plan_continuation(
        spec,
        args.images_done,
        run_batch=before.global_batch,
        resize=args.resize or Resize.KEEP_BATCH,
    )
    return plan, before


def run_plan(args: argparse.Namespace) -> int:
    from megdet.cli import UsageError

    try:
        plan, before = _plan_from_args(args)
        if args.plot:
            plot_lr(plan, Path(args.plot), before)
    except SpecError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"--plot: cannot write {args.plot}: {err.strerror}") from None
    if args.json:
        json.dump(plan.summary(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_plan(plan, before))
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
    parser.add_argument(
        "--images-done",
        type=_whole,
        metavar="K",
        help="plan the rest of a run that has seen K images (a resume on --gpus)",
    )
    parser.add_argument(
        "--from-gpus",
        type=_whole,
        metavar="N",
        help="with --images-done: the GPUs the run trained on so far (default --gpus)",
    )
    parser.add_argument(
        "--resize",
        choices=[r.value for r in Resize],
        help="with --images-done: keep the run's global batch through accumulation where the "
        "new world can make it (keep-batch, the default), or rescale it and its LR",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--plot", metavar="PNG", help="write the LR curve to this PNG file")
    parser.set_defaults(handler=run_plan)
