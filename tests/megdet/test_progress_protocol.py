"""megdet.progress: the trainer's report and the controller's status.progress, one module.

Round trip (what the trainer sends is what the controller shows), Trainer v2.3's bounds on
every request (percent 0..100, ETA 0..int32, <= 256 metrics, names and values 1..64
characters, lastUpdatedTime RFC 3339) and to_status never raising on any input.
"""

from __future__ import annotations

import contextlib
import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megdet.progress import (
    MAX_INT32,
    MAX_METRIC_LENGTH,
    MAX_METRICS,
    METRIC_NAMES,
    NUMBER_METRICS,
    REPORT_METRICS,
    STAGES,
    Progress,
    format_time,
    parse_time,
    run_audience,
    run_status_path,
    to_request,
    to_status,
)

# Aware datetimes Trainer can hold (metav1.Time: whole seconds, years 1..9999).
times = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.just(UTC)
).map(lambda d: format_time(d))
counts = st.integers(0, 10**12)
maybe = st.none

numbers = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def progresses(draw) -> Progress:
    return Progress(
        iteration=draw(counts),
        max_iter=draw(st.integers(0, 10**9)),
        images_seen=draw(maybe() | counts),
        planned_images=draw(maybe() | counts),
        images_per_second=draw(maybe() | numbers),
        eta_seconds=draw(maybe() | st.integers(0, 10**15)),
        ap=draw(maybe() | numbers),
        ap50=draw(maybe() | numbers),
        eval_iteration=draw(maybe() | counts),
        checkpoint_iteration=draw(maybe() | counts),
        checkpoint_time=draw(maybe() | times),
        updated_time=draw(times),
        stage=draw(maybe() | st.sampled_from(STAGES)),
        stage_time=draw(maybe() | times),
        world_time=draw(maybe() | times),
        loaded_time=draw(maybe() | times),
        first_iteration_time=draw(maybe() | times),
        totals=draw(
            maybe()
            | st.fixed_dictionaries(
                {},
                optional={
                    name: numbers if name in NUMBER_METRICS else st.integers(0, 10**12)
                    for name in REPORT_METRICS
                },
            )
        ),
    )


def check_trainer_bounds(request: dict) -> None:
    """What Trainer v2.3's TrainerStatus / Metric markers require (trainjob_types.go)."""
    assert set(request) == {"trainerStatus"}
    ts = request["trainerStatus"]
    assert set(ts) <= {
        "progressPercentage",
        "estimatedRemainingSeconds",
        "metrics",
        "lastUpdatedTime",
    }
    if "progressPercentage" in ts:
        assert type(ts["progressPercentage"]) is int and 0 <= ts["progressPercentage"] <= 100
    if "estimatedRemainingSeconds" in ts:
        eta = ts["estimatedRemainingSeconds"]
        assert type(eta) is int and 0 <= eta <= MAX_INT32
    assert len(ts["metrics"]) <= MAX_METRICS
    names = [m["name"] for m in ts["metrics"]]
    assert len(names) == len(set(names))
    for m in ts["metrics"]:
        assert set(m) == {"name", "value"}
        assert isinstance(m["name"], str) and 1 <= len(m["name"]) <= MAX_METRIC_LENGTH
        assert isinstance(m["value"], str) and 1 <= len(m["value"]) <= MAX_METRIC_LENGTH
    assert parse_time(ts["lastUpdatedTime"]) is not None
    json.dumps(request, allow_nan=False)  # strict JSON: Go's decoder refuses NaN


