"""Job status -> MegDetRun phase and conditions (pure functions, upstream condition shapes).

The job statuses below have the shapes the upstream operators write: PyTorchJob conditions from
kubeflow/trainer release-1.9 ``pkg/util/status.go`` (Running and Restarting exclusive, Running
set False on Succeeded/Failed) and TrainJob ``metav1.Condition``s and ``jobsStatus`` from
kubeflow/trainer v2.3.0 ``pkg/apis/trainer/v1alpha1/trainjob_types.go``.
"""

from __future__ import annotations

from typing import Any

import pytest

from megdet.controller.job_state import JobState, job_state, pytorchjob_state, trainjob_state
from megdet.controller.status import (
    Created,
    Decision,
    Foreign,
    JobGone,
    NotCreated,
    Refused,
    SpecInvalid,
    conflict_message,
    desired_status,
    finished,
    had_job,
    next_status,
    refused_at,
    set_condition,
)

T0 = "2026-11-30T10:00:00Z"
T1 = "2026-11-30T10:05:00Z"
UID = "u-1"


def after(
    old: dict[str, Any], decision: Decision, now: str, generation: Any, job: Any = None
) -> dict[str, Any]:
    """The status a run (uid ``UID``) with status ``old`` should hold after ``decision``."""
    return desired_status({"metadata": {"uid": UID}, "status": old}, job, decision, now, generation)


def planned_run(generation: int = 2, gpus: int = 8) -> tuple[Any, dict[str, Any]]:
    """A run's plan and its job as just created (no status yet)."""
    from megdet.controller.planning import plan_children

    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": "vision", "uid": UID, "generation": generation},
        "spec": {"gpus": gpus},
    }
    planned = plan_children(run)
    return planned, planned.job


def with_uid(job: dict[str, Any], uid: str) -> dict[str, Any]:
    return {**job, "metadata": {**job["metadata"], "uid": uid}}


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
    # The condition says which restart of which attempt (status.attempt: the run's job).
    restart = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restart["message"] == "restart 2 of attempt 1: pod failed"
    again = next_status({**status, "phase": "Running", "attempt": 3}, restarting, T1, 1)
    restart = next(c for c in again["conditions"] if c["type"] == "Restarting")
    assert restart["message"] == "restart 3 of attempt 3: pod failed"


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
    problems = ("spec.gpus: 12 is not a multiple", "spec.x: unknown")
    status = after({}, SpecInvalid(problems), T0, 3)
    assert status["phase"] == "Invalid"
    (valid,) = status["conditions"]
    assert valid["type"] == "Valid" and valid["status"] == "False"
    assert valid["reason"] == "InvalidSpec"
    assert "spec.gpus" in valid["message"] and "spec.x" in valid["message"]
    assert valid["observedGeneration"] == 3


