"""The fleet dashboard's "Start-up" row: how long each part of a run attempt's start took
(``megdet_controller_startup_seconds``, one observation per attempt and part; the controller's
``status.startup``), p50 and p95 over the dashboard's time range, per part, for the chosen
namespaces. The histogram has no run label (a run's own parts are in its ``status.startup``),
so the row sits in the fleet dashboard, not the run one."""

from __future__ import annotations

from megdet.monitoring.panels import NAMESPACES, Ids, Panel, stat_panel

__all__ = ["STARTUP_BUCKET", "startup_panels"]

STARTUP_BUCKET = "megdet_controller_startup_seconds_bucket"


def _quantile(q: float) -> str:
    # increase over the whole range: a part is observed once per attempt, too rarely for a
    # rate over a few scrape intervals to hold any.
    return (
        f"histogram_quantile({q}, sum by (part, le) "
        f"(increase({STARTUP_BUCKET}{{{NAMESPACES}}}[$__range])))"
    )


def startup_panels(ids: Ids) -> list[Panel]:
    about = (
        "the time each part of a run attempt's start took, over the dashboard's time range: "
        "admission_wait (Workload created to admitted by Kueue), scheduling (first pod created "
        "to the last scheduled), container_start (image pull, sandbox, init containers), "
        "rendezvous (torchrun's rendezvous, the trainer's imports), data_model (model, data "
        "and checkpoint loaded), first_iteration, total (created to the first iteration done). "
        "Interpolated within the histogram's buckets (1 s to 1 h)."
    )
    return [
        stat_panel(ids, "Start-up p50 by part", f"Median of {about}", _quantile(0.5), "s",
                   legend="{{part}}").span(12),
        stat_panel(ids, "Start-up p95 by part", f"95th percentile of {about}", _quantile(0.95),
                   "s", legend="{{part}}").span(12),
    ]  # fmt: skip
