"""Every dashboard query and every alert rule, run by a real Prometheus against real exporters.

One module-scoped fixture starts, on 127.0.0.1 with free ports:

* the controller (real kopf operator against kmock, see live_harness.py) driven through
  every run phase, its registry served like the controller pod's ``metrics`` port;
* Prometheus 2.42 (Debian's package, unpacked into the venv) scraping every second, with the
  chart's rendered alert rules loaded, and static targets labelled as the PodMonitor's
  relabeling (namespace, pod, run) and the controller's ServiceMonitor (honorLabels) label them;
* a 2-worker CPU training run (gloo) exporting metrics, stopped with SIGTERM once every
  training series has been scraped.

Queries then run at that moment (``time=``), so the training run may be gone by then.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from live_harness import (
    NAMESPACE,
    SCRAPER_TOKEN,
    TRAINING_RUN,
    ControllerUnderTest,
    TrainingRun,
    training_command,
)
from monitoring_helpers import rule_groups, rules_by_alert

from megdet.monitoring.__main__ import DASHBOARD_DIR
from megdet.monitoring.dashboards import DASHBOARDS
from megdet.monitoring.queries import (
    EXTERNAL_METRICS,
    dashboard_queries,
    metric_names,
    substitute,
    variable_queries,
)
from megdet.monitoring.records import IMAGES_PER_GPU, RECORDED_METRICS, SCALING
from tests.prometheus_harness import PrometheusError, PrometheusServer, free_port, promtool

pytestmark = pytest.mark.slow

POD = f"{TRAINING_RUN}-master-0"
# Grafana's built-ins as Grafana would fill them for a short time range at 1 s scrapes.
GRAFANA = {"__rate_interval": "20s", "__range": "5m", "__interval": "1s", "datasource": "x"}
VARIABLES = {
    "megdet-run": {**GRAFANA, "namespace": NAMESPACE, "run": TRAINING_RUN},
    "megdet-fleet": {**GRAFANA, "namespace": NAMESPACE},
}
# Panels of the run dashboard that cannot have data on this machine, and why.
NO_DATA_HERE = {
    "GPU memory (max allocated)": "torch.cuda.max_memory_allocated: CUDA only, this run is CPU",
    "GPU utilization (DCGM)": "dcgm-exporter's metric; no GPU and no dcgm-exporter here",
    "GPU framebuffer used (DCGM)": "dcgm-exporter's metric; no GPU and no dcgm-exporter here",
    "GPU activity (DCGM)": "dcgm-exporter's metric; no GPU and no dcgm-exporter here",
}
# Series that must have been scraped before the run stops: every kind the run dashboard shows.
TRAINING_READY = [
    f'count(megdet_train_iteration_seconds{{run="{TRAINING_RUN}"}}) == 2',
    f'megdet_eval_ap{{run="{TRAINING_RUN}", metric="AP50"}}',
    f'megdet_train_last_checkpoint_timestamp_seconds{{run="{TRAINING_RUN}"}} > 0',
    f'megdet_syncbn_divergence{{run="{TRAINING_RUN}"}}',
    f'sum(rate(megdet_train_images_total{{run="{TRAINING_RUN}"}}[20s])) > 0',
    f'megdet_train_loss{{run="{TRAINING_RUN}", component="total"}}',
    f'megdet_train_eta_seconds{{run="{TRAINING_RUN}"}}',
    # The efficiency rules' output (one node: the run is its own single-node reference).
    f'{SCALING}{{run="{TRAINING_RUN}"}}',
]


@dataclass
class Live:
    prometheus: PrometheusServer
    at: float  # the moment every training series had been scraped
    trainer_metrics: str
    controller_metrics: str
    training_exit: int
    workers_left: list[int]
    controller_url: str
    #: The files of the trainer's default metrics folder (one per port in /tmp) after the
    #: stop, or None: the folder is gone.
    metrics_folder_left: list[str] | None

    def query(self, expr: str) -> list[dict]:
        return self.prometheus.api("query", {"query": expr, "time": f"{self.at:.3f}"})["result"]


def _get(url: str, token: str | None = None) -> str:
    import ssl

    context = None
    if url.startswith("https:"):  # the controller's self-signed certificate, as Prometheus
        context = ssl.create_default_context()  # scrapes it: insecure_skip_verify
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return response.read().decode()


def _wait_until_ready(prom: PrometheusServer, run: TrainingRun, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(TRAINING_READY)
    while pending:
        if not run.running():
            raise AssertionError(f"training exited early:\n{run.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not scraped after {timeout}s: {pending}\n{run.log.read_text()[-3000:]}"
            )
        pending = [q for q in pending if not prom.query(q)["result"]]
        time.sleep(1)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Live:
    from megdet.trainer.shapes import make_shapes

    work = tmp_path_factory.mktemp("live")
    shapes = make_shapes(work / "shapes", train=16, val=8, seed=1)
    trainer_port, controller_port = free_port(), free_port()
    rules = work / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    token_file = work / "prometheus-token"  # the ServiceAccount token file of a real pod
    token_file.write_text(SCRAPER_TOKEN)

    controller = ControllerUnderTest(controller_port)
    prom = PrometheusServer(
        work / "prometheus",
        scrape_configs=[
            {
                # As Prometheus Operator configures the PodMonitor: namespace/pod/container/
                # endpoint from the pod, job "<namespace>/<podmonitor>", run from the relabeling.
                "job_name": "monitoring/megdet-trainers",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{trainer_port}"],
                        "labels": {
                            "namespace": NAMESPACE,
                            "pod": POD,
                            "container": "trainer",
                            "endpoint": "metrics",
                            "run": TRAINING_RUN,
                        },
                    }
                ],
            },
            {
                # The controller's ServiceMonitor keeps the exposed `namespace` (the run's)
                # with honorLabels; the pod's namespace labels the controller-wide series.
                # metrics.secure (the default): HTTPS, Prometheus's token (bearerTokenFile),
                # the self-signed certificate not verified (insecureSkipVerify).
                "job_name": "megdet-operator",
                "honor_labels": True,
                "scheme": "https",
                "authorization": {"credentials_file": str(token_file)},
                "tls_config": {"insecure_skip_verify": True},
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{controller_port}"],
                        "labels": {"namespace": "megdet-system", "pod": "megdet-operator-0"},
                    }
                ],
            },
        ],
        rule_files=(rules,),
    )
    run = None
    try:
        prom.start()
        run = TrainingRun(training_command(shapes, work / "run", trainer_port), work / "train.log")
        # The controller scenario runs while the trainer starts up (its imports dominate).
        controller.start()
        _wait_until_ready(prom, run, timeout=240)
        at = time.time()
        trainer_text = _get(f"http://127.0.0.1:{trainer_port}/metrics")
        controller_text = _get(f"https://127.0.0.1:{controller_port}/metrics", SCRAPER_TOKEN)
        exit_status = run.stop()
        time.sleep(1)  # let the workers' exit be reaped before looking for leftovers
        yield Live(
            prom, at, trainer_text, controller_text, exit_status, run.group_alive(),
            f"https://127.0.0.1:{controller_port}/metrics",
            trainer_metrics_folder_left(trainer_port),
        )  # fmt: skip
    finally:
        if run is not None:
            run.stop()
            run.kill_group()
        prom.stop()
        controller.stop()


def trainer_metrics_folder_left(port: int) -> list[str] | None:
    """What is left of the trainer's default metrics folder for ``port`` (None: gone)."""
    from megdet.trainer.metrics import default_multiproc_dir  # detectron2: not at collection

    folder = default_multiproc_dir(port)
    return sorted(os.listdir(folder)) if folder.exists() else None


