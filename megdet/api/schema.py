"""What the API server does with a MegDetRun's CRD schema, offline: default, validate, run CEL.

No API server can run here, so these three steps reproduce the documented behaviour of
kube-apiserver's apiextensions code with real implementations where they exist:

- defaulting follows ``defaulting.Default`` (kubernetes/kubernetes,
  ``staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting/algorithm.go``
  and ``prunenulls.go``): a missing field, or a null in a field that is not nullable, takes its
  default (a deep copy); then defaulting recurses into every value, so ``default: {}`` on an
  object brings in its children's defaults;
- the structural schema is converted to JSON Schema (``nullable``, ``x-kubernetes-int-or-string``,
  ``x-kubernetes-preserve-unknown-fields``, boolean ``exclusiveMinimum``) and checked with
  ``jsonschema``; unknown fields are errors, as with ``kubectl apply --validate=strict``;
- ``x-kubernetes-validations`` rules are evaluated with a real CEL implementation
  (common-expression-language, Python bindings of the Rust ``cel`` interpreter), ``self`` bound
  to the node the rule sits on (``oldSelf`` too for transition rules), values typed by the
  schema (an integer field is a CEL int, a number field a CEL double). cel-python gives the same
  verdicts (a test runs both) but takes ~100x longer per rule, too slow for the controller.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any

import cel
import jsonschema

from megdet.controller.problems import Problem, field_path

__all__ = [
    "ABSENT",
    "apply_defaults",
    "cel_problems",
    "coerce_numbers",
    "rule_sites",
    "schema_problems",
    "to_json_schema",
]

_Path = list[str | int]


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with the schema's defaults applied, as the API server applies them (in place)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name, prop in props.items():
            missing = name not in value or (value[name] is None and not prop.get("nullable"))
            if missing and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for name, child in value.items():
            sub = props.get(name, extra if isinstance(extra, Mapping) else None)
            if sub:
                apply_defaults(sub, child)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for child in value:
            apply_defaults(schema["items"], child)
    return value


def to_json_schema(node: Mapping[str, Any]) -> dict[str, Any]:
    """A structural OpenAPI v3.0 schema as JSON Schema (draft 7)."""
    out: dict[str, Any] = {}
    for key in ("enum", "pattern", "minLength", "maxLength", "minItems", "maxItems",
                "minProperties", "maxProperties", "required"):  # fmt: skip
        if key in node:
            out[key] = copy.deepcopy(node[key])
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if bound in node:
            out[exclusive if node.get(exclusive) else bound] = node[bound]
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    elif "type" in node:
        out["type"] = node["type"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*(out["type"] if isinstance(out["type"], list) else [out["type"]]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    elif isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = to_json_schema(node["additionalProperties"])
    if isinstance(node.get("items"), Mapping):
        out["items"] = to_json_schema(node["items"])
    return out


@functools.cache
def _validator(schema_json: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(to_json_schema(json.loads(schema_json)))


def _error_problems(err: jsonschema.ValidationError, root: str) -> list[Problem]:
    parts: _Path = list(err.absolute_path)
    path = functools.partial(field_path, root=root)

    value, kind = err.instance, err.validator
    if kind == "additionalProperties" and isinstance(value, Mapping):
        known = set(err.schema.get("properties") or {})
        return [
            Problem(path([*parts, k]), f"unknown field; allowed fields: {sorted(known)}")
            for k in sorted(set(value) - known)
        ]
    if kind == "required":
        missing = [r for r in err.validator_value if r not in value]
        return [Problem(path([*parts, m]), "is required") for m in missing]
    if kind == "type":
        wanted = err.validator_value
        return [Problem(path(parts), f"{value!r} is not of type {wanted}")]
    if kind in ("maxProperties", "maxItems") and isinstance(value, Sized):
        return [Problem(path(parts), f"has {len(value)} entries; at most {err.validator_value}")]
    if kind == "enum":
        return [Problem(path(parts), f"{value!r} is not one of {err.validator_value}")]
    return [Problem(path(parts), err.message)]


def schema_problems(schema: Mapping[str, Any], value: Any, root: str = "spec") -> list[Problem]:
    """Structural-schema problems of ``value`` (already defaulted), sorted by field path."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    problems = [p for err in validator.iter_errors(value) for p in _error_problems(err, root)]
    return sorted(set(problems), key=lambda p: (p.path, p.message))


