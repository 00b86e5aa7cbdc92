"""The trainer's metric table: every metric it exports, with type, labels, scope and help.

The contract with the dashboards and alerts (monitoring/): :data:`TRAINER_METRICS` is the one
list; :mod:`megdet.trainer.metrics` creates the prometheus_client objects from it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Append-only JSON lines in the output folder: one object per resume / non-finite loss.
HISTORY_FILE = "run_history.jsonl"
#: Loss history window for the loss gauges (detectron2's console printer uses the same).
LOSS_WINDOW = 20
#: Iteration-time window for the ETA (detectron2's CommonMetricPrinter uses the same).
ETA_WINDOW = 1000


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: exposition name, type, labels, who exports it, help text."""

    name: str
    kind: str  # "gauge" | "counter" (counter names end in _total, as exposed)
    labels: tuple[str, ...]
    scope: str  # "global": rank 0 only | "rank": every rank, with a rank label
    help: str


GAUGE, COUNTER = "gauge", "counter"
_G, _C = GAUGE, COUNTER
#: Every metric the trainer exports (the contract with the dashboards and alerts).
TRAINER_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("megdet_train_iteration", _G, (), "global", "Iterations completed."),
    MetricSpec("megdet_train_max_iterations", _G, (), "global", "Planned iterations (max_iter)."),
    MetricSpec(
        "megdet_train_loss",
        _G,
        ("component",),
        "global",
        f"Training loss by component (total = their sum); median of the last {LOSS_WINDOW} "
        "iterations.",
    ),
    MetricSpec("megdet_train_learning_rate", _G, (), "global", "Learning rate in use."),
    MetricSpec(
        "megdet_train_planned_learning_rate",
        _G,
        (),
        "global",
        "Learning rate the plan gives for the same iteration (megdet.plan Plan.lr_at).",
    ),
    MetricSpec(
        "megdet_train_images_total", _C, ("rank",), "rank", "Training images processed by a rank."
    ),
    MetricSpec(
        "megdet_train_iteration_seconds",
        _G,
        ("rank",),
        "rank",
        "Wall time of a rank's last iteration.",
    ),
    MetricSpec(
        "megdet_train_data_seconds",
        _G,
        ("rank",),
        "rank",
        "Data-loading time of a rank's last iteration.",
    ),
    MetricSpec(
        "megdet_train_eta_seconds",
        _G,
        (),
        "global",
        f"Estimated seconds to the last iteration (median of the last {ETA_WINDOW} iteration "
        "times x iterations left).",
    ),
    MetricSpec(
        "megdet_train_gpu_memory_max_bytes",
        _G,
        ("rank",),
        "rank",
        "Peak GPU memory allocated by a rank (torch.cuda.max_memory_allocated); CUDA only.",
    ),
    MetricSpec(
        "megdet_train_run_info",
        _G,
        ("world_size", "sync_bn", "bn_group_size", "global_batch"),
        "global",
        "The run's shape (value 1): world size, SyncBN scope, BN group size, global batch.",
    ),
    MetricSpec(
        "megdet_train_world_size",
        _G,
        (),
        "global",
        "Processes the run trains on now, one per GPU (changes when the run is resized).",
    ),
    MetricSpec("megdet_train_nodes", _G, (), "global", "Nodes (pods) the run trains on now."),
    MetricSpec(
        "megdet_eval_ap",
        _G,
        ("metric",),
        "global",
        "COCO box AP of the last evaluation, percent (AP, AP50, AP75, APs, APm, APl).",
    ),
    MetricSpec(
        "megdet_train_last_checkpoint_timestamp_seconds",
        _G,
        (),
        "global",
        "Unix time of the last complete checkpoint in the output folder.",
    ),
    MetricSpec(
        "megdet_train_nonfinite_loss_total",
        _C,
        (),
        "global",
        f"Non-finite losses in this run, restarts included ({HISTORY_FILE}).",
    ),
    MetricSpec(
        "megdet_train_resumes",
        _G,
        (),
        "global",
        f"Times this run resumed from a checkpoint ({HISTORY_FILE}).",
    ),
    MetricSpec(
        "megdet_syncbn_divergence",
        _G,
        ("stat",),
        "global",
        "Largest |difference| of backbone BN running statistics (stat=mean|var) between ranks "
        "of a BN group; ~0 when BN is synchronized.",
    ),
    MetricSpec(
        "megdet_train_fabric_info",
        _G,
        ("rank", "transport", "requested"),
        "rank",
        "The network a rank's NCCL uses (value 1), from NCCL's init log (trainer/fabric.py): "
        "transport = NCCL's network name (IB, Socket, a plugin's), gloo for a CPU run (not "
        "NCCL), none for one process, unknown when the log was not readable; requested = IB "
        "(NCCL_IB_DISABLE=0 or NCCL_IB_HCA set), Socket (InfiniBand off) or any.",
    ),
)
#: The exposition names of :data:`TRAINER_METRICS`.
TRAINER_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in TRAINER_METRICS)
