"""`helm install megdet charts/megdet ...` with the real Helm CLI against the real API server
and the real training operator (its webhook validates every PyTorchJob): the README's command,
the CI values for 16 GPUs over InfiniBand, and the examples' specs as values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from e2e_helpers import (
    ROOT,
    apply_objects,
    claim_volumes,
    ensure_free_gpus,
    eventually,
    get_json,
    helm,
    namespace,
    pods_of,
)

NS = "chart-e2e"


@pytest.fixture(scope="module")
def ns(kube):
    name = namespace(kube, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    objects = claim_volumes(name, claims=("megdet-coco", "megdet-output"))  # the chart's defaults
    # The IB values ask for this PriorityClass; the Priority admission plugin refuses pods
    # that name one the cluster lacks.
    apply_objects(
        kube,
        *objects,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high-priority"},
            "value": 1000,
        },
    )
    if kueue_runs(kube):
        queue_for_the_ci_values(kube, name)
    return name


#: The queue charts/megdet/ci/multinode-ib-values.yaml names (kueue.queueName) and room for its
#: two pods.
CI_QUEUE = "gpu-queue"
CI_QUEUE_ROOM = {
    "cpu": "64",
    "memory": "512Gi",
    "nvidia.com/gpu": "16",
    "rdma/rdma_shared_device_a": "2",
}


def kueue_runs(kube) -> bool:
    """Whether an earlier module started Kueue on the session's cluster (this module does not:
    the modules that run the TrainJob target restart the host controller only when they
    themselves start Kueue or Trainer v2)."""
    return kube.running("kueue", kube.state())


def queue_for_the_ci_values(kube, ns: str) -> None:
    """A ClusterQueue for this namespace with room for the IB values' run, and the LocalQueue
    those values name. Without it, once Kueue runs (its pytorchjob integration is on), Kueue
    keeps a job labelled with a queue that does not exist suspended and the operator makes no
    pod; without Kueue the label is only a label."""
    resources = [{"name": k, "nominalQuota": v} for k, v in CI_QUEUE_ROOM.items()]
    apply_objects(
        kube,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "chart-e2e-flavor"},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "chart-e2e"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [
                    {
                        "coveredResources": list(CI_QUEUE_ROOM),
                        "flavors": [{"name": "chart-e2e-flavor", "resources": resources}],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": CI_QUEUE, "namespace": ns},
            "spec": {"clusterQueue": "chart-e2e"},
        },
    )


def release_job(kube, ns: str, release: str) -> dict | None:
    items = get_json(kube, "pytorchjobs", "-n", ns, "-l", f"app.kubernetes.io/instance={release}")
    return items["items"][0] if items["items"] else None


def example_values(name: str, tmp: Path) -> Path:
    """A MegDetRun example's spec is the chart's values."""
    spec = yaml.safe_load((ROOT / "examples" / name).read_text())["spec"]
    path = tmp / name
    path.write_text(yaml.safe_dump(spec))
    return path


CASES = [
    ("gpus16", ["--set", "gpus=16"], 2),
    ("ib16", ["-f", "charts/megdet/ci/multinode-ib-values.yaml"], 2),
    ("ex-ib16", ["-f", "examples:megdetrun-16gpu-ib.yaml"], 2),
    ("ex-gang64", ["-f", "examples:megdetrun-64gpu-gang.yaml"], 8),
]


@pytest.mark.parametrize(("release", "args", "pods"), CASES, ids=[c[0] for c in CASES])
def test_helm_install_is_accepted_by_the_server_and_the_operator(
    kube, ns, tmp_path, release, args, pods
) -> None:
    args = [
        str(example_values(a.split(":", 1)[1], tmp_path)) if a.startswith("examples:") else a
        for a in args
    ]
    out = helm(kube, "install", release, "charts/megdet", "-n", ns, *args)
    assert "STATUS: deployed" in out.stdout
    job = eventually(lambda: release_job(kube, ns, release), timeout=30, message="the PyTorchJob")
    name = job["metadata"]["name"]
    # The operator accepted it (its webhook ran at create) and made every pod: the namespace
    # enforces `restricted`, so each pod also passed Pod Security.
    made = eventually(
        lambda: (p := pods_of(kube, ns, f"training.kubeflow.org/job-name={name}"))
        and len(p) == pods
        and p,
        timeout=60,
        message=f"{pods} pods",
    )
    for pod in made:
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    queued = (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")
    assert (queued is not None) == (release == "ib16"), queued  # only the CI values name a queue
    if queued is not None and kueue_runs(kube):  # Kueue admitted it before the pods were made
        assert queued == CI_QUEUE
        workloads = get_json(kube, "workloads.kueue.x-k8s.io", "-n", ns)["items"]
        mine = [w for w in workloads if w["metadata"]["ownerReferences"][0]["name"] == name]
        admitted = [c for c in mine[0]["status"]["conditions"] if c["type"] == "Admitted"]
        assert admitted and admitted[0]["status"] == "True", mine[0]["status"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == pods - 1
    helm(kube, "uninstall", release, "-n", ns, "--wait")
    eventually(
        lambda: not pods_of(kube, ns, f"training.kubeflow.org/job-name={name}"),
        timeout=60,
        message="pods gone after helm uninstall",
    )


def test_helm_install_gpus_16_runs_on_two_nodes(kube, ns) -> None:
    """The README's command, as is: `helm install megdet charts/megdet --set gpus=16`."""
    ensure_free_gpus(kube, 16)  # the runs test_faults and test_run_targets leave take 32
    helm(kube, "install", "megdet", "charts/megdet", "-n", ns, "--set", "gpus=16")

    def running() -> bool:
        job = release_job(kube, ns, "megdet") or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Running" and c["status"] == "True" for c in conditions)

    eventually(running, timeout=120, message="PyTorchJob Running")
    name = release_job(kube, ns, "megdet")["metadata"]["name"]
    nodes = {
        p["spec"]["nodeName"] for p in pods_of(kube, ns, f"training.kubeflow.org/job-name={name}")
    }
    assert len(nodes) == 2
    helm(kube, "uninstall", "megdet", "-n", ns, "--wait")
