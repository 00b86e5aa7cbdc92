"""What the trainer benchmarks share: configs, worker processes, the step loop, counters.

The benchmarks build exactly what ``megdet train`` builds (``load_config``, ``plan_config``,
``register_datasets``, ``build_trainer``) and start their processes with the trainer's own
``run_workers`` (gloo on CPU, one thread per worker on this 2-core machine). They drive a trainer's
``before_step``/``run_step``/``after_step`` in blocks (what ``TrainerBase.train`` does in one
go), so that several trainers can take turns in the same processes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import pickle
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Overrides that keep hooks from firing inside a benchmark: no checkpoint save, a schedule
#: long enough that no run reaches its end (the LR curve does not change the step's work).
NO_CHECKPOINTS = (
    "SOLVER.MAX_ITER",
    "100000",
    "SOLVER.STEPS",
    "(80000, 90000)",
    "SOLVER.CHECKPOINT_PERIOD",
    "1000000",
)

#: R50-FPN from the production config at a small input on CPU. Image size, RoI and proposal
#: counts change the work per step but not which layers exist, so the collective counts (BN
#: layers, gradient bytes, buckets) are those of the production model.
R50_SMALL_INPUT = (
    "MODEL.WEIGHTS",
    "",
    "MODEL.DEVICE",
    "cpu",
    "MEGDET.IMAGES_PER_GPU",
    "1",
    "INPUT.MIN_SIZE_TRAIN",
    "(128,)",
    "INPUT.MAX_SIZE_TRAIN",
    "128",
    "MODEL.RPN.PRE_NMS_TOPK_TRAIN",
    "256",
    "MODEL.RPN.POST_NMS_TOPK_TRAIN",
    "128",
    "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE",
    "32",
    "DATALOADER.NUM_WORKERS",
    "0",
)

#: BatchNorm outside the backbone too: FPN convs with BN (detectron2's SyncBN configs do this)
#: and a box head of 4 convs with BN + 1 FC. Without these, the shipped configs have no BN
#: outside the ResNet, and scope ``all`` synchronizes exactly what ``backbone`` does.
NORMED_HEADS = (
    "MODEL.FPN.NORM",
    "BN",
    "MODEL.ROI_BOX_HEAD.NUM_CONV",
    "4",
    "MODEL.ROI_BOX_HEAD.NUM_FC",
    "1",
    "MODEL.ROI_BOX_HEAD.NORM",
    "BN",
)

#: The tiny box head's convs: 64 channels like its FPN (the default 256 would dominate a step).
TINY_NORMED_HEADS = (*NORMED_HEADS, "MODEL.ROI_BOX_HEAD.CONV_DIM", "64")


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that have ended and been waited
    for (``getrusage(RUSAGE_CHILDREN)``): the difference around a ``subprocess.run`` is what
    that command and everything it waited for spent."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pids: Iterator[int] | list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` together (``/proc/<pid>/stat``;
    a process that is gone counts 0)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def wait_quiet(
    pids: list[int],
    quiet_s: float = 3.0,
    below: float = 0.05,
    timeout: float = 300,
    log: Callable[[str], None] | None = None,
) -> float:
    """Wait until the processes ``pids`` together use less than ``below`` of a core for
    ``quiet_s`` in a row. Returns the seconds waited (``timeout`` at most; ``log`` says so)."""
    started = time.perf_counter()
    quiet_since, last, last_cpu = started, started, process_cpu_s(pids)
    while time.perf_counter() - started < timeout:
        time.sleep(1.0)
        now, used = time.perf_counter(), process_cpu_s(pids)
        if (used - last_cpu) / (now - last) >= below:
            quiet_since = now
        last, last_cpu = now, used
        if now - quiet_since >= quiet_s:
            return now - started
    if log is not None:
        log(f"not quiet after {timeout:.0f} s; measuring anyway")
    return time.perf_counter() - started


def make_dataset(folder: str | Path, train: int = 64) -> dict[str, str]:
    """A shapes dataset (``megdet make-shapes``) with ``train`` images; returns its paths."""
    from megdet.trainer.shapes import make_shapes

    paths = make_shapes(folder, train=train, val=1, seed=0)
    return {key: str(value) for key, value in paths.items()}


def data_overrides(data: dict[str, str]) -> tuple[str, ...]:
    """Config overrides that train on ``data`` (from :func:`make_dataset`), no evaluation."""
    return (
        "MEGDET.DATA.TRAIN_JSON",
        data["train_json"],
        "MEGDET.DATA.TRAIN_IMAGES",
        data["train_images"],
        "MEGDET.DATA.VAL_JSON",
        "",
    )


def load_bench_config(config: str, overrides: tuple[str, ...], output_dir: str):
    """``load_config`` (what ``megdet train --config`` does) plus the benchmark's overrides."""
    from megdet.trainer.config import load_config

    return load_config(config, [*overrides, "OUTPUT_DIR", output_dir])


