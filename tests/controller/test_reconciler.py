"""The operator against kmock: runs -> one owned job, status mirroring, suspend, delete.

kmock emulates the API server (none can run here); see conftest.py for what it does not do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import kopf
import pytest
from kmock_helpers import (
    NAMESPACE,
    NETWORKPOLICIES,
    PYTORCHJOBS,
    RUNS,
    RUNTIMES,
    TRAINJOBS,
    apply,
    arrivals,
    collect_garbage,
    cond,
    condition,
    counted,
    delay,
    delete,
    edit,
    events_for,
    eventually,
    get,
    inject,
    is_create,
    is_status_patch,
    job_condition,
    objects,
    patch,
    phase,
    reconciled,
    reconciles,
    requests_to,
    run_body,
    run_read_after,
    run_reads,
    settle,
    start_operator,
    stop_operator,
)
from kmock_helpers import (
    apply as apply_run,
)
from kmock_helpers import (
    run_status as status,
)

from megdet.controller import metrics
from megdet.controller.api import FINALIZER, GROUP
from megdet.controller.diffbase import FIELD as HANDLED_FIELD
from megdet.controller.diffbase import LEGACY_KEY
from megdet.controller.render import render_run


@contextlib.asynccontextmanager
async def resumed(api: Any) -> AsyncIterator[float]:
    """A controller started again (a restart, or a failover's new leader) for the block, from
    the end of its first (resume) reconcile; gives the reconcile count before it started."""
    since = reconciles()
    op = await start_operator(str(api.url))
    try:
        await counted(since)  # the resume reconcile ran
        yield since
    finally:
        await stop_operator(op)


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
    # No finalizer: deleting the run never waits for the controller (the garbage collector
    # deletes what it owns).
    assert not get(cluster, RUNS, "coco-16")["metadata"].get("finalizers")
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
    # Counted before its Event is queued (status_writer.py): whoever sees the Event reads it.
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


async def test_a_deleted_run_is_forgotten_and_its_job_counted_when_collected(
    cluster, operator
) -> None:
    deleted = deleted_jobs()
    await apply(cluster, run_body("gone"))
    await apply(cluster, run_body("stays"))
    await eventually(
        lambda: get(cluster, PYTORCHJOBS, "gone") and get(cluster, PYTORCHJOBS, "stays")
    )
    await eventually(lambda: status(cluster, "gone").get("target"), message="status")
    info = _info_labels(cluster, "gone")
    await eventually(
        lambda: metrics.sample("megdet_controller_run_info", info) == 1, message="run_info"
    )
    assert not get(cluster, RUNS, "gone")["metadata"].get("finalizers")

    await delete(cluster, RUNS, "gone")
    # Nothing holds the run: it is gone at once, and the controller forgets it (its series).
    assert get(cluster, RUNS, "gone") is None
    await eventually(
        lambda: metrics.REGISTRY.get_sample_value("megdet_controller_run_info", info) is None,
        message="the deleted run's series dropped",
    )
    # The controller deletes nothing: what the run owns is the garbage collector's (owner
    # references), which kmock does not run. Its delete of the job, made here, still counts.
    assert sorted(objects(cluster, PYTORCHJOBS)) == ["gone", "stays"]
    assert [r.url.path for r in list(cluster) if r.method == "DELETE"] == [
        f"/apis/megdet.io/v1alpha1/namespaces/{NAMESPACE}/megdetruns/gone"  # the test's own
    ]
    assert await collect_garbage(cluster) == ["PyTorchJob/gone"]
    await eventually(lambda: deleted_jobs() == deleted + 1, message="the collected job counted")


async def test_the_finalizer_of_earlier_controllers_is_removed(cluster, operator) -> None:
    """Runs made by a controller that still had a delete handler carry its finalizer: this
    controller removes it (no handler needs it), reconciles the run, and a delete then goes
    through without it."""
    body = run_body("legacy")
    body["metadata"]["finalizers"] = [FINALIZER]
    await apply(cluster, body)
    await eventually(
        lambda: not get(cluster, RUNS, "legacy")["metadata"].get("finalizers"),
        message="the old finalizer removed",
    )
    await eventually(lambda: get(cluster, PYTORCHJOBS, "legacy"), message="its job")
    await eventually(lambda: status(cluster, "legacy").get("jobName") == "legacy")
    await delete(cluster, RUNS, "legacy")
    assert get(cluster, RUNS, "legacy") is None


async def test_a_reconcile_costs_kopf_no_patch_of_the_run(cluster, operator) -> None:
    """kopf's diff base rides on the reconcile's own status write (controller/diffbase.py):
    neither a create nor a spec edit makes kopf patch the run, and no kopf annotation lands on
    it."""
    await apply_run(cluster, run_body("quiet"))
    await reconciled(cluster, "quiet")
    await edit(cluster, "quiet", 2, {"imagesPerGpu": 2})
    await reconciled(cluster, "quiet")
    # The one patch of the run is the edit's own.
    patches = requests_to(cluster, "PATCH", "/megdetruns/quiet")
    assert [r.data.get("spec") for r in patches] == [{"imagesPerGpu": 2}]
    run = get(cluster, RUNS, "quiet")
    assert json.loads(run["status"][HANDLED_FIELD])["spec"] == run["spec"]
    annotations = run["metadata"].get("annotations") or {}
    assert [k for k in annotations if k.startswith(f"{GROUP}/")] == []
    # kopf found each one written (and the controller keeps nothing of it once it has)...
    await eventually(lambda: len(operator.reconciler.diffbase) == 0, message="nothing kept")
    # ... so two reconciles made two status writes that each carried their diff base.
    writes = requests_to(cluster, "PATCH", "/megdetruns/quiet/status")
    assert [HANDLED_FIELD in r.data["status"] for r in writes] == [True, True]


async def test_a_run_handled_by_an_earlier_controller_is_resumed_not_created(cluster) -> None:
    """Earlier controllers kept kopf's diff base in an annotation: a restart onto this one
    resumes such a run (a resume looks for a NetworkPolicy its spec no longer renders; a
    create never does), and its diff base moves into its status."""
    await apply_run(cluster, run_body("old"))
    stored = get(cluster, RUNS, "old")
    legacy = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key=LEGACY_KEY)
    essence = legacy.build(body=kopf.Body(stored))
    marker = {f"{GROUP}/kopf-managed": "yes"}
    annotations = {f"{GROUP}/{LEGACY_KEY}": json.dumps(essence) + "\n", **marker}
    await patch(cluster, RUNS, "old", {"metadata": {"annotations": annotations}})
    async with resumed(cluster):
        await eventually(lambda: status(cluster, "old").get(HANDLED_FIELD), message="moved")
    assert len(requests_to(cluster, "GET", "/networkpolicies/old")) == 1  # a resume's look
    assert json.loads(status(cluster, "old")[HANDLED_FIELD]) == essence
    assert job_posts(cluster) == 1


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


# ------------------------------------------------------------------------------------------
# The Trainer v2 target against kmock: one owned TrainJob (+ its TrainingRuntime), status
# from the TrainJob's conditions and jobsStatus; a bad target is refused by field name.


async def test_trainjob_target_owns_one_trainjob_and_its_runtime(cluster, operator) -> None:
    body = run_body("tj", {"gpus": 16, "target": "trainjob"})
    await apply(cluster, body)
    await eventually(lambda: status(cluster, "tj").get("jobName"), message="status")
    await reconciled(cluster, "tj")
    assert objects(cluster, PYTORCHJOBS) == {}
    trainjobs, runtimes = objects(cluster, TRAINJOBS), objects(cluster, RUNTIMES)
    assert list(trainjobs) == ["tj"]
    rendered = render_run("tj", NAMESPACE, body["spec"])
    runtime_names = [
        o["metadata"]["name"] for o in rendered.objects if o["kind"] == "TrainingRuntime"
    ]
    assert sorted(runtimes) == runtime_names
    uid = body["metadata"]["uid"]
    for obj in (*trainjobs.values(), *runtimes.values()):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["kind"] == "MegDetRun" and ref["controller"] is True
    st = status(cluster, "tj")
    assert st["target"] == "trainjob" and st["worldSize"] == 16 and st["phase"] == "Pending"


async def test_run_phase_follows_trainjob_conditions(cluster, operator) -> None:
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await eventually(lambda: status(cluster, "tj").get("phase") == "Pending")

    jobs = [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]
    await patch(cluster, TRAINJOBS, "tj", {"status": {"jobsStatus": jobs}}, status=True)
    await eventually(lambda: status(cluster, "tj").get("phase") == "Running", message="Running")

    suspended = {"type": "Suspended", "status": "True", "reason": "Suspended", "message": "Kueue"}
    await patch(cluster, TRAINJOBS, "tj", {"status": {"conditions": [suspended]}}, status=True)
    await eventually(lambda: status(cluster, "tj").get("phase") == "Suspended", message="Suspended")

    complete = {
        "type": "Complete",
        "status": "True",
        "reason": "JobSetCompleted",
        "message": "done",
        "lastTransitionTime": "2026-11-30T12:00:00Z",
    }
    await patch(cluster, TRAINJOBS, "tj", {"status": {"conditions": [complete]}}, status=True)
    await eventually(lambda: status(cluster, "tj").get("phase") == "Succeeded", message="Succeeded")
    assert status(cluster, "tj")["completionTime"] == "2026-11-30T12:00:00Z"


async def test_trainjob_suspend_passes_through_from_the_run(cluster, operator) -> None:
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await eventually(lambda: get(cluster, TRAINJOBS, "tj"))
    assert get(cluster, TRAINJOBS, "tj")["spec"]["suspend"] is False
    await patch(cluster, RUNS, "tj", {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: get(cluster, TRAINJOBS, "tj")["spec"]["suspend"] is True)


async def test_bad_target_is_refused_naming_the_field(cluster, operator) -> None:
    await apply(cluster, run_body("bad", {"gpus": 8, "target": "tfjob"}))
    await eventually(lambda: status(cluster, "bad").get("phase") == "Invalid", message="Invalid")
    (valid,) = [c for c in status(cluster, "bad")["conditions"] if c["type"] == "Valid"]
    assert valid["message"].startswith("spec.target:")
    assert "pytorchjob" in valid["message"] and "trainjob" in valid["message"]
    await reconciled(cluster, "bad")
    assert objects(cluster, TRAINJOBS) == {} and objects(cluster, PYTORCHJOBS) == {}


# ------------------------------------------------------------------------------------------
# A run's job over its whole life, against kmock: a job that vanishes (TTL, kubectl delete), a
# job the API server refuses, deleting a run without listing the namespace, jobs the run does not
# control, and two runs that would write one output folder.
#
# kmock emulates the API server (none runs here); see kmock_helpers.py for what it does not do.


def warnings(api: Any, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in events_for(api, name)
        if e.get("type") == "Warning" and (reason is None or e.get("reason") == reason)
    ]


def job_posts(api: Any) -> int:
    return len(requests_to(api, "POST", "/pytorchjobs"))


def deleted_jobs() -> float:
    return metrics.sample(
        "megdet_controller_jobs_deleted_total", {"namespace": NAMESPACE, "target": "pytorchjob"}
    )


# ------------------------------------------------------------------------------------------
# A job that vanishes.


async def test_a_finished_runs_deleted_job_is_recorded_and_never_created_again(cluster) -> None:
    deleted = deleted_jobs()
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("done"))
        await eventually(lambda: phase(cluster, "done") == "Pending", message="Pending")
        await job_condition(cluster, "done", cond("Created"), cond("Running"))
        await eventually(lambda: phase(cluster, "done") == "Running", message="Running")
        await job_condition(
            cluster, "done", cond("Created"), cond("Running", "False"), cond("Succeeded")
        )
        await eventually(lambda: phase(cluster, "done") == "Succeeded", message="Succeeded")

        # The training operator's ttlSecondsAfterFinished removes the finished job.
        await delete(cluster, PYTORCHJOBS, "done")
        present = await eventually(
            lambda: condition(cluster, "done", "JobPresent"), message="JobPresent condition"
        )
        assert present["status"] == "False" and present["reason"] == "JobDeleted"
        assert "ttlSecondsAfterFinished" in present["message"]
        assert "delete and re-create the MegDetRun" in present["message"]
        assert phase(cluster, "done") == "Succeeded"  # the result stands
        assert condition(cluster, "done", "Succeeded")["status"] == "True"
        await eventually(lambda: warnings(cluster, "done", "JobDeleted"), message="Warning event")
        # Counted before the Event is queued, so it is counted once the Event is seen (a CI run
        # read it one short when the count came after).
        assert deleted_jobs() == deleted + 1

        # A spec edit does not launch it again, nor count the deletion again.
        await patch(cluster, RUNS, "done", {"spec": {"image": {"pullPolicy": "Always"}}})
        await reconciled(cluster, "done")
        assert deleted_jobs() == deleted + 1
    finally:
        await stop_operator(op)
    # Nor does a controller restart (or a failover: the new leader resumes every run).
    async with resumed(cluster):
        pass  # the resume reconcile ran
    assert objects(cluster, PYTORCHJOBS) == {}
    assert job_posts(cluster) == 1
    assert phase(cluster, "done") == "Succeeded"
    assert len(warnings(cluster, "done")) == 1  # JobDeleted, once


async def test_a_running_job_deleted_by_hand_fails_the_run_and_is_not_recreated(
    cluster, operator
) -> None:
    await apply(cluster, run_body("r"))
    await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")

    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
    failed = condition(cluster, "r", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "JobDeleted"
    assert "was deleted while the run was Running" in failed["message"]
    assert "delete and re-create the MegDetRun" in failed["message"]
    assert condition(cluster, "r", "JobPresent")["status"] == "False"
    assert condition(cluster, "r", "Running")["status"] == "False"
    assert status(cluster, "r")["completionTime"]
    await eventually(lambda: warnings(cluster, "r", "JobDeleted"), message="Warning event")
    await patch(cluster, RUNS, "r", {"spec": {"image": {"pullPolicy": "Always"}}})
    await reconciled(cluster, "r")
    assert objects(cluster, PYTORCHJOBS) == {}
    assert job_posts(cluster) == 1
    assert len(warnings(cluster, "r")) == 1  # one Warning: JobDeleted (no second "Failed")


async def test_a_job_deleted_while_the_controller_was_away_is_noticed_at_resume(cluster) -> None:
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    finally:
        await stop_operator(op)
    await delete(cluster, PYTORCHJOBS, "r")  # no controller hears of it
    async with resumed(cluster):
        await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
        await eventually(lambda: warnings(cluster, "r", "JobDeleted"), message="Warning event")
    assert condition(cluster, "r", "Failed")["reason"] == "JobDeleted"
    assert objects(cluster, PYTORCHJOBS) == {}
    assert job_posts(cluster) == 1


async def test_a_job_deleted_as_it_finishes_still_counts_as_succeeded(cluster, operator) -> None:
    """TTL 0: the job's last state arrives only with its DELETED event."""
    await apply(cluster, run_body("quick"))
    await eventually(lambda: phase(cluster, "quick") == "Pending", message="Pending")
    done = {"conditions": [cond("Created"), cond("Succeeded")]}
    cluster.write_quietly(PYTORCHJOBS, "quick", {"status": done})  # no watch event for this
    await delete(cluster, PYTORCHJOBS, "quick")
    await eventually(lambda: condition(cluster, "quick", "JobPresent"), message="JobPresent")
    assert phase(cluster, "quick") == "Succeeded"
    assert condition(cluster, "quick", "JobPresent")["reason"] == "JobDeleted"
    await eventually(lambda: warnings(cluster, "quick", "JobDeleted"), message="Warning event")
    assert not warnings(cluster, "quick", "Failed")


# ------------------------------------------------------------------------------------------
# A job the API server refuses.


def refuse_job_creates(api: Any, code: int, reason: str, message: str, details: Any) -> list:
    """Answer the first job create with ``code`` before kmock stores anything, as the API server
    refuses a create before storing it. Returns the refused requests."""
    refused: list[Any] = []

    def hook(request: Any) -> None:
        if is_create("pytorchjobs")(request) and not refused:
            refused.append(request)
            raise kmock_lib.KubernetesError(
                status=code, reason=reason, message=message, details=details
            )

    api.before_write.append(hook)
    return refused


SCHEMA = (
    422,
    "Invalid",
    'PyTorchJob.kubeflow.org "r" is invalid: spec.pytorchReplicaSpecs.Master.replicas: '
    "Invalid value: 2: must be 1",
    {
        "name": "r",
        "group": "kubeflow.org",
        "kind": "PyTorchJob",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 2: must be 1",
                "field": "spec.pytorchReplicaSpecs.Master.replicas",
            },
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image",
            },
        ],
    },
)
#: A verdict on the spec that is a 403 too (a ValidatingAdmissionPolicy with reason Forbidden):
#: final, unlike the 403s that heal (this file).
POLICY = (
    403,
    "Forbidden",
    'pytorchjobs.kubeflow.org "r" is forbidden: ValidatingAdmissionPolicy "gpu-cap" with '
    'binding "gpu-cap" denied request: at most 64 GPUs per job',
    {"name": "r", "group": "kubeflow.org", "kind": "pytorchjobs"},
)
WEBHOOK = (
    400,
    "BadRequest",
    'admission webhook "validation.pytorchjob.kubeflow.org" denied the request: '
    "spec.runPolicy.schedulingPolicy.queue is immutable",
    None,
)


