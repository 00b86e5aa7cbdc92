"""The Grafana building blocks both dashboards use: label matchers that pick a run, and
small builders (time series, stat, row, variables) over ``grafana-foundation-sdk``, so every
panel gets the same datasource, legend and size conventions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models.common import BigValueTextMode, LegendDisplayMode
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableHide,
    VariableRefresh,
    VariableSort,
)

from megdet.monitoring.pods import POD_SUFFIX

__all__ = [
    "DATASOURCE",
    "NAMESPACES",
    "POD_SUFFIX",
    "RATE",
    "RUN",
    "RUN_PODS",
    "RUN_POD_NAMES",
    "Ids",
    "Panel",
    "dashboard",
    "datasource_variable",
    "query",
    "query_variable",
    "row",
    "stat_panel",
    "targets",
    "timeseries_panel",
    "with_rows",
]

#: Every panel and query variable reads from the dashboard's datasource variable.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label matchers that pick one run. `run` is the pod label app.kubernetes.io/instance, which the
# PodMonitor relabels to `run`; `namespace` comes from the scrape target.
RUN = 'namespace="$namespace", run="$run"'
# dcgm-exporter labels a GPU's series with the pod that holds it (pod, namespace). A run's pods
# are named after the run: PyTorchJob <run>-master-0 / <run>-worker-N; TrainJob (JobSet)
# <run>-node-<job>-<index>-<suffix>. Spelled out so run "coco" does not match "coco-big"'s pods.
RUN_POD_NAMES = f"$run-{POD_SUFFIX}"
RUN_PODS = f'namespace="$namespace", pod=~"{RUN_POD_NAMES}"'
# The fleet dashboard's namespace variable is multi-valued ("All" = ".*").
NAMESPACES = 'namespace=~"$namespace"'
RATE = "$__rate_interval"
REFRESH = "30s"

# Any panel builder (time series, stat, table).
Panel = timeseries.Panel | stat.Panel | table.Panel


@dataclass
class Ids:
    """Hands out panel ids in order, so ids are unique within a dashboard."""

    last: int = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def query(
    expr: str, legend: str = "", ref: str = "A", instant: bool = False
) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant().format("table") if instant else q


def targets(panel: Panel, queries: list[tuple[str, str]]) -> Panel:
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, ref=chr(ord("A") + index)))
    return panel


def _titled(
    panel: Any, ids: Ids, title: str, description: str, unit: str, width: int, height: int
) -> Any:
    """``panel`` with the next id, its title, description and unit, the dashboard's
    datasource, ``width`` of 24 columns and ``height`` rows."""
    return (
        panel.id(ids.next())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
    )


def timeseries_panel(
    ids: Ids,
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str = "short",
    width: int = 12,
) -> timeseries.Panel:
    panel = _titled(timeseries.Panel(), ids, title, description, unit, width, 8).legend(
        common_builders.VizLegendOptions()
        .display_mode(LegendDisplayMode.TABLE)
        .placement("bottom")
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )
    return targets(panel, queries)


def stat_panel(
    ids: Ids, title: str, description: str, expr: str, unit: str = "short", legend: str = ""
) -> stat.Panel:
    panel = _titled(stat.Panel(), ids, title, description, unit, 3, 4).reduce_options(
        common_builders.ReduceDataOptions().calcs(["lastNotNull"])
    )
    if legend:
        panel = panel.text_mode(BigValueTextMode.VALUE_AND_NAME)
    return panel.with_target(query(expr, legend))


def row(ids: Ids, title: str) -> db.Row:
    return db.Row(title).id(ids.next())


def with_rows(
    d: db.Dashboard, ids: Ids, rows: Sequence[tuple[str, Callable[[Ids], Iterable[Panel]]]]
) -> db.Dashboard:
    """``d`` with each row of ``rows`` (its title, what makes its panels) and its panels, in
    order: the row takes its id before its panels take theirs."""
    for title, panels in rows:
        d = d.with_row(row(ids, title))
        for panel in panels(ids):
            d = d.with_panel(panel)
    return d


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, multi: bool = False) -> db.QueryVariable:
    variable = (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .hide(VariableHide.DONT_HIDE)
    )
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".*")
    return variable


def dashboard(
    title: str,
    uid: str,
    description: str,
    variables: Sequence[db.QueryVariable],
    rows: Sequence[tuple[str, Callable[[Ids], Iterable[Panel]]]],
) -> db.Dashboard:
    """A MegDet dashboard: the data source variable, then ``variables``, then ``rows`` (see
    :func:`with_rows`), with panel ids from 1."""
    d = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["megdet"])
        .refresh(REFRESH)
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
        .with_variable(datasource_variable())
    )
    for variable in variables:
        d = d.with_variable(variable)
    return with_rows(d, Ids(), rows)
