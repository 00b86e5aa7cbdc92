"""A MegDetRun through the real Kubeflow training operator (v1.9, its validating webhook
served with the project's certificates) on the real scheduler and kwok's fake 8-GPU nodes,
in a namespace that enforces the `restricted` Pod Security profile."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import (
    apply_objects,
    eventually,
    get_json,
    get_or_none,
    launch_dry_run,
    mdr,
    namespace,
    pods_of,
    resolve_env,
)

NS = "vision-e2e"
RUN = "coco-16"


def volumes(ns: str, claims: tuple[str, ...] = ("coco", "megdet-output")) -> list[dict]:
    """PVCs for the dataset and the output, pre-bound to hostPath PVs (kwok mounts nothing)."""
    objects = []
    for claim in claims:
        pv = f"{ns}-{claim}"
        objects += [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                      "hostPath": {"path": f"/tmp/{pv}"}, "storageClassName": "",
                      "claimRef": {"namespace": ns, "name": claim}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": claim, "namespace": ns},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                      "resources": {"requests": {"storage": "1Ti"}}}},
        ]  # fmt: skip
    return objects


@pytest.fixture(scope="module")
def ns(kube, controller):
    name = namespace(kube, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    apply_objects(kube, *volumes(name))
    return name


def phase(kube, ns: str, name: str) -> str | None:
    run = get_or_none(kube, "mdr", name, "-n", ns)
    return ((run or {}).get("status") or {}).get("phase")


def test_a_16_gpu_run_becomes_a_running_pytorchjob(kube, ns, controller) -> None:
    apply_objects(kube, mdr(RUN, ns, {
        "gpus": 16,
        "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"},
    }))  # fmt: skip
    job = eventually(
        lambda: get_or_none(kube, "pytorchjob", RUN, "-n", ns),
        timeout=60,
        message="the controller's PyTorchJob",
    )
    assert job["metadata"]["ownerReferences"][0]["kind"] == "MegDetRun"
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1

    # The real operator made the pods and their Services; the scheduler put each 8-GPU pod on
    # its own fake node (one node cannot hold both).
    pods = eventually(
        lambda: (p := pods_of(kube, ns, f"training.kubeflow.org/job-name={RUN}"))
        and len(p) == 2
        and all(x["spec"].get("nodeName") for x in p)
        and p,
        timeout=90,
        message="two scheduled pods",
    )
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    for pod in pods:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "8"
    services = get_json(kube, "services", "-n", ns)["items"]
    assert {f"{RUN}-master-0", f"{RUN}-worker-0"} <= {s["metadata"]["name"] for s in services}

    eventually(
        lambda: phase(kube, ns, RUN) == "Running", timeout=90, message="MegDetRun phase Running"
    )
    table = kube.kubectl("get", "mdr", RUN, "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "GPUS", "WORLD", "BATCH"]
    assert row.split()[:5] == [RUN, "Running", "16", "16", "32"]


def test_the_operators_env_launches_a_world_of_16(kube, ns) -> None:
    """The env the real operator put into the pods, read back from the API server, is what
    `megdet launch` turns into torchrun's arguments: world size 16, two nodes of 8, the
    rendezvous on the Master's Service, hosted by the Master (node rank 0's pod)."""
    pods = {
        p["metadata"]["name"]: p for p in pods_of(kube, ns, f"training.kubeflow.org/job-name={RUN}")
    }
    ranks = {}
    for name, pod in sorted(pods.items()):
        args = launch_dry_run(resolve_env(pod))
        assert "world size 16:" in " ".join(args), args
        # c10d rendezvous on the Master's Service; torchrun numbers the nodes as they join and
        # the Master's node hosts the store.
        assert f"--rdzv-endpoint={RUN}-master-0:23456" in args, args
        assert "--nnodes=2:2" in args and "--nproc-per-node=8" in args, args
        ranks[name] = next(a.split("=")[-1] for a in args if a.startswith("--rdzv-conf="))
    assert ranks == {f"{RUN}-master-0": "1", f"{RUN}-worker-0": "0"}  # is_host


def test_pods_meet_the_restricted_profile(kube, ns) -> None:
    """The namespace enforces `restricted`: that the operator could create the pods at all is
    the server's verdict; check what it let through."""
    for pod in pods_of(kube, ns, f"training.kubeflow.org/job-name={RUN}"):
        spec = pod["spec"]
        assert spec.get("automountServiceAccountToken") is False
        ctx = spec["containers"][0]["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
    events = json.loads(kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    assert not [e for e in events if "violates PodSecurity" in e.get("message", "")]
