"""``status.summary`` (controller/run_summary.py): what a finished run's summary holds, what it
leaves out, and that whatever a status holds, the summary fits the committed CRD's schema."""

from __future__ import annotations

import copy
import functools
from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st
from test_status import _crd_status_schema, _pruned

from megdet.controller.run_summary import (
    FIELDS,
    MAX_SEGMENTS,
    MAX_TEXT,
    build_summary,
    summary_stale,
    with_summary,
)
from megdet.controller.status_writer import changed_fields


def cond(kind: str, status: str = "True", reason: str = "", when: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason or kind,
            "lastTransitionTime": when or "2026-12-06T10:00:00Z"}  # fmt: skip


#: A run that trained to Succeeded: what the controller's writers leave in its status.
PROGRESS = {
    "iteration": 30, "maxIter": 30, "percent": 100, "imagesSeen": 120, "plannedImages": 120,
    "imagesPerSecond": 5.25, "etaSeconds": 0, "ap": 31.5, "ap50": 52.25, "evalIteration": 30,
    "checkpointIteration": 30, "updatedTime": "2026-12-06T10:09:58Z", "stage": "finished",
    "stageTime": "2026-12-06T10:09:58Z", "worldTime": "2026-12-06T10:01:10Z",
    "loadedTime": "2026-12-06T10:01:40Z", "firstIterationTime": "2026-12-06T10:01:58Z",
    "attempts": 1, "wallSeconds": 530, "setupSeconds": 40, "stepsSeconds": 420,
    "hooksSeconds": 30, "evaluationSeconds": 25, "stepsImagesPerSecond": 5.5,
}  # fmt: skip
SUCCEEDED = {
    "phase": "Succeeded", "target": "pytorchjob", "jobName": "r", "jobUID": "job-uid-1",
    "gpus": 2, "worldSize": 2, "nodes": 2, "globalBatch": 4, "lr": 0.005, "maxIter": 30,
    "attempt": 1, "restarts": 0,
    "segments": [{"attempt": 1, "gpus": 2, "globalBatch": 4, "jobUID": "job-uid-1",
                  "startTime": "2026-12-06T10:00:00Z", "reason": "Created"}],
    "startTime": "2026-12-06T10:00:30Z", "completionTime": "2026-12-06T10:10:30Z",
    "startup": {"attempt": 1, "schedulingSeconds": 1, "totalSeconds": 118},
    "conditions": [
        cond("Created"), cond("Running", "False"),
        cond("Succeeded", reason="PyTorchJobSucceeded"),
        cond("FabricDegraded", "False", "NotNCCL"),
    ],
    "progress": PROGRESS,
}  # fmt: skip


def test_a_succeeded_run_gets_every_field_its_sources_give() -> None:
    assert build_summary(SUCCEEDED) == {
        "phase": "Succeeded", "reason": "PyTorchJobSucceeded",
        "ap": 31.5, "ap50": 52.25, "evalIteration": 30, "iteration": 30, "maxIter": 30,
        "imagesSeen": 120, "plannedImages": 120, "imagesPerSecond": 5.25,
        # The trainer's final report: its report's attempts and wall time by part.
        "trainerAttempts": 1, "wallSeconds": 530, "setupSeconds": 40, "stepsSeconds": 420,
        "hooksSeconds": 30, "evaluationSeconds": 25, "stepsImagesPerSecond": 5.5,
        "target": "pytorchjob", "gpus": 2, "worldSize": 2, "nodes": 2, "globalBatch": 4,
        "lr": 0.005, "attempt": 1, "restarts": 0,
        "segments": [{"attempt": 1, "gpus": 2, "globalBatch": 4}],
        "startTime": "2026-12-06T10:00:30Z", "completionTime": "2026-12-06T10:10:30Z",
        "durationSeconds": 600,  # the job's start to its completion
        "startupSeconds": 118,  # status.startup.totalSeconds
        "trainingSeconds": 480,  # first iteration (10:01:58) to finished (10:09:58)
        "finishingSeconds": 32,  # finished to the job's completion
        "fabric": "NotNCCL",
    }  # fmt: skip
    assert list(build_summary(SUCCEEDED)) == [k for k in FIELDS if k in build_summary(SUCCEEDED)]


def test_a_failed_run_gets_what_it_has_and_nothing_guessed() -> None:
    # The job deleted by hand while the pods started: no report, no start-up, no fabric.
    status = {
        key: value for key, value in SUCCEEDED.items()
        if key not in ("progress", "startup", "startTime")
    } | {
        "phase": "Failed",
        "conditions": [cond("Created"), cond("Failed", reason="JobDeleted")],
    }  # fmt: skip
    assert build_summary(status) == {
        "phase": "Failed", "reason": "JobDeleted", "target": "pytorchjob", "gpus": 2,
        "worldSize": 2, "nodes": 2, "globalBatch": 4, "lr": 0.005, "attempt": 1, "restarts": 0,
        "segments": [{"attempt": 1, "gpus": 2, "globalBatch": 4}],
        "completionTime": "2026-12-06T10:10:30Z",
    }  # fmt: skip
    # A trainer that stopped mid-run (not "finished"): its last numbers, no training time.
    stopped = status | {"progress": PROGRESS | {"stage": "training", "iteration": 20}}
    summary = build_summary(stopped)
    assert summary["iteration"] == 20 and summary["ap"] == 31.5
    assert "trainingSeconds" not in summary and "finishingSeconds" not in summary


