"""networkPolicy: one NetworkPolicy per run, for both targets, rendered by the real engine and
checked with kubernetes-validate; its rules are evaluated (tests/network_policy.py) to show who
can reach the run's pods on which port."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest
from chart_helpers import CHART_DIR, NAMESPACE, RELEASE

from megdet.controller.render import split_manifests
from tests.network_policy import egress_allowed, ingress_allowed, selects

K8S_VERSIONS = ("1.27.0", "1.34.0")
TARGETS = ("pytorchjob", "trainjob")
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
RUN_NS = {"kubernetes.io/metadata.name": NAMESPACE}


def policies(render, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [o for o in render(dict(values)).objects if o["kind"] == "NetworkPolicy"]


def policy(render, target: str = "pytorchjob", **network_policy: Any) -> dict[str, Any]:
    (only,) = policies(
        render, {"target": target, "networkPolicy": {"enabled": True, **network_policy}}
    )
    return only


def run_pods(render, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of the release (both targets)."""
    out = []
    for obj in render(dict(values)).objects:
        if obj["kind"] == "PyTorchJob":
            out += [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
        elif obj["kind"] == "TrainingRuntime":
            jobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
            out += [j["template"]["spec"]["template"] for j in jobs]
    return out


# --- rendering ----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_no_network_policy_by_default(render, target):
    assert policies(render, {"target": target}) == []


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "network_policy",
    [
        {},
        {"restrictEgress": True},
        {"metricsFrom": [MONITORING, {"team": "observability"}]},
        {"metricsFrom": []},
        {
            "restrictEgress": True,
            "extraEgress": [
                {
                    "to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                    "ports": [{"protocol": "TCP", "port": 443}],
                }
            ],
        },
    ],
    ids=["defaults", "restrict-egress", "two-monitoring-selectors", "no-metrics", "extra-egress"],
)
def test_the_policy_passes_kubernetes_validate_strict(render, target, network_policy):
    obj = policy(render, target, **network_policy)
    assert obj["metadata"]["name"] == RELEASE and obj["metadata"]["namespace"] == NAMESPACE
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_kubernetes_validate_strict_catches_a_typo_in_the_policy(render):
    obj = policy(render)
    obj["spec"]["ingress"][0]["form"] = obj["spec"]["ingress"][0].pop("from")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_the_policy_selects_exactly_the_runs_pods(render, target):
    values = {"target": target, "gpus": 16, "podLabels": {"team": "vision"}}
    obj = policy(render, target)
    pods = run_pods(render, values)
    assert pods
    for pod in pods:
        assert selects(obj["spec"]["podSelector"], pod["metadata"]["labels"])
    # Another release's pods in the same namespace (same chart, other instance) are not selected.
    files = render.chart.render(values=values, name="other", namespace=NAMESPACE, is_install=True)
    objects, _ = split_manifests(files)
    for obj_other in objects:
        if obj_other["kind"] == "PyTorchJob":
            for replica in obj_other["spec"]["pytorchReplicaSpecs"].values():
                labels = replica["template"]["metadata"]["labels"]
                assert not selects(obj["spec"]["podSelector"], labels)


@pytest.mark.parametrize("target", TARGETS)
def test_ingress_only_from_the_run_and_to_metrics_from_monitoring(render, target):
    obj = policy(render, target)
    (pod, *_) = run_pods(render, {"target": target, "gpus": 16})
    own = pod["metadata"]["labels"]
    other_run = {**own, "app.kubernetes.io/instance": "other"}
    # The run's own pods: any TCP port (rendezvous 23456/29400/29500, NCCL's ephemeral ports).
    for port in (23456, 29400, 29500, 40000, 61000, 9477):
        assert ingress_allowed(obj, own, RUN_NS, port)
    assert not ingress_allowed(obj, own, RUN_NS, 29500, "UDP")
    # Another run in the same namespace, or any pod elsewhere: nothing but monitoring.
    for port in (29500, 9477):
        assert not ingress_allowed(obj, other_run, RUN_NS, port)
        assert not ingress_allowed(obj, {"app": "x"}, {"kubernetes.io/metadata.name": "x"}, port)
    # The monitoring namespace: the metrics port only.
    assert ingress_allowed(obj, {"app.kubernetes.io/name": "prometheus"}, MONITORING, 9477)
    assert not ingress_allowed(obj, {"app.kubernetes.io/name": "prometheus"}, MONITORING, 29500)
    # Egress stays open unless restricted.
    assert obj["spec"]["policyTypes"] == ["Ingress"]
    assert egress_allowed(obj, {}, {"kubernetes.io/metadata.name": "x"}, 443)


