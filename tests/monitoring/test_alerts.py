"""The alert rules as the operator chart renders them: promtool check + unit tests, metadata,
runbooks, metric names, thresholds from values.

The rules under test are always the chart's render (real Helm engine) of the template that
`make dashboards` generates from monitoring/alerts.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from monitoring_helpers import ROOT, render_operator, rule_groups, rules_by_alert

from megdet.monitoring.alerts import ALERTS, GROUPS
from megdet.monitoring.queries import EXTERNAL_METRICS, metric_names
from megdet.monitoring.records import EFFICIENCY_KEY, RECORDS
from megdet.monitoring.records import GROUP as EFFICIENCY_GROUP
from megdet.monitoring.registry import exported_metric_names
from tests.prometheus_harness import promtool

UNIT_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
OPERATIONS = ROOT / "docs" / "operations.md"


def write_rules(groups, path: Path) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_every_alert_of_the_source_is_rendered_once_in_its_group(default_rule_groups):
    assert [g["name"] for g in default_rule_groups] == [*GROUPS, EFFICIENCY_GROUP]
    rendered = {
        (g["name"], r["alert"]) for g in default_rule_groups for r in g["rules"] if "alert" in r
    }
    assert rendered == {(a.group, a.name) for a in ALERTS}
    assert len(ALERTS) == 10


def test_promtool_check_rules_accepts_the_rendered_rules(default_rule_groups, tmp_path):
    result = promtool("check", "rules", str(write_rules(default_rule_groups, tmp_path / "r.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS) + len(RECORDS)} rules found" in result.stdout


def test_promtool_check_rules_would_catch_a_broken_expression(default_rule_groups, tmp_path):
    groups = yaml.safe_load(yaml.safe_dump(default_rule_groups))
    groups[0]["rules"][0]["expr"] = "sum(rate(megdet_train_images_total[5m])"
    result = promtool("check", "rules", str(write_rules(groups, tmp_path / "r.yaml")))
    assert result.returncode != 0


def _unit_test_rules(groups):
    """The rules with only the summary annotation (the unit tests compare annotations)."""
    groups = yaml.safe_load(yaml.safe_dump(groups))
    for group in groups:
        for rule in group["rules"]:
            if "record" in rule:
                continue
            rule["annotations"] = {"summary": rule["annotations"]["summary"]}
    return groups


def test_each_alert_fires_on_a_bad_series_and_stays_silent_on_a_healthy_one(
    default_rule_groups, tmp_path
):
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fires = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    silent = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    names = {a.name for a in ALERTS}
    assert fires == names and silent == names, "every alert needs a firing and a silent case"

    write_rules(_unit_test_rules(default_rule_groups), tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_fail_when_a_rule_loses_its_guard(default_rule_groups, tmp_path):
    # Without the sync_bn!="none" guard, scope `none` would page: the silent case catches it.
    groups = _unit_test_rules(default_rule_groups)
    rule = rules_by_alert(groups)["MegDetSyncBNDivergence"]
    rule["expr"] = rule["expr"].split("\nand on")[0]
    write_rules(groups, tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "scope none diverges by design" in result.stdout + result.stderr


def test_every_alert_has_severity_summary_description_and_a_runbook_section(default_rule_groups):
    runbook = OPERATIONS.read_text()
    headings = {m.group(1) for m in re.finditer(r"^### (\S+)\s*$", runbook, re.MULTILINE)}
    for name, rule in rules_by_alert(default_rule_groups).items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook_url"] == (
            f"https://github.com/megdet/megdet/blob/main/docs/operations.md#{name.lower()}"
        )
        assert name in headings, f"docs/operations.md has no '### {name}' runbook section"
        section = runbook.split(f"### {name}", 1)[1].split("\n### ", 1)[0]
        for part in ("What it means", "How to check", "What to do"):
            assert part in section, f"runbook {name} lacks '{part}'"


def test_every_metric_in_the_alerts_is_exported(default_rule_groups):
    allowed = exported_metric_names() | set(EXTERNAL_METRICS)
    for name, rule in rules_by_alert(default_rule_groups).items():
        names = metric_names(rule["expr"])
        assert names and names <= allowed, f"{name} reads unknown metrics {names - allowed}"


def test_thresholds_come_from_chart_values():
    groups = rule_groups(
        {
            "alerts": {
                "trainingStalled": {"window": "45m", "for": "2m"},
                "syncBNDivergence": {"threshold": 0.05},
                "restarts": {"count": 7},
                "runFailed": {"severity": "warning"},
                "ruleLabels": {"team": "vision"},
                "runbookBaseUrl": "https://wiki.example/megdet",
            }
        }
    )
    rules = rules_by_alert(groups)
    stalled = rules["MegDetTrainingStalled"]
    assert "changes(megdet_train_iteration[45m])" in stalled["expr"]
    assert stalled["for"] == "2m"
    assert "> 0.05" in rules["MegDetSyncBNDivergence"]["expr"]
    assert ">= 7" in rules["MegDetRunRestarting"]["expr"]
    assert rules["MegDetRunFailed"]["labels"] == {"severity": "warning", "team": "vision"}
    assert rules["MegDetRunFailed"]["annotations"]["runbook_url"] == (
        "https://wiki.example/megdet#megdetrunfailed"
    )


def test_switched_off_alerts_and_empty_groups_are_left_out(tmp_path):
    off = {a.key: {"enabled": False} for a in ALERTS if a.group == "megdet-controller"}
    off["trainingStalled"] = {"enabled": False}
    off[EFFICIENCY_KEY] = {"enabled": False}
    groups = rule_groups({"alerts": off})
    assert [g["name"] for g in groups] == ["megdet-training"]
    assert "MegDetTrainingStalled" not in rules_by_alert(groups)
    result = promtool("check", "rules", str(write_rules(groups, tmp_path / "r.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"trainingStalled": {"window": "20 minutes"}}, ["/alerts/trainingStalled/window"]),
        ({"runFailed": {"severity": "page"}}, ["/alerts/runFailed/severity", "critical"]),
        ({"throughputDrop": {"ratio": 1.5}}, ["/alerts/throughputDrop/ratio"]),
        ({"nonFiniteLos": {"enabled": False}}, ["nonFiniteLos"]),
    ],
)
def test_bad_alert_values_are_refused_naming_the_field(values, words):
    with pytest.raises(Exception) as err:
        render_operator({"alerts": {"enabled": True, **values}})
    for word in words:
        assert word in str(err.value)
