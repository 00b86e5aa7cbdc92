"""A MegDetRun that Kueue preempts and admits again, in real pods on the real node.

Kueue v0.19.0 (its ``kubeflow.org/pytorchjob`` integration) queues a run of 2 pods (gpus 2,
gpusPerNode 1, ``kueue.queueName``) in a ClusterQueue of 2 GPUs that preempts lower priorities
within itself. After the run's first checkpoint a Workload of priority 1000 asking for both GPUs
is queued: Kueue evicts the run's Workload (``Evicted``, reason ``Preempted``) and sets the
PyTorchJob's ``runPolicy.suspend`` (kueue pkg/controller/jobframework/reconciler.go, ``stopJob``);
the training operator deletes the pods (the kubelet's SIGTERM: the trainer saves where it stops)
and the run shows ``Suspended``. While the other Workload holds the GPUs the job stays
suspended: the controller does not undo Kueue's suspend. Once it is deleted, Kueue admits the
run's Workload again and resumes the job; the trainer continues at equal images seen (a second
segment on the same 2 workers) and the run reaches Succeeded with the planned images.

The preemptor is a Workload of its own (no job behind it: Kueue admits it, nothing runs), so the
GPUs it takes are only Kueue's accounting and the test trains one run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import apply_objects, condition, eventually, get_json, get_or_none, mdr, pods_of
from test_e2e_elastic import real_node_policy
from test_e2e_real_training import run_values, shapes_volumes, train_image

__all__ = ["real_node_policy", "train_image"]  # the fixtures, shared with the other modules

NS = "real-preempt"
RUN = "yielding"
#: 40 iterations at the global batch of 4, a checkpoint every 10: the preemption comes after
#: the first, far from the end.
MAX_ITER = 40
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "real-node", "real-node-gpus", "training"
PREEMPTOR = "urgent"
pytestmark = [pytest.mark.timeout(2400), pytest.mark.real_pods]


@pytest.fixture(scope="module")
def volumes(kube, real_node) -> Iterator[dict[str, Path]]:
    """The shapes dataset and an empty output folder, each on a PersistentVolume."""
    yield from shapes_volumes(kube, NS)


@pytest.fixture(scope="module")
def queue(kube, volumes) -> Iterator[str]:
    """Kueue, a ClusterQueue of 2 GPUs (the run's) that preempts lower priorities within
    itself, and a LocalQueue in the run's namespace."""
    kube.start_kueue()
    quotas = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    apply_objects(
        kube,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": NS},
                },
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(quotas),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": k, "nominalQuota": v} for k, v in quotas.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NS},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    yield LOCAL_QUEUE
    kube.kubectl("delete", "clusterqueue", CLUSTER_QUEUE, "--wait=false", check=False)


def preemptor(gpus: int) -> dict[str, Any]:
    """A Workload of priority 1000 for ``gpus`` GPUs in the run's queue."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": PREEMPTOR, "namespace": NS},
        "spec": {
            "queueName": LOCAL_QUEUE,
            "priority": 1000,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"nvidia.com/gpu": str(gpus)}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def run_workload(kube) -> dict[str, Any] | None:
    """The Workload Kueue made for the run's PyTorchJob."""
    for item in get_json(kube, "workloads.kueue.x-k8s.io", "-n", NS)["items"]:
        owners = item["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "PyTorchJob" and o["name"] == RUN for o in owners):
            return item
    return None


def is_true(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    cond = condition(obj, kind)
    return cond if cond and cond["status"] == "True" else None


def job_suspended(kube) -> bool:
    job = get_json(kube, "pytorchjob", RUN, "-n", NS)
    return bool(job["spec"].get("runPolicy", {}).get("suspend"))


def test_a_run_preempted_by_kueue_resumes_at_equal_images_and_succeeds(
    kube, controller, real_node_policy, train_image, volumes, queue
) -> None:
    started = time.monotonic()
    spec = {k: v for k, v in run_values(train_image).items() if k != "runName"}
    spec.update(maxIter=MAX_ITER, steps=[30], kueue={"queueName": queue})
    apply_objects(kube, mdr(RUN, NS, spec))
    folder = volumes["output"] / RUN

    # Kueue admits the run (its quota fits) and the job trains to its first checkpoint.
    eventually(lambda: is_true(run_workload(kube), "Admitted"), timeout=300, message="run admitted")
    eventually(
        lambda: list(folder.glob("model_*.pth")), timeout=1200, interval=1,
        message="a first checkpoint",
    )  # fmt: skip
    assert not (folder / "model_final.pth").exists()

    # A higher priority takes both GPUs: Kueue evicts the run's Workload and suspends its job;
    # the operator deletes the pods and the run shows Suspended.
    apply_objects(kube, preemptor(2))
    evicted = eventually(
        lambda: is_true(run_workload(kube), "Evicted"), timeout=300, message="run evicted"
    )
    assert evicted["reason"] == "Preempted", evicted
    eventually(lambda: job_suspended(kube), timeout=120, message="the job suspended by Kueue")
    eventually(
        lambda: not pods_of(kube, NS, f"training.kubeflow.org/job-name={RUN}"),
        timeout=300, message="the run's pods gone",
    )  # fmt: skip
    eventually(
        lambda: is_true(get_or_none(kube, "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", NS),
                        "Admitted"),
        timeout=300, message="the preemptor admitted",
    )  # fmt: skip
    requeued = condition(run_workload(kube), "Requeued")
    assert requeued and requeued["reason"] == "Preempted", run_workload(kube)
    run = get_json(kube, "mdr", RUN, "-n", NS)
    assert run["status"]["phase"] == "Suspended", run["status"]
    assert is_true(run, "Suspended"), run["status"]
    # The controller leaves Kueue's suspend alone: it holds while the preemptor runs, through
    # the status writes the suspend caused (each one a reconcile of the run).
    time.sleep(15)
    assert job_suspended(kube)
    assert not pods_of(kube, NS, f"training.kubeflow.org/job-name={RUN}")
    assert get_json(kube, "mdr", RUN, "-n", NS)["status"]["phase"] == "Suspended"

    # The preemptor ends: Kueue admits the run again and resumes the job; it trains to the end.
    kube.kubectl("delete", "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", NS)
    eventually(
        lambda: (a := is_true(run_workload(kube), "Admitted"))
        and a["lastTransitionTime"] >= evicted["lastTransitionTime"],
        timeout=300, message="the run admitted again",
    )  # fmt: skip
    st = eventually(
        lambda: (s := get_json(kube, "mdr", RUN, "-n", NS).get("status") or {}).get("phase")
        in ("Succeeded", "Failed") and s,
        timeout=1200, interval=5, message="the run to finish",
    )  # fmt: skip
    master = kube.kubectl("logs", "-n", NS, f"{RUN}-master-0", check=False).stdout
    assert st["phase"] == "Succeeded", (st, master[-4000:])
    # One job throughout (Kueue suspends and resumes it; nothing is created again), and the
    # run's status says it was suspended and resumed.
    assert st["attempt"] == 1 and len(st["segments"]) == 1, st
    suspended = condition({"status": st}, "Suspended")
    assert (
        suspended["status"] == "False"
        and suspended["lastTransitionTime"] >= (evicted["lastTransitionTime"])
    ), st["conditions"]

    # The trainer: a checkpoint at the iteration SIGTERM found, the resume at equal images on
    # the same 2 workers (in the new Master's log), two segments adding up to the plan.
    log = (folder / "log.txt").read_text()
    saved = [
        int(line.split("at iteration ")[1].split()[0])
        for line in log.splitlines()
        if "after SIGTERM" in line and "at iteration " in line
    ]
    assert len(saved) == 1, log[-4000:]
    plan = json.loads((folder / "plan.json").read_text())
    one, two = plan["segments"]
    assert (one["world_size"], two["world_size"]) == (2, 2)
    assert one["global_batch"] == two["global_batch"] == 4
    assert one["last_iter"] == saved[0] and one["images_end"] == (saved[0] + 1) * 4
    assert two["images_start"] == one["images_end"] and two["first_iter"] == saved[0] + 1
    assert two["images_end"] == plan["images_seen"] == MAX_ITER * 4
    line = f"Resuming after {one['images_end']:,} images on the same 2 workers"
    assert line in master, master[-4000:]
    assert (folder / "model_final.pth").stat().st_size > 0
    print(
        f"\npreempted after iteration {saved[0]}; the test took {time.monotonic() - started:.0f} s"
    )
