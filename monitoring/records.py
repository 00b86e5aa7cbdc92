"""The efficiency recording rules as data: what each recorded series is and its PromQL.

Pure data (no Grafana SDK): :mod:`megdet.monitoring.alerts` renders these into the operator
chart's PrometheusRule, and the dashboards (:mod:`megdet.monitoring.efficiency`) read the
series they write. What the numbers mean: docs/monitoring.md, "GPU efficiency".
"""

from __future__ import annotations

from dataclasses import dataclass

from megdet.monitoring.pods import POD_SUFFIX

__all__ = [
    "ACTIVITY",
    "EFFICIENCY_KEY",
    "GROUP",
    "IMAGES_PER_GPU",
    "RECORDED_METRICS",
    "RECORDS",
    "SCALING",
    "SINGLE_NODE",
    "Record",
]

#: The rules' section in the operator chart's ``alerts`` values (``enabled``, ``lookback``).
EFFICIENCY_KEY = "efficiency"
#: The PrometheusRule group that holds the recording rules.
GROUP = "megdet-efficiency"

IMAGES_PER_GPU = "namespace_run:megdet_train_images_per_gpu:rate5m"
SINGLE_NODE = "namespace_run:megdet_train_images_per_gpu_single_node:rate5m"
SCALING = "namespace_run:megdet_train_scaling_efficiency:ratio"
ACTIVITY = "namespace_run:megdet_gpu_activity:avg"

_BY = "(namespace, run)"


@dataclass(frozen=True)
class Record:
    """One recording rule; ``<<name>>`` in ``expr`` is ``.Values.alerts.efficiency.<name>``."""

    record: str
    expr: str


RECORDS: tuple[Record, ...] = (
    Record(
        IMAGES_PER_GPU,
        f"sum by {_BY} (rate(megdet_train_images_total[5m]))\n"
        f"/ on {_BY} max by {_BY} (megdet_train_world_size)",
    ),
    Record(
        SINGLE_NODE,
        f"{IMAGES_PER_GPU}\nand on {_BY} (max by {_BY} (megdet_train_nodes) == 1)",
    ),
    Record(
        SCALING,
        f"{IMAGES_PER_GPU}\n/ on {_BY} max_over_time({SINGLE_NODE}[<<lookback>>])",
    ),
    Record(
        ACTIVITY,
        f"avg by {_BY} (label_replace(DCGM_FI_PROF_GR_ENGINE_ACTIVE, "
        f'"run", "$1", "pod", "(.+)-{POD_SUFFIX}"))\n'
        f"and on {_BY} megdet_train_run_info",
    ),
)
#: The series the recording rules write (dashboards may read them).
RECORDED_METRICS: frozenset[str] = frozenset(r.record for r in RECORDS)
