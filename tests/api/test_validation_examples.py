"""examples/ and hand-written invalid MegDetRuns: what the CRD, CEL and validate_run say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from megdet.api.cel_rules import IMMUTABLE_FIELDS
from megdet.api.crd import build_crd
from megdet.api.schema import apply_defaults, to_json_schema
from megdet.api.validation import validate_run, validate_update
from megdet.controller.render import render_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def cr_schema() -> dict[str, Any]:
    (version,) = build_crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def load(path: Path) -> dict[str, Any]:
    (doc,) = yaml.safe_load_all(path.read_text())
    return doc


def test_examples_cover_8_16_and_64_gpus_with_ib_and_gang():
    specs = {load(p)["spec"]["gpus"]: load(p)["spec"] for p in EXAMPLES}
    assert set(specs) == {8, 16, 64}
    assert any(s.get("nccl", {}).get("ib", {}).get("enabled") for s in specs.values())
    assert any(s.get("gang", {}).get("enabled") for s in specs.values())
    for path in EXAMPLES:
        assert 10 <= len(path.read_text().splitlines()) <= 25, path.name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path, cr_schema):
    doc = load(path)
    assert (doc["apiVersion"], doc["kind"]) == ("megdet.io/v1alpha1", "MegDetRun")
    # The CRD's schema, as JSON Schema, on the object as the API server would default it.
    defaulted = dict(doc, spec=apply_defaults(cr_schema["properties"]["spec"], dict(doc["spec"])))
    jsonschema.validate(defaulted, to_json_schema(cr_schema))
    assert validate_run(doc["spec"], name=doc["metadata"]["name"]) == []


# What each example's comment promises, from plan_run via render_run.
PLANS = {
    "megdetrun-8gpu.yaml": (8, 1, 16, 0.02, 90000),
    "megdetrun-16gpu-ib.yaml": (16, 2, 32, 0.04, 45000),
    "megdetrun-64gpu-gang.yaml": (64, 8, 128, 0.16, 11250),
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_plan(path):
    doc = load(path)
    plan = render_run(doc["metadata"]["name"], "vision", doc["spec"]).status_plan()
    got = (plan["worldSize"], plan["nodes"], plan["globalBatch"], plan["lr"], plan["maxIter"])
    assert got == pytest.approx(PLANS[path.name])


BASE = {"gpus": 16, "dataset": {"claimName": "coco"}}

# spec change -> the field path validate_run must name (and a word of the message).
INVALID = [
    ({"gpus": 12}, "spec.gpus", "multiple of gpusPerNode"),
    ({"gpus": 0}, "spec.gpus", "minimum"),
    ({"gpus": "16"}, "spec.gpus", "not of type"),
    ({"gpus": True}, "spec.gpus", "not of type"),
    ({"gpu": 16}, "spec.gpu", "unknown field"),
    ({"imagesPerGpu": 0}, "spec.imagesPerGpu", "minimum"),
    ({"baseLr": 0}, "spec.baseLr", "minimum"),
    ({"scaling": "cosine"}, "spec.scaling", "not one of"),
    ({"schedule": "cosine"}, "spec.schedule", "not one of"),
    ({"steps": [80000, 60000]}, "spec.steps", "strictly increasing"),
    ({"steps": [60000, 95000]}, "spec.steps", "below maxIter"),
    ({"warmupIters": 90000}, "spec.warmupIters", "below maxIter"),
    ({"maxIter": 1, "gpus": 64, "steps": []}, "spec.maxIter", "less than one iteration"),
    ({"gpus": 64, "maxIter": 100, "steps": [50, 51], "warmupIters": 0}, "spec.steps", "collapse"),
    ({"syncBN": "some"}, "spec.syncBN", "not one of"),
    ({"dataset": {"claimName": "Not_A_PVC"}}, "spec.dataset.claimName", "does not match"),
    ({"dataset": {"claimName": "coco", "valJson": ""}}, "spec.dataset.valJson", "neither"),
    ({"nccl": {"ib": {"enabled": True}}}, "spec.nccl.ib.rdmaResourceName", "rdmaResourceName"),
    ({"nccl": {"ib": {"enabled": "yes"}}}, "spec.nccl.ib.enabled", "not of type"),
    ({"nccl": {"ib": {"timeout": 99}}}, "spec.nccl.ib.timeout", "maximum"),
    ({"extraOverrides": {"SOLVER.BASE_LR": "0.1"}}, "spec.extraOverrides", "use spec.baseLr"),
    ({"extraOverrides": {"test.eval_period": 1}}, "spec.extraOverrides", "detectron2 config"),
    # A MegDetRun's override values are int-or-string (the one union the API server can
    # type-check; floats and booleans are quoted).
    (
        {"extraOverrides": {"TEST.EVAL_PERIOD": [1]}},
        "spec.extraOverrides[TEST.EVAL_PERIOD]",
        "'integer', 'string'",
    ),
    (
        {"extraOverrides": {"SOLVER.MOMENTUM": 0.9}},
        "spec.extraOverrides[SOLVER.MOMENTUM]",
        "'integer', 'string'",
    ),
    ({"restartPolicy": "Sometimes"}, "spec.restartPolicy", "not one of"),
    ({"shm": {"sizeLimit": "lots"}}, "spec.shm.sizeLimit", "does not match"),
    ({"nameOverride": "x"}, "spec.nameOverride", "unknown field"),
    ({"resources": {"cpu": "1.5"}}, "spec.resources.cpu", "whole number"),
    ({"resources": {"memoryLimit": "300Gi"}}, "spec.resources.memoryLimit", "Guaranteed"),
    (
        {"gang": {"enabled": True, "scheduleTimeoutSeconds": 60}},
        "spec.gang.scheduleTimeoutSeconds",
        "no effect",
    ),
    (
        {"gang": {"enabled": True, "schedulerName": "sp", "queue": "q"}},
        "spec.gang.queue",
        "no effect",
    ),
    (
        {"kueue": {"queueName": "q"}, "runPolicy": {"suspend": True}},
        "spec.runPolicy.suspend",
        "Kueue owns suspend",
    ),
]


@pytest.mark.parametrize(("change", "path", "words"), INVALID, ids=[i[1] for i in INVALID])
def test_invalid_spec_names_the_field(change, path, words, cr_schema):
    spec = {**BASE, **change}
    problems = validate_run(spec)
    assert problems, f"{spec} was accepted"
    assert any(p.path == path and words in p.message for p in problems), problems


@pytest.mark.parametrize(("change", "path", "words"), INVALID, ids=[i[1] for i in INVALID])
def test_every_invalid_spec_fails_the_crd_alone(change, path, words, cr_schema):
    """Each is refused at `kubectl apply` already (schema or CEL), on the same field."""
    from megdet.api.validation import crd_problems, default_spec

    problems = crd_problems(default_spec({**BASE, **change}))
    assert any(p.path == path for p in problems), problems


@pytest.mark.parametrize(
    ("spec", "name", "words", "pytorchjob_ok"),
    [
        # Not an RFC 1035 label: the PyTorchJob webhook refuses it too (NameIsDNS1035Label).
        ({"target": "trainjob"}, "9lives", "RFC 1035", False),
        # 64 GPUs = 8 nodes: JobSet pod names <name>-node-0-7-xxxxx need 15 characters.
        ({"target": "trainjob", "gpus": 64}, "r" * 49, "too long for this many nodes", True),
    ],
)
def test_trainjob_names_are_checked_at_apply(spec, name, words, pytorchjob_ok):
    problems = validate_run(spec, name=name)
    assert [p.path for p in problems] == ["metadata.name"]
    assert words in problems[0].message
    on_v1 = validate_run({**spec, "target": "pytorchjob"}, name=name)
    assert on_v1 == [] if pytorchjob_ok else [p.path for p in on_v1] == ["metadata.name"]


def test_metadata_name_too_long_is_refused():
    problems = validate_run(BASE, name="r" * 51)
    assert [p.path for p in problems] == ["metadata.name"]
    assert validate_run(BASE, name="r" * 50) == []


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"gpus": 32}, "spec.gpus"),
        ({"baseLr": 0.01}, "spec.baseLr"),
        ({"steps": [50000, 80000]}, "spec.steps"),
        ({"dataset": {"claimName": "other"}}, "spec.dataset"),
        ({"output": {"claimName": "other"}}, "spec.output"),
        ({"syncBN": "all"}, "spec.syncBN"),
    ],
)
def test_changing_an_immutable_field_is_refused_with_the_reason(change, path):
    problems = validate_update(BASE, {**BASE, **change})
    assert [p.path for p in problems] == [path]
    field = path.removeprefix("spec.")
    assert problems[0].message == f"{field} is immutable: {IMMUTABLE_FIELDS[field]}"


@pytest.mark.parametrize(
    "change",
    [
        {"runPolicy": {"suspend": True}},
        {"image": {"tag": "v2"}},
        {"nccl": {"debug": "INFO"}},
        {"gang": {"enabled": True}},
    ],
)
def test_operational_fields_stay_changeable(change):
    assert validate_update(BASE, {**BASE, **change}) == []


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        (
            {"gang": {"enabled": True, "queue": "a"}},
            {"gang": {"enabled": True, "queue": "b"}},
            "spec.gang.queue",
        ),
        (
            {"target": "trainjob"},
            {"target": "trainjob", "runPolicy": {"activeDeadlineSeconds": 9}},
            "spec.runPolicy.activeDeadlineSeconds",
        ),
        ({"target": "trainjob"}, {"target": "pytorchjob"}, "spec.target"),
    ],
)
def test_job_fields_fixed_once_the_job_exists(old, new, path):
    problems = validate_update({**BASE, **old}, {**BASE, **new})
    assert [p.path for p in problems] == [path]


def test_deadline_stays_changeable_for_pytorchjobs():
    new = {**BASE, "runPolicy": {"activeDeadlineSeconds": 9}}
    assert validate_update(BASE, new) == []


ELASTIC = {**BASE, "gpus": 16, "elastic": {"minGpus": 8, "maxGpus": 32}}


@pytest.mark.parametrize("gpus", [8, 24, 32])
def test_an_elastic_run_may_change_gpus_within_its_bounds(gpus):
    assert validate_update(ELASTIC, {**ELASTIC, "gpus": gpus}) == []


@pytest.mark.parametrize("gpus", [4, 40])
def test_gpus_outside_the_bounds_are_refused_naming_gpus_and_the_bounds(gpus):
    problems = validate_update(ELASTIC, {**ELASTIC, "gpus": gpus})
    assert [p.path for p in problems] == ["spec.gpus"]
    assert problems[0].message.startswith(
        "gpus must be within elastic.minGpus..elastic.maxGpus, the bounds the run declared"
    )


def test_a_run_without_bounds_keeps_gpus_fixed_with_the_same_message():
    problems = validate_update(BASE, {**BASE, "gpus": 32})
    assert [p.path for p in problems] == ["spec.gpus"]
    assert problems[0].message == f"gpus is immutable: {IMMUTABLE_FIELDS['gpus']}"


@pytest.mark.parametrize(
    "change",
    [
        {"elastic": {"minGpus": 8, "maxGpus": 64}},
        {"elastic": {"minGpus": 0, "maxGpus": 0}, "gpus": 16},
        {"elastic": {"minGpus": 8, "maxGpus": 32, "resize": "rescale"}},
    ],
)
def test_the_bounds_and_the_resize_mode_are_fixed_at_creation(change):
    problems = validate_update(ELASTIC, {**ELASTIC, **change})
    assert "spec.elastic" in [p.path for p in problems]
    assert any(
        p.message == f"elastic is immutable: {IMMUTABLE_FIELDS['elastic']}" for p in problems
    )


@pytest.mark.parametrize(
    ("elastic", "gpus"),
    [
        ({"minGpus": 8, "maxGpus": 0}, 8),  # one bound alone
        ({"minGpus": 0, "maxGpus": 32}, 16),
        ({"minGpus": 16, "maxGpus": 8}, 16),
        ({"minGpus": 24, "maxGpus": 32}, 16),  # gpus below its own bounds
        ({"minGpus": 8, "maxGpus": 12}, 16),
    ],
)
def test_bounds_that_do_not_hold_gpus_are_refused_at_creation(elastic, gpus):
    spec = {**BASE, "gpus": gpus, "elastic": elastic}
    problems = validate_run(spec)
    assert [p.path for p in problems] == ["spec.gpus"]
    assert "elastic.minGpus..elastic.maxGpus" in problems[0].message
