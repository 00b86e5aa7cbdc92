"""The fleet dashboard (uid ``megdet-fleet``): the controller's view of every run: runs by
phase, the time each part of the runs' start-up took (monitoring/startup.py), the runs' GPU
efficiency, reconcile rate, errors and latency, progress reports, jobs
created/failed/succeeded/restarted, and the alerts firing."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table

from megdet.monitoring.efficiency import fleet_efficiency_panels
from megdet.monitoring.panels import (
    DATASOURCE,
    NAMESPACES,
    RATE,
    Ids,
    Panel,
    dashboard,
    query,
    query_variable,
    stat_panel,
    timeseries_panel,
)
from megdet.monitoring.startup import startup_panels

__all__ = ["fleet_dashboard"]

# Every controller replica that has acted exports megdet_controller_runs for the whole cluster
# (a standby keeps its last values): max over replicas per namespace, never sum.
RUNS_BY_NAMESPACE = f"max by (namespace, phase) (megdet_controller_runs{{{NAMESPACES}}})"


def fleet_dashboard() -> db.Dashboard:
    """The fleet dashboard: the controller's reconciles and jobs, and every run's phase."""
    return dashboard(
        "MegDet fleet",
        "megdet-fleet",
        "Every MegDetRun the controller manages: phases, reconciles, jobs, throughput.",
        [
            query_variable(
                "namespace",
                "Namespace",
                "label_values(megdet_controller_runs, namespace)",
                multi=True,
            )
        ],
        [
            ("Runs", _fleet_run_panels),
            ("Start-up", startup_panels),
            ("GPU efficiency", fleet_efficiency_panels),
            ("Controller", _fleet_controller_panels),
            ("Jobs", _fleet_job_panels),
        ],
    )


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
            "status.progress writes of the progress endpoint: written, superseded (the run held "
            "that report or a newer one), refused (the API server refused the value: dropped, "
            "never retried), error (retried), gone (run deleted).",
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
    def jobs(kind: str, legend: str) -> tuple[str, str]:
        """One job counter's increase by namespace and target, and its legend naming both."""
        return (
            f"sum by (namespace, target) "
            f"(increase(megdet_controller_jobs_{kind}_total{{{NAMESPACES}}}[{RATE}]))",
            legend + " {{namespace}} {{target}}",
        )

    return [
        timeseries_panel(
            ids,
            "Jobs created and deleted",
            "PyTorchJobs/TrainJobs the controller created or saw deleted.",
            [jobs("created", "created"), jobs("deleted", "deleted")],
        ),
        timeseries_panel(
            ids,
            "Jobs succeeded, failed, restarted",
            "Job outcomes as the controller observed them.",
            [
                jobs("successful", "succeeded"),
                jobs("failed", "failed"),
                jobs("restarted", "restarted"),
            ],
        ),
        *(
            stat_panel(
                ids,
                f"Jobs {outcome} (range)",
                f"Jobs {outcome} in the selected time range.",
                f"sum(increase(megdet_controller_jobs_{outcome}_total{{{NAMESPACES}}}[$__range]))",
            )
            for outcome in ("created", "failed")
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