def test_no_summary_before_the_end_nor_for_a_run_that_never_had_its_job() -> None:
    for phase in ("Pending", "Running", "Restarting", "Suspended", "Invalid"):
        assert build_summary(SUCCEEDED | {"phase": phase}) is None, phase
    assert build_summary({k: v for k, v in SUCCEEDED.items() if k != "jobUID"}) is None
    refused = {
        "phase": "Failed",
        "conditions": [cond("Created", "False", "JobRefused"), cond("Failed", reason="JobRefused")],
    }
    assert build_summary(refused) is None  # a change of its spec tries again
    assert build_summary({}) is None and build_summary(None) is None  # type: ignore[arg-type]


def test_with_summary_writes_it_once_and_removes_one_that_no_longer_applies() -> None:
    old = copy.deepcopy(SUCCEEDED)
    new = with_summary(copy.deepcopy(old))
    assert changed_fields(old, new) == {"summary": build_summary(SUCCEEDED)}
    assert summary_stale(old) and not summary_stale(new)
    # Nothing changed since: nothing to write.
    assert changed_fields(new, with_summary(copy.deepcopy(new))) == {}
    # The trainer's final report lands after the end: the summary follows it.
    late = copy.deepcopy(new)
    late["progress"] = PROGRESS | {"ap": 33.0}
    assert summary_stale(late)
    patch = changed_fields(late, with_summary(copy.deepcopy(late)))
    assert patch == {"summary": {**build_summary(late)}}
    assert patch["summary"]["ap"] == 33.0
    # A run no longer finished (never so in practice but for a refused one tried again).
    again = new | {"phase": "Pending"}
    assert summary_stale(again)
    assert changed_fields(again, with_summary(copy.deepcopy(again))) == {"summary": None}
    assert with_summary({"phase": "Pending"}) == {"phase": "Pending"}  # no summary key at all


def test_values_of_the_wrong_type_are_left_out_and_long_ones_clipped() -> None:
    status = copy.deepcopy(SUCCEEDED)
    status["progress"] |= {"ap": "31.5", "iteration": 29.5, "imagesSeen": True,
                           "ap50": float("nan"), "maxIter": None}  # fmt: skip
    status["conditions"][2]["reason"] = "R" * 1000
    status["startTime"] = "yesterday"
    status["segments"] = [{"attempt": n, "gpus": 2, "globalBatch": "4"} for n in range(1, 11)]
    summary = build_summary(status)
    for key in ("ap", "iteration", "imagesSeen", "ap50", "maxIter", "startTime", "durationSeconds"):
        assert key not in summary, key
    assert summary["reason"] == "R" * MAX_TEXT
    # The first segment and the newest: MAX_SEGMENTS of them.
    assert [s["attempt"] for s in summary["segments"]] == [1, 8, 9, 10]
    assert len(summary["segments"]) == MAX_SEGMENTS
    assert summary["segments"][0] == {"attempt": 1, "gpus": 2}


@functools.cache
def _status_schema() -> dict[str, Any]:
    return _crd_status_schema()


def _schema() -> dict[str, Any]:
    return _status_schema()["properties"]["summary"]


def test_a_full_summary_fits_the_committed_crd_and_nothing_is_pruned() -> None:
    status = with_summary(copy.deepcopy(SUCCEEDED))
    jsonschema.validate(status["summary"], _schema())
    assert _pruned(status, _crd_status_schema()) == []
    assert set(status["summary"]) == set(FIELDS)  # this status exercises every field


_anything = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(
    max_size=300
) | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(),
                                                          max_size=2)  # fmt: skip
_values = st.one_of(
    _anything,
    st.sampled_from(["2026-12-06T10:00:00Z", "2026-12-06T11:00:00Z", "finished", "R" * 400]),
    st.integers(0, 10**6),
    st.floats(0, 100),
)


@functools.cache
def _validator() -> Any:
    return jsonschema.Draft7Validator(_schema())


@settings(max_examples=200, deadline=None)
@given(
    status=st.fixed_dictionaries(
        {"phase": st.sampled_from(["Succeeded", "Failed"]), "jobUID": st.just("u")},
        optional={
            **{key: _values for key in SUCCEEDED if key not in ("phase", "jobUID")},
            "segments": st.lists(st.dictionaries(st.sampled_from(["attempt", "gpus",
                                 "globalBatch", "x"]), _values), max_size=12),
            "progress": st.dictionaries(st.sampled_from(sorted(PROGRESS)), _values),
            "startup": st.dictionaries(st.sampled_from(["totalSeconds", "attempt"]), _values),
        },
    )
)  # fmt: skip
def test_whatever_the_status_holds_the_summary_fits_the_schema(status: dict[str, Any]) -> None:
    summary = build_summary(status)
    if summary is None:  # a refused-looking Failed run
        return
    _validator().validate(summary)
    assert _pruned({"summary": summary}, _status_schema()) == []
    whole = [v for v in summary.values() if isinstance(v, int)]
    whole += [v for s in summary.get("segments", []) for v in s.values()]
    assert all(-(2**63) <= v < 2**63 for v in whole)  # what the API server's JSON keeps
