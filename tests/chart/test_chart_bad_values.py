"""Wrong values fail `helm install` with a message that names the value, never a broken job."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from chart_helpers import CHART_DIR, values_from

from megdet.plan import SpecError, plan_run
from megdet.run_values import RUN_VALUES

SCHEMA_ERRORS = [
    ("gpus=0", ["at '/gpus'", "minimum: got 0, want 1"]),
    ("gpus=x", ["at '/gpus': got string, want integer"]),
    ("gpus=-8", ["at '/gpus'", "minimum: got -8, want 1"]),
    ("shm.sizeLimit=-1Gi", ["at '/shm/sizeLimit'", "'-1Gi' does not match pattern"]),
    ("shm.sizeLimit=lots", ["at '/shm/sizeLimit'", "'lots' does not match pattern"]),
    ("gpuss=16", ["additional properties 'gpuss' not allowed"]),
    ("nccl.ib.hcaa=mlx5", ["at '/nccl/ib'", "additional properties 'hcaa' not allowed"]),
    ("scaling=cubic", ["at '/scaling': value must be one of 'linear', 'sqrt', 'none'"]),
    ("schedule=cosine", ["at '/schedule'", "step", "three-stage"]),
    ("syncBN=some", ["at '/syncBN'", "backbone", "all", "none"]),
    ("runPolicy.cleanPodPolicy=Always", ["at '/runPolicy/cleanPodPolicy'", "None"]),
    ("nccl.ib.gidIndex=-1", ["at '/nccl/ib/gidIndex'", "minimum"]),
    ("baseLr=0", ["at '/baseLr'", "exclusiveMinimum"]),
    ("nccl.ib.enabled=yes", ["at '/nccl/ib/enabled': got string, want boolean"]),
    ("terminationGracePeriodSeconds=5", ["at '/terminationGracePeriodSeconds'", "minimum"]),
    # A value of the wrong type in a string enum still lists the allowed values (below).
    ("target=5", ["at '/target': value must be one of 'pytorchjob', 'trainjob'"]),
    ("syncBN=true", ["at '/syncBN': value must be one of 'backbone', 'all', 'none'"]),
]


@pytest.mark.parametrize(("expr", "expected"), SCHEMA_ERRORS, ids=[e for e, _ in SCHEMA_ERRORS])
def test_schema_rejects_bad_values_naming_the_key(render, expr, expected):
    message = render.error(values_from(sets=[expr]))
    for text in expected:
        assert text in message


def test_gpus_not_a_multiple_of_gpus_per_node_fails_like_the_plan_module(render):
    message = render.error(values_from(sets=["gpus=12"]))
    assert "gpus=12 is not a multiple of gpusPerNode=8 (multi-node runs use whole nodes)" in message
    # The same rule as the plan module's, which names the same field.
    with pytest.raises(SpecError) as err:
        plan_run({"gpus": 12, "gpusPerNode": 8})
    assert err.value.field == "gpus"
    assert "multi-node runs use whole nodes" in err.value.message


@pytest.mark.parametrize(("gpus", "per_node"), [(4, 8), (24, 8), (6, 3), (1, 1)])
def test_whole_nodes_and_single_partial_nodes_are_accepted(render, gpus, per_node):
    rendered = render(values_from(gpus=gpus, gpusPerNode=per_node))
    plan = plan_run({"gpus": gpus, "gpusPerNode": per_node})
    assert rendered.job["spec"]["nprocPerNode"] == str(plan.procs_per_node)


def test_infiniband_without_an_rdma_resource_name_fails(render):
    message = render.error(values_from(sets=["nccl.ib.enabled=true"]))
    assert "nccl.ib.enabled=true needs nccl.ib.rdmaResourceName" in message
    assert "rdma/rdma_shared_device_a" in message


def test_rdma_resource_name_must_be_a_resource_name(render):
    message = render.error(
        values_from(sets=["nccl.ib.enabled=true", "nccl.ib.rdmaResourceName=rdma shared"])
    )
    assert "at '/nccl/ib/rdmaResourceName'" in message


@pytest.mark.parametrize(
    ("values", "expected", "spec"),
    [
        (
            {"steps": [100000]},
            "steps=[100000] must all be below maxIter=90000",
            {"gpus": 8, "steps": [100000]},
        ),
        (
            {"steps": [80000, 60000]},
            "steps=[80000,60000] must be strictly increasing",
            {"gpus": 8, "steps": [80000, 60000]},
        ),
        (
            {"warmupIters": 90000},
            "warmupIters=90000 must be below maxIter=90000",
            {"gpus": 8, "warmupIters": 90000},
        ),
        (
            {"gpus": 4096, "imagesPerGpu": 64},
            "steps=[60000,80000] collapse to [4,5] at global batch 262144 (maxIter 5)",
            {"gpus": 4096, "imagesPerGpu": 64},
        ),
    ],
)
def test_schedule_rules_fail_where_the_plan_module_fails(render, values, expected, spec):
    assert expected in render.error(values_from(**values))
    with pytest.raises(SpecError):
        plan_run(spec)


def test_validation_set_needs_both_paths(render):
    message = render.error(values_from(sets=["dataset.valImages="]))
    assert "dataset.valJson" in message and "dataset.valImages" in message


def test_extra_override_keys_must_look_like_config_keys(render):
    message = render.error(values_from(extraOverrides={"solver.base_lr": 0.1}))
    assert "at '/extraOverrides': additional properties 'solver.base_lr' not allowed" in message


def _string_enums(node: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list]]:
    if node.get("enum") and all(isinstance(v, str) for v in node["enum"]):
        yield path, node["enum"]
    for key, sub in (node.get("properties") or {}).items():
        yield from _string_enums(sub, (*path, key))


SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
STRING_ENUMS = list(_string_enums(SCHEMA))


def _schema_node(dotted: str) -> dict:
    node = SCHEMA
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("path", "allowed"), STRING_ENUMS, ids=[".".join(p) for p, _ in STRING_ENUMS]
)
@pytest.mark.parametrize("wrong", [7, True, ["x"]], ids=["number", "boolean", "list"])
def test_a_wrongly_typed_enum_value_is_answered_with_the_allowed_values(
    render, path, allowed, wrong
):
    # The values schema leaves "type" off its string enums: with it, Helm's validator stops at
    # "got number, want string" and never names the allowed values.
    values: dict = {}
    node = values
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = wrong
    message = render.error(values)
    listed = ", ".join(f"'{v}'" for v in allowed)
    assert f"at '/{'/'.join(path)}': value must be one of {listed}" in message


def test_every_string_enum_of_the_chart_is_covered() -> None:
    # Guards the parametrization above: the schema has string enums at these places.
    # ...and every run value of megdet/run_values.py whose schema is a string enum among them.
    enums = {r.value for r in RUN_VALUES if "enum" in _schema_node(r.value)}
    assert {".".join(p) for p, _ in STRING_ENUMS} >= {"nccl.ib.memlock"} | enums
    assert enums >= {"target", "syncBN", "elastic.resize"}
    assert len(STRING_ENUMS) >= 15