def build_bench_trainer(cfg, seed_offset: int = 0):
    """Plan ``cfg`` for this world and build the trainer exactly as ``megdet train`` does.

    Returns ``(bundle, plan)``; call in every rank (building the trainer is collective).
    """
    import torch
    from detectron2.utils import comm

    from megdet.trainer.config import plan_config
    from megdet.trainer.engine import build_trainer
    from megdet.trainer.train import register_datasets

    cfg = cfg.clone()
    plan = plan_config(cfg, comm.get_world_size(), comm.get_local_size())
    register_datasets(cfg)
    cfg.freeze()
    torch.manual_seed(seed_offset + comm.get_rank())
    return build_trainer(cfg, plan, resume=False), plan


@dataclass
class Driven:
    """A trainer prepared for stepping in blocks, with its own event storage."""

    trainer: Any
    storage: Any
    iterations: int = 0


def build_tiny_trainer(data: dict[str, str], out: str, overrides: tuple[str, ...]):
    """``megdet_tiny_cpu`` on the shapes data, no checkpoints; returns (cfg, bundle, plan)."""
    cfg = load_bench_config(
        "megdet_tiny_cpu", (*data_overrides(data), *NO_CHECKPOINTS, *overrides), out
    )
    bundle, plan = build_bench_trainer(cfg)
    return cfg, bundle, plan


def round_parser(
    doc: str, rounds: int, block_help: str, quick_help: str = "1 round of 1 step: a smoke run"
) -> argparse.ArgumentParser:
    """The CLI shared by the side-by-side benchmarks (rounds of blocks): --quick, --rounds,
    --block, --json.

    A benchmark adds its own flags to the returned parser; ``emit`` prints the result.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--block", type=int, default=4, help=block_help)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    return parser


def emit(result: dict[str, Any], as_json: bool, print_report: Callable[[dict], None]) -> None:
    """Print a benchmark's result: raw JSON for machines, its report table for people."""
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


def prepare(trainer, max_iter: int) -> Driven:
    """``TrainerBase.train``'s set-up (storage, ``before_train``) without its loop."""
    from detectron2.utils.events import EventStorage

    trainer.iter = trainer.start_iter = 0
    trainer.max_iter = max_iter
    storage = EventStorage(0)
    trainer.storage = storage
    with storage:
        trainer.before_train()
    return Driven(trainer, storage)


def step_block(driven: Driven, iterations: int) -> list[float]:
    """Run ``iterations`` steps (hooks included), as ``TrainerBase.train``'s loop does.

    Returns the wall time of each step. Each trainer writes to its own event storage, which is
    made current for the block (detectron2 finds the storage through a global stack).
    """
    trainer = driven.trainer
    times = []
    with driven.storage:
        for _ in range(iterations):
            trainer.iter = driven.iterations
            start = time.perf_counter()
            trainer.before_step()
            trainer.run_step()
            trainer.after_step()
            times.append(time.perf_counter() - start)
            driven.iterations += 1
    return times


def finish(driven: Driven) -> None:
    """``TrainerBase.train``'s tear-down (``after_train``: writers closed, signals restored)."""
    with driven.storage:
        driven.trainer.iter = driven.iterations
        driven.trainer.after_train()