def _queries():
    out = []
    for name in sorted(DASHBOARDS):
        dashboard = json.loads((DASHBOARD_DIR / f"{name}.json").read_text())
        out += dashboard_queries(name, dashboard)
    return out


QUERIES = _queries()


def test_the_training_run_stopped_cleanly_on_sigterm(live):
    # 143: the trainer's exit status after a SIGTERM stop with a checkpoint (128 + SIGTERM).
    assert live.training_exit == 143
    assert live.workers_left == [], "training processes left running after the stop"
    assert live.metrics_folder_left is None, "the trainer's metrics folder left in /tmp"


@pytest.mark.parametrize("query", QUERIES, ids=str)
def test_every_dashboard_query_evaluates_and_run_panels_have_data(live, query):
    expr = substitute(query.expr, VARIABLES[query.dashboard])
    try:
        result = live.query(expr)
    except PrometheusError as err:
        pytest.fail(f"{query}: Prometheus refused {expr!r}: {err}")
    if query.dashboard == "megdet-run" and query.panel_title not in NO_DATA_HERE:
        assert result, f"{query}: no series for {expr!r}"
    if query.panel_title in NO_DATA_HERE:
        assert metric_names(expr) & (set(EXTERNAL_METRICS) | {"megdet_train_gpu_memory_max_bytes"})


FLEET_WITH_DATA = {
    "Runs by phase",
    "Throughput by run",
    "Runs and their plans",
    "Reconcile rate by result",
    "Reconcile latency",
    "Jobs created and deleted",
    "Jobs succeeded, failed, restarted",
    "Jobs created (range)",
    "Jobs failed (range)",
    "Runs failed now",
    "Alerts firing",
}


