"""Job status -> MegDetRun phase and conditions (pure functions, upstream condition shapes).

The job statuses below have the shapes the upstream operators write: PyTorchJob conditions from
kubeflow/trainer release-1.9 ``pkg/util/status.go`` (Running and Restarting exclusive, Running
set False on Succeeded/Failed) and TrainJob ``metav1.Condition``s and ``jobsStatus`` from
kubeflow/trainer v2.3.0 ``pkg/apis/trainer/v1alpha1/trainjob_types.go``.
"""

from __future__ import annotations

from typing import Any

import pytest

from megdet.controller.status import (
    JobState,
    invalid_status,
    job_state,
    next_status,
    pytorchjob_state,
    set_condition,
    trainjob_state,
)

T0 = "2026-11-30T10:00:00Z"
T1 = "2026-11-30T10:05:00Z"


def cond(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason or kind, "message": message}


def pytorchjob(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "status": {"conditions": list(conditions), **status},
    }


def trainjob(*conditions: dict[str, Any], jobs: list[dict[str, Any]] | None = None) -> dict:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if jobs is not None:
        status["jobsStatus"] = jobs
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "status": status}


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ([], "Pending"),
        ([cond("Created")], "Pending"),
        ([cond("Created"), cond("Running")], "Running"),
        ([cond("Created"), cond("Restarting")], "Restarting"),
        ([cond("Created"), cond("Running", "False"), cond("Succeeded")], "Succeeded"),
        ([cond("Created"), cond("Running", "False"), cond("Failed")], "Failed"),
        ([cond("Created"), cond("Running", "False"), cond("Suspended")], "Suspended"),
        # Resumed: Suspended turns False (reason PyTorchJobResumed), no Running yet.
        ([cond("Created"), cond("Suspended", "False", "PyTorchJobResumed")], "Pending"),
        # Failed wins over a stale Running (the operator freezes conditions once Failed).
        ([cond("Running"), cond("Failed")], "Failed"),
    ],
)
def test_pytorchjob_conditions_map_to_phase(conditions: list[dict], phase: str) -> None:
    assert pytorchjob_state(pytorchjob(*conditions)).phase == phase


def test_pytorchjob_state_carries_reason_message_and_times() -> None:
    job = pytorchjob(
        cond("Failed", reason="PyTorchJobFailed", message="worker-1 exit 137"),
        startTime=T0,
        completionTime=T1,
    )
    state = pytorchjob_state(job)
    assert state == JobState("Failed", "PyTorchJobFailed", "worker-1 exit 137", T0, T1)


def test_pytorchjob_without_status_is_pending() -> None:
    assert pytorchjob_state({"kind": "PyTorchJob"}).phase == "Pending"
    assert pytorchjob_state({"kind": "PyTorchJob", "status": "garbage"}).phase == "Pending"


@pytest.mark.parametrize(
    ("conditions", "jobs", "phase"),
    [
        ([], None, "Pending"),
        ([], [{"name": "node", "ready": 0, "active": 1, "failed": 0}], "Pending"),
        ([], [{"name": "node", "ready": 1, "active": 1, "failed": 0}], "Running"),
        ([], [{"name": "node", "ready": 0, "active": 1, "failed": 1}], "Restarting"),
        ([cond("Complete", reason="JobSetCompleted")], None, "Succeeded"),
        ([cond("Failed", reason="DeadlineExceeded")], None, "Failed"),
        ([cond("Suspended", reason="Suspended")], None, "Suspended"),
        ([cond("Suspended", "False", "Resumed")], [{"name": "node", "ready": 1}], "Running"),
    ],
)
def test_trainjob_conditions_and_jobs_status_map_to_phase(
    conditions: list[dict], jobs: list[dict] | None, phase: str
) -> None:
    job = trainjob(*conditions, jobs=jobs)
    assert trainjob_state(job).phase == phase
    assert job_state(job).phase == phase  # dispatch by kind


def test_trainjob_complete_takes_its_transition_time_as_completion() -> None:
    done = {**cond("Complete"), "lastTransitionTime": T1}
    assert trainjob_state(trainjob(done)).completion_time == T1


