"""A PyTorchJob that a namespace user creates under the name of a run's deleted job, naming the
run as its controller, on the real API server with the real training operator writing its
status: the run records the uid of the job the controller created (status.jobUID) and never
adopts nor mirrors the other one (ForeignJob=True, a Warning event). Held suspended: no GPU."""

from __future__ import annotations

import copy

from e2e_helpers import apply_objects, condition, eventually, get_json, get_or_none, mdr, namespace

NS, RUN = "foreign-job-e2e", "forged"


def run_of(kube) -> dict | None:
    return get_or_none(kube, "mdr", RUN, "-n", NS)


def test_a_forged_job_under_the_deleted_jobs_name_is_not_adopted(kube, controller) -> None:
    namespace(kube, NS)
    apply_objects(kube, mdr(RUN, NS, {"gpus": 8, "runPolicy": {"suspend": True}}))
    eventually(lambda: (run_of(kube) or {}).get("status", {}).get("jobUID"), message="jobUID")
    job = get_json(kube, "pytorchjob", RUN, "-n", NS)
    created_uid = job["metadata"]["uid"]
    assert run_of(kube)["status"]["jobUID"] == created_uid
    eventually(
        lambda: run_of(kube)["status"].get("phase") == "Suspended", timeout=60, message="Suspended"
    )

    kube.kubectl("delete", "pytorchjob", RUN, "-n", NS, "--wait=true", "--timeout=60s")
    eventually(
        lambda: run_of(kube)["status"].get("phase") == "Failed", message="Failed (job deleted)"
    )

    # The same job again, by a user: a controller reference to the run (no blockOwnerDeletion,
    # which would need update on the run's finalizers).
    forged = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "metadata": {
            "name": RUN,
            "namespace": NS,
            "ownerReferences": [
                {**ref, "blockOwnerDeletion": False} for ref in job["metadata"]["ownerReferences"]
            ],
        },
        "spec": copy.deepcopy(job["spec"]),
    }
    apply_objects(kube, forged)
    forged_uid = get_json(kube, "pytorchjob", RUN, "-n", NS)["metadata"]["uid"]
    # The training operator gives it a status; the controller's mirror hears of it.
    foreign = eventually(
        lambda: (c := condition(run_of(kube), "ForeignJob")) and c["status"] == "True" and c,
        timeout=60,
        message="ForeignJob=True",
    )
    assert foreign["reason"] == "NotCreatedByController"
    assert forged_uid in foreign["message"] and created_uid in foreign["message"]
    eventually(
        lambda: get_json(kube, "pytorchjob", RUN, "-n", NS).get("status", {}).get("conditions"),
        message="the forged job's status",
    )
    status = run_of(kube)["status"]
    assert status["phase"] == "Failed" and status["jobUID"] == created_uid, status
    assert condition(run_of(kube), "Failed")["reason"] == "JobDeleted"
    events = get_json(kube, "events", "-n", NS)["items"]
    warnings = [
        e
        for e in events
        if e["involvedObject"].get("name") == RUN and e.get("reason") == "ForeignJob"
    ]
    assert len(warnings) == 1, warnings

    kube.kubectl("delete", "pytorchjob", RUN, "-n", NS, "--wait=true", "--timeout=60s")
    eventually(
        lambda: condition(run_of(kube), "ForeignJob")["status"] == "False",
        message="ForeignJob=False once it is gone",
    )
    assert run_of(kube)["status"]["phase"] == "Failed"
