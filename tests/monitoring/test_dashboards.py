"""The Grafana dashboards: generated JSON is fresh, structure is sound, every metric exists.

Every query's PromQL is checked against a real Prometheus in test_live_prometheus.py; here the
checks need no server: freshness of the committed JSON, unique panel ids, the datasource
variable, no hard-coded namespace, and every metric name found in an exporter's registry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest

from megdet.monitoring.__main__ import DASHBOARD_DIR, stale_files
from megdet.monitoring.dashboards import DASHBOARDS, RUN_POD_NAMES, render
from megdet.monitoring.queries import (
    EXTERNAL_METRICS,
    PROMETHEUS_METRICS,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    substitute,
    variable_queries,
)
from megdet.monitoring.records import RECORDED_METRICS, RECORDS
from megdet.monitoring.registry import exported_metric_names

# Grafana's interval built-ins, replaced so the PromQL parses; $namespace/$run stay as text.
BUILTINS = {"__rate_interval": "1m", "__range": "1h", "__interval": "30s"}


def committed(name: str) -> dict:
    return json.loads((DASHBOARD_DIR / f"{name}.json").read_text())


def keep_variables(expr: str) -> str:
    """Substitute only Grafana's interval built-ins; dashboard variables stay `$name`."""
    names = {"namespace", "run", "datasource"}
    return substitute(expr, {**BUILTINS, **{n: f"${n}" for n in names}})


def _selectors(node):
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, promql_parser.VectorSelector):
            yield n
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(n, attr, None)
            if child is not None:
                stack.append(child)
        stack.extend(getattr(n, "args", None) or [])


def test_committed_dashboards_and_rule_template_are_what_make_dashboards_writes():
    assert stale_files() == [], "run `make dashboards` and commit the result"


def test_stale_check_notices_an_edited_dashboard(tmp_path, monkeypatch):
    import megdet.monitoring.__main__ as cli

    copy = tmp_path / "megdet-run.json"
    copy.write_text(render(DASHBOARDS["megdet-run"]()).replace("Loss components", "Losses"))
    monkeypatch.setattr(
        cli,
        "generated_files",
        lambda: {copy: render(DASHBOARDS["megdet-run"]())},
    )
    assert cli.stale_files() == [copy]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique_and_every_panel_has_title_and_description(name):
    panels = dashboard_panels(committed(name))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}: {sorted(ids)}"
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in panels:
        assert panel["title"], panel["id"]
        if panel["type"] != "row":
            assert panel.get("description"), f"{name} panel {panel['title']!r} has no description"
            assert panel["targets"], f"{name} panel {panel['title']!r} has no query"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_is_a_variable_everywhere(name):
    dashboard = committed(name)
    (ds_var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["name"] == "datasource" and ds_var["query"] == "prometheus"
    for panel in dashboard_panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_no_hard_coded_namespace_and_run_panels_select_the_run(name):
    dashboard = committed(name)
    queries = dashboard_queries(name, dashboard)
    assert queries
    for query in queries:
        for selector in _selectors(promql_parser.parse(keep_variables(query.expr))):
            labels = {m.name: m.value for m in selector.matchers.matchers}
            if selector.name == "ALERTS":
                continue  # Prometheus' alert state: not a namespace-scoped series
            if selector.name.startswith("megdet_controller_") and "namespace" not in labels:
                # reconcile and progress-report counters/histogram: one controller, no run
                # namespace
                assert selector.name.startswith(
                    (
                        "megdet_controller_reconcile",
                        "megdet_controller_reconciles",
                        "megdet_controller_progress_reports",
                        "megdet_controller_progress_writes",
                        "megdet_controller_http_refused",
                        "megdet_controller_run_reads",
                    )
                ), query
                continue
            assert labels.get("namespace") == "$namespace", f"{query}: {query.expr}"
            if name == "megdet-run":
                run = labels.get("run") or labels.get("pod")
                assert run in ("$run", RUN_POD_NAMES), f"{query} does not select the run"
    for variable_query in variable_queries(dashboard).values():
        assert "namespace=" not in variable_query or '"$namespace"' in variable_query


def test_the_run_dashboard_has_its_variables_and_dcgm_panels():
    dashboard = committed("megdet-run")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "run"}
    exprs = " ".join(q.expr for q in dashboard_queries("megdet-run", dashboard))
    for external in EXTERNAL_METRICS:
        assert external in exprs


def test_every_metric_in_the_dashboards_is_exported():
    exported = exported_metric_names()
    allowed = exported | set(EXTERNAL_METRICS) | PROMETHEUS_METRICS | RECORDED_METRICS
    seen: set[str] = set()
    for name in DASHBOARDS:
        for query in dashboard_queries(name, committed(name)):
            names = metric_names(keep_variables(query.expr))
            assert names, f"{query} reads no metric"
            assert names <= allowed, f"{query} reads unknown metrics {names - allowed}"
            seen |= names
    # A recorded series reads what its rule reads (monitoring/efficiency.py).
    for _ in RECORDS:  # records read records: follow the chain to its end
        for record in RECORDS:
            if record.record in seen:
                seen |= metric_names(record.expr.replace("<<lookback>>", "7d"))
    # The dashboards cover what the trainer and the controller export (minus counters'
    # _created, histogram _sum/_count which the latency panel reads through _bucket).
    wanted = {n for n in exported if not n.endswith(("_created", "_sum", "_count"))}
    assert wanted - seen == set()


def test_metric_name_check_rejects_an_unknown_name():
    # The check above would fail on a typo: the parser finds the misspelt name.
    assert metric_names("sum(rate(megdet_train_image_total[1m]))") == {"megdet_train_image_total"}
    assert "megdet_train_image_total" not in exported_metric_names()


def test_dashboard_files_are_the_chart_files():
    # The chart ships files/dashboards/*.json; nothing else sits there unnoticed.
    assert sorted(p.stem for p in Path(DASHBOARD_DIR).glob("*.json")) == sorted(DASHBOARDS)


@pytest.mark.parametrize(
    ("pod", "matches"),
    [
        ("coco-master-0", True),
        ("coco-worker-11", True),
        ("coco-node-0-3-x7k2p", True),
        ("coco-big-master-0", False),
        ("coco-big-node-0-0-abcde", False),
        ("other-master-0", False),
    ],
)
def test_dcgm_panels_match_exactly_the_runs_pods(pod, matches):
    # Prometheus anchors =~ regexes at both ends, as fullmatch does.
    assert bool(re.fullmatch(RUN_POD_NAMES.replace("$run", "coco"), pod)) is matches