_INT64 = (-(2**63), 2**63 - 1)


def coerce_numbers(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy typed as the schema says: 2.0 in an integer field -> 2, 1 in a number field -> 1.0.

    The API server stores values by schema type, and CEL sees them so typed.
    """
    kind = schema.get("type")
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not _INT64[0] <= value <= _INT64[1]
    ):
        # The API server's JSON decoder reads a number beyond int64 as a float64.
        return float(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Mapping):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {
            k: coerce_numbers(props.get(k) or (extra if isinstance(extra, Mapping) else {}), v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        return [coerce_numbers(items, v) for v in value]
    return value


@functools.cache
def _program(rule: str) -> cel.Program:
    return cel.compile(rule)


def _is_transition(rule: str) -> bool:
    return "oldSelf" in rule


def rule_sites(
    schema: Mapping[str, Any], value: Any, old: Any, parts: _Path
) -> Iterator[tuple[Mapping[str, Any], Any, Any, _Path]]:
    """(schema node, value, old value, path) for every node that carries CEL rules."""
    if schema.get("x-kubernetes-validations"):
        yield schema, value, old, parts
    if isinstance(value, Mapping):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, child in value.items():
            sub = props.get(name, extra if isinstance(extra, Mapping) else None)
            if sub:
                child_old = old.get(name, ABSENT) if isinstance(old, Mapping) else ABSENT
                yield from rule_sites(sub, child, child_old, [*parts, name])
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = schema.get("items")
        if isinstance(items, Mapping):
            # Kubernetes correlates list items for transition rules only in map/set lists.
            for i, child in enumerate(value):
                yield from rule_sites(items, child, ABSENT, [*parts, i])


class _Absent:
    """No old value (create, or the field was not set before)."""


ABSENT = _Absent()


def _without_nulls(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` as the API server's CEL sees it: in an object with properties, a null field is
    absent (``has()`` is false; apiserver pkg/cel/common/valuesunstructured.go,
    ``unstructuredMap.Find``). Map values (additionalProperties) keep their nulls."""
    if isinstance(value, Mapping):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, child in value.items():
            if props is not None and child is None:
                continue
            sub = (props or {}).get(key) or (extra if isinstance(extra, Mapping) else {})
            out[key] = _without_nulls(sub, child)
        return out
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        return [_without_nulls(items, v) for v in value]
    return value


def _relative(parts: _Path, field_path_text: str) -> _Path:
    """A rule's ``fieldPath`` (``.gpus``, ``.metadata.name``) appended to the node's path."""
    names = [p for p in field_path_text.split(".") if p]
    return [*parts, *names]


def cel_problems(
    schema: Mapping[str, Any],
    value: Any,
    old: Any = ABSENT,
    root: str = "spec",
) -> list[Problem]:
    """Problems from the schema's CEL rules. Transition rules run only when ``old`` is given."""
    typed = _without_nulls(schema, coerce_numbers(schema, value))
    typed_old = (
        _without_nulls(schema, coerce_numbers(schema, old)) if not isinstance(old, _Absent) else old
    )
    problems: list[Problem] = []
    for node, node_value, node_old, parts in rule_sites(schema, typed, typed_old, []):
        # One context per node: converting the values to CEL costs more than most rules.
        context = cel.Context({"self": node_value})
        transition = None
        for rule in node["x-kubernetes-validations"]:
            text = rule["rule"]
            activation = context
            if _is_transition(text):
                if isinstance(node_old, _Absent):
                    continue
                transition = transition or cel.Context({"self": node_value, "oldSelf": node_old})
                activation = transition
            where = _relative(parts, rule.get("fieldPath", ""))
            message = rule.get("message", f"failed rule: {text}")
            try:
                passed = _program(text).execute(activation) is True
            except Exception as err:  # the API server reports a rule it cannot evaluate too
                passed, message = False, f"rule {text!r} could not be evaluated: {err}"
            if not passed:
                problems.append(Problem(field_path(where, root), message))
    return problems
