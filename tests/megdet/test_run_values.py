"""megdet/run_values.py against its copies: every row is a value of the run chart's schema with
the row's form and a field of the CRD's spec, every key is one of the trainer's config, every
``RunSpec`` field the chart has is a row, and the tables made from it say what it says. The chart's
arguments are held against it in tests/chart/test_chart_run_values.py."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from megdet.api import fields
from megdet.api.cel_rules import IMMUTABLE_FIELDS
from megdet.api.crd import committed_spec_schema
from megdet.controller.api import DROPPED_VALUES
from megdet.overrides import OWNED_OVERRIDES
from megdet.plan import RunSpec
from megdet.run_values import (
    PLAN,
    RUN_VALUES,
    RunValue,
    by_value,
    immutable_fields,
    owned_keys,
    pod_name,
    pod_text,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "charts/megdet/values.schema.json").read_text())
#: The values.schema.json types each form of the table may have (null aside).
SCHEMA_TYPES = {
    "int": {"integer"},
    "float": {"number"},
    "str": {"string"},
    "bool": {"boolean"},
    "tuple": {"array"},
    "map": {"object"},
}


def schema_node(schema: Mapping[str, Any], dotted: str) -> Mapping[str, Any] | None:
    node: Any = schema
    for part in dotted.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    return node


def _types(node: Mapping[str, Any]) -> set[str]:
    kind = node.get("type")
    types = {kind} if isinstance(kind, str) else set(kind or ())
    if not types and node.get("enum"):  # the chart's string enums leave "type" off
        types = {"string"} if all(isinstance(v, str) for v in node["enum"]) else set()
    return types - {"null"}


def _keys(node: Any, prefix: str = "") -> Iterator[str]:
    for name, child in node.items():
        if isinstance(child, Mapping) and child:
            yield from _keys(child, f"{prefix}{name}.")
        else:
            yield prefix + name


def table_problems(
    table: tuple[RunValue, ...],
    schema: Mapping[str, Any],
    crd_spec: Mapping[str, Any],
    trainer_keys: set[str],
) -> list[str]:
    """Where the table and its copies disagree (empty: they agree)."""
    found = []
    for row in table:
        node = schema_node(schema, row.value)
        if node is None:
            found.append(f"{row.value}: not a value of charts/megdet/values.schema.json")
        elif _types(node) != SCHEMA_TYPES[row.form]:
            found.append(f"{row.value}: form {row.form}, schema type {sorted(_types(node))}")
        in_crd = schema_node(crd_spec, row.value) is not None
        if row.in_spec and not in_crd:
            found.append(f"{row.value}: not a field of the MegDetRun spec")
        if not row.in_spec and (in_crd or row.top not in DROPPED_VALUES):
            found.append(f"{row.value}: in_spec=False, but not a dropped value")
        if row.kind == "key" and row.form != "map" and pod_name(row) not in trainer_keys:
            found.append(f"{row.value}: {pod_name(row)} is not a key of the trainer's config")
    rows = by_value(table)
    for name in RunSpec.model_fields:
        value = to_camel(name)
        row = rows.get(value)
        if value in schema["properties"] and (row is None or row.immutable != PLAN):
            found.append(f"{value}: a RunSpec field the chart has, not a row fixed by the plan")
    return found


@pytest.fixture(scope="module")
def trainer_keys() -> set[str]:
    from detectron2.config import get_cfg

    from megdet.trainer.config import add_megdet_config

    cfg = get_cfg()
    add_megdet_config(cfg)
    return set(_keys(cfg))


@pytest.fixture(scope="module")
def crd_spec() -> Mapping[str, Any]:
    return committed_spec_schema()


def test_the_table_agrees_with_the_schema_the_crd_the_trainer_and_the_plan(crd_spec, trainer_keys):
    assert table_problems(RUN_VALUES, SCHEMA, crd_spec, trainer_keys) == []


def test_the_check_notices_each_kind_of_drift(crd_spec, trainer_keys):
    planted = (
        RunValue("bnGroupSize", "key", "MEGDET.BN_GROUP", "int", PLAN),
        RunValue("syncBN", "key", "MEGDET.SYNC_BN", "int", PLAN),
        RunValue("fooBar", "key", "MEGDET.FOO_BAR", "int"),
        RunValue("allowUnsafeWeights", "key", "MEGDET.ALLOW_UNSAFE_WEIGHTS", "bool"),
        RunValue("gpus", "job", "replicas", "int", "another reason"),
    )
    assert table_problems(planted, SCHEMA, crd_spec, trainer_keys) == [
        "bnGroupSize: MEGDET.BN_GROUP is not a key of the trainer's config",
        "syncBN: form int, schema type ['string']",
        "fooBar: not a value of charts/megdet/values.schema.json",
        "fooBar: not a field of the MegDetRun spec",
        "fooBar: MEGDET.FOO_BAR is not a key of the trainer's config",
        "allowUnsafeWeights: not a field of the MegDetRun spec",
        *(
            f"{to_camel(n)}: a RunSpec field the chart has, not a row fixed by the plan"
            for n in RunSpec.model_fields
            if to_camel(n) in SCHEMA["properties"]
        ),
    ]


def test_the_tables_made_from_it_say_what_it_says():
    assert owned_keys().items() <= OWNED_OVERRIDES.items()
    assert "MEGDET.BN_GROUP_SIZE" in owned_keys() and "SOLVER.STEPS" in owned_keys()
    assert immutable_fields() == IMMUTABLE_FIELDS
    (plan_entry,) = [e for e in fields.TABLE if "spec.imagesPerGpu" in e.paths]
    assert set(plan_entry.paths) == {
        f"spec.{r.value}{'[]' if r.form == 'tuple' else ''}" for r in RUN_VALUES if r.recipe
    }


def test_a_value_listed_twice_or_fixed_for_two_reasons_is_refused():
    row = RUN_VALUES[0]
    with pytest.raises(ValueError, match="gpus: listed twice"):
        by_value((row, row))
    with pytest.raises(ValueError, match=r"dataset\.b: dataset is immutable for two reasons"):
        immutable_fields((RunValue("dataset.a", "flag", "--a", "str", "one"),
                          RunValue("dataset.b", "flag", "--b", "str", "two")))  # fmt: skip
    with pytest.raises(ValueError, match="kind 'arg'; allowed: key, flag, env"):
        RunValue("x", "arg", "--x", "str")


@pytest.mark.parametrize(
    ("value", "form", "given", "text"),
    [
        ("baseLr", "float", 1, "1.0"),
        ("baseLr", "float", 0.02, "0.02"),
        ("steps", "tuple", [5], "(5,)"),
        ("steps", "tuple", [5, 8], "(5, 8)"),
        ("allowUnsafeWeights", "bool", True, "True"),
        ("allowUnsafeWeights", "bool", False, None),
        ("numWorkers", "int", 0, "0"),
        ("numWorkers", "int", None, None),
        ("dataset.trainJson", "str", "a.json", "/data/a.json"),
    ],
)
def test_pod_text_writes_each_form_as_the_trainer_reads_it(value, form, given, text):
    row = by_value()[value]
    assert row.form == form
    assert pod_text(row, given) == text
