"""The run chart's values schema, checked in process only where that check is Helm's own.

:class:`ValuesSchema` compiles ``values.schema.json`` once (draft 7), and the renderer skips
Helm's check for values it passes; otherwise it answers "no" and Helm's check decides. When
that is safe, and why each keyword outside :data:`ENFORCED` and :data:`ANNOTATIONS` is left
out: docs/architecture.md, "The controller".
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
    "NotRE2",
    "ValuesSchema",
    "go_pattern",
    "re2_difference",
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

#: Keywords ``Draft7Validator`` enforces exactly as Helm's validator does under draft 7
#: (docs/architecture.md, "The controller"); ``$ref`` only to the root or ``#/definitions/<name>``.
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
#: ``x-kubernetes-validations``: the CRD's CEL rules, megdet/api/crd.py).
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
        elif key == "pattern" and isinstance(value, str) and (why := re2_difference(value)):
            found.append(f"{here} ({why})")
        elif key == "patternProperties" and isinstance(value, Mapping):
            found += [f"{_pointer(here, n)} ({w})" for n in value if (w := re2_difference(n))]
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
    unlisted = unlisted_keywords(schema)
    if unlisted:
        names = ", ".join(unlisted)
        return f"it uses keywords the in-process check does not enforce as Helm does: {names}"
    try:
        jsonschema.Draft7Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        return f"it is not a valid draft-7 schema: {err.message}"
    return None


# RE2's \s (Go's regexp/syntax, perl_groups.go): Python's ASCII \s also takes \v.
_RE2_SPACE = "\\t\\n\\f\\r "
# Escapes both read alike (with ``(?a)``), outside and inside a bracket expression; \s and \S
# are rewritten, ASCII punctuation is itself in both.
_ESCAPES = frozenset("dDwWbBAntrfv")
_CLASS_ESCAPES = frozenset("dDwWntrfv")
# RE2's repetitions: {n}, {n,}, {n,m}, each count at most 1000.
_REPEAT = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")


class NotRE2(ValueError):
    """A pattern that Go's RE2 and Python's ``re`` would read differently (or RE2 not at all)."""


def _escape(pattern: str, i: int, in_class: bool) -> str:
    """The escape at ``pattern[i]`` (a backslash) for Python."""
    e = pattern[i + 1 : i + 2]
    if not e:
        raise NotRE2("a trailing \\")
    if e.isascii() and e.isprintable() and not e.isalnum():
        return pattern[i : i + 2]  # punctuation (or a space): itself in both
    if e == "s":
        return _RE2_SPACE if in_class else f"[{_RE2_SPACE}]"
    if e == "S" and not in_class:
        return f"[^{_RE2_SPACE}]"
    if e in (_CLASS_ESCAPES if in_class else _ESCAPES):
        return pattern[i : i + 2]
    where = "in a bracket expression" if in_class else "outside a bracket expression"
    raise NotRE2(f"\\{e} {where}")


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """The bracket expression at ``pattern[i]`` for Python, and the index after it."""
    j, out = i + 1, ["["]
    if pattern.startswith("^", j):
        out.append("^")
        j += 1
    if pattern.startswith("]", j):
        out.append("\\]")  # a leading ] is itself in both
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            out.append(_escape(pattern, j, in_class=True))
            j += 2
        elif pattern[j] == "[":
            raise NotRE2("[ in a bracket expression (RE2 reads [:alpha:] as a class)")
        else:
            out.append(pattern[j])
            j += 1
    if j >= len(pattern):
        raise NotRE2("an unclosed [")
    return "".join(out) + "]", j + 1


def go_pattern(pattern: str) -> str:
    """A JSON Schema ``pattern`` (Go's RE2, as Helm matches it) rewritten for Python's ``re`` to
    match what RE2 matches; :class:`NotRE2` for what the two do not read alike (the rewrites
    and the refusals: docs/architecture.md, "The controller")."""
    out, i, repeatable = ["(?a)"], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(_escape(pattern, i, in_class=False))
            repeatable = pattern[i + 1] not in "bBA"
            i += 2
        elif c == "[":
            text, i = _bracket(pattern, i)
            out.append(text)
            repeatable = True
        elif c == "(":
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                raise NotRE2("a group flag or lookaround: (? other than (?:")
            step = 3 if pattern.startswith("(?:", i) else 1
            out.append(pattern[i : i + step])
            i += step
            repeatable = False
        elif c in "*+?{":
            repeat = _REPEAT.match(pattern, i) if c == "{" else None
            if c == "{" and (repeat is None or int(repeat[1]) > 1000 or int(repeat[3] or 0) > 1000):
                raise NotRE2("a { that is no repetition {n}, {n,} or {n,m} of at most 1000")
            if not repeatable:
                raise NotRE2(f"a repetition of nothing or of a repetition at {i}")
            i = repeat.end() if repeat else i + 1
            lazy = pattern.startswith("?", i)
            out.append((repeat[0] if repeat else c) + ("?" if lazy else ""))
            i += lazy
            repeatable = False
        else:
            out.append("\\Z" if c == "$" else c)
            repeatable = c not in "$^|"
            i += 1
    return "".join(out)


def re2_difference(pattern: str) -> str | None:
    """What in ``pattern`` RE2 and Python's re read differently; None when nothing."""
    try:
        go_pattern(pattern)
    except NotRE2 as err:
        return str(err)
    return None


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
    """A chart's ``values.schema.json`` compiled once (draft 7, its patterns as RE2 reads them).
    :meth:`passes` errs towards "no": a value it passes, Helm's check passes too; for a schema
    :func:`unlike_helm` finds fault with, it is always "no"."""

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
