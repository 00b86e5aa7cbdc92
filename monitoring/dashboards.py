"""Grafana dashboards as code, built with Grafana's own ``grafana-foundation-sdk``.

Two dashboards:

* **MegDet run** (uid ``megdet-run``): one training run, picked with the ``namespace`` and
  ``run`` variables. Is it learning (losses, LR against the plan, AP), is it fast (images/s per
  rank and in total, iteration against data-loading time, GPU memory), is it stuck (iteration,
  ETA, checkpoint age, resumes), are all ranks healthy (ranks reporting, scrape health, SyncBN
  divergence), plus dcgm-exporter's GPU utilization and memory when it runs in the cluster.
* **MegDet fleet** (uid ``megdet-fleet``): the controller's view: runs by phase, reconcile rate,
  errors and latency, jobs created/failed/succeeded/restarted, and throughput of every run.

Every query goes through the datasource variable ``${datasource}``; no namespace is written
into a query. ``python -m megdet.monitoring generate`` (``make dashboards``) writes the JSON
that the operator chart ships; a test fails when the committed JSON is stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from megdet.monitoring.efficiency import fleet_efficiency_panels, gpu_panels
from megdet.monitoring.panels import (
    DATASOURCE,
    NAMESPACES,
    RATE,
    RUN,
    RUN_POD_NAMES,
    Ids,
    Panel,
    dashboard,
    datasource_variable,
    query,
    query_variable,
    row,
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

# Every controller replica that has acted exports megdet_controller_runs for the whole cluster
# (a standby keeps its last values): max over replicas per namespace, never sum.
RUNS_BY_NAMESPACE = f"max by (namespace, phase) (megdet_controller_runs{{{NAMESPACES}}})"


def run_dashboard() -> db.Dashboard:
    """The per-run dashboard: learning, speed, health and GPU panels for one MegDetRun."""
    ids = Ids()
    d = (
        dashboard(
            "MegDet run",
            "megdet-run",
            "One MegDet training run: is it learning, is it fast, is it stuck, are all ranks "
            "healthy, is SyncBN synchronizing.",
        )
        .with_variable(datasource_variable())
        .with_variable(
            query_variable(
                "namespace", "Namespace", "label_values(megdet_train_iteration, namespace)"
            )
        )
        .with_variable(
            query_variable(
                "run", "Run", 'label_values(megdet_train_iteration{namespace="$namespace"}, run)'
            )
        )
    )
    d = d.with_row(row(ids, "Overview"))
    for panel in _overview_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "Learning"))
    for panel in _learning_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "Speed"))
    for panel in _speed_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "Health"))
    for panel in _health_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "GPUs (dcgm-exporter) and efficiency"))
    for panel in gpu_panels(ids):
        d = d.with_panel(panel)
    return d


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


def fleet_dashboard() -> db.Dashboard:
    """The fleet dashboard: the controller's reconciles and jobs, and every run's phase."""
    ids = Ids()
    d = (
        dashboard(
            "MegDet fleet",
            "megdet-fleet",
            "Every MegDetRun the controller manages: phases, reconciles, jobs, throughput.",
        )
        .with_variable(datasource_variable())
        .with_variable(
            query_variable(
                "namespace",
                "Namespace",
                "label_values(megdet_controller_runs, namespace)",
                multi=True,
            )
        )
    )
    d = d.with_row(row(ids, "Runs"))
    for panel in _fleet_run_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "GPU efficiency"))
    for panel in fleet_efficiency_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "Controller"))
    for panel in _fleet_controller_panels(ids):
        d = d.with_panel(panel)
    d = d.with_row(row(ids, "Jobs"))
    for panel in _fleet_job_panels(ids):
        d = d.with_panel(panel)
    return d


def _fleet_run_panels(ids: Ids) -> list[Panel]:
    runs_table = (
        table.Panel()
        .id(ids.next())
        .title("Runs and their plans")
        .description("One row per run the controller planned (megdet_controller_run_info).")
        .datasource(DATASOURCE)
        .span(24)
        .height(8)
        .with_target(
            query(
                f"max by (namespace, run, target, world_size, global_batch, lr) "
                f"(megdet_controller_run_info{{{NAMESPACES}}})",
                instant=True,
            )
        )
    )
    return [
        timeseries_panel(
            ids,
            "Runs by phase",
            "MegDetRuns per status phase.",
            [(f"sum by (phase) ({RUNS_BY_NAMESPACE})", "{{phase}}")],
        ),
        timeseries_panel(
            ids,
            "Throughput by run",
            "Images per second of every training run the trainer exporters report.",
            [
                (
                    f"sum by (namespace, run) "
                    f"(rate(megdet_train_images_total{{{NAMESPACES}}}[{RATE}]))",
                    "{{namespace}}/{{run}}",
                )
            ],
            unit="suffix: img/s",
        ),
        runs_table,
    ]


def _fleet_controller_panels(ids: Ids) -> list[Panel]:
    duration = "megdet_controller_reconcile_duration_seconds_bucket"
    return [
        timeseries_panel(
            ids,
            "Reconcile rate by result",
            "Reconciles per second: success, invalid (spec refused), denied (outside the "
            "cluster's MegDet policy), error (retried), conflict (a job name or output folder "
            "taken), refused (the API server refused the job).",
            [
                (
                    f"sum by (result) (rate(megdet_controller_reconciles_total[{RATE}]))",
                    "{{result}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Reconcile errors",
            "Reconciles that raised and will be retried, per second.",
            [
                (
                    f'sum(rate(megdet_controller_reconciles_total{{result="error"}}[{RATE}]))',
                    "errors",
                )
            ],
            unit="reqps",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Reconcile latency",
            "p50 and p99 time to reconcile one MegDetRun.",
            [
                (
                    f"histogram_quantile(0.5, sum by (le) (rate({duration}[{RATE}])))",
                    "p50",
                ),
                (
                    f"histogram_quantile(0.99, sum by (le) (rate({duration}[{RATE}])))",
                    "p99",
                ),
            ],
            unit="s",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Progress reports by result",
            "Training pods' progress reports to the controller's endpoint (target pytorchjob): "
            "accepted, or refused (unauthenticated, forbidden: a token not of that run; "
            "invalid payload or value out of range, not_found, rate_limited: too many token "
            "reviews from one address, busy, error).",
            [
                (
                    f"sum by (result) (rate(megdet_controller_progress_reports_total[{RATE}]))",
                    "{{result}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Progress status writes by result",
            "status.progress writes of the progress endpoint: written, refused (the API server "
            "refused the value: dropped, never retried), error (retried), gone (run deleted).",
            [
                (
                    f"sum by (result) (rate(megdet_controller_progress_writes_total[{RATE}]))",
                    "{{result}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Connections refused",
            "Connections to the controller's /metrics and progress servers closed unserved: "
            "busy (refused over the cap), evicted (the oldest unfinished one, for a newcomer) or "
            "deadline (the request did not arrive in full in time). A steady rate is a client "
            "holding connections open (slowloris) or too many reporters for the cap.",
            [
                (
                    f"sum by (server, reason) (rate(megdet_controller_http_refused_total[{RATE}]))",
                    "{{server}} {{reason}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
        timeseries_panel(
            ids,
            "Run reads for status writes",
            "Where the controller read a run before writing its status: watch (its watch of the "
            "runs, or its own last write: no request), server (the API server) and stale (a "
            "view the API server refused with 409 because the run had changed: read again). "
            "server or stale near watch means the watch lags the API server.",
            [
                (
                    f"sum by (source) (rate(megdet_controller_run_reads_total[{RATE}]))",
                    "{{source}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
    ]


def _fleet_job_panels(ids: Ids) -> list[Panel]:
    def jobs(kind: str) -> str:
        return (
            f"sum by (namespace, target) "
            f"(increase(megdet_controller_jobs_{kind}_total{{{NAMESPACES}}}[{RATE}]))"
        )

    return [
        timeseries_panel(
            ids,
            "Jobs created and deleted",
            "PyTorchJobs/TrainJobs the controller created or saw deleted.",
            [
                (jobs("created"), "created {{namespace}} {{target}}"),
                (jobs("deleted"), "deleted {{namespace}} {{target}}"),
            ],
        ),
        timeseries_panel(
            ids,
            "Jobs succeeded, failed, restarted",
            "Job outcomes as the controller observed them.",
            [
                (jobs("successful"), "succeeded {{namespace}} {{target}}"),
                (jobs("failed"), "failed {{namespace}} {{target}}"),
                (jobs("restarted"), "restarted {{namespace}} {{target}}"),
            ],
        ),
        stat_panel(
            ids,
            "Jobs created (range)",
            "Jobs created in the selected time range.",
            f"sum(increase(megdet_controller_jobs_created_total{{{NAMESPACES}}}[$__range]))",
        ),
        stat_panel(
            ids,
            "Jobs failed (range)",
            "Jobs failed in the selected time range.",
            f"sum(increase(megdet_controller_jobs_failed_total{{{NAMESPACES}}}[$__range]))",
        ),
        stat_panel(
            ids,
            "Runs failed now",
            "MegDetRuns in phase Failed.",
            f'sum(max by (namespace) (megdet_controller_runs{{{NAMESPACES}, phase="Failed"}}))',
        ),
        stat_panel(
            ids,
            "Alerts firing",
            "MegDet alerts firing now (from the PrometheusRule this chart ships).",
            'count(ALERTS{alertname=~"MegDet.*", alertstate="firing"}) or vector(0)',
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