def expected_status(p: Progress) -> dict:
    """status.progress as the design says it follows from a Progress."""

    def num(x):
        return None if x is None or not math.isfinite(x) else round(x, 4) + 0.0

    updated = parse_time(p.updated_time)
    out = {
        "iteration": p.iteration,
        "maxIter": p.max_iter,
        "percent": None if p.max_iter == 0 else min(100, p.iteration * 100 // p.max_iter),
        "imagesSeen": p.images_seen,
        "plannedImages": p.planned_images,
        "imagesPerSecond": num(p.images_per_second),
        "etaSeconds": None if p.eta_seconds is None else min(p.eta_seconds, MAX_INT32),
        "ap": num(p.ap),
        "ap50": num(p.ap50),
        "evalIteration": p.eval_iteration,
        "checkpointIteration": p.checkpoint_iteration,
        "checkpointTime": p.checkpoint_time,
        "updatedTime": p.updated_time,
        "stage": p.stage,
        "stageTime": p.stage_time,
        "worldTime": p.world_time,
        "loadedTime": p.loaded_time,
        "firstIterationTime": p.first_iteration_time,
    }
    for name, value in (p.totals or {}).items():  # ints clamped to int32 as the ETA is
        out[name] = num(value) if name in NUMBER_METRICS else min(value, MAX_INT32)
    if out["etaSeconds"] is not None:
        with contextlib.suppress(OverflowError):
            out["etaTime"] = format_time(updated + timedelta(seconds=out["etaSeconds"]))
    return {k: v for k, v in out.items() if v is not None}


def test_names_and_paths_follow_trainers_shape_under_megdet_io():
    assert (
        run_audience("team-a", "r50", "8c1e")
        == "megdet.io/v1alpha1/namespaces/team-a/megdetruns/r50/status/8c1e"
    )
    # A run created again under the same name has a new uid: another audience.
    assert run_audience("team-a", "r50", "8c1e") != run_audience("team-a", "r50", "9d2f")
    assert (
        run_status_path("team-a", "r50")
        == "/apis/megdet.io/v1alpha1/namespaces/team-a/megdetruns/r50/status"
    )


def test_a_typical_report_is_exactly_trainers_format():
    p = Progress(
        iteration=1200,
        max_iter=45000,
        images_seen=1200 * 32,
        planned_images=45000 * 32,
        images_per_second=251.3333333,
        eta_seconds=5700,
        ap=12.345678,
        ap50=25.5,
        eval_iteration=1000,
        checkpoint_iteration=1000,
        checkpoint_time="2026-03-01T10:00:00.250+01:00",
        updated_time="2026-03-01T09:30:00Z",
        stage="training",
        stage_time="2026-03-01T08:00:03Z",
        world_time="2026-03-01T08:00:00Z",
        loaded_time="2026-03-01T08:00:01Z",
        first_iteration_time="2026-03-01T08:00:03Z",
        totals={"attempts": 2, "wallSeconds": 5400, "setupSeconds": 120, "stepsSeconds": 4900,
                "hooksSeconds": 300, "evaluationSeconds": 250, "stepsImagesPerSecond": 250.5},
    )  # fmt: skip
    request = to_request(p)
    check_trainer_bounds(request)
    ts = request["trainerStatus"]
    assert ts["progressPercentage"] == 2  # 2.67 % rounded down: 100 only when done
    assert ts["estimatedRemainingSeconds"] == 5700
    assert ts["lastUpdatedTime"] == "2026-03-01T09:30:00Z"
    assert [m["name"] for m in ts["metrics"]] == list(METRIC_NAMES)
    values = {m["name"]: m["value"] for m in ts["metrics"]}
    assert values["imagesPerSecond"] == "251.3333"
    assert (values["attempts"], values["wallSeconds"]) == ("2", "5400")
    assert values["ap"] == "12.3457"
    assert values["checkpointTime"] == "2026-03-01T09:00:00Z"  # normalized to UTC
    status, problems = to_status(ts)
    assert problems == []
    assert status == expected_status(p) | {"checkpointTime": "2026-03-01T09:00:00Z"}
    assert status["etaTime"] == "2026-03-01T11:05:00Z"
    assert status["percent"] == 2


def test_only_known_facts_are_sent():
    p = Progress(iteration=0, max_iter=100, updated_time="2026-01-01T00:00:00Z")
    ts = to_request(p)["trainerStatus"]
    assert ts == {
        "progressPercentage": 0,
        "metrics": [{"name": "iteration", "value": "0"}, {"name": "maxIter", "value": "100"}],
        "lastUpdatedTime": "2026-01-01T00:00:00Z",
    }
    assert to_status(ts) == (
        {"iteration": 0, "maxIter": 100, "percent": 0, "updatedTime": "2026-01-01T00:00:00Z"},
        [],
    )


@settings(max_examples=400, deadline=None)
@given(progresses())
def test_every_progress_round_trips_within_trainers_bounds(p):
    request = to_request(p)
    check_trainer_bounds(request)
    status, problems = to_status(json.loads(json.dumps(request))["trainerStatus"])
    assert problems == []
    assert status == expected_status(p)


def test_out_of_range_facts_are_clamped_or_left_out_never_sent_invalid():
    p = Progress(
        iteration=500,
        max_iter=100,  # past the end (a resumed run with a shorter schedule)
        images_per_second=math.inf,
        eta_seconds=10**12,
        ap=math.nan,
        ap50=-0.0,
        images_seen=10**70,  # 71 digits: longer than a metric value may be
        updated_time="2026-01-01T00:00:00Z",
    )
    ts = to_request(p)["trainerStatus"]
    check_trainer_bounds({"trainerStatus": ts})
    assert ts["progressPercentage"] == 100
    assert ts["estimatedRemainingSeconds"] == MAX_INT32
    names = {m["name"]: m["value"] for m in ts["metrics"]}
    assert "imagesPerSecond" not in names and "ap" not in names and "imagesSeen" not in names
    assert names["ap50"] == "0.0"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"iteration": -1},
        {"max_iter": True},
        {"eta_seconds": -5},
        {"ap": "41"},
        {"checkpoint_time": "yesterday"},
        {"stage": "sleeping"},
        {"world_time": "2026-01-01"},
        {"updated_time": "2026-01-01 00:00:00"},  # no T, no zone
        {"updated_time": "2026-01-01T00:00:00"},  # no zone
    ],
)
def test_progress_refuses_values_no_report_could_carry(kwargs):
    base = {"iteration": 1, "max_iter": 10, "updated_time": "2026-01-01T00:00:00Z"}
    with pytest.raises(ValueError, match=r"Progress\."):
        Progress(**(base | kwargs))