@pytest.mark.parametrize("answer", [SCHEMA, POLICY, WEBHOOK], ids=["422", "403", "400"])
async def test_a_job_the_server_refuses_fails_the_run_until_the_spec_changes(
    cluster, answer
) -> None:
    code, reason, message, details = answer
    refused = refuse_job_creates(cluster, code, reason, message, details)
    refusals = metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
        created = condition(cluster, "r", "Created")
        assert created["status"] == "False" and created["reason"] == "JobRefused"
        assert f"HTTP {code} {reason}" in created["message"]
        assert message in created["message"]  # the server's own words
        for cause in (details or {}).get("causes", []):
            assert f"{cause['field']}: {cause['message']}" in created["message"]
        assert (
            "metadata.generation 1" in created["message"] and "edit the spec" in created["message"]
        )
        assert condition(cluster, "r", "Failed")["reason"] == "JobRefused"
        assert "startTime" not in status(cluster, "r")
        await eventually(lambda: warnings(cluster, "r", "JobRefused"), message="Warning event")
        await reconciled(cluster, "r")  # handled for good: kopf holds no retry
        assert len(refused) == 1 and job_posts(cluster) == 1
        assert (
            metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
            == refusals + 1
        )
    finally:
        await stop_operator(op)
    # Not on a restart either: the same spec would be refused again.
    async with resumed(cluster):
        assert job_posts(cluster) == 1 and phase(cluster, "r") == "Failed"
        # A change of the spec (the API server bumps metadata.generation) tries again.
        await edit(cluster, "r", 2, {"image": {"pullPolicy": "Always"}})
        await eventually(lambda: get(cluster, PYTORCHJOBS, "r"), message="the job")
        await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    assert condition(cluster, "r", "Created")["status"] == "True"
    assert condition(cluster, "r", "Failed")["status"] == "False"
    assert len(warnings(cluster, "r", "JobRefused")) == 1
    assert not warnings(cluster, "r", "Failed")  # one Warning per refusal, not two


