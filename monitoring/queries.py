"""Every PromQL query of the dashboards and alerts, as data the tests can run and inspect.

A Grafana query holds template variables (``$namespace``, ``${datasource}``) and Grafana's
built-ins (``$__rate_interval``, ``$__range``); :func:`substitute` turns one into plain PromQL
the way Grafana would before sending it. :func:`metric_names` parses PromQL with
``promql-parser`` and lists the metric names a query reads, for the check that every name
exists in an exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser

__all__ = [
    "EXTERNAL_METRICS",
    "PROMETHEUS_METRICS",
    "DashboardQuery",
    "dashboard_queries",
    "metric_names",
    "substitute",
    "variable_queries",
]

#: Metrics other exporters own, by owner: the run dashboard's GPU panels read them when
#: NVIDIA's dcgm-exporter runs in the cluster (field names from DCGM's field list).
EXTERNAL_METRICS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "dcgm-exporter",
    "DCGM_FI_DEV_FB_USED": "dcgm-exporter",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "dcgm-exporter",
}
#: Series Prometheus itself writes: scrape health and the alert state.
PROMETHEUS_METRICS: frozenset[str] = frozenset({"up", "ALERTS"})

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class DashboardQuery:
    """One target of one panel."""

    dashboard: str
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} panel {self.panel_id} {self.panel_title!r} {self.ref_id}"


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row holds its panels


def dashboard_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard JSON, rows and panels inside rows included."""
    return list(_panels(dashboard.get("panels") or []))


def dashboard_queries(name: str, dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every Prometheus query of every panel of a dashboard JSON."""
    return [
        DashboardQuery(name, panel["id"], panel.get("title", ""), target["refId"], target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets") or []
        if "expr" in target
    ]


def variable_queries(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Query variables' queries by variable name (``label_values(...)`` Grafana syntax)."""
    return {
        v["name"]: v["query"]
        for v in dashboard.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    }


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` / ``${name:format}`` as Grafana does; unknown ones raise.

    ``variables`` must include Grafana's built-ins the query uses (``__rate_interval``,
    ``__range``, ...): a forgotten variable would reach Prometheus as a parse error anyway,
    but a KeyError names it.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return variables[name]

    return _VARIABLE.sub(replace, expr)


def _children(node: Any) -> Iterator[Any]:
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None:
            yield child
    yield from getattr(node, "args", None) or []


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (``name{...}`` and ``{__name__="..."}``).

    Raises ValueError when the expression does not parse.
    """
    tree = promql_parser.parse(expr)
    names: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)
        stack.extend(_children(node))
    return names
