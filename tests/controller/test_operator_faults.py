"""API failures and a controller killed mid-reconcile: retried, and still exactly one job.

kmock (the API emulator; no API server runs here) stores a created object before any injected
reaction answers, so an injected failure on a job POST is the nasty case: the job exists but
the controller was told it failed. The controller must find and adopt it, never create another.
"""

from __future__ import annotations

from typing import Any

import pytest
from kmock_helpers import (
    PYTORCHJOBS,
    RUNS,
    apply,
    counted,
    eventually,
    get,
    inject,
    is_create,
    is_status_patch,
    objects,
    reconciled,
    reconciles,
    requests_to,
    run_body,
    start_operator,
    stop_operator,
)

from megdet.controller import metrics
from megdet.controller.job_state import job_state
from megdet.controller.status import next_status


def converged(api: Any, name: str) -> bool:
    status = (get(api, RUNS, name) or {}).get("status") or {}
    return status.get("jobName") == name and status.get("phase") == "Pending"


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
    # The client gives up after 1 s; an injected "timeout" answers after 2.5 s.
    op = await start_operator(str(cluster.url), timeout=1.0)
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
    if fault != "409":
        assert after > errors
    elif where == "create":  # resolved in place: the name is taken, look the object up
        assert after == errors
    else:
        # A conditional status write that conflicts is resolved in place too: read the run
        # again, recompute the status from what it holds now, write again.
        assert after == errors
        assert len(requests_to(cluster, "GET", "/megdetruns/r")) >= len(failed) == 2


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


async def test_a_status_write_that_races_the_job_mirror_loses_nothing(cluster) -> None:
    """The job starts and the mirror records Running between a reconcile's read and its write.

    Staged on the resume reconcile of a restarted controller: it has read the run (Pending) and
    the job (no status yet) when the job starts running and the job mirror writes Running.
    That job event has been handled, and no other follows, so nothing would correct a reconcile
    that then writes the Pending it computed from its stale reads. Its status write is
    conditional on the run's resourceVersion: the API server refuses it (409), the reconcile
    reads the run and the job again and writes Running.
    """
    first = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
    finally:
        await stop_operator(first)

    raced: list[Any] = []

    def the_mirror_writes_first(request: Any) -> None:
        if raced or not is_status_patch("r")(request):
            return
        raced.append(request)
        started = {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}
        cluster.write_quietly(PYTORCHJOBS, "r", {"status": {"conditions": [started]}})
        run, job = get(cluster, RUNS, "r"), get(cluster, PYTORCHJOBS, "r")
        mirrored = next_status(
            run["status"], job_state(job), "2026-11-30T12:00:00Z", run["metadata"]["generation"]
        )
        cluster.write_quietly(RUNS, "r", {"status": mirrored})
        assert get(cluster, RUNS, "r")["status"]["phase"] == "Running"

    cluster.before_write.append(the_mirror_writes_first)
    patches_before = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    resumes = reconciles()
    second = await start_operator(str(cluster.url))
    try:
        await eventually(lambda: raced, timeout=20, message="the resume reconcile's status write")
        # Without the conditional write the reconcile's stale Pending lands and stays.
        await eventually(
            lambda: get(cluster, RUNS, "r")["status"]["phase"] == "Running"
            and len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) - patches_before >= 2,
            timeout=15,
            message="the status to be written again from fresh reads",
        )
        await counted(resumes)  # the resume reconcile ended: no stale write is still to come
    finally:
        await stop_operator(second)
    run_status = get(cluster, RUNS, "r")["status"]
    assert run_status["phase"] == "Running", run_status
    running = [c for c in run_status["conditions"] if c["type"] == "Running"]
    assert running and running[0]["status"] == "True", run_status["conditions"]
    assert {"Valid", "Created"} <= {c["type"] for c in run_status["conditions"]}
    # The refused write and the one computed again from the fresh reads.
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) - patches_before >= 2
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]


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