# ------------------------------------------------------------------------------------------
# Deleting a run: by name, never a list of the namespace.


def collection_reads(api: Any) -> list[Any]:
    """GETs of a namespace's job or runtime collection (a list; watches excluded)."""
    return [
        r
        for r in list(api)
        if r.method == "GET"
        and r.params.get("watch") != "true"
        and r.url.path.endswith(
            tuple(
                f"/namespaces/{NAMESPACE}/{p}"
                for p in ("pytorchjobs", "trainjobs", "trainingruntimes")
            )
        )
    ]


async def test_deleting_runs_costs_no_request_for_what_they_own(cluster, operator) -> None:
    """A run's deletion is the garbage collector's to carry out: the controller neither lists,
    reads nor deletes the run's objects of either target; when they are collected, their
    DELETED events cost one read of the run (gone) each, and count."""
    trainjobs = metrics.sample(
        "megdet_controller_jobs_deleted_total", {"namespace": NAMESPACE, "target": "trainjob"}
    )
    pytorchjobs = deleted_jobs()
    await apply(cluster, run_body("pj"))
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await eventually(
        lambda: status(cluster, "pj").get("jobName") and status(cluster, "tj").get("jobName"),
        message="status",
    )
    await reconciled(cluster, "pj", "tj")
    before = len(list(cluster))
    await delete(cluster, RUNS, "pj")
    await delete(cluster, RUNS, "tj")
    assert get(cluster, RUNS, "pj") is None and get(cluster, RUNS, "tj") is None
    # What the garbage collector does on a cluster (kmock has none).
    assert sorted(await collect_garbage(cluster)) == [
        "PyTorchJob/pj",
        "TrainJob/tj",
        "TrainingRuntime/tj",
    ]
    await eventually(lambda: deleted_jobs() == pytorchjobs + 1, message="PyTorchJob counted")
    await eventually(
        lambda: metrics.sample(
            "megdet_controller_jobs_deleted_total", {"namespace": NAMESPACE, "target": "trainjob"}
        )
        == trainjobs + 1,
        message="TrainJob counted",
    )
    after = list(cluster)[before:]
    owned = ("/pytorchjobs", "/trainjobs", "/trainingruntimes", "/networkpolicies")
    by_controller = [
        r for r in after if r.method != "DELETE" and any(o in r.url.path for o in owned)
    ]
    assert [r for r in by_controller if "watch" not in r.url.query_string] == []
    assert collection_reads(cluster) == []
    # The test's own deletes (the runs, then the collected objects), and no other.
    assert len([r for r in after if r.method == "DELETE"]) == 5


