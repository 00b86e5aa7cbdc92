"""The GPU-efficiency recording rules as the operator chart renders them: promtool unit tests on
synthetic series (recording_rules_test.yaml), the names they read, the chart values that shape
and switch them (monitoring/efficiency.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from monitoring_helpers import render_operator, rule_groups, rules_by_record

from megdet.monitoring.queries import EXTERNAL_METRICS, metric_names
from megdet.monitoring.records import (
    GROUP,
    RECORDED_METRICS,
    RECORDS,
    SCALING,
    SINGLE_NODE,
)
from megdet.monitoring.registry import exported_metric_names
from tests.prometheus_harness import promtool

UNIT_TESTS = Path(__file__).with_name("recording_rules_test.yaml")


def _run_unit_tests(groups, tmp_path: Path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)


def test_every_record_of_the_source_is_rendered_in_its_group(default_rule_groups):
    (group,) = [g for g in default_rule_groups if g["name"] == GROUP]
    assert [r["record"] for r in group["rules"]] == [r.record for r in RECORDS]
    assert set(rules_by_record(default_rule_groups)) == RECORDED_METRICS


def test_the_records_give_the_expected_values_on_synthetic_series(default_rule_groups, tmp_path):
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    tested = {t["expr"].split("{")[0] for c in cases for t in c["promql_expr_test"]}
    assert tested == RECORDED_METRICS, "every recorded series needs a unit test"
    result = _run_unit_tests(default_rule_groups, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_fail_when_the_single_node_guard_is_lost(default_rule_groups, tmp_path):
    # Without `nodes == 1` the two-node rate becomes the reference: r1 would read 1, not 0.75.
    groups = yaml.safe_load(yaml.safe_dump(default_rule_groups))
    rule = rules_by_record(groups)[SINGLE_NODE]
    rule["expr"] = rule["expr"].split("\nand on")[0]
    result = _run_unit_tests(groups, tmp_path)
    assert result.returncode != 0
    assert SCALING in result.stdout + result.stderr


def test_every_name_the_records_read_is_exported_external_or_recorded(default_rule_groups):
    allowed = exported_metric_names() | set(EXTERNAL_METRICS) | RECORDED_METRICS
    for name, rule in rules_by_record(default_rule_groups).items():
        names = metric_names(rule["expr"])
        assert names and names <= allowed, f"{name} reads unknown metrics {names - allowed}"


def test_the_lookback_comes_from_the_chart_values_and_the_group_can_be_switched_off():
    rules = rules_by_record(rule_groups({"alerts": {"efficiency": {"lookback": "30d"}}}))
    assert f"{SINGLE_NODE}[30d]" in rules[SCALING]["expr"]
    groups = rule_groups({"alerts": {"efficiency": {"enabled": False}}})
    assert GROUP not in [g["name"] for g in groups]
    assert rules_by_record(groups) == {}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"lookback": "a week"}, ["/alerts/efficiency/lookback"]),
        ({"enabled": "yes"}, ["/alerts/efficiency/enabled"]),
        ({"window": "5m"}, ["window"]),
    ],
)
def test_bad_efficiency_values_are_refused_naming_the_field(values, words):
    with pytest.raises(Exception) as err:
        render_operator({"alerts": {"enabled": True, "efficiency": values}})
    for word in words:
        assert word in str(err.value)
