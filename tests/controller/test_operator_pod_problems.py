"""A pod of the run's job that cannot start, shown on the run (PodsStarted) with the kubelet's
reason, against kmock: the pods' watch, the ownership check, the Warning event, the phase left
to the job. (pod_problems' pure part: test_pod_problems.py; the real kubelet: tests/e2e.)"""

from __future__ import annotations

from typing import Any

from kmock_helpers import (
    NAMESPACE,
    PYTORCHJOBS,
    apply,
    cond,
    condition,
    events_for,
    eventually,
    get,
    job_condition,
    patch,
    phase,
    reconciled,
    requests_to,
    run_body,
    run_status,
    settle,
)

PODS = "v1/pods"
MISSING = 'Container image "megdet.local/megdet:nope" is not present with pull policy of Never'


def pod_body(name: str, run: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A trainer pod as the training operator makes it, labelled as the run chart labels it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "megdet", "app.kubernetes.io/instance": run},
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"containers": [{"name": "pytorch", "image": "megdet.local/megdet:nope"}]},
        "status": {"phase": "Pending"},
    }


def job_owner(api: Any, name: str) -> dict[str, Any]:
    job = get(api, PYTORCHJOBS, name)
    meta = job["metadata"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": meta["uid"]}


def never_pull() -> dict[str, Any]:
    waiting = {"waiting": {"reason": "ErrImageNeverPull", "message": MISSING}}
    return {"phase": "Pending", "containerStatuses": [{"name": "pytorch", "state": waiting}]}


def running() -> dict[str, Any]:
    state = {"running": {"startedAt": "2026-12-02T00:00:00Z"}}
    return {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": state}]}


async def create_pod(api: Any, body: dict[str, Any]) -> None:
    resp = await api.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body)
    assert resp.status in (200, 201), await resp.text()


def pod_warnings(api: Any, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events_for(api, name)
        if e.get("type") == "Warning" and e.get("reason") == "ErrImageNeverPull"
    ]


async def started_run(api: Any, name: str) -> None:
    await apply(api, run_body(name))
    await eventually(lambda: run_status(api, name).get("jobUID"), message="the job recorded")
    await reconciled(api, name)


async def pods_started(cluster: Any, name: str, status: str, why: str = "") -> None:
    """Wait for the run's ``PodsStarted`` condition to have ``status``."""
    await eventually(
        lambda: (condition(cluster, name, "PodsStarted") or {}).get("status") == status,
        message=f"PodsStarted={status} {why}".strip(),
    )


async def test_a_pod_that_cannot_start_is_said_on_the_run_and_cleared_when_it_runs(
    cluster, operator
) -> None:
    await started_run(cluster, "r")
    await create_pod(cluster, pod_body("r-master-0", "r", job_owner(cluster, "r")))
    await patch(cluster, PODS, "r-master-0", {"status": never_pull()})
    await pods_started(cluster, "r", "False")
    pods = condition(cluster, "r", "PodsStarted")
    assert pods["reason"] == "ErrImageNeverPull"
    assert pods["message"] == f"pod r-master-0, container pytorch: ErrImageNeverPull: {MISSING}"
    await eventually(lambda: pod_warnings(cluster, "r"), message="a Warning event")
    (event,) = pod_warnings(cluster, "r")
    assert event["message"] == pods["message"]
    assert phase(cluster, "r") == "Pending"  # the job says nothing yet: the phase is its

    # The kubelet rewrites the waiting pod's status: no second Warning, no second write.
    writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    again = never_pull() | {"startTime": "2026-12-02T00:00:01Z"}
    await patch(cluster, PODS, "r-master-0", {"status": again})
    await settle()
    assert len(pod_warnings(cluster, "r")) == 1
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes

    # The image fixed: the pod runs, the condition turns True; the phase is still the job's.
    await patch(cluster, PODS, "r-master-0", {"status": running()})
    await pods_started(cluster, "r", "True")
    pods = condition(cluster, "r", "PodsStarted")
    assert (pods["reason"], pods["message"]) == ("Started", "pod r-master-0 started")
    assert phase(cluster, "r") == "Pending"
    assert len(pod_warnings(cluster, "r")) == 1


async def test_the_job_running_clears_it_and_the_phase_follows_the_job(cluster, operator) -> None:
    await started_run(cluster, "r")
    await create_pod(cluster, pod_body("r-worker-0", "r", job_owner(cluster, "r")))
    await patch(cluster, PODS, "r-worker-0", {"status": never_pull()})
    await pods_started(cluster, "r", "False")
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")
    await pods_started(cluster, "r", "True", "from the job")
    assert condition(cluster, "r", "PodsStarted")["message"] == "the job is Running"


async def test_a_pod_not_of_the_runs_job_changes_nothing(cluster, operator) -> None:
    await started_run(cluster, "r")
    real = job_owner(cluster, "r")
    forged = [
        # The run's labels, no owner of the run's job: anyone's pod.
        {"apiVersion": "v1", "kind": "ReplicaSet", "name": "r", "uid": "rs-uid"},
        # The job's name, another uid (a job after the run's was deleted, or made up).
        {**real, "uid": "not-the-jobs-uid"},
        # Another job's name with the real uid.
        {**real, "name": "other"},
    ]
    for i, owner in enumerate(forged):
        await create_pod(cluster, pod_body(f"x-{i}", "r", owner))
        await patch(cluster, PODS, f"x-{i}", {"status": never_pull()})
    await settle(1.0)
    assert condition(cluster, "r", "PodsStarted") is None
    assert pod_warnings(cluster, "r") == []
    # ... while the same pod owned by the run's job is said.
    await create_pod(cluster, pod_body("r-master-0", "r", real))
    await patch(cluster, PODS, "r-master-0", {"status": never_pull()})
    await eventually(lambda: condition(cluster, "r", "PodsStarted"), message="PodsStarted")
    assert condition(cluster, "r", "PodsStarted")["message"].startswith("pod r-master-0,")


async def test_a_finished_run_is_not_touched(cluster, operator) -> None:
    await started_run(cluster, "r")
    await job_condition(cluster, "r", cond("Created"), cond("Succeeded"))
    await eventually(lambda: phase(cluster, "r") == "Succeeded", message="Succeeded")
    await create_pod(cluster, pod_body("r-master-0", "r", job_owner(cluster, "r")))
    await patch(cluster, PODS, "r-master-0", {"status": never_pull()})
    await settle(1.0)
    assert condition(cluster, "r", "PodsStarted") is None
    assert phase(cluster, "r") == "Succeeded"