# ------------------------------------------------------------------------------------------
# Jobs the run does not control.


def foreign_job(name: str, run: dict[str, Any], controller: bool) -> dict[str, Any]:
    ref = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "name": run["metadata"]["name"],
        "uid": run["metadata"]["uid"],
        "controller": controller,
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NAMESPACE, "ownerReferences": [ref]},
        "spec": {"pytorchReplicaSpecs": {}},
    }


async def test_the_mirror_follows_only_the_job_the_run_controls(cluster, operator) -> None:
    run = run_body("r")
    await apply(cluster, run)
    await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    # Someone else's job names the run as a plain owner; another claims to be controlled by it
    # but is not the run's job name. Neither is the run's.
    await apply(cluster, foreign_job("r-eval", run, controller=False))
    await apply(cluster, foreign_job("r-copy", run, controller=True))
    reads = run_reads()
    await job_condition(cluster, "r-eval", cond("Failed"))
    await job_condition(cluster, "r-copy", cond("Succeeded"))
    await run_read_after(reads)  # the mirror got r-copy's status event
    await settle()  # and ended its handling of it
    assert phase(cluster, "r") == "Pending"
    await delete(cluster, PYTORCHJOBS, "r-eval")
    reads = run_reads()
    await delete(cluster, PYTORCHJOBS, "r-copy")
    await run_read_after(reads)  # the mirror got r-copy's DELETED event
    await settle()
    assert phase(cluster, "r") == "Pending" and condition(cluster, "r", "JobPresent") is None
    # The run's own job is still followed.
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")


async def test_a_same_named_job_with_a_plain_owner_reference_is_a_conflict(
    cluster, operator
) -> None:
    run = run_body("taken")
    await apply(cluster, foreign_job("taken", run, controller=False))
    await apply(cluster, run)
    created = await eventually(lambda: condition(cluster, "taken", "Created"), message="Created")
    assert created["status"] == "False" and created["reason"] == "JobNameConflict"
    assert (
        get(cluster, PYTORCHJOBS, "taken")["metadata"]["ownerReferences"][0]["controller"] is False
    )


# ------------------------------------------------------------------------------------------
# One output folder, one live run.


@pytest.mark.parametrize("first_ends_by", ["succeeding", "being deleted"])
async def test_a_second_live_run_on_the_same_output_folder_waits_for_the_first(
    cluster, operator, first_ends_by
) -> None:
    shared = {"gpus": 8, "runName": "coco-baseline"}
    await apply(cluster, run_body("first", shared))
    await eventually(lambda: get(cluster, PYTORCHJOBS, "first"), message="first job")
    await eventually(lambda: phase(cluster, "first") == "Pending", message="first Pending")

    await apply(cluster, run_body("second", shared))
    await apply(cluster, run_body("third", {"gpus": 8}))  # its own folder: not held up
    created = await eventually(lambda: condition(cluster, "second", "Created"), message="Created")
    assert created["status"] == "False" and created["reason"] == "OutputInUse"
    for text in ("MegDetRun first", "/output/coco-baseline", "megdet-output", "spec.runName"):
        assert text in created["message"], text
    assert phase(cluster, "second") == "Pending"
    await eventually(lambda: warnings(cluster, "second", "OutputInUse"), message="Warning event")
    await eventually(lambda: get(cluster, PYTORCHJOBS, "third"), message="third job")
    conflicts = metrics.sample("megdet_controller_reconciles_total", {"result": "conflict"})
    await counted(conflicts, 2, "megdet_controller_reconciles_total", result="conflict")
    assert get(cluster, PYTORCHJOBS, "second") is None
    assert len(warnings(cluster, "second", "OutputInUse")) == 1  # per episode, not per re-check

    if first_ends_by == "succeeding":
        await job_condition(cluster, "first", cond("Created"), cond("Succeeded"))
        await eventually(lambda: phase(cluster, "first") == "Succeeded", message="Succeeded")
    else:
        await delete(cluster, RUNS, "first")
    await eventually(lambda: get(cluster, PYTORCHJOBS, "second"), message="second job")
    await eventually(
        lambda: (condition(cluster, "second", "Created") or {}).get("status") == "True",
        message="Created=True",
    )


