"""The lifecycle handlers (controller/lifecycle_watch.py) in the running operator, against
kmock: a Kueue Workload of the run's job queues the run with Kueue's words and admits it; the
pods of the job schedule and start; the trainer's stage in status.progress makes it Training;
nothing is written when nothing changes. (The mapping itself: test_lifecycle.py; the real
node: tests/e2e/test_e2e_shared_run.py.)"""

from __future__ import annotations

import copy
from typing import Any

from kmock_helpers import (
    NAMESPACE,
    RUNS,
    WORKLOADS,
    condition,
    eventually,
    patch,
    requests_to,
    run_status,
    settle,
)
from test_lifecycle import PENDING_WORKLOAD
from test_operator_pod_problems import PODS, create_pod, job_owner, pod_body, running, started_run

from megdet.controller import metrics


def stage(api: Any, name: str) -> str | None:
    return run_status(api, name).get("stage")


async def create_workload(api: Any, owner: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(PENDING_WORKLOAD)
    body["metadata"] |= {"namespace": NAMESPACE, "name": "pytorchjob-r-3c1f9"}
    body["metadata"]["ownerReferences"] = [
        {**owner, "controller": True, "blockOwnerDeletion": True}
    ]
    resp = await api.post(
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads", json=body
    )
    assert resp.status in (200, 201), await resp.text()
    return body


def observed(part: str) -> float:
    """How often megdet_controller_startup_seconds observed ``part`` in the test namespace."""
    labels = {"namespace": NAMESPACE, "target": "pytorchjob", "part": part}
    return metrics.sample("megdet_controller_startup_seconds_count", labels)


async def test_a_workload_queues_the_run_then_pods_and_the_trainer_move_it_on(
    cluster, operator
) -> None:
    parts = ("admission_wait", "container_start", "rendezvous", "first_iteration", "total")
    before = {part: observed(part) for part in parts}
    await started_run(cluster, "r")
    owner = job_owner(cluster, "r")
    await create_workload(cluster, owner)
    await eventually(lambda: stage(cluster, "r") == "Queued", message="stage Queued")
    admitted = condition(cluster, "r", "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "Pending")
    assert "insufficient quota for nvidia.com/gpu" in admitted["message"]

    # Kueue admits it.
    conditions = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue gpus",
         "lastTransitionTime": "2026-12-06T08:58:40Z"},
        {"type": "Admitted", "status": "True", "reason": "Admitted",
         "message": "The workload is admitted", "lastTransitionTime": "2026-12-06T08:58:40Z"},
    ]  # fmt: skip
    await patch(cluster, WORKLOADS, "pytorchjob-r-3c1f9", {"status": {"conditions": conditions}})
    await eventually(
        lambda: (condition(cluster, "r", "Admitted") or {}).get("status") == "True",
        message="Admitted=True",
    )
    assert run_status(cluster, "r")["startup"]["admissionWaitSeconds"] == 40

    # The job's pod: scheduled, then running; the trainer's report of its world and stages.
    pod = pod_body("r-master-0", "r", owner)
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True",
                        "lastTransitionTime": "2026-12-06T08:58:41Z"}],
    }  # fmt: skip
    await create_pod(cluster, pod)
    await eventually(
        lambda: (condition(cluster, "r", "PodsScheduled") or {}).get("status") == "True",
        message="PodsScheduled=True",
    )
    status = running() | {"conditions": pod["status"]["conditions"]}
    status["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-12-06T08:58:45Z"
    await patch(cluster, PODS, "r-master-0", {"status": status})
    await eventually(
        lambda: (condition(cluster, "r", "Initialized") or {}).get("reason") == "Rendezvous",
        message="Initialized=False Rendezvous",
    )
    progress = {
        "iteration": 1, "maxIter": 10, "stage": "training", "stageTime": "2026-12-06T08:59:00Z",
        "worldTime": "2026-12-06T08:58:50Z", "loadedTime": "2026-12-06T08:58:55Z",
        "firstIterationTime": "2026-12-06T08:59:00Z",
    }  # fmt: skip
    await patch(cluster, RUNS, "r", {"status": {"progress": progress}})
    await eventually(lambda: stage(cluster, "r") == "Training", message="stage Training")
    startup = run_status(cluster, "r")["startup"]
    assert startup == {
        "attempt": 1, "admissionWaitSeconds": 40, "containerStartSeconds": 4,
        "rendezvousSeconds": 5, "dataModelSeconds": 5, "firstIterationSeconds": 5,
        "totalSeconds": 60,
    } | {k: v for k, v in startup.items() if k == "schedulingSeconds"}  # fmt: skip
    # Each part observed once, as status.startup got it: the handler observes them after its
    # write returns, so the status can be read before they are.
    await eventually(
        lambda: all(observed(part) > before[part] for part in parts),
        message="each part of status.startup observed",
    )
    await settle()
    assert {part: observed(part) - before[part] for part in parts} == dict.fromkeys(parts, 1)

    # A report that changes nothing of the lifecycle (the next iteration) writes nothing more.
    await settle()
    writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    await patch(cluster, RUNS, "r", {"status": {"progress": progress | {"iteration": 2}}})
    await settle()
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes
    assert {part: observed(part) - before[part] for part in parts} == dict.fromkeys(parts, 1)
