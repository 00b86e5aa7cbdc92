"""The Trainer v2 target against kmock: one owned TrainJob (+ its TrainingRuntime), status
from the TrainJob's conditions and jobsStatus; a bad target is refused by field name."""

from __future__ import annotations

from kmock_helpers import (
    NAMESPACE,
    PYTORCHJOBS,
    RUNS,
    RUNTIMES,
    TRAINJOBS,
    apply,
    eventually,
    get,
    objects,
    patch,
    reconciled,
    run_body,
)
from kmock_helpers import (
    run_status as status,
)

from megdet.controller.render import render_run


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
