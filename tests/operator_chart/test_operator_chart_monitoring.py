"""The operator chart's monitoring objects: off by default, dashboards ConfigMaps, PodMonitor,
lint --strict with everything on (real Helm engine)."""

from __future__ import annotations

import json

import helm_python
from operator_chart_helpers import CHART_DIR, NAMESPACE, render

from megdet.monitoring.__main__ import DASHBOARD_DIR
from megdet.monitoring.dashboards import DASHBOARDS

MONITORING_KINDS = ("PrometheusRule", "PodMonitor")
ALL_ON = {
    "dashboards": {"enabled": True},
    "alerts": {"enabled": True},
    "podMonitor": {"enabled": True},
}


def dashboard_configmaps(rendered):
    return [o for o in rendered.of_kind("ConfigMap") if o["metadata"]["name"].endswith(
        tuple(DASHBOARDS))]  # fmt: skip


def test_monitoring_objects_are_off_by_default():
    rendered = render()
    assert not [o for o in rendered.objects if o["kind"] in MONITORING_KINDS]
    assert not dashboard_configmaps(rendered)


def test_dashboards_ship_as_sidecar_configmaps_holding_the_generated_json():
    rendered = render({"dashboards": {"enabled": True}})
    maps = dashboard_configmaps(rendered)
    assert len(maps) == len(DASHBOARDS)
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == NAMESPACE
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((DASHBOARD_DIR / key).read_text())


def test_dashboard_label_namespace_and_folder_annotation_are_configurable():
    rendered = render(
        {
            "dashboards": {
                "enabled": True,
                "label": "grafana_dashboard_megdet",
                "labelValue": "yes",
                "namespace": "grafana",
                "additionalLabels": {"team": "vision"},
                "annotations": {"grafana_folder": "MegDet"},
            }
        }
    )
    for cm in dashboard_configmaps(rendered):
        meta = cm["metadata"]
        assert meta["labels"]["grafana_dashboard_megdet"] == "yes"
        assert "grafana_dashboard" not in meta["labels"]
        assert meta["labels"]["team"] == "vision"
        assert meta["namespace"] == "grafana"
        assert meta["annotations"] == {"grafana_folder": "MegDet"}


def test_podmonitor_selects_trainer_pods_and_relabels_instance_to_run():
    rendered = render({"podMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}}})
    (pm,) = rendered.of_kind("PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "kps"
    spec = pm["spec"]
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "megdet"}
    (component,) = spec["selector"]["matchExpressions"]
    assert component["key"] == "app.kubernetes.io/component"
    assert set(component["values"]) == {"master", "worker", "node"}
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "targetLabel": "run",
        "action": "replace",
    } in endpoint["relabelings"]


def test_podmonitor_can_be_limited_to_namespaces():
    rendered = render({"podMonitor": {"enabled": True, "namespaces": ["vision"]}})
    (pm,) = rendered.of_kind("PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["vision"]}


def test_prometheusrule_carries_additional_labels():
    rendered = render({"alerts": {"enabled": True, "additionalLabels": {"release": "kps"}}})
    (rule,) = rendered.of_kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == NAMESPACE


def test_lint_strict_is_clean_with_every_monitoring_object_on():
    ci = helm_python.values_from_yaml((CHART_DIR / "ci" / "monitoring-values.yaml").read_text())
    for values in (ALL_ON, ci):
        result = helm_python.lint(str(CHART_DIR), values, strict=True)
        assert result["errors"] == []
        assert not [m for m in result["messages"] if m["severity"] > 1], result["messages"]


def test_the_ci_values_file_turns_every_monitoring_object_on():
    ci = helm_python.values_from_yaml((CHART_DIR / "ci" / "monitoring-values.yaml").read_text())
    rendered = render(ci)
    kinds = {o["kind"] for o in rendered.objects}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    assert len(dashboard_configmaps(rendered)) == len(DASHBOARDS)
    for obj in rendered.objects:
        if obj["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
