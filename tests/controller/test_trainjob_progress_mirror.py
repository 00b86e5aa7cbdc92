"""target: trainjob: the controller mirrors ``TrainJob.status.trainerStatus`` (what Kubeflow
Trainer v2.3.0's status server stores from the trainer's reports) into the run's
``status.progress``, converted by ``megdet.progress.to_status``, and writes only when the
mirrored progress changed. The pure part (controller/status.py) first, then the real operator
against kmock."""

from __future__ import annotations

from typing import Any

from kmock_helpers import (
    RUNS,
    TRAINJOBS,
    apply,
    events_for,
    eventually,
    get,
    is_status_patch,
    patch,
    run_body,
    run_read_after,
    run_reads,
)

from megdet.controller.job_state import trainjob_progress
from megdet.controller.status_writer import progress_patch
from megdet.progress import Progress, to_request, to_status

T0 = "2026-12-01T10:00:00Z"
JOBS_RUNNING = [
    {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
]


def report(**fields: Any) -> dict[str, Any]:
    """A trainerStatus as the trainer sends it (and as Trainer stores it)."""
    values = {"iteration": 1200, "max_iter": 4800, "updated_time": T0, **fields}
    return to_request(Progress(**values))["trainerStatus"]


# -- pure ----------------------------------------------------------------------------------------


def test_trainjob_progress_reads_trainer_status() -> None:
    trainer = report(eta_seconds=3600, ap=41.25, eval_iteration=1000)
    job = {"kind": "TrainJob", "status": {"trainerStatus": trainer, "jobsStatus": JOBS_RUNNING}}
    progress, problems = trainjob_progress(job)
    assert problems == []
    assert progress == to_status(trainer)[0]
    assert progress["percent"] == 25 and progress["iteration"] == 1200
    assert progress["maxIter"] == 4800 and progress["ap"] == 41.25
    assert progress["etaSeconds"] == 3600 and progress["etaTime"] == "2026-12-01T11:00:00Z"


def test_trainjob_progress_without_trainer_status_is_none() -> None:
    assert trainjob_progress({"kind": "TrainJob", "status": {"jobsStatus": JOBS_RUNNING}}) == (
        None,
        [],
    )
    assert trainjob_progress({"kind": "TrainJob"}) == (None, [])
    assert trainjob_progress({"kind": "TrainJob", "status": "garbage"}) == (None, [])


def test_trainjob_progress_reports_problems_and_keeps_the_rest() -> None:
    trainer = {"progressPercentage": 250, "lastUpdatedTime": T0, "metrics": "x"}
    progress, problems = trainjob_progress({"status": {"trainerStatus": trainer}})
    assert progress == {"updatedTime": T0}
    assert any("progressPercentage" in p for p in problems), problems
    assert any("metrics" in p for p in problems), problems


def test_progress_patch_only_when_changed_and_removes_dropped_fields() -> None:
    new = {"percent": 50, "iteration": 2400, "updatedTime": T0}
    assert progress_patch(None, new) == new
    assert progress_patch(dict(new), new) is None
    assert progress_patch(None, {}) is None  # nothing reported that could be kept
    old = {"percent": 25, "iteration": 1200, "ap": 40.0, "updatedTime": T0}
    assert progress_patch(old, new) == {**new, "ap": None}
    assert progress_patch("garbage", new) == new


# -- the operator --------------------------------------------------------------------------------


def progress_of(api: Any, name: str) -> dict[str, Any] | None:
    return ((get(api, RUNS, name) or {}).get("status") or {}).get("progress")


def status_writes(api: Any, name: str) -> list[Any]:
    match = is_status_patch(name)
    return [r for r in list(api) if match(r)]


def progress_writes(api: Any, name: str) -> list[Any]:
    return [r for r in status_writes(api, name) if "progress" in (r.data or {}).get("status", {})]


async def test_trainer_status_is_mirrored_into_the_run_once_per_change(cluster, operator) -> None:
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await eventually(lambda: get(cluster, TRAINJOBS, "tj"), message="the TrainJob")
    status = {"jobsStatus": JOBS_RUNNING}
    await patch(cluster, TRAINJOBS, "tj", {"status": status}, status=True)
    await eventually(
        lambda: (get(cluster, RUNS, "tj").get("status") or {}).get("phase") == "Running",
        message="Running",
    )
    # Phase and progress go in one write: the phase proves this event was mirrored.
    assert progress_of(cluster, "tj") is None  # nothing reported yet: nothing mirrored
    assert progress_writes(cluster, "tj") == []

    # A report lands in the TrainJob's status (as Trainer's status server applies it).
    first = report(eta_seconds=3600, ap=41.25, ap50=60.5, eval_iteration=1000)
    await patch(cluster, TRAINJOBS, "tj", {"status": {"trainerStatus": first}}, status=True)
    expected, _ = to_status(first)
    await eventually(lambda: progress_of(cluster, "tj") == expected, message="progress mirrored")
    assert expected["percent"] == 25 and expected["ap"] == 41.25
    assert (get(cluster, RUNS, "tj")["status"]["phase"]) == "Running"
    # The evaluation is a milestone: one Normal event, as the pytorchjob endpoint posts.
    evaluated = await eventually(
        lambda: [e for e in events_for(cluster, "tj") if e.get("reason") == "Evaluated"],
        message="an Evaluated event",
    )
    assert evaluated[0]["type"] == "Normal"
    assert "iteration 1000: AP 41.25, AP50 60.50" in evaluated[0]["message"]
    writes = len(status_writes(cluster, "tj"))
    assert len(progress_writes(cluster, "tj")) == 1

    # TrainJob events that leave trainerStatus (and the phase) as they were: no write.
    reads = run_reads()
    await patch(cluster, TRAINJOBS, "tj", {"metadata": {"labels": {"touched": "1"}}})
    await patch(cluster, TRAINJOBS, "tj", {"status": {"jobsStatus": JOBS_RUNNING}}, status=True)
    await run_read_after(reads)  # the mirror handles them
    assert len(status_writes(cluster, "tj")) == writes
    assert progress_of(cluster, "tj") == expected

    # The next report replaces the mirror whole: a metric it no longer carries is dropped.
    second = report(iteration=2400, eta_seconds=1800, updated_time="2026-12-01T10:30:00Z")
    await patch(cluster, TRAINJOBS, "tj", {"status": {"trainerStatus": None}}, status=True)
    await patch(cluster, TRAINJOBS, "tj", {"status": {"trainerStatus": second}}, status=True)
    expected2, _ = to_status(second)
    assert "ap" not in expected2
    await eventually(lambda: progress_of(cluster, "tj") == expected2, message="second report")
    mirrored = progress_of(cluster, "tj")
    assert mirrored["percent"] == 50 and mirrored["etaTime"] == "2026-12-01T11:00:00Z"
    assert len(progress_writes(cluster, "tj")) == 2
    # kopf handles one TrainJob's events in order: the second report's write proves the events
    # above were handled, and they wrote nothing (clearing trainerStatus keeps the mirror too).
    assert len(status_writes(cluster, "tj")) == writes + 1
    # No new evaluation in the second report: no second event. A third report's write proves the
    # second one's handling (its write, then its events) is over.
    third = report(iteration=3600, eta_seconds=900, updated_time="2026-12-01T10:45:00Z")
    await patch(cluster, TRAINJOBS, "tj", {"status": {"trainerStatus": third}}, status=True)
    await eventually(lambda: progress_of(cluster, "tj") == to_status(third)[0], message="third")
    assert len([e for e in events_for(cluster, "tj") if e.get("reason") == "Evaluated"]) == 1
