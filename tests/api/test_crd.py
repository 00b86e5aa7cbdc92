"""The MegDetRun CRD: generated from the run chart, structural, described, valid for Kubernetes."""

from __future__ import annotations

import copy
import functools
import json
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

import cel
import celpy
import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megdet.api import crd as crd_module
from megdet.api.cel_rules import ELASTIC_FIELDS, IMMUTABLE_FIELDS
from megdet.api.crd import (
    CRD_FILE,
    MissingDescriptionsError,
    build_crd,
    crd_yaml,
    spec_schema,
)
from megdet.api.schema import (
    apply_defaults,
    cel_problems,
    coerce_numbers,
    rule_sites,
    schema_problems,
)
from megdet.controller.api import DROPPED_VALUES
from megdet.naming import MAX_JOB_NAME_LENGTH
from megdet.overrides import OWNED_OVERRIDES
from tests.repo_files import RUN_CHART, run_values_schema

#: Keywords a structural schema must not use (apiextensions v1 refuses them).
FORBIDDEN = {"$ref", "$schema", "id", "definitions", "dependencies", "patternProperties",
             "additionalItems", "oneOf", "anyOf", "allOf", "not"}  # fmt: skip


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="module")
def version(crd: Mapping[str, Any]) -> dict[str, Any]:
    (only,) = crd["spec"]["versions"]
    return only


@pytest.fixture(scope="module")
def root(version: Mapping[str, Any]) -> dict[str, Any]:
    return version["schema"]["openAPIV3Schema"]


def nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema node with its path (properties, map values, list items)."""
    yield path, schema
    for name, prop in (schema.get("properties") or {}).items():
        yield from nodes(prop, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from nodes(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), Mapping):
        yield from nodes(schema["items"], f"{path}[]")


def test_committed_crd_is_the_generated_one():
    assert CRD_FILE.read_text() == crd_yaml(), "stale CRD: run `make crd`"


def test_crd_names_and_version(crd, version):
    assert crd["metadata"]["name"] == "megdetruns.megdet.io"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("megdet.io", "Namespaced")
    assert spec["names"]["kind"] == "MegDetRun"
    assert spec["names"]["plural"] == "megdetruns"
    assert spec["names"]["shortNames"] == ["mdr"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "GPUs": ".status.gpus",  # the job's: an elastic run's spec leads during a resize
        "World": ".status.worldSize",
        "Batch": ".status.globalBatch",
        "LR": ".status.lr",
        "Progress": ".status.progress.percent",
        "ETA": ".status.progress.etaTime",
        "AP": ".status.progress.ap",
        "Stage": ".status.stage",  # controller/lifecycle.py: Queued, Scheduling, Training, ...
        "Age": ".metadata.creationTimestamp",
        "Iteration": ".status.progress.iteration",
        "Images/s": ".status.progress.imagesPerSecond",
        "AP50": ".status.progress.ap50",
        "Attempt": ".status.attempt",
        "Checkpoint": ".status.progress.checkpointIteration",
        "Reported": ".status.progress.updatedTime",
    }
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Iteration", "Images/s", "AP50", "Attempt", "Checkpoint", "Reported"}


@pytest.mark.parametrize("k8s_version", ["1.30.0", "1.34.0"])
def test_kubernetes_validate_strict_accepts_the_crd(k8s_version):
    data = yaml.safe_load(CRD_FILE.read_text())
    kubernetes_validate.validate(data, k8s_version, strict=True)  # raises when invalid


def test_kubernetes_validate_strict_refuses_a_typo_in_the_crd(crd):
    # The check above has teeth: a misspelt keyword fails it.
    broken = json.loads(json.dumps(crd))
    spec = broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["gpus"]["minimun"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.34.0", strict=True)


def test_every_field_has_a_description(root):
    missing = [
        path
        for path, node in nodes(root)
        if path and not path.endswith(("[]", ".*")) and path != ".metadata"
        if not node.get("description")
    ]
    assert missing == []


def test_generation_fails_listing_fields_without_a_description(tmp_path, capsys, monkeypatch):
    chart = tmp_path / "megdet"
    shutil.copytree(RUN_CHART, chart)
    schema = json.loads((chart / "values.schema.json").read_text())
    del schema["properties"]["gpus"]["description"]
    del schema["properties"]["nccl"]["properties"]["ib"]["properties"]["hca"]["description"]
    (chart / "values.schema.json").write_text(json.dumps(schema))
    with pytest.raises(MissingDescriptionsError) as excinfo:
        spec_schema(chart)
    assert excinfo.value.paths == ["spec.gpus", "spec.nccl.ib.hca"]
    monkeypatch.setenv("MEGDET_CHART_DIR", str(chart))
    assert crd_module.main(["--output", str(tmp_path / "crd.yaml")]) == 1
    assert "spec.gpus, spec.nccl.ib.hca" in capsys.readouterr().err
    assert not (tmp_path / "crd.yaml").exists()


def test_schema_is_structural(root):
    for path, node in nodes(root):
        assert not FORBIDDEN & set(node), f"{path}: {FORBIDDEN & set(node)}"
        typed = node.get("type") or node.get("x-kubernetes-int-or-string")
        free = node.get("x-kubernetes-preserve-unknown-fields")
        assert typed or free, f"{path}: no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        if "additionalProperties" in node:
            assert node["additionalProperties"] is not False, path
        if node.get("type") == "array":
            assert isinstance(node.get("items"), Mapping), f"{path}: array without items"
    # Only name and generateName may be constrained in metadata, and only at the root.
    assert root["properties"]["metadata"] == {"type": "object"}


def test_spec_drops_the_chart_naming_values(root):
    spec = root["properties"]["spec"]["properties"]
    assert not set(DROPPED_VALUES) & set(spec)
    values = run_values_schema()
    assert set(spec) == set(values) - set(DROPPED_VALUES)


def test_null_type_lists_become_nullable(root):
    spec = root["properties"]["spec"]["properties"]
    assert spec["numWorkers"]["type"] == "integer" and spec["numWorkers"]["nullable"] is True
    timeout = spec["nccl"]["properties"]["ib"]["properties"]["timeout"]
    assert timeout["type"] == "integer" and timeout["nullable"] is True


def test_enums_ranges_and_exclusive_bounds_are_kept(root):
    spec = root["properties"]["spec"]["properties"]
    values = run_values_schema()
    assert spec["scaling"]["enum"] == values["scaling"]["enum"]
    assert (spec["gpus"]["minimum"], spec["gpus"]["maximum"]) == (
        values["gpus"]["minimum"],
        values["gpus"]["maximum"],
    )
    # draft-07 exclusiveMinimum: 0 -> OpenAPI 3.0 minimum: 0 + exclusiveMinimum: true
    assert spec["baseLr"]["minimum"] == values["baseLr"]["exclusiveMinimum"]
    assert spec["baseLr"]["exclusiveMinimum"] is True


def test_free_form_objects_preserve_unknown_fields(root):
    spec = root["properties"]["spec"]["properties"]
    for name in ("affinity", "podSecurityContext"):
        assert spec[name]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"] is True


def test_crd_defaults_are_the_chart_defaults(root):
    """A CR with an empty spec, defaulted by the API server, carries values.yaml's values."""
    chart_defaults = yaml.safe_load((RUN_CHART / "values.yaml").read_text())

    def without_nulls(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_nulls(v) for k, v in value.items() if v is not None}
        return value

    expected = without_nulls({k: v for k, v in chart_defaults.items() if k not in DROPPED_VALUES})
    defaulted = apply_defaults(root["properties"]["spec"], {})
    assert defaulted == expected


def test_defaults_pass_the_schema_and_the_cel_rules(root):
    spec = root["properties"]["spec"]
    defaulted = apply_defaults(spec, {})
    assert schema_problems(spec, defaulted) == []
    assert cel_problems(spec, defaulted) == []


def test_every_cel_rule_compiles_in_both_cel_implementations(root):
    rules = [r["rule"] for _, node in nodes(root) for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) > 20
    env = celpy.Environment()
    for rule in rules:
        cel.compile(rule)
        env.compile(rule)


def test_one_rule_per_owned_override(root):
    overrides = root["properties"]["spec"]["properties"]["extraOverrides"]
    refused = {
        r["message"].split(" ")[0]
        for r in overrides["x-kubernetes-validations"]
        if r["rule"].startswith("!(")
    }
    assert refused == set(OWNED_OVERRIDES)