@pytest.mark.parametrize(
    ("trainer_status", "field", "kept"),
    [
        (None, "trainerStatus", {}),
        ([1, 2], "trainerStatus", {}),
        ({}, "lastUpdatedTime", {}),
        ({"lastUpdatedTime": "soon"}, "lastUpdatedTime", {}),
        (
            {"lastUpdatedTime": "2026-01-01T00:00:00Z", "progressPercentage": 101},
            "progressPercentage",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {"lastUpdatedTime": "2026-01-01T00:00:00Z", "progressPercentage": True},
            "progressPercentage",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {"lastUpdatedTime": "2026-01-01T00:00:00Z", "estimatedRemainingSeconds": -1},
            "estimatedRemainingSeconds",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {"lastUpdatedTime": "2026-01-01T00:00:00Z", "metrics": {"ap": "1"}},
            "metrics",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [{"name": "ap", "value": "x" * 65}, {"name": "ap50", "value": "7"}],
            },
            "metrics[0].value (ap)",
            {"updatedTime": "2026-01-01T00:00:00Z", "ap50": 7.0},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [
                    {"name": "iteration", "value": "-3"},
                    {"name": "maxIter", "value": "9"},
                ],
            },
            "metrics[0].value (iteration)",
            {"updatedTime": "2026-01-01T00:00:00Z", "maxIter": 9},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [{"name": "ap", "value": "nan"}],
            },
            "metrics[0].value (ap)",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [{"name": "x" * 65, "value": "1"}],
            },
            "metrics[0].name",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [{"name": "iteration", "value": "1"}] * 2,
            },
            "metrics[1]",
            {"updatedTime": "2026-01-01T00:00:00Z", "iteration": 1},
        ),
        (
            {
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
                "metrics": [{"name": f"user{i}", "value": "1"} for i in range(300)],
            },
            "metrics",
            {"updatedTime": "2026-01-01T00:00:00Z"},
        ),
    ],
)
def test_bad_fields_become_problems_naming_them_and_the_rest_is_kept(trainer_status, field, kept):
    status, problems = to_status(trainer_status)
    assert status == kept
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"trainerStatus.{field}:" if field != "trainerStatus" else "trainerStatus:"
    )