def test_metrics_port_and_namespaces_follow_their_values(render):
    values = {
        "metrics": {"port": 9100},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"team": "obs"}, MONITORING]},
    }
    (obj,) = policies(render, values)
    for ns in ({"team": "obs"}, MONITORING):
        assert ingress_allowed(obj, {}, ns, 9100)
        assert not ingress_allowed(obj, {}, ns, 9477)
    # A namespace needs every label of one selector.
    assert not ingress_allowed(obj, {}, {"team": "other"}, 9100)


@pytest.mark.parametrize(
    "values",
    [{"metrics": {"enabled": False}}, {"networkPolicy": {"metricsFrom": []}}],
    ids=["metrics-off", "no-monitoring-namespaces"],
)
def test_no_metrics_rule_without_metrics_or_namespaces(render, values):
    merged = {**values, "networkPolicy": {"enabled": True, **values.get("networkPolicy", {})}}
    (obj,) = policies(render, merged)
    assert len(obj["spec"]["ingress"]) == 1
    assert not ingress_allowed(obj, {}, MONITORING, 9477)


def test_restricted_egress_reaches_the_run_and_dns_only(render):
    extra = {"to": [{"namespaceSelector": {"matchLabels": {"team": "storage"}}}]}
    obj = policy(render, restrictEgress=True, extraEgress=[extra])
    assert obj["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (pod, *_) = run_pods(render, {"gpus": 16})
    own = pod["metadata"]["labels"]
    assert egress_allowed(obj, own, RUN_NS, 29500)
    assert not egress_allowed(obj, {**own, "app.kubernetes.io/instance": "other"}, RUN_NS, 29500)
    kube_dns = ({"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"})
    assert egress_allowed(obj, *kube_dns, 53, "UDP") and egress_allowed(obj, *kube_dns, 53, "TCP")
    assert not egress_allowed(obj, *kube_dns, 443)
    # extraEgress: appended as given.
    assert obj["spec"]["egress"][-1] == extra
    assert egress_allowed(obj, {}, {"team": "storage"}, 9000)


PROGRESS_NS = {"kubernetes.io/metadata.name": "megdet-system"}
CONTROLLER = {"app.kubernetes.io/part-of": "megdet", "app.kubernetes.io/component": "controller"}


def progress_values(url: str) -> dict[str, Any]:
    """The chart value the controller sets for each run (controller/planning.py with_progress)."""
    return {"url": url, "caConfigMap": "megdet-progress-ca", "runUID": "0d2f-uid"}


def operator_progress_endpoint() -> tuple[str, dict[str, str], int]:
    """What the operator chart (defaults, release megdet-operator in megdet-system) gives the
    controller as --progress-url, its pod's labels and its progress container port."""
    import helm_python

    with helm_python.Chart.load(str(CHART_DIR.parent / "megdet-operator")) as chart:
        files = chart.render(
            values={}, name="megdet-operator", namespace="megdet-system", is_install=True
        )
    (deployment,) = [o for o in split_manifests(files)[0] if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    (url,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--progress-url=")]
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "progress"]
    return url, pod["metadata"]["labels"], port


def test_the_operator_charts_progress_endpoint_is_reachable_under_restricted_egress(render):
    url, controller_pod, port = operator_progress_endpoint()
    values = {
        "progress": progress_values(url),
        "networkPolicy": {"enabled": True, "restrictEgress": True},
    }
    (obj,) = policies(render, values)
    assert egress_allowed(obj, controller_pod, PROGRESS_NS, port)


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("https://megdet-operator-progress.megdet-system.svc:8443", 8443),
        ("https://megdet-operator-progress.megdet-system.svc.cluster.local:9443", 9443),
        ("https://megdet-operator-progress.megdet-system.svc", 443),
    ],
)
def test_restricted_egress_reaches_the_controllers_progress_endpoint(render, url, port):
    values = {
        "progress": progress_values(url),
        "networkPolicy": {"enabled": True, "restrictEgress": True},
    }
    (obj,) = policies(render, values)
    # Every controller replica (each serves; the progress Service selects them all), on the
    # URL's port only.
    assert egress_allowed(obj, CONTROLLER, PROGRESS_NS, port)
    assert not egress_allowed(obj, CONTROLLER, PROGRESS_NS, port + 1)
    # Not another pod of that namespace, nor the controller's labels in another namespace.
    other = {k: v for k, v in CONTROLLER.items() if k != "app.kubernetes.io/component"}
    assert not egress_allowed(obj, other, PROGRESS_NS, port)
    assert not egress_allowed(obj, CONTROLLER, {"kubernetes.io/metadata.name": "x"}, port)
    # What was reachable stays so; the rest stays closed.
    (pod, *_) = run_pods(render, values)
    assert egress_allowed(obj, pod["metadata"]["labels"], RUN_NS, 29500)
    assert not egress_allowed(obj, {}, {"kubernetes.io/metadata.name": "x"}, 443)
    assert f"the controller's progress endpoint (TCP {port}) and DNS." in render(values).notes


