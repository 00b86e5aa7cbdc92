"""Resizing a live elastic run against kmock: the job stopped and created again at the new
size, attempt and segments in the status, an Event per resize, a restart mid-resize, and a
deletion the controller did not make still failing the run.

kmock deletes at once and has no garbage collector: where a test needs the API server's
foreground deletion (the job kept, being deleted, until its pods are gone) it holds the
controller's delete (:func:`hold_foreground_deletes`) and finishes it itself.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import kopf
from aiohttp import web
from kmock_helpers import (
    PYTORCHJOBS,
    RUNS,
    RUNTIMES,
    TRAINJOBS,
    apply,
    cond,
    condition,
    delete,
    events_for,
    eventually,
    get,
    job_condition,
    objects,
    patch,
    phase,
    reconciled,
    requests_to,
    run_body,
    start_operator,
    stop_operator,
)
from kmock_helpers import run_status as status

from megdet.controller.planning import Planned
from megdet.controller.render import render_run
from megdet.controller.resize import POLL_SECONDS, finish, with_segments

ELASTIC = {"gpus": 2, "gpusPerNode": 1, "elastic": {"minGpus": 1, "maxGpus": 2}}


def replicas(job: dict[str, Any]) -> dict[str, int]:
    return {k: v["replicas"] for k, v in job["spec"]["pytorchReplicaSpecs"].items()}


def uid_of(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def hold_foreground_deletes(api: Any) -> list[Any]:
    """Answer the controller's foreground deletes of jobs without deleting: the API server
    keeps such a job (deletionTimestamp set) until the garbage collector has deleted its pods.
    The test then marks it as being deleted and deletes it when its pods would be gone.
    Returns the held requests (it grows)."""
    held: list[Any] = []

    def hold(request: Any) -> Any:
        data = request.data if isinstance(request.data, dict) else {}
        if data.get("propagationPolicy") != "Foreground":
            return None  # not ours: kmock serves it
        held.append(request)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    api.before_delete.append(hold)
    return held


async def running(api: Any, name: str) -> dict[str, Any]:
    """The run's job, once its status says Running."""
    await eventually(lambda: status(api, name).get("jobUID"), message="job recorded")
    await job_condition(api, name, cond("Created"), cond("Running"))
    await eventually(lambda: phase(api, name) == "Running", message="Running")
    return get(api, PYTORCHJOBS, name)


def normal_events(api: Any, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(api, name) if e["reason"] == reason and e["type"] == "Normal"]


async def test_a_resize_within_bounds_creates_the_job_again_at_the_new_size(
    cluster, operator
) -> None:
    await apply(cluster, run_body("r", dict(ELASTIC)))
    first = await running(cluster, "r")
    assert replicas(first) == {"Master": 1, "Worker": 1}
    st = status(cluster, "r")
    assert st["gpus"] == 2 and st["attempt"] == 1
    assert [(s["attempt"], s["gpus"], s["reason"]) for s in st["segments"]] == [(1, 2, "Created")]

    await patch(cluster, RUNS, "r", {"spec": {"gpus": 1}})
    await eventually(lambda: status(cluster, "r").get("attempt") == 2, message="attempt 2")
    second = get(cluster, PYTORCHJOBS, "r")
    assert uid_of(second) != uid_of(first)
    assert replicas(second) == {"Master": 1}  # one pod: the job the chart renders for 1 GPU
    (delete_request,) = requests_to(cluster, "DELETE", "/pytorchjobs/r")
    # Only the job the run had (its uid), and in the foreground: gone once its pods are.
    assert delete_request.data["propagationPolicy"] == "Foreground"
    assert delete_request.data["preconditions"] == {"uid": uid_of(first)}
    st = status(cluster, "r")
    assert st["gpus"] == 1 and st["jobUID"] == uid_of(second) and "resize" not in st
    assert [(s["attempt"], s["gpus"], s["reason"]) for s in st["segments"]] == [
        (1, 2, "Created"),
        (2, 1, "Resized"),
    ]
    assert st["segments"][1]["jobUID"] == uid_of(second)
    resized = condition(cluster, "r", "Resizing")
    assert resized["status"] == "False" and resized["reason"] == "Resized"
    assert phase(cluster, "r") == "Pending"  # the new job has no status yet
    await eventually(lambda: normal_events(cluster, "r", "Resized"), message="Resized event")
    (event,) = normal_events(cluster, "r", "Resized")
    assert event["message"].startswith("from 2 to 1 GPUs: r created again (attempt 2)")
    assert len(normal_events(cluster, "r", "Resizing")) == 1
    assert not [e for e in events_for(cluster, "r") if e["type"] == "Warning"]

    # Back to 2: a third job, a third segment, one more event.
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running again")
    await patch(cluster, RUNS, "r", {"spec": {"gpus": 2}})
    await eventually(lambda: status(cluster, "r").get("attempt") == 3, message="attempt 3")
    assert replicas(get(cluster, PYTORCHJOBS, "r")) == {"Master": 1, "Worker": 1}
    assert [s["gpus"] for s in status(cluster, "r")["segments"]] == [2, 1, 2]
    await eventually(lambda: len(normal_events(cluster, "r", "Resized")) == 2, message="events")
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 3