def interleaved(
    driven: dict[str, Driven], rounds: int, block: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Step every trainer ``warmup`` times, then ``rounds`` rounds of ``block`` steps each, the
    order rotated every round (so no trainer always runs first, after a cold cache or a
    neighbour's burst), and finish them. Returns, by name, each block's mean step time and
    every step's time."""
    names = list(driven)
    for name in names:
        step_block(driven[name], warmup)
    blocks: dict[str, list[float]] = {name: [] for name in names}
    steps: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times = step_block(driven[name], block)
            blocks[name].append(sum(times) / len(times))
            steps[name].extend(times)
    for d in driven.values():
        finish(d)
    return blocks, steps


# --- processes ---------------------------------------------------------------------------


def _rank_entry(job: tuple[Callable[..., Any], tuple, str]) -> int:
    fn, args, result_path = job
    import warnings

    from detectron2.utils import comm

    # torch 2.14 deprecates DDP's broadcast_buffers (the trainer passes it on purpose); the
    # warning, once per model and process, would bury the benchmark's output.
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")
    # Deprecation notices from detectron2's imports (torch.jit.script, meshgrid indexing).
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="torch.meshgrid")

    result = fn(*args)
    if comm.is_main_process():
        Path(result_path).write_text(json.dumps(result))
    return 0


def run_world(world: int, fn: Callable[..., Any], *args: Any, use_cuda: bool = False) -> Any:
    """Run ``fn(*args)`` in every rank of a ``world``-process world; rank 0's result.

    Processes come from the trainer's ``run_workers`` (spawned, where ``megdet train`` forks CPU
    workers: this runs inside pytest's threaded workers too, where fork is not safe; gloo with
    ``cpu_count // world`` threads each, or NCCL with one GPU each); under torchrun this
    process is one rank of torchrun's world. ``world`` 1 runs in this process.
    ``fn`` must be importable (module level) and its result JSON-serializable. Returns None in
    the other ranks of a torchrun world (rank 0 reports).
    """
    import torch

    from megdet.trainer.workers import run_workers

    fd, result_path = tempfile.mkstemp(prefix="megdet-bench-", suffix=".json")
    os.close(fd)
    threads = torch.get_num_threads()
    if world == 1 and not use_cuda:
        # One in-process CPU worker gets 1 thread, like each of 2 spawned workers on 2 cores:
        # with 2 OpenMP threads on a machine other jobs keep busy, a tiny step took 6 s
        # instead of 0.3 s (threads spin waiting for a core).
        torch.set_num_threads(1)
    try:
        code = run_workers(
            _rank_entry, (fn, args, result_path), num_workers=world, use_cuda=use_cuda
        )
        if code:
            raise RuntimeError(f"benchmark workers failed (exit code {code}); see above")
        text = Path(result_path).read_text()
        return json.loads(text) if text else None
    finally:
        torch.set_num_threads(threads)
        Path(result_path).unlink(missing_ok=True)


# --- collective counting -----------------------------------------------------------------

#: The torch.distributed collectives that are counted -> (position, keyword) of the tensor (or
#: tensor list) this rank contributes.
_TENSOR_COLLECTIVES = {
    "all_reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "reduce": (0, "tensor"),
    "gather": (0, "tensor"),
    "scatter": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "reduce_scatter": (1, "input_list"),
    "reduce_scatter_tensor": (1, "input"),
}
_OBJECT_COLLECTIVES = ("gather_object", "all_gather_object", "broadcast_object_list")

#: Who called a collective (a function's ``__qualname__`` on the call stack) -> category.
CALLER_CATEGORIES = {
    "_GroupAllReduce.forward": "bn_forward",
    "_GroupAllReduce.backward": "bn_backward",
    "_allreduce_fut": "grad_allreduce",
    "StopOnSignal._stop_agreed": "stop_signal",
    "SimpleTrainer._write_metrics": "metrics",
}

CATEGORIES = ("bn_forward", "bn_backward", "grad_allreduce", "stop_signal", "metrics", "other")


def _payload_bytes(name: str, args: tuple, kwargs: dict) -> int:
    if name in _OBJECT_COLLECTIVES:
        if name == "broadcast_object_list":
            return 0  # the size is known only on the source rank
        obj = args[0] if args else next(iter(kwargs.values()))
        return len(pickle.dumps(obj))  # what torch sends (plus a size tensor)
    position, keyword = _TENSOR_COLLECTIVES[name]
    payload = args[position] if len(args) > position else kwargs.get(keyword)
    tensors = payload if isinstance(payload, (list, tuple)) else [payload]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _category(frame) -> str:
    depth = 0
    while frame is not None and depth < 8:
        category = CALLER_CATEGORIES.get(frame.f_code.co_qualname)
        if category:
            return category
        frame = frame.f_back
        depth += 1
    return "other"


@dataclass
class CollectiveCounter:
    """Counts calls and payload bytes of torch.distributed collectives in this process.

    Instrumentation only: while active, the ``torch.distributed`` functions are wrapped by
    counting shims that call the originals. Each call is attributed to a category by its
    caller (see :data:`CALLER_CATEGORIES`). DDP's gradient all-reduce runs in C++ and is not a
    Python call: :func:`count_ddp_buckets` routes it through torch's reference Python hook
    (``allreduce_hook``, same buckets, same result) so it is counted here too.
    """

    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    @contextlib.contextmanager
    def active(self) -> Iterator[CollectiveCounter]:
        import torch.distributed as dist

        originals = {}
        for name in (*_TENSOR_COLLECTIVES, *_OBJECT_COLLECTIVES):
            original = getattr(dist, name, None)
            if original is None:
                continue
            originals[name] = original
            setattr(dist, name, self._wrap(name, original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)

    def _wrap(self, name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def counted(*args, **kwargs):
            category = _category(sys._getframe(1))
            self.calls[category] += 1
            self.bytes[category] += _payload_bytes(name, args, kwargs)
            return original(*args, **kwargs)

        return counted

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"calls": dict(self.calls), "bytes": dict(self.bytes)}


def count_ddp_buckets(model) -> None:
    """Route a DDP model's gradient all-reduce through a Python hook the counter can see.

    ``allreduce_hook`` is torch's reference implementation of DDP's built-in all-reduce (same
    buckets, same averaging). Only for counting runs: it can't be unregistered.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(None, default_hooks.allreduce_hook)


def per_iteration(snapshots: list[dict[str, dict[str, int]]]) -> list[dict[str, dict[str, int]]]:
    """Differences between consecutive cumulative snapshots: one entry per iteration."""
    out = []
    for before, after in itertools.pairwise(snapshots):
        out.append(
            {kind: {c: after[kind][c] - before[kind][c] for c in CATEGORIES} for kind in after}
        )
    return out


# --- statistics --------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of a list of samples."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def spread_text(s: dict[str, float], unit: str = "", digits: int = 3) -> str:
    """A :func:`spread` as a report says it: ``median 0.123 s/step (min 0.100, max 0.200)``."""
    return (
        f"median {s['median']:.{digits}f}{unit} "
        f"(min {s['min']:.{digits}f}, max {s['max']:.{digits}f})"
    )


def side_by_side(
    blocks: dict[str, list[float]], steps: dict[str, list[float]], base: str
) -> dict[str, Any]:
    """Interleaved conditions against ``base``: each one's per-block step time
    (``step_s``), the ratio of its pooled step median to ``base``'s (``ratio_of_step_medians``:
    less sensitive to one slow block) and the spread of its per-round ratios to ``base``
    (``ratio_to_<base>``)."""
    return {
        "step_s": {name: spread(blocks[name]) for name in blocks},
        "ratio_of_step_medians": {
            name: statistics.median(steps[name]) / statistics.median(steps[base]) for name in steps
        },
        f"ratio_to_{base}": {
            name: spread([a / b for a, b in zip(blocks[name], blocks[base], strict=True)])
            for name in blocks
        },
    }


def run_on_shapes(
    prefix: str, world: int, train: int, worker: Callable[..., Any], *args: Any
) -> dict[str, Any]:
    """``worker(data, out, *args)`` in ``world`` gloo processes on a ``train``-image shapes
    dataset in a scratch folder; rank 0's result with the machine's load average."""
    with scratch_dir(prefix) as tmp:
        data = make_dataset(f"{tmp}/shapes", train=train)
        result = run_world(world, worker, data, f"{tmp}/out", *args)
    result["load_average"] = machine_load()
    return result


def machine_load() -> str:
    """The 1/5/15-minute load averages, for the record (other jobs may share the machine)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (on {os.cpu_count()} cores)"


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for a benchmark's dataset and output."""
    return tempfile.TemporaryDirectory(prefix=f"megdet-bench-{prefix}-")
