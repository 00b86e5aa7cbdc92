"""Grafana dashboards as code, built with Grafana's own ``grafana-foundation-sdk``.

Two dashboards:

* **MegDet run** (uid ``megdet-run``): one training run, picked with the ``namespace`` and
  ``run`` variables. Is it learning (losses, LR against the plan, AP), is it fast (images/s per
  rank and in total, iteration against data-loading time, GPU memory), is it stuck (iteration,
  ETA, checkpoint age, resumes), are all ranks healthy (ranks reporting, scrape health, SyncBN
  divergence), plus dcgm-exporter's GPU utilization, memory and activity when it runs in the
  cluster, and the run's GPU efficiency (monitoring/efficiency.py).
* **MegDet fleet** (uid ``megdet-fleet``, monitoring/fleet.py): the controller's view: runs by
  phase, every run's GPU efficiency, reconcile rate,
  errors and latency, jobs created/failed/succeeded/restarted, and throughput of every run.

Every query goes through the datasource variable ``${datasource}``; no namespace is written
into a query. ``python -m megdet.monitoring generate`` (``make dashboards``) writes the JSON
that the operator chart ships; a test fails when the committed JSON is stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from megdet.monitoring.efficiency import gpu_panels
from megdet.monitoring.fleet import fleet_dashboard
from megdet.monitoring.panels import (
    DATASOURCE,
    RATE,
    RUN,
    RUN_POD_NAMES,
    Ids,
    Panel,
    dashboard,
    query_variable,
    stat_panel,
    timeseries_panel,
)

__all__ = [
    "DASHBOARDS",
    "DATASOURCE",
    "RUN_POD_NAMES",
    "fleet_dashboard",
    "render",
    "run_dashboard",
]


def run_dashboard() -> db.Dashboard:
    """The per-run dashboard: learning, speed, health and GPU panels for one MegDetRun."""
    return dashboard(
        "MegDet run",
        "megdet-run",
        "One MegDet training run: is it learning, is it fast, is it stuck, are all ranks "
        "healthy, is SyncBN synchronizing.",
        [
            query_variable(
                "namespace", "Namespace", "label_values(megdet_train_iteration, namespace)"
            ),
            query_variable(
                "run", "Run", 'label_values(megdet_train_iteration{namespace="$namespace"}, run)'
            ),
        ],
        [
            ("Overview", _overview_panels),
            ("Learning", _learning_panels),
            ("Speed", _speed_panels),
            ("Health", _health_panels),
            ("GPUs (dcgm-exporter) and efficiency", gpu_panels),
        ],
    )


def _overview_panels(ids: Ids) -> list[Panel]:
    images_per_s = f"sum(rate(megdet_train_images_total{{{RUN}}}[{RATE}]))"
    return [
        stat_panel(
            ids,
            "Iteration",
            "Last completed iteration (rank 0).",
            f"max(megdet_train_iteration{{{RUN}}})",
        ),
        stat_panel(
            ids,
            "Progress",
            "Completed iterations over the plan's max_iter.",
            f"max(megdet_train_iteration{{{RUN}}}) / max(megdet_train_max_iterations{{{RUN}}})",
            unit="percentunit",
        ),
        stat_panel(
            ids,
            "ETA",
            "detectron2's estimate of the time left.",
            f"max(megdet_train_eta_seconds{{{RUN}}})",
            unit="s",
        ),
        stat_panel(
            ids,
            "Throughput",
            "Images per second, all ranks together.",
            images_per_s,
            unit="suffix: img/s",
        ),
        stat_panel(
            ids,
            "Plan",
            "World size, global batch and SyncBN scope the run trains with.",
            "max by (world_size, global_batch, sync_bn, bn_group_size) "
            f"(megdet_train_run_info{{{RUN}}})",
            legend="{{world_size}} ranks, batch {{global_batch}}, SyncBN {{sync_bn}}",
        ),
        stat_panel(
            ids,
            "Ranks reporting",
            "Ranks whose exporter Prometheus scrapes now; compare with the world size.",
            f"count(megdet_train_iteration_seconds{{{RUN}}})",
        ),
        stat_panel(
            ids,
            "Resumes",
            "Times this run resumed from a checkpoint (restarts that got going again).",
            f"max(megdet_train_resumes{{{RUN}}})",
        ),
        stat_panel(
            ids,
            "Non-finite losses",
            "Iterations whose loss was NaN or infinite.",
            f"sum(megdet_train_nonfinite_loss_total{{{RUN}}})",
        ),
    ]


def _learning_panels(ids: Ids) -> list[Panel]:
    return [
        timeseries_panel(
            ids,
            "Loss components",
            "Each detectron2 loss term and their total (rank 0's smoothed values).",
            [(f"max by (component) (megdet_train_loss{{{RUN}}})", "{{component}}")],
        ),
        timeseries_panel(
            ids,
            "Learning rate vs plan",
            "The LR the optimizer uses against megdet.plan's LR for the same iteration; "
            "a gap means the schedule is not the planned one.",
            [
                (f"max(megdet_train_learning_rate{{{RUN}}})", "in use"),
                (f"max(megdet_train_planned_learning_rate{{{RUN}}})", "plan"),
            ],
        ),
        timeseries_panel(
            ids,
            "COCO box AP",
            "AP metrics after each evaluation.",
            [(f"max by (metric) (megdet_eval_ap{{{RUN}}})", "{{metric}}")],
            width=24,
        ),
    ]


def _speed_panels(ids: Ids) -> list[Panel]:
    return [
        timeseries_panel(
            ids,
            "Throughput per rank and total",
            "Images per second; one slow rank slows every rank (synchronous data parallel).",
            [
                (
                    f"sum by (rank) (rate(megdet_train_images_total{{{RUN}}}[{RATE}]))",
                    "rank {{rank}}",
                ),
                (f"sum(rate(megdet_train_images_total{{{RUN}}}[{RATE}]))", "total"),
            ],
            unit="suffix: img/s",
        ),
        timeseries_panel(
            ids,
            "Iteration vs data time",
            "Recent time per iteration and the part spent waiting for data, per rank.",
            [
                (f"max by (rank) (megdet_train_iteration_seconds{{{RUN}}})", "iteration r{{rank}}"),
                (f"max by (rank) (megdet_train_data_seconds{{{RUN}}})", "data r{{rank}}"),
            ],
            unit="s",
        ),
        timeseries_panel(
            ids,
            "Data-loading share",
            "Data time over iteration time per rank: near 1 means the run is input-bound.",
            [
                (
                    f"max by (rank) (megdet_train_data_seconds{{{RUN}}}) / "
                    f"max by (rank) (megdet_train_iteration_seconds{{{RUN}}})",
                    "rank {{rank}}",
                )
            ],
            unit="percentunit",
        ),
        timeseries_panel(
            ids,
            "GPU memory (max allocated)",
            "torch.cuda.max_memory_allocated per rank.",
            [(f"max by (rank) (megdet_train_gpu_memory_max_bytes{{{RUN}}})", "rank {{rank}}")],
            unit="bytes",
        ),
    ]


def _health_panels(ids: Ids) -> list[Panel]:
    return [
        timeseries_panel(
            ids,
            "SyncBN divergence",
            "Largest difference across ranks of the backbone BN running mean/var. About 0 "
            "when BN is synchronized; it grows when it is not (scope none).",
            [(f"max by (stat) (megdet_syncbn_divergence{{{RUN}}})", "{{stat}}")],
        ),
        timeseries_panel(
            ids,
            "Checkpoint age",
            "Seconds since the last complete checkpoint.",
            [
                (
                    f"time() - max(megdet_train_last_checkpoint_timestamp_seconds{{{RUN}}})",
                    "age",
                )
            ],
            unit="s",
        ),
        timeseries_panel(
            ids,
            "Resumes and non-finite losses",
            "Resumes from a checkpoint, and NaN/inf loss events, over time.",
            [
                (f"max(megdet_train_resumes{{{RUN}}})", "resumes"),
                (f"sum(megdet_train_nonfinite_loss_total{{{RUN}}})", "non-finite losses"),
            ],
        ),
        timeseries_panel(
            ids,
            "Scrape health per pod",
            "1 when Prometheus reached the pod's metrics port at the last scrape.",
            [(f"max by (pod) (up{{{RUN}}})", "{{pod}}")],
        ),
        timeseries_panel(
            ids,
            "Ranks by NCCL network",
            "The network each rank's NCCL uses, from NCCL's own init log (IB, Socket, a "
            "plugin's; gloo: a CPU run, not NCCL), against what the pod asked for. Socket "
            "where IB was requested is MegDetFabricDegraded.",
            [
                (
                    f"count by (transport, requested) (megdet_train_fabric_info{{{RUN}}})",
                    "{{transport}} (requested {{requested}})",
                )
            ],
            width=24,
        ),
    ]


#: File stem -> builder, for every dashboard the chart ships.
DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "megdet-run": run_dashboard,
    "megdet-fleet": fleet_dashboard,
}


def render(builder: db.Dashboard) -> str:
    """The dashboard's JSON as committed: sorted keys, two-space indent, trailing newline."""
    return json.dumps(builder.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
