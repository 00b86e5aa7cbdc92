"""Helpers for the monitoring tests: render the operator chart's monitoring objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megdet.controller.render import split_manifests

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_CHART = ROOT / "charts" / "megdet-operator"
RELEASE, NAMESPACE = "megdet", "monitoring"


def render_operator(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the operator chart renders with these values (real Helm engine)."""
    import helm_python

    with helm_python.Chart.load(str(OPERATOR_CHART)) as chart:
        out = chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return split_manifests(out)[0]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups (alerts enabled, other values merged in)."""
    merged = {**(values or {})}
    merged["alerts"] = {"enabled": True, **merged.get("alerts", {})}
    (rule,) = of_kind(render_operator(merged), "PrometheusRule")
    return rule["spec"]["groups"]


def rules_by_alert(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def rules_by_record(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The recording rules (monitoring/efficiency.py) by the series they write."""
    return {r["record"]: r for g in groups for r in g["rules"] if "record" in r}