def test_a_stage_outside_the_stages_is_a_problem_naming_them():
    status, problems = to_status(
        {
            "lastUpdatedTime": "2026-01-01T00:00:00Z",
            "metrics": [{"name": "stage", "value": "napping"}, {"name": "stage", "value": "x"}],
        }
    )
    assert status == {"updatedTime": "2026-01-01T00:00:00Z"}
    assert problems[0] == (
        "trainerStatus.metrics[0].value (stage): 'napping' is not one of loading, "
        "firstIteration, training, evaluating, finished"
    )


def test_unknown_metrics_are_someone_elses_and_percent_follows_the_iterations():
    status, problems = to_status(
        {
            "lastUpdatedTime": "2026-01-01T00:00:00+02:00",
            "metrics": [
                {"name": "loss", "value": "0.5"},
                {"name": "iteration", "value": "250"},
                {"name": "maxIter", "value": "1000"},
            ],
        }
    )
    assert problems == []
    assert status == {
        "updatedTime": "2025-12-31T22:00:00Z",
        "iteration": 250,
        "maxIter": 1000,
        "percent": 25,
    }


def test_an_eta_past_year_9999_keeps_the_seconds_and_says_so():
    status, problems = to_status(
        {"lastUpdatedTime": "9999-12-31T23:00:00Z", "estimatedRemainingSeconds": 7200}
    )
    assert status == {"updatedTime": "9999-12-31T23:00:00Z", "etaSeconds": 7200}
    assert problems == ["trainerStatus.estimatedRemainingSeconds: ends past year 9999"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=20), children, max_size=5),
    max_leaves=30,
)
metric_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(METRIC_NAMES) | json_values,
        "value": st.text(max_size=70) | json_values,
    },
)
status_like = st.fixed_dictionaries(
    {},
    optional={
        "progressPercentage": json_values | st.integers(-5, 105),
        "estimatedRemainingSeconds": json_values | st.integers(),
        "lastUpdatedTime": times | json_values | st.text(max_size=40),
        "metrics": st.lists(metric_like, max_size=10) | json_values,
    },
)


@settings(max_examples=500, deadline=None)
@given(json_values | status_like)
def test_to_status_never_raises_and_keeps_only_valid_fields(garbage):
    status, problems = to_status(garbage)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert all(p.startswith("trainerStatus") for p in problems)
    if "percent" in status:
        assert type(status["percent"]) is int and 0 <= status["percent"] <= 100
    if "etaSeconds" in status:
        assert type(status["etaSeconds"]) is int and 0 <= status["etaSeconds"] <= MAX_INT32
    for key in ("iteration", "maxIter", "imagesSeen", "plannedImages", "evalIteration",
                "checkpointIteration"):  # fmt: skip
        if key in status:
            assert type(status[key]) is int and status[key] >= 0
    for key in ("imagesPerSecond", "ap", "ap50"):
        if key in status:
            assert type(status[key]) is float and math.isfinite(status[key])
    for key in ("updatedTime", "checkpointTime", "etaTime"):
        if key in status:
            assert parse_time(status[key]) is not None and status[key].endswith("Z")
    json.dumps(status, allow_nan=False)


def test_a_run_total_past_int32_is_left_out_naming_the_bound_and_unknown_totals_refused():
    metrics = [{"name": "wallSeconds", "value": "99999999999"}, {"name": "attempts", "value": "3"}]
    status, problems = to_status({"lastUpdatedTime": "2026-01-01T00:00:00Z", "metrics": metrics})
    assert "wallSeconds" not in status and status["attempts"] == 3
    assert problems == [
        f"trainerStatus.metrics[0].value (wallSeconds): '99999999999' is not a whole number "
        f"0..{MAX_INT32}"
    ]
    with pytest.raises(ValueError, match=r"Progress\.totals: 'lossSeconds' is not one of"):
        Progress(iteration=1, max_iter=1, updated_time="2026-01-01T00:00:00Z",
                 totals={"lossSeconds": 1})  # fmt: skip
    with pytest.raises(ValueError, match=r"Progress.totals\['attempts'\] must be an integer"):
        Progress(iteration=1, max_iter=1, updated_time="2026-01-01T00:00:00Z",
                 totals={"attempts": -1})  # fmt: skip
