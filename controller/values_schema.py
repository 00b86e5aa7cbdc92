"""The run chart's values schema, checked in process only where that check is Helm's own.

Helm checks a chart's ``values.schema.json`` on every render, compiling it each time (helm/helm,
``pkg/chart/common/util/jsonschema.go`` ``ValidateAgainstSingleSchema``: a new
santhosh-tekuri/jsonschema v6 compiler per call). :class:`ValuesSchema` compiles it once with
jsonschema's ``Draft7Validator``, and the renderer skips Helm's check for values it passes. That
is only safe where the two validators agree, so a schema is checked in process only when:

- its ``$schema`` is draft 7: Helm's validator reads a schema without one as draft 2020-12
  (santhosh-tekuri/jsonschema ``roots.go``, ``draftLatest``), where, for one, the keywords
  beside a ``$ref`` apply, which draft 7 ignores;
- it is a valid draft-7 schema (Helm refuses every render of a chart whose schema is not);
- every keyword in it, at any depth, is in :data:`ENFORCED` or :data:`ANNOTATIONS`.

Otherwise :meth:`ValuesSchema.passes` answers "no" to everything, and every value goes to
Helm's check. Left out on purpose, each for a reason:

- ``format``: Helm's compiler asserts it for drafts before 2019-09 (santhosh-tekuri/jsonschema
  ``objcompiler.go``, ``assertFormat``); ``Draft7Validator`` without a format checker does not,
  so a value Helm refuses would pass.
- ``not``, ``oneOf``, ``if``/``then``/``else``: where a pattern reads differently in Python
  (``go_pattern``), the in-process answer is "no" where Helm's may be "yes"; these turn such a
  "no" into a "yes".
- ``multipleOf``: floating point in Python, exact rationals in Go.
- everything else (``$id``, ``dependencies``, ``uniqueItems``, ``contains``, ...): not compared
  with Helm's check; add a keyword here with a test in tests/controller/test_render_schema.py
  that holds the two checks side by side on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema

__all__ = [
    "ANNOTATIONS",
    "DRAFT7",
    "ENFORCED",
    "SCHEMA_FILE",
    "ValuesSchema",
    "go_pattern",
    "unlike_helm",
    "unlisted_keywords",
]

#: The values schema's file in a chart (Helm's name for it).
SCHEMA_FILE = "values.schema.json"

#: The ``$schema`` values Helm's validator reads as draft 7 (santhosh-tekuri/jsonschema,
#: ``draft.go`` ``draftFromURL``: http or https, an empty fragment or none).
DRAFT7 = frozenset(
    f"{scheme}://json-schema.org/draft-07/schema{hash_}"
    for scheme in ("http", "https")
    for hash_ in ("", "#")
)

#: Keywords ``Draft7Validator`` enforces exactly as Helm's validator does under draft 7 (the
#: same types, integers as numbers without a fraction, enum and const equality with booleans
#: apart from numbers, lengths in code points, ``$ref`` ignoring its siblings), ``pattern``
#: and ``patternProperties`` read as RE2 reads them (:func:`go_pattern`). ``$ref`` only to the
#: root or to ``#/definitions/<name>`` (a part of the schema this module walks).
ENFORCED = frozenset(
    {
        "$ref",
        "additionalProperties",
        "allOf",
        "anyOf",
        "const",
        "definitions",
        "enum",
        "exclusiveMaximum",
        "exclusiveMinimum",
        "items",
        "maxItems",
        "maxLength",
        "maxProperties",
        "maximum",
        "minItems",
        "minLength",
        "minProperties",
        "minimum",
        "pattern",
        "patternProperties",
        "properties",
        "required",
        "type",
    }
)
#: Keywords neither validator enforces: draft 7's annotations, ``$schema`` (at the root, one of
#: :data:`DRAFT7`), and the chart's own (``patternMessageRef``: megdet/messages.py;
#: ``x-kubernetes-validations``: the CRD's CEL rules, controller/offline/crd.py).
ANNOTATIONS = frozenset(
    {
        "$comment",
        "$schema",
        "default",
        "description",
        "examples",
        "patternMessageRef",
        "readOnly",
        "title",
        "writeOnly",
        "x-kubernetes-validations",
    }
)

# Draft 7's keywords whose value holds schemas: name -> schema, a schema, a list of schemas.
_SCHEMA_MAPS = frozenset({"definitions", "dependencies", "patternProperties", "properties"})
_SCHEMAS = frozenset(
    {"additionalItems", "additionalProperties", "contains", "else", "if", "items", "not",
     "propertyNames", "then"}
)  # fmt: skip
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "items", "oneOf"})
_LOCAL_REF = re.compile(r"#(/definitions/[A-Za-z0-9_.-]+)?")


def _is_draft7(value: Any) -> bool:
    return isinstance(value, str) and value in DRAFT7


def _listed(key: str, value: Any, at: str) -> bool:
    if key == "$schema":
        return not at and _is_draft7(value)
    if key == "$ref":
        return isinstance(value, str) and _LOCAL_REF.fullmatch(value) is not None
    return key in ENFORCED or key in ANNOTATIONS


def _pointer(at: str, key: str | int) -> str:
    return f"{at}/{str(key).replace('~', '~0').replace('/', '~1')}"


def unlisted_keywords(schema: Any, at: str = "") -> list[str]:
    """The JSON pointers of the keywords in ``schema``, at any depth, that are in neither
    :data:`ENFORCED` nor :data:`ANNOTATIONS` (or, for ``$schema`` and ``$ref``, whose value
    is not one allowed there)."""
    if not isinstance(schema, Mapping):
        return []  # a boolean schema (or not a schema: the metaschema check says so)
    found: list[str] = []
    for key, value in schema.items():
        here = _pointer(at, key)
        if not _listed(key, value, at):
            found.append(here)
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                found += unlisted_keywords(sub, _pointer(here, name))
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for index, sub in enumerate(value):
                found += unlisted_keywords(sub, _pointer(here, index))
        elif key in _SCHEMAS:
            found += unlisted_keywords(value, here)
    return found


def unlike_helm(schema: Mapping[str, Any]) -> str | None:
    """Why checking ``schema`` in process could answer otherwise than Helm; None when it
    cannot."""
    if not _is_draft7(schema.get("$schema")):
        return f"its $schema is not draft 7 (one of {sorted(DRAFT7)}): Helm reads it as another"
    try:
        jsonschema.Draft7Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        return f"it is not a valid draft-7 schema: {err.message}"
    unlisted = unlisted_keywords(schema)
    if unlisted:
        return "it uses keywords the in-process check does not enforce as Helm does: " + ", ".join(
            unlisted
        )
    return None


# An unescaped `$` outside a bracket expression (RE2's end of text, without the (?m) flag).
_DOLLAR = re.compile(r"(\\.|\[(?:\\.|[^\]\\])*\]|\$)")


def go_pattern(pattern: str) -> str:
    """A JSON Schema ``pattern`` (Go's RE2, as Helm matches it) for Python's ``re``: ``$`` is
    the end of the text in RE2 but also matches before a final newline in Python, so each
    ``$`` outside a bracket expression becomes ``\\Z``; ``(?a)`` makes ``\\d``, ``\\w`` and
    ``\\s`` ASCII classes, as RE2's are (Python's ``\\s`` also takes ``\\v``: where a pattern
    negates it, as the chart's do, Python matches less)."""
    return "(?a)" + _DOLLAR.sub(lambda m: r"\Z" if m.group(0) == "$" else m.group(0), pattern)


def _go_patterns(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                out[key] = go_pattern(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out[key] = {go_pattern(k): _go_patterns(v) for k, v in value.items()}
            else:
                out[key] = _go_patterns(value)
        return out
    if isinstance(node, list):
        return [_go_patterns(v) for v in node]
    return node


class ValuesSchema:
    """A chart's ``values.schema.json`` compiled once (draft 7, its patterns as RE2 reads them):
    :meth:`passes` answers in about 0.5 ms what Helm's check answers in about 5 ms (it compiles
    the schema per call). Only a pass is acted on, so where the two could differ the answer
    must err towards "no": a value this passes, Helm's check passes too (tests check both on
    the chart's valid and invalid values). For a schema :func:`unlike_helm` finds fault with,
    the answer is always "no"."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        #: Why this schema is not checked in process (None: it is).
        self.unlike_helm = unlike_helm(schema)
        self._validator = (
            None if self.unlike_helm else jsonschema.Draft7Validator(_go_patterns(schema))
        )

    def passes(self, values: Any) -> bool:
        if self._validator is None:
            return False
        try:
            return bool(self._validator.is_valid(values))
        except (jsonschema.exceptions.SchemaError, re.error, RecursionError, TypeError, ValueError):
            return False  # not ours to judge: Helm's check decides