async def test_the_next_job_waits_until_the_stopped_one_and_its_pods_are_gone(
    cluster, operator
) -> None:
    held = hold_foreground_deletes(cluster)
    await apply(cluster, run_body("r", dict(ELASTIC)))
    first = await running(cluster, "r")
    await patch(cluster, RUNS, "r", {"spec": {"gpus": 1}})
    await eventually(lambda: held, message="the foreground delete")
    st = status(cluster, "r")
    assert st["resize"]["fromGpus"] == 2 and st["resize"]["toGpus"] == 1
    assert st["resize"]["jobUID"] == uid_of(first)
    assert condition(cluster, "r", "Resizing")["status"] == "True"
    await eventually(lambda: normal_events(cluster, "r", "Resizing"), message="Resizing event")

    # Being deleted: its pods still save their checkpoint. Nothing is created meanwhile, and
    # the run is not failed.
    # (kmock, as the API server, keeps an object being deleted while it has finalizers.)
    being_deleted = {"deletionTimestamp": "2030-01-01T00:00:00Z", "finalizers": ["foreground"]}
    await patch(cluster, PYTORCHJOBS, "r", {"metadata": being_deleted})
    await eventually(
        lambda: (get(cluster, PYTORCHJOBS, "r") or {})["metadata"].get("deletionTimestamp"),
        message="deletionTimestamp",
    )
    await patch(cluster, RUNS, "r", {"metadata": {"labels": {"touch": "1"}}})  # a reconcile
    await reconciled(cluster, "r")
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
    assert phase(cluster, "r") == "Running"

    # The pods are gone: so is the job (the garbage collector removes its finalizer).
    await patch(cluster, PYTORCHJOBS, "r", {"metadata": {"finalizers": None}})
    await eventually(lambda: status(cluster, "r").get("attempt") == 2, message="attempt 2")
    assert replicas(get(cluster, PYTORCHJOBS, "r")) == {"Master": 1}
    assert phase(cluster, "r") != "Failed"