def test_set_condition_moves_transition_time_only_when_status_flips() -> None:
    conditions = set_condition([], "Running", True, "Running", "", T0, 1)
    same = set_condition(conditions, "Running", True, "StillRunning", "msg", T1, 2)
    assert same == [
        {
            "type": "Running",
            "status": "True",
            "reason": "StillRunning",
            "message": "msg",
            "lastTransitionTime": T0,
            "observedGeneration": 2,
        }
    ]
    flipped = set_condition(same, "Running", False, "Done", "", T1, 2)
    assert flipped[0]["lastTransitionTime"] == T1
    assert flipped[0]["status"] == "False"


def test_next_status_counts_restarts_on_entering_restarting_only() -> None:
    status: dict[str, Any] = {"phase": "Running", "restarts": 0}
    restarting = JobState("Restarting", "PyTorchJobRestarting", "pod failed")
    status.update(next_status(status, restarting, T0, 1))
    assert status["restarts"] == 1
    status.update(next_status(status, restarting, T1, 1))  # still restarting: no new restart
    assert status["restarts"] == 1
    status.update(next_status(status, JobState("Running", "Running", ""), T1, 1))
    status.update(next_status(status, restarting, T1, 1))
    assert status["restarts"] == 2
    kinds = {c["type"]: c["status"] for c in status["conditions"]}
    assert kinds == {"Running": "False", "Restarting": "True"}


def test_next_status_sets_start_and_completion_times() -> None:
    pending = next_status({}, JobState("Pending", "Created", ""), T0, 1)
    assert "startTime" not in pending and "completionTime" not in pending
    running = next_status(pending, JobState("Running", "Running", "", start_time=T0), T1, 1)
    assert running["startTime"] == T0
    done = next_status({**pending, **running}, JobState("Succeeded", "Succeeded", ""), T1, 1)
    assert done["startTime"] == T0
    assert done["completionTime"] == T1
    assert done["phase"] == "Succeeded"


def test_invalid_status_names_every_problem_and_sets_valid_false() -> None:
    status = invalid_status({}, ["spec.gpus: 12 is not a multiple", "spec.x: unknown"], T0, 3)
    assert status["phase"] == "Invalid"
    (valid,) = status["conditions"]
    assert valid["type"] == "Valid" and valid["status"] == "False"
    assert valid["reason"] == "InvalidSpec"
    assert "spec.gpus" in valid["message"] and "spec.x" in valid["message"]
    assert valid["observedGeneration"] == 3


def _crd_status_schema() -> dict[str, Any]:
    from pathlib import Path

    import yaml

    crd = (
        Path(__file__).resolve().parents[2]
        / "charts/megdet-operator/crds/megdetruns.megdet.io.yaml"
    )
    (version,) = yaml.safe_load(crd.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["status"]


def _pruned(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Fields the API server would prune: not declared by the structural schema."""
    if isinstance(value, dict) and "properties" in schema:
        out = []
        for key, item in value.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out += _pruned(item, schema["properties"][key], f"{path}.{key}")
        return out
    if isinstance(value, list) and "items" in schema:
        return [
            p
            for i, item in enumerate(value)
            for p in _pruned(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def test_every_status_the_controller_writes_fits_the_crd_status_schema() -> None:
    import jsonschema

    from megdet.controller.operator import conflict_status, plan_children, planned_status

    schema = _crd_status_schema()
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": "vision", "uid": "u-1", "generation": 1},
        "spec": {"gpus": 16},
    }
    planned = plan_children(run)
    status: dict[str, Any] = planned_status({}, planned, None, T0, 1)
    written = [dict(status)]
    for state in (
        JobState("Running", "Running", "", start_time=T0),
        JobState("Restarting", "Restarting", "pod failed"),
        JobState("Suspended", "Suspended", ""),
        JobState("Failed", "Failed", "exit 1", completion_time=T1),
    ):
        status.update(next_status(status, state, T1, 1))
        written.append(dict(status))
    written.append(conflict_status(status, "PyTorchJob", "r", T1, 2))
    written.append(invalid_status(status, ["spec.gpus: bad"], T1, 2))
    for status in written:
        jsonschema.validate(status, schema)  # types, enums (phase)
        assert _pruned(status, schema) == []  # nothing the API server would silently drop