def test_transition_rules_on_exactly_the_immutable_fields(root):
    spec = root["properties"]["spec"]["properties"]
    with_transition = {
        name
        for name, node in spec.items()
        if any("oldSelf" in r["rule"] for r in node.get("x-kubernetes-validations", []))
    }
    immutable = {
        name
        for name, node in spec.items()
        if any(r["rule"] == "self == oldSelf" for r in node.get("x-kubernetes-validations", []))
    }
    assert immutable == (set(IMMUTABLE_FIELDS) - set(ELASTIC_FIELDS)) & set(spec)
    # gang.queue is fixed once the job exists (kubeflow.org/v1); the rest of gang is not.
    assert with_transition == immutable | {"gang"}
    assert "runPolicy" not in with_transition  # suspend must stay changeable
    # gpus: a rule on the spec (it reads elastic), naming gpus, with the field's message.
    on_spec = {
        r["fieldPath"]: r
        for r in root["properties"]["spec"]["x-kubernetes-validations"]
        if "oldSelf" in r["rule"]
    }
    for name in ELASTIC_FIELDS:
        assert on_spec[f".{name}"]["message"] == f"{name} is immutable: {IMMUTABLE_FIELDS[name]}"


@pytest.mark.parametrize(
    ("length", "ok"), [(MAX_JOB_NAME_LENGTH, True), (MAX_JOB_NAME_LENGTH + 1, False)]
)
def test_metadata_name_rule_uses_the_naming_limit(root, length, ok):
    obj = {
        "metadata": {"name": "r" * length},
        "spec": apply_defaults(root["properties"]["spec"], {}),
    }
    rules = [r for r in root["x-kubernetes-validations"] if "metadata.name" in r["rule"]]
    problems = [p for p in cel_problems({"x-kubernetes-validations": rules}, obj, root="") if p]
    assert (problems == []) is ok
    if not ok:
        # No fieldPath on root rules (the API server refuses one there: root metadata has no
        # properties in the schema), so the problem is at the object; the message names it.
        assert problems[0].path == ""
        assert problems[0].message.startswith("metadata.name")


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize(
    ("name", "ok"), [("r50-fpn", True), ("1run", False), ("a.b", False), ("run-", False)]
)
def test_metadata_name_must_be_an_rfc_1035_label_for_both_targets(root, target, name, ok):
    # The PyTorchJob webhook (NameIsDNS1035Label) and the TrainJob CRD both refuse these names,
    # which the API server alone would accept for a MegDetRun.
    obj = {
        "metadata": {"name": name},
        "spec": apply_defaults(root["properties"]["spec"], {"target": target}),
    }
    rules = [r for r in root["x-kubernetes-validations"] if "metadata.name" in r["rule"]]
    problems = [p for p in cel_problems({"x-kubernetes-validations": rules}, obj, root="") if p]
    assert (problems == []) is ok, problems
    if not ok:
        assert problems[0].path == "" and "RFC 1035" in problems[0].message


def test_status_declares_the_controller_fields(root):
    status = root["properties"]["status"]["properties"]
    assert set(status) == {
        "phase", "conditions", "observedGeneration", "worldSize", "nodes", "globalBatch",
        "lr", "maxIter", "steps", "warmupIters", "jobName", "jobUID", "target", "startTime",
        "completionTime", "restarts", "progress", "handledConfiguration", "gpus", "attempt",
        "segments", "resize", "stage", "startup", "summary",
    }  # fmt: skip
    summary = status["summary"]["properties"]
    assert set(summary) == {
        "phase", "reason", "ap", "ap50", "evalIteration", "iteration", "maxIter", "imagesSeen",
        "plannedImages", "imagesPerSecond", "target", "gpus", "worldSize", "nodes",
        "globalBatch", "lr", "attempt", "restarts", "segments", "startTime", "completionTime",
        "durationSeconds", "startupSeconds", "trainingSeconds", "finishingSeconds", "fabric",
        "trainerAttempts", "wallSeconds", "setupSeconds", "stepsSeconds", "hooksSeconds",
        "evaluationSeconds", "stepsImagesPerSecond",
    }  # fmt: skip
    assert summary["phase"]["enum"] == ["Failed", "Succeeded"]
    assert summary["segments"]["maxItems"] == 4
    assert all(summary[k]["maxLength"] == 256 for k in ("reason", "target", "fabric"))
    progress = status["progress"]["properties"]
    assert set(progress) == {
        "iteration", "maxIter", "percent", "imagesSeen", "plannedImages", "imagesPerSecond",
        "etaSeconds", "etaTime", "ap", "ap50", "evalIteration", "checkpointIteration",
        "checkpointTime", "updatedTime", "stage", "stageTime", "worldTime", "loadedTime",
        "firstIterationTime", "attempts", "wallSeconds", "setupSeconds", "stepsSeconds",
        "hooksSeconds", "evaluationSeconds", "stepsImagesPerSecond",
    }  # fmt: skip
    assert status["phase"]["enum"] == [
        "Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Invalid",
    ]  # fmt: skip
    condition = status["conditions"]["items"]["properties"]
    assert set(condition) == {
        "type", "status", "reason", "message", "lastTransitionTime", "observedGeneration",
    }  # fmt: skip


