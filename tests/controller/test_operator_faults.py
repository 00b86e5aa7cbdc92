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
    arrivals,
    cond,
    counted,
    delay,
    eventually,
    get,
    inject,
    is_create,
    is_status_patch,
    job_condition,
    objects,
    patch,
    reconciled,
    reconciles,
    requests_to,
    run_body,
    start_operator,
    stop_operator,
)

from megdet.controller import metrics


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
    if where == "create" and fault == "409":
        assert after == errors  # resolved in place: the name is taken, look the object up
    else:
        # Status writes carry no precondition, so a 409 there is an error like any other:
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
    job's change meanwhile, waits: it reads the job only after that write is done, and records
    Running from the job as it is now. No write carries a precondition and none is lost.
    """
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await reconciled(cluster, "r")
        held = delay(cluster, is_status_patch("r"), 1.0)
        job_reads = arrivals(
            cluster, lambda r: r.method == "GET" and r.url.path.endswith("/pytorchjobs/r")
        )
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
    # The reconcile read the job before its write; the mirror reads the job (under the run's
    # lock, to compute the status) only once that write is done, and it did read it.
    assert [t for t in job_reads if arrived < t < released] == []
    assert [t for t in job_reads if t >= released]
    status = get(cluster, RUNS, "r")["status"]
    assert status["observedGeneration"] == 2, status
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert {"Valid": "True", "Created": "True", "Running": "True"}.items() <= conditions.items()
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]


async def test_a_job_event_that_changes_nothing_writes_nothing(cluster) -> None:
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await job_condition(cluster, "r", cond("Created"), cond("Running"))
        await eventually(
            lambda: (get(cluster, RUNS, "r").get("status") or {}).get("phase") == "Running",
            timeout=20,
            message="Running",
        )
        await reconciled(cluster, "r")
        writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
        job_reads = len(requests_to(cluster, "GET", "/pytorchjobs/r"))
        # The operator writes the same status again (a new resourceVersion, a watch event).
        await job_condition(cluster, "r", cond("Created"), cond("Running"))
        await eventually(
            lambda: len(requests_to(cluster, "GET", "/pytorchjobs/r")) > job_reads,
            message="the mirror to read the job",
        )
        await reconciled(cluster, "r")
    finally:
        await stop_operator(op)
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes


async def test_a_reconcile_that_changes_nothing_writes_nothing(cluster) -> None:
    """A reconcile whose desired status is the run's own sends no status PATCH and posts no
    event: on a resume (the controller restarted) and on an update that changes no status (a
    label: kopf reconciles on it), while the job runs."""
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r"))
        await eventually(lambda: converged(cluster, "r"), timeout=20, message="status to converge")
        await job_condition(cluster, "r", cond("Created"), cond("Running"))
        await eventually(
            lambda: (get(cluster, RUNS, "r").get("status") or {}).get("phase") == "Running",
            timeout=20,
            message="Running",
        )
        await reconciled(cluster, "r")
    finally:
        await stop_operator(op)
    writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    posted = len(requests_to(cluster, "POST", "/events"))
    since = reconciles()
    op = await start_operator(str(cluster.url))
    try:
        await counted(since)  # the resume reconcile ran
        await patch(cluster, RUNS, "r", {"metadata": {"labels": {"team": "vision"}}})
        await counted(since, 2)  # and the update's
        await reconciled(cluster, "r")
    finally:
        await stop_operator(op)
    # Both computed the run's status and wrote nothing: the status and the events are what
    # they were.
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes
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
