"""Faults the cluster makes, on the real control plane: kwok fails a worker container, a
finished run's job is deleted (as ttlSecondsAfterFinished does) while the controller restarts,
and a deleted run's objects are removed by Kubernetes' garbage collector.

Faults of the API itself (500s, timeouts, a controller killed mid-reconcile) stay in
tests/controller on kmock, where they can be injected (docs/architecture.md)."""

from __future__ import annotations

import json

import pytest
from e2e_helpers import (
    CONTROLLER_USER,
    apply_objects,
    eventually,
    get_json,
    get_or_none,
    mdr,
    pods_of,
    run_namespace,
)

from megdet.controller.api import FINALIZER
from megdet.controller.diffbase import FIELD as HANDLED_FIELD

NS = "faults-e2e"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


@pytest.fixture(scope="module")
def ns(kube, controller):
    return run_namespace(kube, NS)


def status(kube, ns: str, name: str) -> dict:
    return ((get_or_none(kube, "mdr", name, "-n", ns) or {}).get("status")) or {}


def condition(kube, ns: str, name: str, kind: str) -> dict | None:
    return next(
        (c for c in status(kube, ns, name).get("conditions", []) if c["type"] == kind), None
    )


def start_run(kube, ns: str, name: str, **spec) -> list[dict]:
    apply_objects(kube, mdr(name, ns, {
        "gpus": 16, "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"}, "runName": name, **spec,
    }))  # fmt: skip
    eventually(
        lambda: status(kube, ns, name).get("phase") == "Running",
        timeout=90,
        message=f"{name} Running",
    )
    return pods_of(kube, ns, f"training.kubeflow.org/job-name={name}")


def fail_container(kube, ns: str, pod: str, exit_code: int) -> None:
    """kwok's pod chaos stage: the running container terminates with ``exit_code``."""
    kube.kubectl(
        "annotate",
        "pod",
        pod,
        "-n",
        ns,
        "--overwrite",
        f"{FAIL_LABEL}/exit-code={exit_code}",
        f"{FAIL_LABEL}/reason=Error",
    )
    kube.kubectl("label", "pod", pod, "-n", ns, "--overwrite", f"{FAIL_LABEL}=true")


def job_events(kube, ns: str, job: str) -> list[dict]:
    events = json.loads(kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    return [e for e in events if e["involvedObject"]["name"] == job]


def test_a_worker_killed_with_137_is_restarted_by_the_operator(kube, ns) -> None:
    """restartPolicy OnFailure (the default): the operator deletes the failed pod and makes a
    new one (common/pod.go: PodFailed with OnFailure, or ExitCode and a retryable code, is
    restarted); the job, and so the run, stay Running."""
    pods = start_run(kube, ns, "kill-137")
    worker = next(p for p in pods if p["metadata"]["name"].endswith("-worker-0"))
    fail_container(kube, ns, worker["metadata"]["name"], 137)
    eventually(
        lambda: [
            e
            for e in job_events(kube, ns, "kill-137")
            if e["reason"] == "ExitedWithCode" and "137" in e["message"]
        ],
        timeout=60,
        message="the operator's ExitedWithCode event",
    )
    replaced = eventually(
        lambda: (p := get_or_none(kube, "pod", worker["metadata"]["name"], "-n", ns))
        and p["metadata"]["uid"] != worker["metadata"]["uid"]
        and p,
        timeout=60,
        message="a new worker pod",
    )
    assert replaced["spec"]["nodeName"]
    assert any(e["reason"] == "PyTorchJobRestarting" for e in job_events(kube, ns, "kill-137"))
    assert status(kube, ns, "kill-137")["phase"] == "Running"


def test_a_non_retryable_exit_fails_the_run_under_exit_code_policy(kube, ns) -> None:
    pods = start_run(kube, ns, "exit-1", restartPolicy="ExitCode")
    worker = next(p for p in pods if p["metadata"]["name"].endswith("-worker-0"))
    fail_container(kube, ns, worker["metadata"]["name"], 1)
    eventually(
        lambda: status(kube, ns, "exit-1").get("phase") == "Failed",
        timeout=60,
        message="run Failed",
    )
    failed = condition(kube, ns, "exit-1", "Failed")
    assert failed and "Worker" in failed["message"], failed  # the operator's own words


def test_a_finished_runs_deleted_job_is_not_launched_again(kube, ns, controller) -> None:
    """What ttlSecondsAfterFinished does, plus a controller restart (a failover): the run
    keeps its result, says the job is gone, and no job is made again.

    The restarted controller handles one object of each kind at a time (--worker-limit=1)
    while more runs, jobs and pods than that exist: kopf's own limit never reconciles any of
    them then (kopf issue #1243); the controller's applies only once all are indexed."""
    eventually(
        lambda: status(kube, ns, "exit-1").get("phase") == "Failed",
        timeout=90,
        message="exit-1 Failed (previous test)",
    )
    # The job goes while no controller runs: only the restarted one can see that it is gone.
    controller.stop()
    kube.kubectl("delete", "pytorchjob", "exit-1", "-n", ns, "--wait=true")
    present = condition(kube, ns, "exit-1", "JobPresent")
    assert present is None or present["status"] == "True"
    assert len(get_json(kube, "mdr", "-A")["items"]) > 1
    controller.start("--worker-limit=1")
    try:
        gone = eventually(
            lambda: (c := condition(kube, ns, "exit-1", "JobPresent"))
            and c["status"] == "False"
            and c,
            timeout=60,
            message="JobPresent=False on the run",
        )
        assert gone["reason"] == "JobDeleted"
        # The restarted controller wrote the condition above: the run's result is kept and no
        # job was made again.
        controller_seen = status(kube, ns, "exit-1")
        assert controller_seen["phase"] == "Failed"
        assert get_or_none(kube, "pytorchjob", "exit-1", "-n", ns) is None
    finally:
        controller.restart()  # the chart's flags again


def test_deleting_a_run_leaves_nothing_even_without_the_controller(kube, ns, controller) -> None:
    """Runs carry no finalizer: with the controller stopped, `kubectl delete mdr` returns at
    once and the garbage collector removes the job, its pods and Services through the owner
    references (the controller deletes none of them)."""
    start_run(kube, ns, "gc")
    assert not get_json(kube, "mdr", "gc", "-n", ns)["metadata"].get("finalizers")
    controller.stop()
    try:
        kube.kubectl("delete", "mdr", "gc", "-n", ns, "--wait=true", "--timeout=30s")
        eventually(
            lambda: get_or_none(kube, "pytorchjob", "gc", "-n", ns) is None,
            timeout=60,
            message="the PyTorchJob collected",
        )
        eventually(
            lambda: not pods_of(kube, ns, "training.kubeflow.org/job-name=gc"),
            timeout=60,
            message="its pods collected",
        )
        services = get_json(kube, "services", "-n", ns)["items"]
        assert not [s for s in services if s["metadata"]["name"].startswith("gc-")]
    finally:
        controller.start()


def test_the_finalizer_of_earlier_controllers_is_removed(kube, ns) -> None:
    """A run that still carries the finalizer earlier controllers added (their delete handler's)
    loses it to this controller, on the real API server under the chart's RBAC, and is then
    reconciled and deleted like any other."""
    run = mdr("legacy", ns, {
        "gpus": 8, "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"}, "runName": "legacy",
    })  # fmt: skip
    run["metadata"]["finalizers"] = [FINALIZER]
    apply_objects(kube, run)
    eventually(
        lambda: not (get_or_none(kube, "mdr", "legacy", "-n", ns) or {})["metadata"].get(
            "finalizers"
        ),
        timeout=60,
        message="the old finalizer removed",
    )
    eventually(
        lambda: status(kube, ns, "legacy").get("jobName") == "legacy",
        timeout=60,
        message="the run reconciled",
    )
    kube.kubectl("delete", "mdr", "legacy", "-n", ns, "--wait=true", "--timeout=30s")
    eventually(
        lambda: get_or_none(kube, "pytorchjob", "legacy", "-n", ns) is None,
        timeout=60,
        message="its PyTorchJob collected",
    )