def _types(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_finished_runs_vanished_job_keeps_the_result_and_adds_job_present_false() -> None:
    old = {
        "phase": "Succeeded",
        "completionTime": T0,
        "startTime": T0,
        "conditions": [cond("Created", reason="JobCreated"), cond("Succeeded")],
    }
    patch = after(old, JobGone("PyTorchJob", "r"), T1, 2)
    assert patch["phase"] == "Succeeded"  # the result stands
    assert _types(patch)["JobPresent"] == ("False", "JobDeleted")
    assert _types(patch)["Succeeded"] == ("True", "Succeeded")
    assert "ttlSecondsAfterFinished" in patch["conditions"][-1]["message"]
    # Recorded once: nothing more to write the next time.
    assert after(patch, JobGone("PyTorchJob", "r"), T1, 2) == patch
    assert finished({**old, **patch}) and had_job({**old, **patch})


@pytest.mark.parametrize(
    "phase", [None, "Pending", "Running", "Restarting", "Suspended", "Invalid"]
)
def test_an_unfinished_runs_vanished_job_fails_the_run(phase: str | None) -> None:
    old = {"conditions": [cond("Created", reason="JobCreated")]}
    if phase is not None:
        old["phase"] = phase
    if phase == "Running":
        old["startTime"] = T0
        old["conditions"].append(cond("Running"))
    patch = after(old, JobGone("TrainJob", "r"), T1, 4)
    assert patch["phase"] == "Failed"
    types = _types(patch)
    assert types["Failed"] == ("True", "JobDeleted") and types["JobPresent"] == (
        "False",
        "JobDeleted",
    )
    if phase == "Running":
        assert types["Running"][0] == "False" and patch["startTime"] == T0
    else:
        assert "startTime" not in patch  # it never ran as far as the controller saw
    assert patch["completionTime"] == T1
    message = next(c["message"] for c in patch["conditions"] if c["type"] == "Failed")
    assert message.startswith("TrainJob r was deleted while the run was")
    assert "delete and re-create the MegDetRun" in message
    assert finished({**old, **patch})


def test_a_refused_job_fails_the_run_but_a_spec_change_may_retry() -> None:
    old = {"phase": "Pending", "conditions": [cond("Valid", reason="SpecValid")]}
    status = after(old, Refused("the API server refused ..."), T0, 3)
    assert status["phase"] == "Failed" and status["observedGeneration"] == 3
    assert _types(status)["Created"] == ("False", "JobRefused")
    assert _types(status)["Failed"] == ("True", "JobRefused")
    assert "startTime" not in status and "completionTime" not in status
    assert refused_at(status) == 3
    assert not finished(status) and not had_job(status)
    assert refused_at({"phase": "Failed", "conditions": [cond("Failed")]}) is None
    assert finished({"phase": "Failed", "conditions": [cond("Failed")]})


def _created_and_running() -> dict[str, Any]:
    return {
        "phase": "Running",
        "jobUID": "job-1",
        "conditions": [
            cond("Valid", reason="SpecValid"),
            cond("Created", reason="JobCreated"),
            cond("Running", reason="PyTorchJobRunning"),
        ],
    }


@pytest.mark.parametrize(
    "outcome",
    [
        lambda old: after(old, Refused("the API server refused NetworkPolicy r"), T1, 2),
        lambda old: after(old, NotCreated("JobNameConflict", "NetworkPolicy r is taken"), T1, 2),
        lambda old: after(old, NotCreated("Retrying", "quota"), T1, 2),
    ],
    ids=["refused", "conflict", "retrying"],
)
def test_a_run_whose_job_exists_stays_recorded_as_created(outcome) -> None:
    """A refusal or failure once the job exists is about one of the run's other objects: the
    job stays recorded (Created=True, the phase it has), ChildrenReady=False says the rest."""
    old = _created_and_running()
    after = {**old, **outcome(old)}
    assert had_job(after) and after["phase"] == "Running"
    assert _types(after)["Created"] == ("True", "JobCreated")
    assert _types(after)["Running"] == ("True", "PyTorchJobRunning")
    assert "Failed" not in _types(after)
    assert _types(after)["ChildrenReady"][0] == "False"
    assert refused_at(after) is None and not finished(after)


def test_children_ready_appears_with_a_problem_and_turns_true_once_fixed() -> None:
    old = _created_and_running()
    planned, job = planned_run()
    job = with_uid(job, "job-1")

    def children(status: dict[str, Any], *problems: tuple[str, str]) -> dict[str, Any]:
        return after(status, Created(planned, problems), T1, 2, job)

    assert "ChildrenReady" not in _types(children(old))  # nothing to say yet
    bad = children(old, ("ChildRefused", "NetworkPolicy r: bad CIDR"))
    assert _types(bad)["ChildrenReady"] == ("False", "ChildRefused")
    good = children(bad)
    assert _types(good)["ChildrenReady"] == ("True", "ChildrenReady")
    both = children(old, ("ChildRefused", "a"), ("Retrying", "b"))
    (ready,) = [c for c in both["conditions"] if c["type"] == "ChildrenReady"]
    assert ready["reason"] == "ChildrenNotReady" and ready["message"] == "a; b"


def test_planned_status_keeps_the_first_job_uid_and_says_children_ready() -> None:
    planned, job = planned_run()
    old = _created_and_running()
    problems = (("ChildRefused", "NetworkPolicy r: bad CIDR"),)
    # Another job under the run's name (uid job-2): not the run's, nothing changes.
    assert after(old, Created(planned, problems), T1, 2, with_uid(job, "job-2")) == old
    status = after(old, Created(planned, problems), T1, 2, with_uid(job, "job-1"))
    assert status["jobUID"] == "job-1"
    assert _types(status)["ChildrenReady"] == ("False", "ChildRefused")
    assert after({}, Created(planned), T1, 2, with_uid(job, "j"))["jobUID"] == "j"


def test_a_foreign_job_is_said_once_and_cleared_when_it_goes() -> None:
    old = _created_and_running()

    def foreign_job_status(old, kind, name, uid, present, now, generation):
        job = {"kind": kind, "metadata": {"name": name, "uid": uid}}
        new = after(old, Foreign(present), now, generation, job)
        return None if new == old else new

    patch = foreign_job_status(old, "PyTorchJob", "r", "forged-9", True, T0, 1)
    (foreign,) = [c for c in patch["conditions"] if c["type"] == "ForeignJob"]
    assert foreign["status"] == "True" and foreign["reason"] == "NotCreatedByController"
    assert "forged-9" in foreign["message"] and "job-1" in foreign["message"]
    said = {**old, **patch}
    assert foreign_job_status(said, "PyTorchJob", "r", "forged-9", True, T1, 1) is None
    gone = foreign_job_status(said, "PyTorchJob", "r", "forged-9", False, T1, 1)
    assert _types(gone)["ForeignJob"] == ("False", "ForeignJobDeleted")
    assert foreign_job_status(old, "PyTorchJob", "r", "x", False, T1, 1) is None


def test_only_the_recorded_job_is_the_runs() -> None:
    from megdet.controller.planning import is_runs_job

    ref = {"apiVersion": "megdet.io/v1alpha1", "kind": "MegDetRun", "uid": "u-1",
           "controller": True}  # fmt: skip
    job = {"kind": "PyTorchJob", "metadata": {"uid": "job-1", "ownerReferences": [ref]}}
    forged = {"kind": "PyTorchJob", "metadata": {"uid": "job-2", "ownerReferences": [ref]}}
    assert is_runs_job(job, "u-1", {"jobUID": "job-1"})
    assert not is_runs_job(forged, "u-1", {"jobUID": "job-1"})
    assert is_runs_job(forged, "u-1", {})  # nothing recorded yet: taken once, then recorded
    assert not is_runs_job(job, "u-2", {"jobUID": "job-1"})


def test_finished_and_had_job_read_anything() -> None:
    for junk in ({}, {"conditions": "x"}, {"conditions": [None, 3]}, {"phase": 3}):
        assert not finished(junk) and not had_job(junk) and refused_at(junk) is None


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

    from megdet.controller.planning import plan_children
    from megdet.controller.run_summary import with_summary

    schema = _crd_status_schema()
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": "vision", "uid": "u-1", "generation": 1},
        "spec": {"gpus": 16},
    }
    planned = plan_children(run)
    status: dict[str, Any] = after({}, Created(planned), T0, 1, planned.job)
    written = [dict(status)]
    for state in (
        JobState("Running", "Running", "", start_time=T0),
        JobState("Restarting", "Restarting", "pod failed"),
        JobState("Suspended", "Suspended", ""),
        JobState("Failed", "Failed", "exit 1", completion_time=T1),
    ):
        status.update(next_status(status, state, T1, 1))
        written.append(dict(status))
    conflict = NotCreated("JobNameConflict", conflict_message("PyTorchJob", "r"))
    written.append(after(status, conflict, T1, 2))
    written.append(after(status, SpecInvalid(("spec.gpus: bad",)), T1, 2))
    written.append(after(status, JobGone("PyTorchJob", "r"), T1, 2))
    running = {**status, "phase": "Running"}
    written.append(after(running, JobGone("PyTorchJob", "r"), T1, 2))
    written.append(after(status, Refused("refused"), T1, 2))
    # What the status writer adds to a finished run's status (controller/run_summary.py).
    done = {**written[4], "jobUID": "job-1", "startup": {"attempt": 1, "totalSeconds": 9}}
    finished_run = with_summary(done)
    assert finished_run["summary"]["phase"] == "Failed"
    written.append(finished_run)
    for status in written:
        jsonschema.validate(status, schema)  # types, enums (phase)
        assert _pruned(status, schema) == []  # nothing the API server would silently drop