# -- the two CEL implementations agree ----------------------------------------------------------

_cross_specs = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.integers(1, 130),
        "gpusPerNode": st.integers(1, 16),
        "imagesPerGpu": st.integers(1, 8),
        "maxIter": st.integers(1, 3000),
        "steps": st.lists(st.integers(1, 3000), max_size=4),
        "warmupIters": st.integers(0, 3000),
        "schedule": st.sampled_from(["step", "three-stage"]),
        "extraOverrides": st.dictionaries(
            st.sampled_from(["TEST.EVAL_PERIOD", "SOLVER.BASE_LR", "lower.key"]),
            # int64: the API server's JSON decoder makes larger numbers floats.
            st.one_of(
                st.integers(-(2**63), 2**63 - 1), st.booleans(), st.text(max_size=2), st.just([1])
            ),
            max_size=2,
        ),
        "dataset": st.fixed_dictionaries(
            {"valJson": st.sampled_from(["", "v.json"]), "valImages": st.sampled_from(["", "v"])}
        ),
    },
)


_CELPY = celpy.Environment()


@functools.cache
def _programs(rule: str) -> tuple[cel.Program, Any]:
    return cel.compile(rule), _CELPY.program(_CELPY.compile(rule))


def _both_verdicts(rule: str, activation: dict[str, Any]) -> tuple[bool, bool]:
    """Each implementation's verdict; a rule that cannot be evaluated refuses the object, as
    the API server treats it (cel-python raises on heterogeneous equality such as
    ``[1] == 1``, where cel-go and the Rust interpreter return false)."""
    rust, python = _programs(rule)
    try:
        rust_ok = rust.execute(activation) is True
    except Exception:
        rust_ok = False
    try:
        cel_values = {k: celpy.json_to_cel(v) for k, v in activation.items()}
        python_ok = bool(python.evaluate(cel_values))
    except celpy.CELEvalError:
        python_ok = False
    return rust_ok, python_ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_cross_specs, old=_cross_specs)
def test_cel_python_and_the_rust_interpreter_agree_on_every_rule(root, spec, old):
    schema = root["properties"]["spec"]
    new = coerce_numbers(schema, apply_defaults(schema, copy.deepcopy(spec)))
    before = coerce_numbers(schema, apply_defaults(schema, copy.deepcopy(old)))
    assume(not schema_problems(schema, new) and not schema_problems(schema, before))
    for node, value, old_value, _ in rule_sites(schema, new, before, []):
        for rule in node["x-kubernetes-validations"]:
            activation = {"self": value}
            if "oldSelf" in rule["rule"]:
                activation["oldSelf"] = old_value
            rust, python = _both_verdicts(rule["rule"], activation)
            assert rust is python, (rule["rule"], activation)


# -- JSON Schema constructs without an OpenAPI 3.0 equivalent -----------------------------------


def test_json_schema_constructs_map_to_structural_ones():
    from megdet.api.openapi import convert as _convert

    level = _convert(
        {
            "description": "d",
            "oneOf": [
                {"type": "string", "enum": ["", "LOC"]},
                {"type": "integer", "minimum": 0, "maximum": 2},
            ],
        },
        "LOC",
        "spec.x",
    )
    assert level == {
        "description": "d",
        "x-kubernetes-int-or-string": True,
        "enum": ["", "LOC", 0, 1, 2],
        "default": "LOC",
    }
    nullable = _convert({"type": ["integer", "null"], "exclusiveMinimum": 0}, None, "spec.y")
    assert nullable == {"type": "integer", "nullable": True, "minimum": 0, "exclusiveMinimum": True}
    free = _convert({"type": "object"}, {"a": 1}, "spec.z")
    assert free == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "default": {"a": 1},
    }
    with pytest.raises(ValueError, match="no structural equivalent"):
        _convert({"type": ["string", "integer"]}, None, "spec.w")
