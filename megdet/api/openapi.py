"""JSON Schema (draft-07, as Helm's values.schema.json) -> a Kubernetes structural schema.

A CRD's ``openAPIV3Schema`` is OpenAPI v3.0 and must be structural
(``apiextensions.k8s.io/v1``). Constructs without an equivalent are mapped:

- ``type: [X, "null"]`` -> ``type: X, nullable: true``;
- draft-07 ``exclusiveMinimum: N`` -> ``minimum: N, exclusiveMinimum: true`` (and maximum);
- free-form objects -> ``x-kubernetes-preserve-unknown-fields``;
- the string-or-integer ``oneOf`` -> ``x-kubernetes-int-or-string`` with one enum;
- ``patternProperties``: by the caller's ``pattern_map`` (the project's CEL rules check the keys);
- ``x-kubernetes-validations`` (CEL rules, which Helm ignores) are copied as written, for the
  caller to resolve;
- a ``pattern`` with a ``patternMessageRef`` (a keyword of this project, which Helm ignores)
  becomes a CEL ``self.matches(...)`` rule with that ``messageRef``, for the caller to resolve
  like the others, so that the API server's refusal says what the value must look like rather
  than quoting the regular expression;
- defaults come from a separate values document (Helm's values.yaml), pruned to the declared
  fields.

Nothing here knows the MegDetRun: :mod:`megdet.api.crd` passes the run chart's schema
and the names the spec leaves out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["convert", "missing_descriptions"]

#: pattern_map(node, out): fill ``out`` for a node with ``patternProperties``.
PatternMap = Callable[[Mapping[str, Any], dict[str, Any]], None]


@dataclass(frozen=True)
class _Options:
    root: str
    drop: Collection[str]
    pattern_map: PatternMap | None


def missing_descriptions(
    schema: Mapping[str, Any], path: str = "spec", drop: Collection[str] = ()
) -> list[str]:
    """Paths of properties (at any depth) that have no description; ``drop``: properties of
    the root (``path``) left out of the translation, so not checked."""
    return _missing(schema, path, path, drop)


def _missing(schema: Mapping[str, Any], path: str, root: str, drop: Collection[str]) -> list[str]:
    missing: list[str] = []
    for name, prop in (schema.get("properties") or {}).items():
        if path == root and name in drop:
            continue
        child = f"{path}.{name}"
        if not prop.get("description"):
            missing.append(child)
        missing += _missing(prop, child, root, drop)
    items = schema.get("items")
    if isinstance(items, Mapping):
        missing += _missing(items, f"{path}[]", root, drop)
    return missing


def convert(
    node: Mapping[str, Any],
    default: Any,
    path: str,
    *,
    drop: Collection[str] = (),
    pattern_map: PatternMap | None = None,
) -> dict[str, Any]:
    """``node`` (whose values default to ``default``) as a structural OpenAPI node; ``path``
    names it in errors, ``drop`` lists properties of this root node to leave out."""
    return _convert(node, default, path, _Options(path, drop, pattern_map))


def _scalar_keywords(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    for key in ("enum", "pattern", "minLength", "maxLength", "minimum", "maximum"):
        if key in node and not (key == "pattern" and "patternMessageRef" in node):
            out[key] = copy.deepcopy(node[key])
    # Bounded sizes also bound the API server's CEL cost estimate for rules that iterate.
    for key in ("minItems", "maxItems", "minProperties", "maxProperties"):
        if key in node:
            out[key] = node[key]
    if "exclusiveMinimum" in node:  # draft-07 number -> OpenAPI 3.0 boolean form
        out["minimum"] = node["exclusiveMinimum"]
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in node:
        out["maximum"] = node["exclusiveMaximum"]
        out["exclusiveMaximum"] = True


def _int_or_string(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``oneOf: [{type: string, enum}, {type: integer, minimum, maximum}]`` as one enum."""
    branches = {b.get("type"): b for b in node["oneOf"]}
    if set(branches) != {"string", "integer"}:
        raise ValueError(f"unsupported oneOf: {node['oneOf']}")
    text, number = branches["string"], branches["integer"]
    out["x-kubernetes-int-or-string"] = True
    out["enum"] = [*text["enum"], *range(number["minimum"], number["maximum"] + 1)]


def _convert(node: Mapping[str, Any], default: Any, path: str, opts: _Options) -> dict[str, Any]:
    """One values-schema node as a structural OpenAPI node, with its values.yaml default."""
    out: dict[str, Any] = {}
    if node.get("description"):
        out["description"] = node["description"]
    if "oneOf" in node:
        _int_or_string(node, out)
        if default is not None:
            out["default"] = default
        return out
    kind = node.get("type")
    if kind is None and node.get("enum") and all(isinstance(v, str) for v in node["enum"]):
        # The values schema leaves the type off its string enums, so that Helm reports a value
        # of the wrong type with the allowed values ("value must be one of ...") rather than
        # "got number, want string"; a structural schema needs it.
        kind = "string"
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if "null" in kind:
            out["nullable"] = True
        if len(kinds) != 1:
            raise ValueError(f"{path}: type {kind} has no structural equivalent")
        kind = kinds[0]
    if kind is None:
        raise ValueError(f"{path}: every node needs a type")
    out["type"] = kind
    _scalar_keywords(node, out)
    if kind == "object":
        _convert_object(node, default, path, out, opts)
    elif kind == "array":
        out["items"] = _convert(node.get("items") or {}, None, f"{path}[]", opts)
    if default is not None and kind != "object":
        out["default"] = copy.deepcopy(default)
    if "x-kubernetes-validations" in node:
        out["x-kubernetes-validations"] = copy.deepcopy(node["x-kubernetes-validations"])
    if "pattern" in node and "patternMessageRef" in node:
        rule = {
            "rule": f"self.matches({json.dumps(node['pattern'])})",
            "messageRef": node["patternMessageRef"],
        }
        out.setdefault("x-kubernetes-validations", []).append(rule)
    return out


def _convert_object(
    node: Mapping[str, Any], default: Any, path: str, out: dict[str, Any], opts: _Options
) -> None:
    props = node.get("properties") or {}
    extra = node.get("additionalProperties", True)
    defaults = default if isinstance(default, Mapping) else {}
    if "patternProperties" in node:
        if opts.pattern_map is None:
            raise ValueError(f"{path}: patternProperties has no structural equivalent")
        opts.pattern_map(node, out)
    elif props:
        out["properties"] = {
            name: _convert(prop, defaults.get(name), f"{path}.{name}", opts)
            for name, prop in props.items()
            if not (path == opts.root and name in opts.drop)
        }
        if extra is not False:
            # JSON Schema allows any other key here (e.g. an EnvVar's value/valueFrom).
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, Mapping):
        out["additionalProperties"] = _convert(extra, None, f"{path}.*", opts)
    else:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("required"):
        out["required"] = list(node["required"])
    if isinstance(default, Mapping):
        # A default for the object itself lets the API server default an omitted object. The
        # server validates a default as written (required children, enums, the node's CEL
        # rules), so it is values.yaml's whole object, not {} (which fails `required`).
        out["default"] = _prune(default, out)


def _prune(default: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """values.yaml's object restricted to the fields the structural node declares (a default
    may not hold fields the schema would prune)."""
    props = node.get("properties")
    if props is None:
        return copy.deepcopy(dict(default))
    return {
        key: _prune(value, props[key]) if isinstance(value, Mapping) else copy.deepcopy(value)
        for key, value in default.items()
        if key in props and value is not None  # null and absent mean the same
    }