# ------------------------------------------------------------------------------------------
# A job created under the run's job name by someone else: never adopted, never mirrored.


async def test_a_forged_job_under_the_deleted_jobs_name_is_not_adopted(cluster, operator) -> None:
    run = run_body("r")
    await apply(cluster, run)
    await eventually(lambda: status(cluster, "r").get("jobUID"), message="status.jobUID")
    created_uid = get(cluster, PYTORCHJOBS, "r")["metadata"]["uid"]
    assert status(cluster, "r")["jobUID"] == created_uid
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")
    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed (job deleted)")

    # A namespace user creates a PyTorchJob of the same name, controlled (it says) by the run,
    # and the training operator gives it a status.
    await apply(cluster, foreign_job("r", run, controller=True))
    forged_uid = get(cluster, PYTORCHJOBS, "r")["metadata"]["uid"]
    await job_condition(cluster, "r", cond("Created"), cond("Succeeded"))
    # The mirror says so on the run, and mirrors none of its status ...
    foreign = await eventually(
        lambda: condition(cluster, "r", "ForeignJob"), message="ForeignJob condition"
    )
    assert foreign["status"] == "True" and foreign["reason"] == "NotCreatedByController"
    assert forged_uid in foreign["message"] and created_uid in foreign["message"]
    await eventually(lambda: warnings(cluster, "r", "ForeignJob"), message="Warning event")
    reads = run_reads()
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await run_read_after(reads)  # the mirror got the forged job's next event
    await settle()
    # ... nor does a reconcile (a spec edit) adopt it.
    await edit(cluster, "r", 2, {"imagesPerGpu": 2})
    await reconciled(cluster, "r")
    st = status(cluster, "r")
    assert st["phase"] == "Failed" and st["jobUID"] == created_uid, st
    assert condition(cluster, "r", "Failed")["reason"] == "JobDeleted"
    assert condition(cluster, "r", "Succeeded") is None
    assert job_posts(cluster) == 2  # the controller's one job, and the forged one
    assert get(cluster, PYTORCHJOBS, "r")["metadata"]["uid"] == forged_uid
    assert len(warnings(cluster, "r", "ForeignJob")) == 1  # once, not per event


# ------------------------------------------------------------------------------------------
# The run's other objects (its NetworkPolicy, its TrainingRuntime) once its job exists: a
# refusal of one of them is its own condition (ChildrenReady), never the job's; the job stays
# recorded as created, so the run keeps its output folder and never gets a second job; the
# NetworkPolicy follows the spec (updated, deleted).
#
# kmock emulates the API server (none runs here; it validates nothing, so the refusals are
# injected at the exact request); see kmock_helpers.py.


EGRESS = [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443}]}]
INVALID = (
    'NetworkPolicy.networking.k8s.io "r" is invalid: '
    'spec.egress[2].to[0].ipBlock.cidr: Invalid value: "10.20.0.0/33": must be a valid CIDR'
)


def refuse(api: Any, method: str, plural: str, name: str, times: int = 1) -> list[Any]:
    """Answer the first ``times`` ``method`` requests on ``plural/name`` (a POST: on the
    collection, for that name) with 422 before kmock stores anything, as the API server
    refuses an invalid object."""
    refused: list[Any] = []

    def hook(request: Any) -> None:
        if len(refused) >= times or request.method != method:
            return
        path = request.url.path
        ours = (
            path.endswith(f"/{plural}")
            and (request.data or {}).get("metadata", {}).get("name") == name
            if method == "POST"
            else path.endswith(f"/{plural}/{name}")
        )
        if ours:
            refused.append(request)
            raise kmock_lib.KubernetesError(status=422, reason="Invalid", message=INVALID)

    api.before_write.append(hook)
    return refused


async def test_a_refused_network_policy_leaves_the_running_job_recorded(cluster, operator) -> None:
    shared = {"gpus": 8, "runName": "coco-shared"}
    await apply_run(cluster, run_body("r", shared))
    await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")

    # The author adds a NetworkPolicy the API server refuses (422), while the job runs.
    refused = refuse(cluster, "POST", "networkpolicies", "r")
    policy = {"enabled": True, "restrictEgress": True, "extraEgress": EGRESS}
    await edit(cluster, "r", 2, {"networkPolicy": policy})
    ready = await eventually(
        lambda: condition(cluster, "r", "ChildrenReady"), message="ChildrenReady"
    )
    await reconciled(cluster, "r")
    assert refused
    assert ready["status"] == "False" and ready["reason"] == "ChildRefused", ready
    assert "NetworkPolicy r" in ready["message"] and "must be a valid CIDR" in ready["message"]
    # The job is still the run's: Created=True, the phase its own, nothing Failed.
    assert condition(cluster, "r", "Created")["status"] == "True"
    assert phase(cluster, "r") == "Running" and condition(cluster, "r", "Failed") is None
    await eventually(lambda: warnings(cluster, "r", "ChildRefused"), message="Warning event")

    # So the output folder stays the run's: another run on it waits.
    await apply_run(cluster, run_body("other", shared))
    waiting = await eventually(lambda: condition(cluster, "other", "Created"), message="waits")
    assert waiting["status"] == "False" and waiting["reason"] == "OutputInUse"
    assert get(cluster, PYTORCHJOBS, "other") is None
    await delete(cluster, RUNS, "other")

    # The fix creates the NetworkPolicy; ChildrenReady turns True.
    await edit(cluster, "r", 3, {"networkPolicy": {**policy, "extraEgress": []}})
    await eventually(lambda: get(cluster, NETWORKPOLICIES, "r"), message="the NetworkPolicy")
    await eventually(
        lambda: (condition(cluster, "r", "ChildrenReady") or {}).get("status") == "True",
        message="ChildrenReady=True",
    )

    # The job ends and the training operator's TTL deletes it: a spec edit makes no second job.
    await job_condition(cluster, "r", cond("Created"), cond("Succeeded"))
    await eventually(lambda: phase(cluster, "r") == "Succeeded", message="Succeeded")
    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: condition(cluster, "r", "JobPresent"), message="JobPresent")
    await edit(cluster, "r", 4, {"imagesPerGpu": 2})
    await reconciled(cluster, "r")
    assert objects(cluster, PYTORCHJOBS) == {}
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
    assert phase(cluster, "r") == "Succeeded"
    assert len(warnings(cluster, "r", "ChildRefused")) == 1


