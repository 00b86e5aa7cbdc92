"""The controller's PodDisruptionBudget and NetworkPolicy (charts/megdet-operator), rendered by
the real engine, checked with kubernetes-validate --strict, their rules evaluated
(tests/network_policy.py). The real API server accepts both: tests/e2e/test_operator_install.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from operator_chart_helpers import NAMESPACE, render, render_error

from tests.network_policy import egress_allowed, ingress_allowed, namespace, selects

K8S_VERSION = "1.34.0"
MONITORING = namespace("monitoring")
RUN_POD = {
    "app.kubernetes.io/name": "megdet",
    "app.kubernetes.io/instance": "r50",
    "app.kubernetes.io/component": "master",
    "app.kubernetes.io/part-of": "megdet",
}


def controller_pod_labels(values: dict[str, Any] | None = None) -> dict[str, str]:
    return render(values).one("Deployment")["spec"]["template"]["metadata"]["labels"]


# --- PodDisruptionBudget ------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_budget_keeps_a_replica_through_a_drain(replicas):
    rendered = render({"replicaCount": replicas})
    pdb = rendered.one("PodDisruptionBudget")
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)
    assert pdb["metadata"]["namespace"] == NAMESPACE
    assert pdb["spec"]["maxUnavailable"] == 1
    # A replica that is not Ready never holds a drain up.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # It covers exactly the controller's pods.
    deployment = rendered.one("Deployment")
    assert selects(pdb["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 1, "controller": {"peering": {"enabled": False}}},
        {"podDisruptionBudget": {"enabled": False}},
    ],
    ids=["one-replica", "disabled"],
)
def test_no_budget_for_one_replica_or_when_disabled(values):
    assert render(values).of_kind("PodDisruptionBudget") == []


def test_a_budget_that_would_allow_every_replica_out_is_refused():
    error = render_error({"replicaCount": 2, "podDisruptionBudget": {"maxUnavailable": 2}})
    assert "podDisruptionBudget.maxUnavailable=2 must be below replicaCount=2" in error


# --- NetworkPolicy ------------------------------------------------------------------------------


def policy(values: dict[str, Any] | None = None) -> dict[str, Any]:
    merged = dict(values or {})
    merged["networkPolicy"] = {"enabled": True, **merged.get("networkPolicy", {})}
    obj = render(merged).one("NetworkPolicy")
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return obj


def test_no_network_policy_by_default():
    assert render().of_kind("NetworkPolicy") == []


def test_the_policy_selects_the_controllers_pods_only():
    obj = policy()
    assert obj["metadata"]["namespace"] == NAMESPACE
    assert selects(obj["spec"]["podSelector"], controller_pod_labels())
    assert not selects(obj["spec"]["podSelector"], RUN_POD)
    assert obj["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_ingress_metrics_from_monitoring_and_progress_from_the_runs_pods():
    obj = policy()
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert ingress_allowed(obj, prometheus, MONITORING, 8080)
    assert not ingress_allowed(obj, prometheus, MONITORING, 8443)
    assert not ingress_allowed(obj, prometheus, namespace("vision"), 8080)
    # The runs' pods in any namespace: the progress port only.
    for ns in ("vision", "research"):
        assert ingress_allowed(obj, RUN_POD, namespace(ns), 8443)
        assert not ingress_allowed(obj, RUN_POD, namespace(ns), 8080)
        assert not ingress_allowed(obj, RUN_POD, namespace(ns), 8081)
    assert not ingress_allowed(obj, {"app": "other"}, namespace("vision"), 8443)


def test_ports_and_namespaces_follow_the_values():
    obj = policy(
        {
            "metrics": {"port": 9090},
            "controller": {"progressPort": 9443, "watchNamespaces": ["vision"]},
            "networkPolicy": {"metricsFrom": [{"team": "obs"}]},
        }
    )
    assert ingress_allowed(obj, {}, {"team": "obs"}, 9090)
    assert not ingress_allowed(obj, {}, MONITORING, 9090)
    # Only the served namespaces report progress.
    assert ingress_allowed(obj, RUN_POD, namespace("vision"), 9443)
    assert not ingress_allowed(obj, RUN_POD, namespace("research"), 9443)


@pytest.mark.parametrize(
    "values",
    [{"controller": {"progressEnabled": False}}, {"networkPolicy": {"metricsFrom": []}}],
    ids=["no-progress", "no-scraper"],
)
def test_no_rule_for_what_is_off(values):
    obj = policy(values)
    assert len(obj["spec"]["ingress"]) == 1
    if "controller" in values:
        assert not ingress_allowed(obj, RUN_POD, namespace("vision"), 8443)
    else:
        assert not ingress_allowed(obj, {}, MONITORING, 8080)


def test_egress_only_to_the_api_server_and_dns():
    obj = policy()
    anywhere = ({}, namespace("x"))
    for port in (443, 6443):
        assert egress_allowed(obj, *anywhere, port)
    assert egress_allowed(obj, *anywhere, 53, "UDP") and egress_allowed(obj, *anywhere, 53, "TCP")
    for port in (80, 8443, 9477, 29500):
        assert not egress_allowed(obj, *anywhere, port)
    # With the API server's addresses given, its ports go there only.
    obj = policy({"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.10/32", "fd00::10/128"]}}})
    rule = obj["spec"]["egress"][0]
    assert rule["to"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "fd00::10/128"}},
    ]
    assert not egress_allowed(obj, *anywhere, 443)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"networkPolicy": {"enable": True}}, "additional properties 'enable' not allowed"),
        ({"networkPolicy": {"metricsFrom": [{}]}}, "at '/networkPolicy/metricsFrom/0'"),
        (
            {"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}},
            "/networkPolicy/apiServer/cidrs/0",
        ),
        ({"networkPolicy": {"apiServer": {"ports": []}}}, "/networkPolicy/apiServer/ports"),
        ({"podDisruptionBudget": {"maxUnavailable": 0}}, "/podDisruptionBudget/maxUnavailable"),
    ],
    ids=["typo", "empty-selector", "not-a-cidr", "no-ports", "zero"],
)
def test_bad_values_are_refused_naming_them(values, expected):
    assert expected in render_error(values)
