"""The controller's /metrics: the contract names, Prometheus conventions, run_info lifecycle."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from cluster.control_plane import free_port
from megdet.controller import metrics

#: The names the dashboards and alerts use (the team's contract), with their types.
CONTRACT = {
    "megdet_controller_reconciles": "counter",
    "megdet_controller_reconcile_duration_seconds": "histogram",
    "megdet_controller_runs": "gauge",
    "megdet_controller_jobs_created": "counter",
    "megdet_controller_jobs_deleted": "counter",
    "megdet_controller_jobs_successful": "counter",
    "megdet_controller_jobs_failed": "counter",
    "megdet_controller_jobs_restarted": "counter",
    "megdet_controller_run_info": "gauge",
    "megdet_controller_startup_seconds": "histogram",
}
LABELS = {
    "megdet_controller_reconciles": {"result"},
    "megdet_controller_runs": {"namespace", "phase"},
    "megdet_controller_jobs_created": {"namespace", "target"},
    "megdet_controller_startup_seconds": {"namespace", "target", "part", "le"},
    "megdet_controller_run_info": {
        "namespace",
        "run",
        "target",
        "world_size",
        "global_batch",
        "lr",
    },
}


def test_metrics_endpoint_serves_every_contract_name_with_its_type_and_labels() -> None:
    metrics.RECONCILES.labels("success").inc()
    metrics.JOBS_CREATED.labels("ns-m", "pytorchjob").inc()
    metrics.record_run_info("ns-m", "run-m", "pytorchjob", 16, 32, 0.04)
    metrics.set_run_phases([("ns-m", "Running")])
    metrics.STARTUP.labels("ns-m", "pytorchjob", "total").observe(75)
    port = free_port()
    metrics.serve(port, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in CONTRACT.items():
        assert families[name].type == kind, name
        assert families[name].documentation, f"{name} has no HELP text"
    assert "megdet_controller_reconciles_total{" in text  # counters carry _total on the wire
    for name, labels in LABELS.items():
        sample = next(
            s for s in families[name].samples if s.name in (name, f"{name}_total", f"{name}_bucket")
        )
        assert set(sample.labels) == labels, name
    info = [s for s in families["megdet_controller_run_info"].samples if s.labels["run"] == "run-m"]
    assert [
        (s.labels["world_size"], s.labels["global_batch"], s.labels["lr"], s.value) for s in info
    ] == [("16", "32", "0.04", 1.0)]
    # Every name is one of ours: a private registry, no process or platform collectors.
    assert all(n.startswith("megdet_controller_") for n in families)


def test_run_info_is_replaced_on_replan_and_removed_on_forget() -> None:
    metrics.record_run_info("ns-i", "r", "pytorchjob", 8, 16, 0.02)
    metrics.record_run_info("ns-i", "r", "trainjob", 16, 32, 0.04)
    series = [
        s.labels
        for f in metrics.REGISTRY.collect()
        if f.name == "megdet_controller_run_info"
        for s in f.samples
        if s.labels["namespace"] == "ns-i"
    ]
    assert series == [
        {
            "namespace": "ns-i",
            "run": "r",
            "target": "trainjob",
            "world_size": "16",
            "global_batch": "32",
            "lr": "0.04",
        }
    ]
    metrics.forget_run("ns-i", "r")
    assert metrics.REGISTRY.get_sample_value("megdet_controller_run_info", series[0]) is None


def test_runs_gauge_counts_phases_and_drops_to_zero_not_gaps() -> None:
    metrics.set_run_phases([("ns-p", "Running"), ("ns-p", "Running"), ("ns-p", "Pending")])

    def value(phase: str) -> float:
        return metrics.sample("megdet_controller_runs", {"namespace": "ns-p", "phase": phase})

    assert (value("Running"), value("Pending"), value("Failed")) == (2, 1, 0)
    metrics.set_run_phases([])
    assert (
        metrics.REGISTRY.get_sample_value(
            "megdet_controller_runs", {"namespace": "ns-p", "phase": "Running"}
        )
        == 0
    )
