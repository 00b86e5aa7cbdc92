"""podLabels and podAnnotations cannot take over the keys that select a run's pods.

The operator chart's PodMonitor selects trainer pods by app.kubernetes.io/part-of and
app.kubernetes.io/component and names the run after app.kubernetes.io/instance (the alerts and
dashboards group by it); the NetworkPolicy selects the run's pods by its app.kubernetes.io/*
labels; Kueue, the training operator, Trainer v2/JobSet and the gang schedulers label and
annotate pods under their own prefixes. A podLabels or podAnnotations key there would put a
run's pods in another run's metrics, alerts, policy, queue or gang: the chart refuses it.
"""

from __future__ import annotations

import pytest
from chart_helpers import NAMESPACE, RELEASE

from megdet.controller.render import helm_problems

PREFIXES = "kubernetes.io/, k8s.io/, x-k8s.io/, kubeflow.org/, volcano.sh/"
RESERVED_LABELS = [
    "app.kubernetes.io/instance",  # the run label of metrics, alerts and dashboards
    "app.kubernetes.io/component",  # the PodMonitor's master|worker|node
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/name",
    "app.kubernetes.io/version",
    "kueue.x-k8s.io/queue-name",
    "training.kubeflow.org/job-name",
    "training.kubeflow.org/replica-type",
    "trainer.kubeflow.org/trainjob-name",
    "jobset.sigs.k8s.io/jobset-name",
    "batch.kubernetes.io/job-name",
    "scheduling.x-k8s.io/pod-group",  # scheduler-plugins' gang
    "volcano.sh/job-name",
    "kubernetes.io/metadata.name",
    "k8s.io/anything",
]
FREE_LABELS = ["team", "example.com/team", "app", "kubernetes.io.example.com/x", "mykubeflow.org/x"]


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("key", RESERVED_LABELS)
def test_reserved_pod_label_keys_are_refused_naming_the_key_and_prefixes(render, target, key):
    message = render.error({"podLabels": {"team": "a", key: "other-run"}, "target": target})
    assert f'podLabels: "{key}" is reserved' in message
    assert PREFIXES in message
    assert "use a key of your own" in message


@pytest.mark.parametrize("key", FREE_LABELS)
def test_other_pod_labels_pass_through_to_every_pod(render, key):
    rendered = render({"gpus": 16, "podLabels": {key: "x"}})
    for replica in rendered.replicas().values():
        labels = replica["template"]["metadata"]["labels"]
        assert labels[key] == "x"
        assert labels["app.kubernetes.io/instance"] == RELEASE


def test_the_run_labels_cannot_be_spoofed_on_any_pod(render):
    # The labels the monitors select on are the chart's on every pod of both targets.
    for target in ("pytorchjob", "trainjob"):
        for obj in render({"target": target, "gpus": 16, "podLabels": {"team": "a"}}).objects:
            templates = []
            if obj["kind"] == "PyTorchJob":
                templates = [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
            elif obj["kind"] == "TrainingRuntime":
                jobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
                templates = [j["template"]["spec"]["template"] for j in jobs]
            for template in templates:
                labels = template["metadata"]["labels"]
                assert labels["app.kubernetes.io/instance"] == RELEASE
                assert labels["app.kubernetes.io/part-of"] == "megdet"
                assert labels["app.kubernetes.io/component"] in {"master", "worker", "node"}


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("k8s.v1.cni.cncf.io/networks", "use that value"),
        ("scheduling.k8s.io/group-name", "PodGroup"),
        ("training.kubeflow.org/job-role", "job operators"),
        ("trainer.kubeflow.org/x", "job operators"),
        ("jobset.sigs.k8s.io/jobset-name", "job operators"),
    ],
)
def test_reserved_pod_annotation_keys_are_refused(render, key, says):
    message = render.error({"podAnnotations": {key: "x"}})
    assert f'podAnnotations: "{key}" is reserved' in message and says in message


@pytest.mark.parametrize(
    "key",
    [
        "example.com/team",
        "cluster-autoscaler.kubernetes.io/safe-to-evict",
        "kubectl.kubernetes.io/default-container",
        "kueue.x-k8s.io/podset-required-topology",
    ],
)
def test_user_annotations_under_kubernetes_prefixes_stay_allowed(render, key):
    # Annotations that users set on purpose (autoscaler, kubectl, Kueue's topology requests).
    rendered = render({"podAnnotations": {key: "x"}})
    for replica in rendered.replicas().values():
        assert replica["template"]["metadata"]["annotations"][key] == "x"


def test_multus_networks_comes_from_its_value_only(render):
    rendered = render({"network": {"multusNetworks": "default/ib-sriov"}})
    for replica in rendered.replicas().values():
        annotations = replica["template"]["metadata"]["annotations"]
        assert annotations == {"k8s.v1.cni.cncf.io/networks": "default/ib-sriov"}


def test_the_controller_reports_the_refusal_on_the_spec_field(render):
    # A MegDetRun with such a label: the controller's parser of Helm errors names the field.
    message = render.error({"podLabels": {"app.kubernetes.io/instance": "other"}})
    (problem,) = helm_problems(message)
    assert problem.path == "spec.podLabels"
    assert '"app.kubernetes.io/instance" is reserved' in problem.message


def test_release_name_and_namespace_are_what_the_selectors_use(render):
    rendered = render({})
    assert rendered.job["metadata"]["namespace"] == NAMESPACE
    assert rendered.job["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
