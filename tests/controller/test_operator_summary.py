"""``status.summary`` in the running operator, against kmock: a PyTorchJob run that reaches
Succeeded gets it, and the trainer's final report landing after the end (the progress
endpoint's writer is its own) updates it; a Failed run gets what it has; a TrainJob run gets
its summary from the mirrored trainerStatus. (What a summary holds: test_run_summary.py; the
real node: tests/e2e/test_e2e_real_training.py.)"""

from __future__ import annotations

from typing import Any

from kmock_helpers import (
    RUNS,
    TRAINJOBS,
    apply,
    cond,
    eventually,
    job_condition,
    patch,
    requests_to,
    run_body,
    run_status,
    settle,
)
from test_operator_pod_problems import started_run

from megdet.progress import Progress, to_request

#: What the progress endpoint writes while the trainer trains (its last report before the end).
TRAINING = {
    "iteration": 20, "maxIter": 30, "percent": 66, "imagesSeen": 80, "plannedImages": 120,
    "imagesPerSecond": 4.5, "ap": 20.5, "ap50": 40.0, "evalIteration": 20,
    "updatedTime": "2026-12-06T10:08:00Z", "stage": "training",
    "stageTime": "2026-12-06T10:02:00Z", "worldTime": "2026-12-06T10:01:10Z",
    "loadedTime": "2026-12-06T10:01:40Z", "firstIterationTime": "2026-12-06T10:02:00Z",
}  # fmt: skip
#: ... and the final report: training and the final evaluation done.
FINISHED = TRAINING | {
    "iteration": 30, "percent": 100, "imagesSeen": 120, "ap": 31.5, "ap50": 52.25,
    "evalIteration": 30, "updatedTime": "2026-12-06T10:10:00Z", "stage": "finished",
    "stageTime": "2026-12-06T10:10:00Z",
}  # fmt: skip


def summary(api: Any, name: str) -> dict[str, Any]:
    return run_status(api, name).get("summary") or {}


async def test_a_succeeded_run_gets_its_summary_and_a_late_final_report_updates_it(
    cluster, operator
) -> None:
    await started_run(cluster, "r")
    await job_condition(
        cluster, "r", cond("Created"), cond("Running"), startTime="2026-12-06T10:00:30Z"
    )
    await eventually(lambda: run_status(cluster, "r").get("phase") == "Running")
    await patch(cluster, RUNS, "r", {"status": {"progress": TRAINING}})
    await settle()
    assert "summary" not in run_status(cluster, "r")  # not before the end

    await job_condition(
        cluster, "r", cond("Created"), cond("Running", "False"),
        cond("Succeeded", reason="PyTorchJobSucceeded"), completionTime="2026-12-06T10:10:30Z",
    )  # fmt: skip
    got = await eventually(lambda: summary(cluster, "r"), message="status.summary")
    assert got == {
        "phase": "Succeeded", "reason": "PyTorchJobSucceeded",
        "ap": 20.5, "ap50": 40.0, "evalIteration": 20, "iteration": 20, "maxIter": 30,
        "imagesSeen": 80, "plannedImages": 120, "imagesPerSecond": 4.5,
        "target": "pytorchjob", **{k: got[k] for k in ("gpus", "worldSize", "nodes",
                                                        "globalBatch", "lr")},
        "attempt": 1, "restarts": 0, "segments": got["segments"],
        "startTime": "2026-12-06T10:00:30Z", "completionTime": "2026-12-06T10:10:30Z",
        "durationSeconds": 600,
    }  # fmt: skip
    status = run_status(cluster, "r")
    assert got["gpus"] == status["gpus"] and got["globalBatch"] == status["globalBatch"]
    assert got["segments"] == [{"attempt": 1, "gpus": status["gpus"],
                                "globalBatch": status["globalBatch"]}]  # fmt: skip

    # The endpoint's writer stores the trainer's final report after the job's end.
    await patch(cluster, RUNS, "r", {"status": {"progress": FINISHED}})
    await eventually(lambda: summary(cluster, "r").get("ap") == 31.5, message="the final AP")
    got = summary(cluster, "r")
    assert (got["iteration"], got["imagesSeen"], got["ap50"]) == (30, 120, 52.25)
    assert got["trainingSeconds"] == 480 and got["finishingSeconds"] == 30

    # A change of the status that the summary does not show writes nothing more.
    await settle()
    writes = len(requests_to(cluster, "PATCH", "/megdetruns/r/status"))
    later = FINISHED | {"updatedTime": "2026-12-06T10:10:05Z"}
    await patch(cluster, RUNS, "r", {"status": {"progress": later}})
    await settle()
    assert len(requests_to(cluster, "PATCH", "/megdetruns/r/status")) == writes


async def test_a_failed_run_gets_what_it_has(cluster, operator) -> None:
    await started_run(cluster, "f")
    await job_condition(
        cluster, "f", cond("Created"), cond("Running", "False"),
        cond("Failed", reason="PyTorchJobFailed"),
    )  # fmt: skip
    got = await eventually(lambda: summary(cluster, "f"), message="status.summary")
    assert got["phase"] == "Failed" and got["reason"] == "PyTorchJobFailed"
    status = run_status(cluster, "f")
    assert (got["startTime"], got["completionTime"]) == (
        status["startTime"], status["completionTime"],
    )  # fmt: skip
    # No report, no start-up, no fabric: none of what they would say.
    for key in ("ap", "ap50", "iteration", "imagesSeen", "imagesPerSecond", "startupSeconds",
                "trainingSeconds", "finishingSeconds", "fabric"):  # fmt: skip
        assert key not in got, key


async def test_a_trainjob_run_gets_its_summary_from_the_mirrored_trainer_status(
    cluster, operator
) -> None:
    await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
    await eventually(lambda: run_status(cluster, "tj").get("phase") == "Pending")
    final = Progress(
        iteration=30, max_iter=30, images_seen=120, planned_images=120, ap=31.5, ap50=52.25,
        eval_iteration=30, updated_time="2026-12-06T10:10:00Z", stage="finished",
        stage_time="2026-12-06T10:10:00Z", first_iteration_time="2026-12-06T10:02:00Z",
        totals={"attempts": 2, "wallSeconds": 530, "evaluationSeconds": 25},
    )  # fmt: skip
    complete = {
        "type": "Complete", "status": "True", "reason": "JobSetCompleted", "message": "done",
        "lastTransitionTime": "2026-12-06T10:11:00Z",
    }  # fmt: skip
    trainer = to_request(final)["trainerStatus"]
    await patch(
        cluster, TRAINJOBS, "tj",
        {"status": {"conditions": [complete], "trainerStatus": trainer}}, status=True,
    )  # fmt: skip
    got = await eventually(lambda: summary(cluster, "tj"), message="status.summary")
    assert got["phase"] == "Succeeded" and got["target"] == "trainjob"
    assert (got["ap"], got["ap50"], got["iteration"], got["imagesSeen"]) == (31.5, 52.25, 30, 120)
    assert got["completionTime"] == "2026-12-06T10:11:00Z"
    assert got["finishingSeconds"] == 60 and got["trainingSeconds"] == 480
    # The final report's totals, through Trainer's stored metrics and the mirror.
    assert (got["trainerAttempts"], got["wallSeconds"], got["evaluationSeconds"]) == (2, 530, 25)
    assert "stepsSeconds" not in got  # not in the report: not guessed
