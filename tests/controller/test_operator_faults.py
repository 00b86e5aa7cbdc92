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
    eventually,
    get,
    inject,
    is_create,
    is_status_patch,
    objects,
    requests_to,
    run_body,
    settle,
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
        await settle()
    finally:
        await stop_operator(op)
    assert failed, "the injected failure never happened"
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
    if (where, fault) != ("create", "409"):  # a 409 on create is resolved in place, no retry
        assert metrics.sample("megdet_controller_reconciles_total", {"result": "error"}) > errors


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
        await settle()
    finally:
        await stop_operator(second)
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