def _run_writes(kube, ns: str, name: str) -> list[dict]:
    """The controller's completed patches of the run ``name`` (its status and the run itself),
    from the API server's audit log."""
    return [
        e
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete"
        and e.get("verb") == "patch"
        and (e.get("objectRef") or {}).get("resource") == "megdetruns"
        and (e.get("objectRef") or {}).get("namespace") == ns
        and (e.get("objectRef") or {}).get("name") == name
    ]


def test_kopfs_diff_base_rides_on_the_status_write(kube, ns) -> None:
    """On the real API server, under the chart's RBAC: the CRD keeps status.handledConfiguration
    (a field it did not declare would be pruned, and kopf would take every event for a create),
    a create and a spec edit each record what was handled there, and the controller never
    patches the run itself: kopf's own write per reconcile is gone (controller/diffbase.py)."""
    name = "based"
    apply_objects(kube, mdr(name, ns, {
        "gpus": 8, "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"}, "runName": name,
    }))  # fmt: skip

    def base() -> dict:
        raw = status(kube, ns, name).get(HANDLED_FIELD)
        return json.loads(raw) if raw else {}

    def spec() -> dict:
        return get_json(kube, "mdr", name, "-n", ns)["spec"]

    eventually(lambda: base().get("spec") == spec(), timeout=60, message="the base recorded")
    kube.kubectl(
        "patch", "mdr", name, "-n", ns, "--type=merge", "-p",
        '{"spec": {"image": {"pullPolicy": "Always"}}}',
    )  # fmt: skip
    eventually(
        lambda: base().get("spec") == spec() and spec()["image"]["pullPolicy"] == "Always",
        timeout=60,
        message="the edit's base recorded",
    )
    # A third reconcile (a label): kopf handles a run's events in order, so once its write is
    # in the audit log, any write kopf made after the first two reconciles would be there too.
    kube.kubectl("label", "mdr", name, "-n", ns, "team=vision")
    writes = eventually(
        lambda: (w := _run_writes(kube, ns, name)) and any(
            "team" in json.loads(
                ((x.get("requestObject") or {}).get("status") or {}).get(HANDLED_FIELD) or "{}"
            ).get("metadata", {}).get("labels", {})
            for x in w
        ) and w,
        timeout=60,
        message="the label's base in the audit log",
    )  # fmt: skip
    subresources = [(w.get("objectRef") or {}).get("subresource") for w in writes]
    assert subresources == ["status"] * len(writes), subresources
    bodies = [(w.get("requestObject") or {}).get("status") or {} for w in writes]
    carried = [HANDLED_FIELD in b for b in bodies]
    assert carried.count(True) == 3, carried  # one per reconcile
    kube.kubectl("delete", "mdr", name, "-n", ns, "--wait=true", "--timeout=30s")
