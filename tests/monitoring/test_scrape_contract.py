"""The PodMonitor finds every trainer pod the controller creates, and only trainer pods.

The pods come from the controller's own render of the run chart (one job shape), for both
targets; the selector and port come from the operator chart's rendered PodMonitor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from monitoring_helpers import of_kind, render_operator

from megdet.controller.render import render_run

RUN = "coco"


def pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod template (a dict whose spec has containers) anywhere in a rendered object."""
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and "containers" in spec:
            yield node
        for value in node.values():
            yield from pod_templates(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_templates(value)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@pytest.fixture(scope="module")
def podmonitor() -> dict[str, Any]:
    (pm,) = of_kind(render_operator({"podMonitor": {"enabled": True}}), "PodMonitor")
    return pm


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_every_trainer_pod_is_selected_with_its_metrics_port_and_run_label(podmonitor, target):
    rendered = render_run(RUN, "vision", {"gpus": 16, "gpusPerNode": 8, "target": target})
    pods = [p for obj in rendered.objects for p in pod_templates(obj)]
    assert pods, f"no pod template rendered for target {target}"
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    (relabel,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "run"]
    source = relabel["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert selects(podmonitor["spec"]["selector"], labels), labels
        ports = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        assert endpoint["port"] in ports
        # Prometheus sanitizes label names to [a-zA-Z0-9_]: the relabel source is this label.
        (value,) = [v for k, v in labels.items() if k.replace(".", "_").replace("/", "_") == source]
        assert value == RUN


def test_the_selector_logic_rejects_other_pods(podmonitor):
    selector = podmonitor["spec"]["selector"]
    assert not selects(selector, {"app.kubernetes.io/part-of": "megdet"})
    assert not selects(
        selector, {"app.kubernetes.io/part-of": "other", "app.kubernetes.io/component": "master"}
    )
    assert not selects(
        selector,
        {"app.kubernetes.io/part-of": "megdet", "app.kubernetes.io/component": "controller"},
    )


def test_the_controller_pod_is_not_scraped_as_a_trainer(podmonitor):
    objects = render_operator({"podMonitor": {"enabled": True}})
    (deployment,) = of_kind(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "megdet"  # same project, other component
    assert not selects(podmonitor["spec"]["selector"], labels)


def test_the_controller_servicemonitor_keeps_the_runs_namespace_label():
    # megdet_controller_runs{namespace} is the run's namespace; the live test scrapes the
    # controller with honor_labels for the same reason.
    (monitor,) = of_kind(render_operator({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
