"""The CEL rules written in the run chart's values schema, next to the field they guard: their
messages come from megdet/messages.py by messageRef, and the CRD carries them resolved."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from megdet.api.cel_rules import ELASTIC_FIELDS, GENERATED, resolve_rules
from megdet.api.crd import build_crd, spec_schema
from megdet.messages import MESSAGES, cel_message

CHART = Path(__file__).resolve().parents[2] / "charts" / "megdet"


def rule_lists(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, list[Any]]]:
    if "x-kubernetes-validations" in node:
        yield path, node["x-kubernetes-validations"]
    for name, child in (node.get("properties") or {}).items():
        yield from rule_lists(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            yield from rule_lists(node[key], f"{path}.{key}")


def values_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def test_schema_rules_refer_to_messages_and_write_none():
    for path, rules in rule_lists(values_schema()):
        for rule in rules:
            assert "message" not in rule, f"{path}: use a messageRef into megdet/messages.py"
            if "generated" in rule:
                assert set(rule) == {"generated"} and rule["generated"] in GENERATED, path
            else:
                assert rule["messageRef"] in MESSAGES, path
                assert rule["rule"], path


def test_crd_carries_each_schema_rule_with_its_message():
    (version,) = build_crd()["spec"]["versions"]
    crd = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    resolved = dict(rule_lists(crd))
    for path, rules in rule_lists(values_schema()):
        for rule in rules:
            if "messageRef" not in rule:
                continue
            expected = {k: v for k, v in rule.items() if k != "messageRef"}
            expected["message"] = cel_message(rule["messageRef"])
            assert expected in resolved[path], (path, rule["messageRef"])
    for path, rules in resolved.items():
        assert all("messageRef" not in r and "generated" not in r for r in rules), path


def test_generated_rules_take_the_place_of_their_entry():
    spec = spec_schema()
    rules = [r["fieldPath"] for r in spec["x-kubernetes-validations"]]
    written = values_schema()["x-kubernetes-validations"]
    at = next(i for i, r in enumerate(written) if "generated" in r)
    generated = GENERATED[written[at]["generated"]](spec)
    assert rules[at : at + len(generated)] == [r["fieldPath"] for r in generated]
    # ...and after the written ones, the spec-level transition rules of the elastic fields.
    assert len(rules) == len(written) - 1 + len(generated) + len(ELASTIC_FIELDS)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"rule": "true", "messageRef": "noSuchRule"}, "noSuchRule"),
        ({"generated": "noSuchRules"}, "unknown generated rules 'noSuchRules'"),
    ],
)
def test_a_bad_entry_is_named(entry, says):
    node = {"properties": {"gang": {"x-kubernetes-validations": [copy.deepcopy(entry)]}}}
    with pytest.raises((KeyError, ValueError)) as err:
        resolve_rules(node, spec_schema())
    assert says in str(err.value)


def test_a_rule_moved_in_the_schema_moves_in_the_crd(tmp_path):
    chart = tmp_path / "megdet"
    shutil.copytree(CHART, chart)
    schema = values_schema()
    rule = schema["properties"]["gang"]["x-kubernetes-validations"].pop()
    schema["properties"]["dataset"]["x-kubernetes-validations"].append(rule)
    (chart / "values.schema.json").write_text(json.dumps(schema))
    props = spec_schema(chart)["properties"]
    message = cel_message(rule["messageRef"])
    assert message in [r["message"] for r in props["dataset"]["x-kubernetes-validations"]]
    assert message not in [r["message"] for r in props["gang"]["x-kubernetes-validations"]]
