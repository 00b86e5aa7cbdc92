"""The operator against kmock: runs -> one owned job, status mirroring, suspend, delete.

kmock emulates the API server (none can run here); see conftest.py for what it does not do.
"""

from __future__ import annotations

from typing import Any

from kmock_helpers import (
    NAMESPACE,
    PYTORCHJOBS,
    RUNS,
    apply,
    cond,
    condition,
    counted,
    delete,
    events_for,
    eventually,
    get,
    job_condition,
    objects,
    patch,
    phase,
    reconciled,
    reconciles,
    requests_to,
    run_body,
)
from kmock_helpers import (
    run_status as status,
)

from megdet.controller import metrics
from megdet.controller.api import FINALIZER
from megdet.controller.render import render_run


async def test_apply_run_creates_one_owned_pytorchjob_and_plan_status(cluster, operator) -> None:
    body = run_body("coco-16", {"gpus": 16, "gpusPerNode": 8})
    created = metrics.sample(
        "megdet_controller_jobs_created_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
    )
    await apply(cluster, body)
    await eventually(lambda: status(cluster, "coco-16").get("jobName"), message="status")

    jobs = objects(cluster, PYTORCHJOBS)
    assert list(jobs) == ["coco-16"]
    job = jobs["coco-16"]
    (ref,) = job["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "name": "coco-16",
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    # The job is exactly what the run chart renders for this run, plus the owner reference;
    # the controller passes the run's uid and name to the pods through the chart's extraEnv.
    run_env = [
        {"name": "MEGDET_RUN_UID", "value": body["metadata"]["uid"]},
        {"name": "MEGDET_RUN_NAME", "value": "coco-16"},
    ]
    rendered = render_run("coco-16", NAMESPACE, {**body["spec"], "extraEnv": run_env})
    expected = dict(rendered.job, metadata={**rendered.job["metadata"], "ownerReferences": [ref]})
    server_set = ("uid", "resourceVersion")  # the emulator assigns these, as an API server does
    assert (
        dict(job, metadata={k: v for k, v in job["metadata"].items() if k not in server_set})
        == expected
    )

    for pod in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = pod["template"]["spec"]["containers"]
        assert container["env"][-2:] == run_env

    st = status(cluster, "coco-16")
    assert {k: st[k] for k in rendered.status_plan()} == rendered.status_plan()
    assert st["worldSize"] == 16 and st["nodes"] == 2 and st["globalBatch"] == 32
    assert st["jobName"] == "coco-16" and st["target"] == "pytorchjob"
    # The uid of the job this controller created: the only job its mirror follows.
    assert st["jobUID"] == job["metadata"]["uid"]
    assert st["phase"] == "Pending" and st["observedGeneration"] == 1
    assert condition(cluster, "coco-16", "Valid")["status"] == "True"
    assert condition(cluster, "coco-16", "Created")["status"] == "True"
    assert FINALIZER in get(cluster, RUNS, "coco-16")["metadata"]["finalizers"]
    assert (
        metrics.sample(
            "megdet_controller_jobs_created_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
        )
        == created + 1
    )
    await eventually(
        lambda: any(e["reason"] == "Pending" for e in events_for(cluster, "coco-16")),
        message="event",
    )

    # A repeated reconcile (a spec touch kopf sees as an update) makes no second job.
    await patch(
        cluster,
        RUNS,
        "coco-16",
        {"metadata": {"labels": {"team": "vision"}}, "spec": {"imagesPerGpu": 2}},
    )
    await reconciled(cluster, "coco-16")
    assert list(objects(cluster, PYTORCHJOBS)) == ["coco-16"]
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1


async def test_invalid_run_is_refused_with_a_field_named_message_and_no_job(
    cluster, operator
) -> None:
    invalid = metrics.sample("megdet_controller_reconciles_total", {"result": "invalid"})
    await apply(cluster, run_body("bad", {"gpus": 12, "gpusPerNode": 8}))
    await eventually(lambda: phase(cluster, "bad") == "Invalid", message="phase Invalid")
    valid = condition(cluster, "bad", "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.gpus" in valid["message"] and "multiple" in valid["message"]
    warning = await eventually(
        lambda: [e for e in events_for(cluster, "bad") if e["type"] == "Warning"],
        message="Warning event",
    )
    assert "spec.gpus" in warning[0]["message"]
    await reconciled(cluster, "bad")
    assert objects(cluster, PYTORCHJOBS) == {}
    assert metrics.sample("megdet_controller_reconciles_total", {"result": "invalid"}) > invalid


async def test_fixing_an_invalid_changeable_field_creates_the_job(cluster, operator) -> None:
    await apply(cluster, run_body("fix", {"gpus": 8, "image": {"pullPolicy": "Sometimes"}}))
    await eventually(lambda: phase(cluster, "fix") == "Invalid", message="phase Invalid")
    assert condition(cluster, "fix", "Valid")["message"].startswith("spec.image.pullPolicy")
    await patch(cluster, RUNS, "fix", {"spec": {"image": {"pullPolicy": "Always"}}})
    await eventually(lambda: get(cluster, PYTORCHJOBS, "fix"), message="job after the fix")
    await eventually(lambda: phase(cluster, "fix") == "Pending", message="phase Pending")
    assert condition(cluster, "fix", "Valid")["status"] == "True"


async def test_run_phase_follows_the_job_through_running_restarting_succeeded(
    cluster, operator
) -> None:
    await apply(cluster, run_body("r"))
    await eventually(lambda: get(cluster, PYTORCHJOBS, "r") and phase(cluster, "r") == "Pending")

    await job_condition(
        cluster, "r", cond("Created"), cond("Running"), startTime="2026-11-30T10:00:00Z"
    )
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")
    assert status(cluster, "r")["startTime"] == "2026-11-30T10:00:00Z"

    await job_condition(cluster, "r", cond("Created"), cond("Restarting"))
    await eventually(lambda: phase(cluster, "r") == "Restarting", message="Restarting")
    assert status(cluster, "r")["restarts"] == 1
    assert condition(cluster, "r", "Running")["status"] == "False"

    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running again")
    succeeded = cond("Succeeded")
    await job_condition(
        cluster,
        "r",
        cond("Created"),
        cond("Running", "False"),
        succeeded,
        completionTime="2026-11-30T11:00:00Z",
    )
    await eventually(lambda: phase(cluster, "r") == "Succeeded", message="Succeeded")
    st = status(cluster, "r")
    assert st["completionTime"] == "2026-11-30T11:00:00Z"
    assert st["restarts"] == 1
    reasons = await eventually(
        lambda: {e["reason"] for e in events_for(cluster, "r")}
        >= {"Pending", "Running", "Restarting", "Succeeded"}
        and [e["reason"] for e in events_for(cluster, "r")],
        message="an event per transition",
    )
    assert "Succeeded" in reasons


async def test_run_phase_follows_a_failed_job(cluster, operator) -> None:
    failed = metrics.sample(
        "megdet_controller_jobs_failed_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
    )
    await apply(cluster, run_body("f"))
    await eventually(lambda: phase(cluster, "f") == "Pending")
    await job_condition(
        cluster,
        "f",
        cond("Created"),
        cond("Running", "False"),
        cond("Failed", reason="PyTorchJobFailed"),
    )
    await eventually(lambda: phase(cluster, "f") == "Failed", message="Failed")
    assert condition(cluster, "f", "Failed")["reason"] == "PyTorchJobFailed"
    assert status(cluster, "f")["completionTime"]
    await eventually(
        lambda: [
            e
            for e in events_for(cluster, "f")
            if e["reason"] == "Failed" and e["type"] == "Warning"
        ]
    )
    assert (
        metrics.sample(
            "megdet_controller_jobs_failed_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
        )
        == failed + 1
    )


async def test_suspend_passes_through_both_ways(cluster, operator) -> None:
    await apply(cluster, run_body("s", {"gpus": 8, "runPolicy": {"suspend": False}}))
    await eventually(lambda: get(cluster, PYTORCHJOBS, "s") and phase(cluster, "s") == "Pending")
    assert get(cluster, PYTORCHJOBS, "s")["spec"]["runPolicy"]["suspend"] is False

    # Run -> job: the user suspends the run, the controller suspends the job.
    await patch(cluster, RUNS, "s", {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: get(cluster, PYTORCHJOBS, "s")["spec"]["runPolicy"]["suspend"] is True)
    # Job -> run: the training operator reports Suspended; the run's phase follows.
    await job_condition(cluster, "s", cond("Created"), cond("Suspended"))
    await eventually(lambda: phase(cluster, "s") == "Suspended", message="Suspended")
    # Resume: back through the same path.
    await patch(cluster, RUNS, "s", {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(
        lambda: get(cluster, PYTORCHJOBS, "s")["spec"]["runPolicy"]["suspend"] is False
    )
    await job_condition(
        cluster,
        "s",
        cond("Created"),
        cond("Suspended", "False", "PyTorchJobResumed"),
        cond("Running"),
    )
    await eventually(lambda: phase(cluster, "s") == "Running", message="Running after resume")


async def test_job_suspended_by_kueue_shows_on_the_run_and_is_not_undone(cluster, operator) -> None:
    await apply(cluster, run_body("q", {"gpus": 8}))
    await eventually(lambda: get(cluster, PYTORCHJOBS, "q") and phase(cluster, "q") == "Pending")
    # Kueue suspends the job (spec) and the training operator reports it (status).
    await patch(cluster, PYTORCHJOBS, "q", {"spec": {"runPolicy": {"suspend": True}}})
    await job_condition(cluster, "q", cond("Created"), cond("Suspended"))
    await eventually(lambda: phase(cluster, "q") == "Suspended", message="Suspended")
    # The controller does not fight Kueue: it only syncs suspend when the run's own field changes
    # (a reconcile after Kueue's suspend, here from a label edit, leaves the job suspended).
    await patch(cluster, RUNS, "q", {"metadata": {"labels": {"queue": "later"}}})
    await reconciled(cluster, "q")
    assert get(cluster, PYTORCHJOBS, "q")["spec"]["runPolicy"]["suspend"] is True


async def test_same_named_job_not_owned_is_a_condition_never_an_overwrite(
    cluster, operator
) -> None:
    foreign = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "taken", "namespace": NAMESPACE, "labels": {"owner": "someone-else"}},
        "spec": {"pytorchReplicaSpecs": {}},
    }
    await apply(cluster, foreign)
    before = get(cluster, PYTORCHJOBS, "taken")
    await apply(cluster, run_body("taken"))
    created = await eventually(
        lambda: condition(cluster, "taken", "Created"), message="Created condition"
    )
    assert created["status"] == "False" and created["reason"] == "JobNameConflict"
    assert "not owned" in created["message"]
    await eventually(
        lambda: [e for e in events_for(cluster, "taken") if e["reason"] == "JobNameConflict"]
    )
    await counted(reconciles(), 2)  # re-checks (retried after the conflict) leave it alone
    assert get(cluster, PYTORCHJOBS, "taken") == before  # untouched: same resourceVersion too
    # Once the other job is gone, the controller (retrying) creates its own.
    await delete(cluster, PYTORCHJOBS, "taken")
    job = await eventually(lambda: get(cluster, PYTORCHJOBS, "taken"), message="own job")
    assert job["metadata"]["ownerReferences"][0]["name"] == "taken"
    await eventually(lambda: condition(cluster, "taken", "Created")["status"] == "True")


async def test_delete_run_leaves_nothing_behind(cluster, operator) -> None:
    deleted = metrics.sample(
        "megdet_controller_jobs_deleted_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
    )
    await apply(cluster, run_body("gone"))
    await apply(cluster, run_body("stays"))
    await eventually(
        lambda: get(cluster, PYTORCHJOBS, "gone") and get(cluster, PYTORCHJOBS, "stays")
    )
    await eventually(
        lambda: FINALIZER in (get(cluster, RUNS, "gone")["metadata"].get("finalizers") or [])
    )
    await eventually(lambda: status(cluster, "gone").get("target"), message="status")
    await eventually(
        lambda: metrics.sample("megdet_controller_run_info", _info_labels(cluster, "gone")) == 1,
        message="run_info series",
    )

    await delete(cluster, RUNS, "gone")
    # kmock does no garbage collection: the job goes because the controller's delete handler
    # (behind its finalizer) deletes what the run owns; then kopf drops the finalizer.
    await eventually(lambda: get(cluster, RUNS, "gone") is None, message="run gone")
    assert get(cluster, PYTORCHJOBS, "gone") is None
    assert list(objects(cluster, PYTORCHJOBS)) == ["stays"]  # only what that run owned
    assert (
        metrics.sample(
            "megdet_controller_jobs_deleted_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
        )
        == deleted + 1
    )
    assert metrics.REGISTRY.get_sample_value("megdet_controller_run_info", {"run": "gone"}) is None


def _info_labels(api: Any, name: str) -> dict[str, str]:
    st = status(api, name)
    return {
        "namespace": NAMESPACE,
        "run": name,
        "target": st["target"],
        "world_size": str(st["worldSize"]),
        "global_batch": str(st["globalBatch"]),
        "lr": repr(float(st["lr"])),
    }