async def test_a_resize_interrupted_by_a_controller_restart_completes(cluster) -> None:
    failing = {"delete": True}

    def fail_deletes(request: Any) -> Any:
        if failing["delete"]:
            raise kmock_lib.KubernetesError(status=500, reason="Injected", message="injected")
        return None

    cluster.before_delete.append(fail_deletes)
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r", dict(ELASTIC)))
        first = await running(cluster, "r")
        # The controller records the resize, then cannot delete the job: it stops there.
        await patch(cluster, RUNS, "r", {"spec": {"gpus": 1}})
        await eventually(lambda: status(cluster, "r").get("resize"), message="resize recorded")
        assert status(cluster, "r")["resize"]["jobUID"] == uid_of(first)
    finally:
        await stop_operator(op)
    failing["delete"] = False
    held = hold_foreground_deletes(cluster)
    op = await start_operator(str(cluster.url))
    try:
        await eventually(lambda: held, message="the delete, from the resumed controller")
    finally:
        await stop_operator(op)
    # The job and its pods went while no controller ran; the next one finishes the resize.
    await delete(cluster, PYTORCHJOBS, "r")
    op = await start_operator(str(cluster.url))
    try:
        await eventually(lambda: status(cluster, "r").get("attempt") == 2, message="attempt 2")
    finally:
        await stop_operator(op)
    assert replicas(get(cluster, PYTORCHJOBS, "r")) == {"Master": 1}
    st = status(cluster, "r")
    assert [s["gpus"] for s in st["segments"]] == [2, 1] and "resize" not in st
    assert phase(cluster, "r") != "Failed"
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 2


async def test_a_job_deleted_by_someone_else_still_fails_an_elastic_run(cluster, operator) -> None:
    await apply(cluster, run_body("r", dict(ELASTIC)))
    await running(cluster, "r")
    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
    assert condition(cluster, "r", "Failed")["reason"] == "JobDeleted"
    assert objects(cluster, PYTORCHJOBS) == {}
    # ... and a resize asked for afterwards creates nothing: the run has ended.
    await patch(cluster, RUNS, "r", {"spec": {"gpus": 1}})
    await reconciled(cluster, "r")
    assert objects(cluster, PYTORCHJOBS) == {}
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1


async def test_the_new_job_deleted_by_someone_else_after_a_resize_fails_the_run(
    cluster, operator
) -> None:
    await apply(cluster, run_body("r", dict(ELASTIC)))
    await running(cluster, "r")
    await patch(cluster, RUNS, "r", {"spec": {"gpus": 1}})
    await eventually(lambda: status(cluster, "r").get("attempt") == 2, message="attempt 2")
    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: phase(cluster, "r") == "Failed", message="Failed")
    assert condition(cluster, "r", "Failed")["reason"] == "JobDeleted"
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 2


async def test_gpus_of_a_run_without_bounds_or_outside_them_change_no_job(
    cluster, operator
) -> None:
    """The CRD refuses both edits; a controller never acts on one that got past it."""
    await apply(cluster, run_body("fixed", {"gpus": 2, "gpusPerNode": 1}))
    await apply(cluster, run_body("bounded", dict(ELASTIC)))
    await running(cluster, "fixed")
    await running(cluster, "bounded")
    await patch(cluster, RUNS, "fixed", {"spec": {"gpus": 1}})
    await patch(cluster, RUNS, "bounded", {"spec": {"gpus": 4}})
    await reconciled(cluster, "fixed", "bounded")
    assert requests_to(cluster, "DELETE", "/pytorchjobs/fixed") == []
    assert requests_to(cluster, "DELETE", "/pytorchjobs/bounded") == []
    assert status(cluster, "fixed")["gpus"] == 2 and status(cluster, "bounded")["gpus"] == 2
    assert status(cluster, "fixed")["worldSize"] == 2  # the job's plan, not the spec's


async def test_a_trainjob_run_is_resized_with_its_runtime_brought_to_the_new_size(
    cluster, operator
) -> None:
    await apply(cluster, run_body("t", {**ELASTIC, "target": "trainjob"}))
    await eventually(lambda: status(cluster, "t").get("jobUID"), message="job recorded")
    first = get(cluster, TRAINJOBS, "t")
    assert first["spec"]["trainer"]["numNodes"] == 2
    await patch(cluster, RUNS, "t", {"spec": {"gpus": 1}})
    await eventually(lambda: status(cluster, "t").get("attempt") == 2, message="attempt 2")
    second = get(cluster, TRAINJOBS, "t")
    assert uid_of(second) != uid_of(first)
    assert second["spec"]["trainer"]["numNodes"] == 1
    (delete_request,) = requests_to(cluster, "DELETE", "/trainjobs/t")
    # In the background: Trainer makes the JobSet of a TrainJob being deleted again.
    assert delete_request.data["propagationPolicy"] == "Background"
    runtime = get(cluster, RUNTIMES, "t")
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 1  # patched before the TrainJob
    assert [s["gpus"] for s in status(cluster, "t")["segments"]] == [2, 1]