async def test_the_network_policy_is_updated_and_deleted_with_the_spec(cluster, operator) -> None:
    await apply_run(cluster, run_body("r", {"gpus": 8, "networkPolicy": {"enabled": True}}))
    created = await eventually(lambda: get(cluster, NETWORKPOLICIES, "r"), message="policy")
    assert created["spec"]["policyTypes"] == ["Ingress"] and "egress" not in created["spec"]
    await eventually(lambda: status(cluster, "r").get("jobUID"), message="the job recorded")

    policy = {"enabled": True, "restrictEgress": True, "extraEgress": EGRESS}
    await edit(cluster, "r", 2, {"networkPolicy": policy})
    updated = await eventually(
        lambda: (p := get(cluster, NETWORKPOLICIES, "r")) and "egress" in p["spec"] and p,
        message="the NetworkPolicy updated",
    )
    await reconciled(cluster, "r")
    assert updated["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert EGRESS[0] in updated["spec"]["egress"]
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]  # the same object
    patches = len(requests_to(cluster, "PATCH", "/networkpolicies/r"))
    assert patches == 1

    # Egress open again: the egress rules go (a merge patch removes them, not just adds).
    await edit(cluster, "r", 3, {"networkPolicy": {"restrictEgress": False, "extraEgress": []}})
    await eventually(
        lambda: "egress" not in get(cluster, NETWORKPOLICIES, "r")["spec"],
        message="the egress rules removed",
    )
    assert get(cluster, NETWORKPOLICIES, "r")["spec"]["policyTypes"] == ["Ingress"]

    # A reconcile that changes nothing of it writes nothing to it.
    await edit(cluster, "r", 4, {"imagesPerGpu": 2})
    await reconciled(cluster, "r")
    assert len(requests_to(cluster, "PATCH", "/networkpolicies/r")) == patches + 1

    # networkPolicy.enabled: false deletes it (only this incarnation: a uid precondition).
    await edit(cluster, "r", 5, {"networkPolicy": {"enabled": False}})
    await eventually(
        lambda: get(cluster, NETWORKPOLICIES, "r") is None, message="the NetworkPolicy deleted"
    )
    await reconciled(cluster, "r")
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]  # the job is untouched
    assert condition(cluster, "r", "ChildrenReady") is None


async def test_a_run_without_a_network_policy_never_looks_for_one(cluster, operator) -> None:
    """Only an edit of spec.networkPolicy (or a resume) looks for a policy to delete: a run's
    create and its other edits cost no NetworkPolicy request."""
    await apply_run(cluster, run_body("plain"))
    await eventually(lambda: status(cluster, "plain").get("jobUID"), message="the job recorded")
    await edit(cluster, "plain", 2, {"imagesPerGpu": 2})
    await reconciled(cluster, "plain")
    assert requests_to(cluster, "GET", "/networkpolicies/plain") == []
    await edit(cluster, "plain", 3, {"networkPolicy": {"metricsFrom": []}})
    await eventually(
        lambda: requests_to(cluster, "GET", "/networkpolicies/plain"), message="one look"
    )
    await reconciled(cluster, "plain")
    assert objects(cluster, NETWORKPOLICIES) == {}


# ------------------------------------------------------------------------------------------
# Refusals that heal are not final: a ResourceQuota without room, an admission webhook whose
# cache has not seen the TrainingRuntime the controller has just created (Trainer's TrainJob
# webhook), the controller's own RBAC. The run stays Pending with Created=False reason Retrying
# (one Warning event), the create is retried with backoff, and the job is created once the
# refusal heals. What only a spec edit fixes stays final
# (this file).
#
# kmock emulates the API server (none runs here): the refusals are injected before kmock stores
# anything, as the API server refuses before storing.


QUOTA = (
    "pytorchjobs",
    {"gpus": 8},
    'pytorchjobs.kubeflow.org "r" is forbidden: exceeded quota: jobs, requested: '
    "count/pytorchjobs.kubeflow.org=1, used: count/pytorchjobs.kubeflow.org=4, limited: "
    "count/pytorchjobs.kubeflow.org=4",
    "ResourceQuota",
)
#: Trainer v2.3.0's TrainJob webhook, as it answered on a loaded machine: its runtime not seen
#: yet.
RUNTIME_NOT_SEEN = (
    "trainjobs",
    {"gpus": 8, "target": "trainjob"},
    'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
    'spec.runtimeRef: Invalid value: {"name":"r"}: TrainingRuntime "r" not found: specified '
    "trainingRuntime must be created before the TrainJob is created",
    "does not see yet",
)
RBAC = (
    "pytorchjobs",
    {"gpus": 8},
    'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:ops:megdet-operator" '
    'cannot create resource "pytorchjobs" in API group "kubeflow.org" in the namespace "vision"',
    "ClusterRole",
)


def refuse_creates(api: Any, plural: str, message: str, times: int) -> list[Any]:
    """Answer the first ``times`` creates of ``plural`` with 403 Forbidden, unstored."""
    refused: list[Any] = []

    def hook(request: Any) -> None:
        if is_create(plural)(request) and len(refused) < times:
            refused.append(request)
            raise kmock_lib.KubernetesError(status=403, reason="Forbidden", message=message)

    api.before_write.append(hook)
    return refused


