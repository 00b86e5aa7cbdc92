"""The status the controller writes fits the status schema the CRD declares.

A real API server prunes status fields its schema does not declare (kmock does not), so every
status the controller's pure functions produce is checked here against the CRD's status schema,
converted to JSON Schema: no unknown field, the right types, the phase enum.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from megdet.api.crd import build_crd
from megdet.api.schema import to_json_schema
from megdet.controller.job_state import JobState
from megdet.controller.planning import Planned, plan_children
from megdet.controller.status import (
    Created,
    NotCreated,
    SpecInvalid,
    conflict_message,
    desired_status,
    next_status,
)

NOW = "2026-11-30T10:00:00Z"
RUN = {
    "apiVersion": "megdet.io/v1alpha1",
    "kind": "MegDetRun",
    "metadata": {"name": "r50", "namespace": "vision", "uid": "u-1", "generation": 3},
    "spec": {"gpus": 16, "dataset": {"claimName": "coco"}},
}


@pytest.fixture(scope="module")
def status_validator() -> jsonschema.Draft7Validator:
    (version,) = build_crd()["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return jsonschema.Draft7Validator(to_json_schema(status))


def planned_status(planned: Planned, job_uid: str | None = None) -> dict[str, Any]:
    """The first status of a run whose job was just created."""
    meta = {**planned.job["metadata"], **({"uid": job_uid} if job_uid else {})}
    return desired_status(RUN, {**planned.job, "metadata": meta}, Created(planned), NOW, 3)


def assert_fits(validator: jsonschema.Draft7Validator, status: dict[str, Any]) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(status)]
    assert errors == [], status


@pytest.mark.parametrize(
    "state",
    [
        JobState("Pending", "JobCreated", "job created"),
        JobState("Running", "JobRunning", "running", start_time=NOW),
        JobState("Restarting", "JobRestarting", "a pod failed", start_time=NOW),
        JobState("Succeeded", "JobSucceeded", "done", start_time=NOW, completion_time=NOW),
        JobState("Failed", "JobFailed", "backoff limit", start_time=NOW, completion_time=NOW),
        JobState("Suspended", "JobSuspended", "suspended"),
    ],
    ids=lambda s: s.phase,
)
def test_planned_status_fits_the_schema(status_validator, state):
    planned = plan_children(RUN)
    assert isinstance(planned, Planned)
    status = planned_status(planned, job_uid="job-uid-1")
    assert_fits(status_validator, status)
    assert status["worldSize"] == 16 and status["jobName"] == "r50"
    assert status["jobUID"] == "job-uid-1"
    later = {**status, **next_status(status, state, NOW, 3)}
    assert_fits(status_validator, later)
    assert later["phase"] == state.phase


def test_invalid_and_conflict_status_fit_the_schema(status_validator):
    problems = ("spec.gpus: 12 is not a multiple of gpusPerNode 8",)
    invalid = desired_status(RUN, None, SpecInvalid(problems), NOW, 2)
    assert_fits(status_validator, invalid)
    conflict = NotCreated("JobNameConflict", conflict_message("PyTorchJob", "r50"))
    assert_fits(status_validator, desired_status(RUN, None, conflict, NOW, 2))


def test_the_schema_check_has_teeth(status_validator):
    status = planned_status(plan_children(RUN))
    with pytest.raises(AssertionError):
        assert_fits(status_validator, {**status, "phase": "Sleeping"})
    with pytest.raises(AssertionError):
        assert_fits(status_validator, {**status, "kopf": {"progress": {}}})