def test_progress_egress_to_a_host_outside_the_cluster_is_its_port_at_any_address(render):
    values = {
        "progress": progress_values("https://progress.example.com:10443"),
        "networkPolicy": {"enabled": True, "restrictEgress": True},
    }
    (obj,) = policies(render, values)
    assert obj["spec"]["egress"][-1] == {"ports": [{"protocol": "TCP", "port": 10443}]}


@pytest.mark.parametrize(
    "values",
    [
        {"networkPolicy": {"enabled": True, "restrictEgress": True}},
        {"networkPolicy": {"enabled": True}},
        {"target": "trainjob", "networkPolicy": {"enabled": True, "restrictEgress": True}},
    ],
    ids=["no-progress", "egress-open", "trainjob"],
)
def test_no_progress_rule_without_a_progress_endpoint_or_egress_rules(render, values):
    # No progress.url (a plain helm install), egress open anyway, or a TrainJob (whose pods
    # report to Trainer's status server, not to progress.url: docs/helm.md).
    values = {**values, "progress": progress_values("https://p.megdet-system.svc:8443")}
    if values.get("target") != "trainjob" and values["networkPolicy"].get("restrictEgress"):
        values["progress"] = {"url": ""}
    (obj,) = policies(render, values)
    for rule in obj["spec"].get("egress", []):
        assert all(p.get("port") != 8443 for p in rule.get("ports", []))
    assert egress_allowed(obj, CONTROLLER, PROGRESS_NS, 8443) == (
        "Egress" not in obj["spec"]["policyTypes"]
    )


def test_notes_describe_the_policy(render):
    notes = render({"networkPolicy": {"enabled": True, "restrictEgress": True}}).notes
    assert f"NetworkPolicy {RELEASE}: ingress from the run's own pods (all TCP)" in notes
    assert "kubernetes.io/metadata.name=monitoring" in notes
    assert "egress to the run's own pods and DNS." in notes
    assert "NetworkPolicy" not in render({}).notes


# --- values it refuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"networkPolicy": {"enabled": True}, "network": {"hostNetwork": True}},
            "networkPolicy.enabled=true with network.hostNetwork=true: a NetworkPolicy does not "
            "apply to host-network pods",
        ),
        (
            {"networkPolicy": {"enabled": True, "extraEgress": [{"ports": [{"port": 443}]}]}},
            "networkPolicy.extraEgress: its rules take effect only with "
            "networkPolicy.enabled=true and networkPolicy.restrictEgress=true",
        ),
        (
            {"networkPolicy": {"enabled": True, "metricsFrom": [{}]}},
            "at '/networkPolicy/metricsFrom/0': minProperties: got 0, want 1",
        ),
        (
            {"networkPolicy": {"enabled": True, "metricsFrom": MONITORING}},
            "at '/networkPolicy/metricsFrom': got object, want array",
        ),
        (
            {"networkPolicy": {"enabled": "yes"}},
            "at '/networkPolicy/enabled': got string, want boolean",
        ),
        (
            {"networkPolicy": {"enable": True}},
            "at '/networkPolicy': additional properties 'enable' not allowed",
        ),
    ],
    ids=["hostnetwork", "extra-egress-unused", "empty-selector", "map-not-list", "typed", "typo"],
)
def test_bad_network_policy_values_are_refused_naming_them(render, values, expected):
    assert expected in render.error(values)


def test_a_megdetrun_with_restricted_egress_reaches_the_controller_it_reports_to():
    # The controller's own render: its --progress-url added to the run (planning.with_progress).
    from megdet.controller.planning import Planned, plan_children

    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r50", "namespace": NAMESPACE, "uid": "0d2f-uid"},
        "spec": {"networkPolicy": {"enabled": True, "restrictEgress": True}},
    }
    url = "https://megdet-operator-progress.megdet-system.svc:8443"
    planned = plan_children(run, progress_url=url)
    assert isinstance(planned, Planned), planned
    (obj,) = [o for o in planned.objects if o["kind"] == "NetworkPolicy"]
    assert egress_allowed(obj, CONTROLLER, PROGRESS_NS, 8443)
    (job,) = [o for o in planned.objects if o["kind"] == "PyTorchJob"]
    env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert any(
        e["value"].startswith(url) for e in env if e["name"] == "KUBEFLOW_TRAINER_SERVER_URL"
    )