def test_fleet_panels_show_the_controller_scenario(live):
    by_title: dict[str, list] = {}
    for query in QUERIES:
        if query.dashboard == "megdet-fleet":
            expr = substitute(query.expr, VARIABLES["megdet-fleet"])
            by_title.setdefault(query.panel_title, []).extend(live.query(expr))
    empty = {title for title in FLEET_WITH_DATA if not by_title.get(title)}
    assert not empty, f"fleet panels without data: {sorted(empty)}"
    phases = {s["metric"]["phase"]: float(s["value"][1]) for s in by_title["Runs by phase"]}
    assert phases["Failed"] == 1 and phases["Succeeded"] == 1 and phases["Invalid"] == 1
    assert phases["Pending"] >= 1


def test_dashboard_variables_list_the_namespace_and_the_run(live):
    run_vars = variable_queries(json.loads((DASHBOARD_DIR / "megdet-run.json").read_text()))
    # label_values(metric{...}, label) is Grafana's call of /api/v1/label/<label>/values.
    namespaces = live.prometheus.api(
        "label/namespace/values", [("match[]", "megdet_train_iteration")]
    )
    assert NAMESPACE in namespaces
    assert run_vars["run"] == 'label_values(megdet_train_iteration{namespace="$namespace"}, run)'
    runs = live.prometheus.api(
        "label/run/values", [("match[]", f'megdet_train_iteration{{namespace="{NAMESPACE}"}}')]
    )
    assert runs == [TRAINING_RUN]
    fleet_vars = variable_queries(json.loads((DASHBOARD_DIR / "megdet-fleet.json").read_text()))
    assert fleet_vars["namespace"] == "label_values(megdet_controller_runs, namespace)"
    assert NAMESPACE in live.prometheus.api(
        "label/namespace/values", [("match[]", "megdet_controller_runs")]
    )


ALERT_RULES = rules_by_alert(rule_groups())


@pytest.mark.parametrize("alert", sorted(ALERT_RULES))
def test_every_alert_expression_evaluates(live, alert):
    try:
        live.query(ALERT_RULES[alert]["expr"])
    except PrometheusError as err:
        pytest.fail(f"{alert}: {err}")


def test_prometheus_loaded_and_evaluated_every_rule_without_error(live):
    groups = live.prometheus.api("rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == set(ALERT_RULES) | RECORDED_METRICS
    for name, rule in rules.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
        assert rule["lastEvaluation"] != "0001-01-01T00:00:00Z", name
    # A healthy run fires none of the training alerts.
    firing = {r["name"] for r in rules.values() if r.get("state") == "firing"}
    assert not firing & {
        "MegDetNonFiniteLoss",
        "MegDetSyncBNDivergence",
        "MegDetCheckpointTooOld",
        "MegDetTrainingStalled",
        "MegDetFabricDegraded",  # a gloo run: transport "gloo"
    }


def test_the_efficiency_rules_record_the_live_run(live):
    # Two CPU workers on one node: images/s per process, and the run as its own reference.
    (per_gpu,) = live.query(f'{IMAGES_PER_GPU}{{run="{TRAINING_RUN}"}}')
    assert float(per_gpu["value"][1]) > 0
    (efficiency,) = live.query(f'{SCALING}{{run="{TRAINING_RUN}"}}')
    assert 0 < float(efficiency["value"][1]) <= 1


@pytest.mark.parametrize("which", ["trainer", "controller"])
def test_promtool_check_metrics_is_clean_on_both_exporters(live, which, tmp_path):
    text = live.trainer_metrics if which == "trainer" else live.controller_metrics
    assert "megdet_" in text
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def test_prometheus_scrapes_the_secure_controller_with_its_token(live):
    # The fleet panels' data came this way; here the target itself: HTTPS, up, and the same
    # URL refusing a scrape without the token or with another one.
    (target,) = [
        t
        for t in live.prometheus.api("targets")["activeTargets"]
        if t["labels"]["job"] == "megdet-operator"
    ]
    assert target["scrapeUrl"] == live.controller_url and target["health"] == "up", target
    for token in (None, "not-prometheus"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(live.controller_url, token)
        assert refused.value.code == 401


def test_scraped_names_are_the_exporters_registries(live):
    from megdet.monitoring.registry import controller_metric_names, trainer_metric_names

    def names(text: str) -> set[str]:
        return {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    assert names(live.trainer_metrics) <= trainer_metric_names()
    assert names(live.controller_metrics) <= controller_metric_names()
    assert Path(DASHBOARD_DIR).is_dir()
