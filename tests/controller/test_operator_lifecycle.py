"""A run's job over its whole life, against kmock: a job that vanishes (TTL, kubectl delete), a
job the API server refuses, deleting a run without listing the namespace, jobs the run does not
control, and two runs that would write one output folder.

kmock emulates the API server (none runs here); see kmock_helpers.py for what it does not do.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import pytest
from kmock_helpers import (
    NAMESPACE,
    PYTORCHJOBS,
    RUNS,
    RUNTIMES,
    TRAINJOBS,
    apply,
    cond,
    condition,
    counted,
    delete,
    events_for,
    eventually,
    get,
    is_create,
    job_condition,
    objects,
    patch,
    phase,
    reconciled,
    reconciles,
    requests_to,
    run_body,
    run_read_after,
    settle,
    start_operator,
    stop_operator,
)
from kmock_helpers import (
    run_status as status,
)

from megdet.controller import metrics


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
        assert deleted_jobs() == deleted + 1

        # A spec edit does not launch it again.
        await patch(cluster, RUNS, "done", {"spec": {"image": {"pullPolicy": "Always"}}})
        await reconciled(cluster, "done")
    finally:
        await stop_operator(op)
    # Nor does a controller restart (or a failover: the new leader resumes every run).
    resumes = reconciles()
    op = await start_operator(str(cluster.url))
    try:
        await counted(resumes)  # the resume reconcile ran
    finally:
        await stop_operator(op)
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
    resumes = reconciles()
    op = await start_operator(str(cluster.url))
    try:
        await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
        await eventually(lambda: warnings(cluster, "r", "JobDeleted"), message="Warning event")
        await counted(resumes)  # the resume reconcile ended
    finally:
        await stop_operator(op)
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
#: final, unlike the 403s that heal (tests/controller/test_operator_refusals.py).
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
    resumes = reconciles()
    op = await start_operator(str(cluster.url))
    try:
        await counted(resumes)  # the resume reconcile ran
        assert job_posts(cluster) == 1 and phase(cluster, "r") == "Failed"
        # A change of the spec (the API server bumps metadata.generation) tries again.
        await patch(
            cluster,
            RUNS,
            "r",
            {"metadata": {"generation": 2}, "spec": {"image": {"pullPolicy": "Always"}}},
        )
        await eventually(lambda: get(cluster, PYTORCHJOBS, "r"), message="the job")
        await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    finally:
        await stop_operator(op)
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


async def test_deleting_runs_deletes_their_objects_by_name_without_listing(
    cluster, operator
) -> None:
    await apply(cluster, run_body("pj"))
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await apply(cluster, run_body("keep"))
    await eventually(
        lambda: status(cluster, "pj").get("jobName") and status(cluster, "tj").get("jobName"),
        message="status",
    )
    await eventually(lambda: get(cluster, PYTORCHJOBS, "keep"), message="other job")
    await delete(cluster, RUNS, "pj")
    await delete(cluster, RUNS, "tj")
    await eventually(
        lambda: get(cluster, RUNS, "pj") is None and get(cluster, RUNS, "tj") is None,
        message="runs gone",
    )
    assert collection_reads(cluster) == []
    assert list(objects(cluster, PYTORCHJOBS)) == ["keep"]
    assert objects(cluster, TRAINJOBS) == {} and objects(cluster, RUNTIMES) == {}
    assert requests_to(cluster, "DELETE", "/pytorchjobs/pj")
    assert requests_to(cluster, "DELETE", "/trainjobs/tj")
    assert requests_to(cluster, "DELETE", "/trainingruntimes/tj")
    # Only the kinds of each run's target are even read.
    assert not requests_to(cluster, "GET", "/trainjobs/pj")
    assert not requests_to(cluster, "GET", "/pytorchjobs/tj")


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
    since = len(list(cluster))
    await job_condition(cluster, "r-eval", cond("Failed"))
    await job_condition(cluster, "r-copy", cond("Succeeded"))
    await run_read_after(cluster, "r", since)  # the mirror got r-copy's status event
    await settle()  # and ended its handling of it
    assert phase(cluster, "r") == "Pending"
    await delete(cluster, PYTORCHJOBS, "r-eval")
    since = len(list(cluster))
    await delete(cluster, PYTORCHJOBS, "r-copy")
    await run_read_after(cluster, "r", since)  # the mirror got r-copy's DELETED event
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
    since = len(list(cluster))
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await run_read_after(cluster, "r", since)  # the mirror got the forged job's next event
    await settle()
    # ... nor does a reconcile (a spec edit) adopt it.
    await patch(cluster, RUNS, "r", {"metadata": {"generation": 2}, "spec": {"imagesPerGpu": 2}})
    await reconciled(cluster, "r")
    st = status(cluster, "r")
    assert st["phase"] == "Failed" and st["jobUID"] == created_uid, st
    assert condition(cluster, "r", "Failed")["reason"] == "JobDeleted"
    assert condition(cluster, "r", "Succeeded") is None
    assert job_posts(cluster) == 2  # the controller's one job, and the forged one
    assert get(cluster, PYTORCHJOBS, "r")["metadata"]["uid"] == forged_uid
    assert len(warnings(cluster, "r", "ForeignJob")) == 1  # once, not per event