def _created_status(old: dict[str, Any], spec: dict[str, Any], uid: str) -> dict[str, Any]:
    """The status with_segments makes for a job of ``uid`` rendered from ``spec``."""
    rendered = render_run("r", "vision", spec)
    planned = Planned(rendered=rendered, objects=rendered.objects)
    job = {"metadata": {"uid": uid}}
    return with_segments(old, dict(rendered.status_plan()), job, planned, "t1", 1)


def test_a_resized_keep_batch_run_shows_the_kept_batch_and_a_rescaled_one_the_new() -> None:
    spec = {"gpus": 4, "gpusPerNode": 1, "maxIter": 1000, "steps": [500], "warmupIters": 100}
    first = _created_status({}, {**spec, "elastic": {"minGpus": 1, "maxGpus": 4}}, "a")
    assert first["globalBatch"] == 8 and first["attempt"] == 1
    for mode, batch in (("keep-batch", 8), ("rescale", 4)):
        old = {**first, "resize": {"fromGpus": 4, "toGpus": 2, "jobUID": "a"}, "jobUID": "a"}
        elastic = {"minGpus": 1, "maxGpus": 4, "resize": mode}
        after = _created_status(old, {**spec, "gpus": 2, "elastic": elastic}, "b")
        assert after["attempt"] == 2 and after["gpus"] == 2 and after["jobUID"] == "b"
        assert after["globalBatch"] == batch, mode
        assert after["segments"][-1]["globalBatch"] == batch
        assert (after["lr"] == first["lr"]) is (mode == "keep-batch")


def test_finishing_a_resize_retries_what_heals_and_stops_when_done_elsewhere() -> None:
    """kopf never retries an event handler: the job mirror's finish tries again itself."""
    run = {"metadata": {"uid": "u"}, "status": {"resize": {"jobUID": "old"}}}
    calls: list[int] = []
    slept: list[float] = []

    def reconcile(_run: dict[str, Any], retry: int) -> None:
        calls.append(retry)
        if len(calls) < 3:
            raise kopf.TemporaryError("quota", delay=2.0)

    finish(lambda: run, reconcile, "u", clock=lambda: 0.0, sleep=slept.append)
    assert calls == [0, 1, 2] and slept == [2.0, 2.0]
    # Done by a reconcile meanwhile, another incarnation, or gone: nothing to do.
    calls.clear()
    done = {"metadata": {"uid": "u"}, "status": {}}
    finish(lambda: done, reconcile, "u")
    finish(lambda: run, reconcile, "another")
    finish(lambda: None, reconcile, "u")
    assert calls == []
    # A failure that does not heal in time is left to the run's next reconcile.
    now = [0.0]

    def failing(_run: dict[str, Any], retry: int) -> None:
        raise kopf.TemporaryError("quota", delay=400.0)

    finish(
        lambda: run,
        failing,
        "u",
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert now[0] == 400.0  # one wait, then the next would pass FINISH_SECONDS
    # The stopped job's pods still there (a TrainJob's outlive it): no job until they go.
    calls.clear()
    slept.clear()
    left = [2]

    def pods_left() -> bool:
        left[0] -= 1
        return left[0] >= 0

    finish(lambda: run, reconcile, "u", clock=lambda: 0.0, sleep=slept.append, pods_left=pods_left)
    assert slept[:2] == [POLL_SECONDS, POLL_SECONDS] and calls[0] == 0