@pytest.mark.parametrize(
    "answer", [QUOTA, RUNTIME_NOT_SEEN, RBAC], ids=["quota", "webhook", "rbac"]
)
async def test_a_refusal_that_heals_is_retried_until_the_job_is_created(
    cluster, operator, answer
) -> None:
    plural, spec, message, hint = answer
    refused = refuse_creates(cluster, plural, message, times=2)
    refusals = metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
    await apply(cluster, run_body("r", spec))
    created = await eventually(
        lambda: (c := condition(cluster, "r", "Created")) and c["reason"] == "Retrying" and c,
        message="Created=False reason Retrying",
    )
    assert created["status"] == "False"
    assert message in created["message"] and "HTTP 403 Forbidden" in created["message"]
    assert "Not final" in created["message"] and hint in created["message"]
    assert phase(cluster, "r") == "Pending" and condition(cluster, "r", "Failed") is None

    # Retried with backoff, and created once the refusal heals (the third try).
    await eventually(
        lambda: (condition(cluster, "r", "Created") or {}).get("status") == "True",
        timeout=20,
        message="the job created",
    )
    await reconciled(cluster, "r")
    assert len(refused) == 2 and len(requests_to(cluster, "POST", f"/{plural}")) == 3
    job_kind = TRAINJOBS if plural == "trainjobs" else PYTORCHJOBS
    assert get(cluster, job_kind, "r") is not None
    if plural == "trainjobs":
        # The runtime the TrainJob refers to went first, once.
        assert get(cluster, RUNTIMES, "r") is not None
        assert len(requests_to(cluster, "POST", "/trainingruntimes")) == 1
        # The run's first try created it without a read first; each retry read it.
        runtime = [
            r.method
            for r in list(cluster)
            if r.url.path.endswith("/trainingruntimes/r")
            or (r.method == "POST" and r.url.path.endswith("/trainingruntimes"))
        ]
        assert runtime == ["POST", "GET", "GET"]
    assert phase(cluster, "r") == "Pending" and condition(cluster, "r", "Failed") is None
    assert len(warnings(cluster, "r", "Retrying")) == 1  # per episode, not per retry
    assert not warnings(cluster, "r", "JobRefused") and not warnings(cluster, "r", "Failed")
    after = metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
    assert after == refusals  # never counted as a final refusal


async def test_a_child_refused_after_the_job_exists_is_retried_until_created(
    cluster, operator
) -> None:
    """The reconcile writes the run's status (the job recorded, ChildrenReady=False) and then
    asks kopf to retry the NetworkPolicy: that write must not carry kopf's diff base, or kopf
    would take the spec as handled and never retry (controller/diffbase.py)."""
    await apply_run(cluster, run_body("r"))
    await eventually(lambda: status(cluster, "r").get("jobUID"), message="the job recorded")
    await reconciled(cluster, "r")
    message = (
        'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:ops:'
        'megdet-operator" cannot create resource "networkpolicies" in API group '
        '"networking.k8s.io" in the namespace "vision"'
    )
    refused = refuse_creates(cluster, "networkpolicies", message, times=2)
    await edit(cluster, "r", 2, {"networkPolicy": {"enabled": True}})
    retrying = await eventually(
        lambda: (c := condition(cluster, "r", "ChildrenReady")) and c["status"] == "False" and c,
        message="ChildrenReady=False",
    )
    assert retrying["reason"] == "Retrying" and "NetworkPolicy r" in retrying["message"]
    await eventually(lambda: get(cluster, NETWORKPOLICIES, "r"), timeout=20, message="created")
    await eventually(
        lambda: (condition(cluster, "r", "ChildrenReady") or {}).get("status") == "True",
        message="ChildrenReady=True",
    )
    await reconciled(cluster, "r")
    assert len(refused) == 2 and len(requests_to(cluster, "POST", "/networkpolicies")) == 3
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1


# ------------------------------------------------------------------------------------------
# API failures and a controller killed mid-reconcile: retried, and still exactly one job.
#
# kmock (the API emulator; no API server runs here) stores a created object before any injected
# reaction answers, so an injected failure on a job POST is the nasty case: the job exists but
# the controller was told it failed. The controller must find and adopt it, never create another.


def converged(api: Any, name: str) -> bool:
    status = (get(api, RUNS, name) or {}).get("status") or {}
    return status.get("jobName") == name and status.get("phase") == "Pending"


async def running(api: Any, name: str) -> None:
    """Apply run ``name`` and bring it to Running: its status converged, its job Running (as
    the training operator writes it), recorded, and its reconcile done."""
    await apply(api, run_body(name))
    await eventually(lambda: converged(api, name), timeout=20, message="status to converge")
    await job_condition(api, name, cond("Created"), cond("Running"))
    await eventually(
        lambda: (get(api, RUNS, name).get("status") or {}).get("phase") == "Running",
        timeout=20,
        message="Running",
    )
    await reconciled(api, name)


def is_job_get(name: str):
    return lambda r: r.method == "GET" and r.url.path.endswith(f"/pytorchjobs/{name}")


@pytest.mark.parametrize(
    ("where", "fault"),
    [
        ("create", "500"),
        ("create", "409"),
        ("create", "timeout"),
        ("lookup", "500"),
        ("status", "500"),
        ("status", "409"),
    ],
)
async def test_api_failures_are_retried_and_leave_exactly_one_job(cluster, where, fault) -> None:
    match = {
        "create": is_create("pytorchjobs"),
        "lookup": is_job_get("r"),
        "status": is_status_patch("r"),
    }
    failed = inject(cluster, match[where], fault, times=2)
    errors = metrics.sample("megdet_controller_reconciles_total", {"result": "error"})
    stale = run_reads("stale")
    # The client gives up after 1 s; an injected "timeout" answers after 2.5 s.
    # lookup: the job reads the API server answers. With the job watch cache the read after
    # the create is answered from the create's own answer until the watch has the job, so that
    # read may never reach the server: the cache is off here.
    op = await start_operator(str(cluster.url), timeout=1.0, job_cache=where != "lookup")
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await reconciled(cluster, "r")  # no retry is left pending
    finally:
        await stop_operator(op)
    assert failed, "the injected failure never happened"
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
    after = metrics.sample("megdet_controller_reconciles_total", {"result": "error"})
    if fault == "409":
        # Resolved in place. create: the name is taken, look the object up. status: a write
        # over the run's view carries its resourceVersion, so 409 says the view was stale: read
        # the run and write again (kmock applies a write before its injected answer, so the run
        # read then holds it, kopf's diff base too: nothing is left to write, for kopf either).
        assert after == errors
        if where == "status":
            assert run_reads("stale") == stale + 1
            assert len(requests_to(cluster, "GET", "/megdetruns/r")) == 1
            # kopf found its base written: it patched nothing (it would, and meet the 409 too).
            patches = requests_to(cluster, "PATCH", "/megdetruns/r/status")
            assert [r for r in patches if r.headers.get("User-Agent", "").startswith("kopf/")] == []
    else:
        # kopf retries the reconcile, which reads the run and the job again.
        assert after > errors


async def test_controller_killed_mid_reconcile_restarts_without_a_duplicate_job(cluster) -> None:
    # The first create hangs (the job is already stored), and the controller dies meanwhile.
    hung = inject(cluster, is_create("pytorchjobs"), "timeout", times=1)
    first = await start_operator(str(cluster.url), timeout=10.0)
    await apply(cluster, run_body("r"))
    await eventually(lambda: hung, message="the create to be in flight")
    await stop_operator(first)
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]
    assert not converged(cluster, "r")  # it died before writing status

    second = await start_operator(str(cluster.url), timeout=10.0)
    try:
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await reconciled(cluster, "r")
    finally:
        await stop_operator(second)
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1


async def test_a_runs_reconcile_and_its_jobs_mirror_write_one_at_a_time(cluster) -> None:
    """The job starts running while a reconcile's status write is in flight.

    The reconcile (a spec update) holds the run's lock from its read of the run and the job to
    the end of its write; the write is held 1 s by the emulator. The job's mirror, woken by the
    job's change meanwhile, waits: it reads the run and the job (from their watches) and writes
    only after that write is done, and records Running from the job as it is now. None is lost.
    """
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await reconciled(cluster, "r")
        writes = arrivals(cluster, is_status_patch("r"))  # before the hold: sees it arrive
        held = delay(cluster, is_status_patch("r"), 1.0)
        # A spec change, with the generation the API server would give it (kmock does not).
        change = {"metadata": {"generation": 2}, "spec": {"image": {"pullPolicy": "Always"}}}
        await patch(cluster, RUNS, "r", change)
        await eventually(lambda: len(held) == 1, message="the reconcile's status write")
        await job_condition(cluster, "r", cond("Created"), cond("Running"))
        await eventually(lambda: len(held) == 2, timeout=10, message="the held write's release")
        await eventually(
            lambda: get(cluster, RUNS, "r")["status"].get("phase") == "Running",
            timeout=10,
            message="Running recorded by the job's mirror",
        )
    finally:
        await stop_operator(op)
    arrived, released = held
    # The mirror's write (computed under the run's lock) comes only once the reconcile's write
    # is done, and it came.
    assert writes[0] <= arrived  # the held write is the first (seen just before the hold)
    assert [t for t in writes[1:] if t < released] == []
    assert writes[1:]
    status = get(cluster, RUNS, "r")["status"]
    assert status["observedGeneration"] == 2, status
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert {"Valid": "True", "Created": "True", "Running": "True"}.items() <= conditions.items()
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]


async def test_a_job_event_that_changes_nothing_writes_nothing(cluster) -> None:
    op = await start_operator(str(cluster.url))
    try:
        await running(cluster, "r")
        writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
        gets = len([r for r in list(cluster) if r.method == "GET" and "/r" in r.url.path])
        reads = run_reads()
        # The operator writes the same status again (a new resourceVersion, a watch event).
        await job_condition(cluster, "r", cond("Created"), cond("Running"))
        await run_read_after(reads)  # the mirror handled it
        await reconciled(cluster, "r")
    finally:
        await stop_operator(op)
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes
    # The mirror reads the run once, under its lock (not once to check the event and again
    # before the write), and the run and the job from their watches: no request at all.
    assert run_reads() == reads + 1 and run_reads("watch") >= 1
    assert len([r for r in list(cluster) if r.method == "GET" and "/r" in r.url.path]) == gets


async def test_a_reconcile_that_changes_nothing_writes_nothing(cluster) -> None:
    """A reconcile whose desired status is the run's own sends no status PATCH and posts no
    event: on a resume (the controller restarted) and on an update that changes no status (a
    label: kopf reconciles on it), while the job runs."""
    op = await start_operator(str(cluster.url))
    try:
        await running(cluster, "r")
    finally:
        await stop_operator(op)
    writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    posted = len(requests_to(cluster, "POST", "/events"))
    async with resumed(cluster) as since:
        await patch(cluster, RUNS, "r", {"metadata": {"labels": {"team": "vision"}}})
        await counted(since, 2)  # and the update's
        await reconciled(cluster, "r")
    # Both computed the run's status and wrote nothing of it: the status and the events are
    # what they were. The label is a change kopf compares with, so its diff base (in the
    # status) is the one field written, once, by the update's reconcile.
    later = requests_to(cluster, "PATCH", "/megdetruns/r/status")[writes:]
    assert [sorted(r.data["status"]) for r in later] == [[HANDLED_FIELD]]
    assert len(requests_to(cluster, "POST", "/events")) == posted
    assert get(cluster, RUNS, "r")["status"]["phase"] == "Running"


@pytest.mark.parametrize(
    ("spec", "plural", "provider"),
    [
        ({"gpus": 8}, "pytorchjobs", "the Kubeflow training operator"),
        ({"gpus": 8, "target": "trainjob"}, "trainingruntimes", "Kubeflow Trainer v2"),
    ],
    ids=["pytorchjob", "trainjob"],
)
async def test_a_job_kind_the_cluster_does_not_serve_is_named_on_the_run(
    cluster, spec, plural, provider
) -> None:
    # An API server answers 404 to a POST for a resource it does not serve (no CRD). kmock has
    # every resource declared, so the 404 is injected; it stores the object anyway, which here
    # plays the operator being installed in the meantime: the retry finds it and goes on.
    failed = inject(cluster, is_create(plural), "404", times=1)
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r", spec))
        created = await eventually(
            lambda: next(
                (
                    c
                    for c in (get(cluster, RUNS, "r") or {}).get("status", {}).get("conditions", [])
                    if c["type"] == "Created" and c["reason"] == "JobKindNotInstalled"
                ),
                None,
            ),
            message="Created=False JobKindNotInstalled",
        )
        await eventually(
            lambda: get(cluster, RUNS, "r")["status"].get("jobName") == "r",
            timeout=20,
            message="the retry to create the job",
        )
        await reconciled(cluster, "r")
    finally:
        await stop_operator(op)
    assert failed
    assert created["status"] == "False"
    assert provider in created["message"] and "spec.target" in created["message"]
    assert "restart" in created["message"]
    warnings = [
        e
        for e in objects(cluster, "v1/events").values()
        if e.get("reason") == "JobKindNotInstalled" and e.get("type") == "Warning"
    ]
    assert len(warnings) == 1, warnings
    status = get(cluster, RUNS, "r")["status"]
    assert status["phase"] == "Pending"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Created"] == "True"
