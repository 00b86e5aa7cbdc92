"""The values schema checked in process (controller/values_schema.py, ``ValuesSchema``).

A render whose values the in-process schema passes skips Helm's own schema check (the chart is
rendered without its ``values.schema.json``), so the in-process check must never pass what
Helm's refuses. These tests hold the two side by side on the chart's own values, on values the
chart refuses, and on generated strings in every patterned field (RE2 and Python's ``re`` differ
on ``$`` and on Unicode classes), and check that the render is the same either way.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import pytest
from chart_helpers import ALL_CI_VALUES, CHART_DIR, values_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megdet.controller.problems import InvalidRunError
from megdet.controller.render import ChartRenderer, plain
from megdet.controller.values_schema import (
    SCHEMA_FILE,
    ValuesSchema,
    go_pattern,
    unlike_helm,
    unlisted_keywords,
)

SCHEMA = json.loads((CHART_DIR / SCHEMA_FILE).read_text())


@pytest.fixture(scope="module")
def renderer() -> ChartRenderer:
    return ChartRenderer(memo_size=0)


def helm_passes(renderer: ChartRenderer, merged: Mapping[str, Any]) -> bool:
    """Helm's own check of the values schema (what a render with the schema runs)."""
    try:
        renderer._chart.validate_schema(dict(merged))
    except helm_python.HelmError:
        return False
    return True


def merged_values(renderer: ChartRenderer, spec: Mapping[str, Any]) -> dict[str, Any]:
    values = renderer.values("r", spec)
    return renderer._chart.merge_values(values)


def patterned(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths (through properties only) of the schema's string fields with a pattern."""
    if "pattern" in node:
        yield path
    for name, prop in (node.get("properties") or {}).items():
        yield from patterned(prop, (*path, name))


def with_value(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A spec with ``value`` at ``path`` only: ``("a", "b"), 1`` -> ``{"a": {"b": 1}}``."""
    return functools.reduce(lambda inner, key: {key: inner}, reversed(path), value)


PATTERNED = sorted(patterned(SCHEMA))


def test_go_pattern_ends_at_the_end_of_the_text() -> None:
    pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    # Python's `$` also matches before a final newline; RE2's (Helm's) does not.
    assert re.search(pattern, "abc\n")
    assert not re.search(go_pattern(pattern), "abc\n")
    assert re.search(go_pattern(pattern), "abc")
    # Escaped dollars and dollars in bracket expressions stay literal.
    assert go_pattern(r"^a\$[$]$") == r"(?a)^a\$[$]\Z"
    assert re.search(go_pattern(r"^a\$[$]$"), "a$$")
    # \d is ASCII in RE2: an Arabic-Indic digit is not a digit there.
    assert re.search(r"^\d$", "\u0663") and not re.search(go_pattern(r"^\d$"), "\u0663")


def test_the_chart_has_patterned_fields_and_a_schema() -> None:
    assert len(PATTERNED) >= 20


def test_a_file_helm_read_that_is_gone_means_no_lean_copy(tmp_path, monkeypatch) -> None:
    """The copy is built from the files Helm listed; one missing on disk (the chart changed
    under the process) leaves every render to Helm's check rather than a copy without it."""
    import shutil

    copy_dir = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, copy_dir)
    real_load = helm_python.Chart.load

    def load_then_remove(path: str) -> helm_python.Chart:
        loaded = real_load(path)
        (copy_dir / "files" / "owned-overrides.yaml").unlink()
        return loaded

    monkeypatch.setattr(helm_python.Chart, "load", staticmethod(load_then_remove))
    renderer = ChartRenderer(copy_dir, memo_size=0)
    assert renderer._unchecked is None and renderer._schema is not None


def test_the_copy_without_the_schema_is_the_same_chart(renderer: ChartRenderer) -> None:
    checked, unchecked = renderer._chart, renderer._unchecked
    assert checked.schema and unchecked.schema is None
    notes = [t for t in checked.templates if t["name"] == "templates/NOTES.txt"]
    assert notes and unchecked.templates == [t for t in checked.templates if t not in notes]
    assert unchecked.files == checked.files
    assert unchecked.values == checked.values
    assert unchecked.metadata == checked.metadata


@pytest.mark.parametrize("path", ALL_CI_VALUES, ids=lambda p: p.name)
def test_the_charts_values_pass_both_and_render_the_same(renderer, path) -> None:
    spec = values_file(path)
    merged = merged_values(renderer, spec)
    assert renderer._schema.passes(merged) and helm_passes(renderer, merged)
    before = renderer.prechecked
    fast = renderer.render("r", "ns", spec)
    assert renderer.prechecked == before + 1
    checked = renderer._chart.render(
        values=renderer.values("r", spec), name="r", namespace="ns", is_install=True
    )
    unchecked = renderer._unchecked.render(
        values=renderer.values("r", spec), name="r", namespace="ns", is_install=True
    )
    # The same objects; the NOTES (text for `helm install`) only in the checked render.
    assert unchecked == {k: v for k, v in checked.items() if not k.endswith("/NOTES.txt")}
    assert len(checked) == len(unchecked) + 1
    assert fast.objects[0]["metadata"]["name"] == "r"


REFUSED = [
    {"gpus": "eight"},
    {"gpus": -8},
    {"gpusPerNode": 3.5},
    {"nccl": {"ib": {"hca": "mlx5_0\n"}}},
    {"nccl": {"socketIfname": "eth0\n"}},
    {"image": {"repository": "Registry/Megdet"}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"dataset": {"output": "out\n"}},
    {"extraOverrides": {"solver.base_lr": 1}},
    {"extraOverrides": {"SOLVER.MAX_ITER\n": 1}},
    {"priorityClassName": "High Priority"},
    {"unknownField": 1},
    {"resources": {"cpu": "lots"}},
    {"serviceAccountName": "sa\n"},
]


@pytest.mark.parametrize("spec", REFUSED, ids=lambda s: json.dumps(s)[:60])
def test_what_helm_refuses_the_in_process_check_refuses(renderer, spec) -> None:
    merged = merged_values(renderer, spec)
    assert not helm_passes(renderer, merged)
    assert not renderer._schema.passes(merged)
    # And the render says so with Helm's message, as before.
    before = renderer.prechecked
    with pytest.raises(InvalidRunError):
        renderer.render("r", "ns", spec)
    assert renderer.prechecked == before


TRICKY = ["a\n", "a\nb", "\n", "a ", " a", "a\u00a0b", "\u0663", "A", "a" * 300, "", "a/b",
          "-a", "a.b", "a$", "é", "a\tb", "a\x0bb", "http://x", "https://x/y", "10.0.0.0/8",
          "1Gi\n", "https://x\u00a0y", "mlx5_0", "1Gi", "eth0"]  # fmt: skip


def test_every_patterned_field_on_tricky_strings(renderer) -> None:
    """Every patterned field with strings where RE2 and Python's re could differ: the two
    answer alike (go_pattern rewrites what Python reads otherwise, \\s included)."""
    passed = 0
    for path in PATTERNED:
        for value in TRICKY:
            merged = merged_values(renderer, with_value(path, value))
            ours, helms = renderer._schema.passes(merged), helm_passes(renderer, merged)
            assert ours == helms, (path, value)
            passed += ours
    assert passed > 100  # the check passes what it should: the fast path is taken


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(PATTERNED),
    value=st.one_of(
        st.sampled_from(TRICKY), st.text(max_size=12), st.text(alphabet="a-Z0.\n/: ", max_size=8)
    ),
)
def test_a_string_the_in_process_check_passes_helm_passes(renderer, path, value) -> None:
    merged = merged_values(renderer, with_value(path, value))
    if renderer._schema.passes(merged):
        assert helm_passes(renderer, merged), (path, value)


def test_a_chart_that_cannot_be_rebuilt_is_checked_by_helm(tmp_path) -> None:
    """A chart with dependencies is not copied: every render then runs Helm's own check."""
    import shutil

    copy_dir = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, copy_dir)
    (copy_dir / "charts").mkdir()
    renderer = ChartRenderer(copy_dir, memo_size=0)
    assert renderer._unchecked is None
    assert renderer.render("r", "ns", plain({"gpus": 8})).job["metadata"]["name"] == "r"
    assert renderer.prechecked == 0
    with pytest.raises(InvalidRunError):
        renderer.render("r", "ns", {"gpus": "eight"})


DRAFT7 = "http://json-schema.org/draft-07/schema#"


def test_values_schema_answers_no_when_it_cannot_judge() -> None:
    # A pattern Python's re cannot compile (RE2's \pL): no pass, Helm decides.
    pattern = {"type": "string", "pattern": r"^\pL+$"}
    schema = ValuesSchema({"$schema": DRAFT7, "properties": {"a": pattern}})
    assert not schema.passes({"a": "abc"})
    # Nesting deeper than the interpreter's recursion limit: no pass (not a crash).
    nested: dict[str, Any] = {}
    for _ in range(sys.getrecursionlimit()):
        nested = {"a": nested}
    deep = ValuesSchema(
        {
            "$schema": DRAFT7,
            "$ref": "#/definitions/n",
            "definitions": {"n": {"additionalProperties": {"$ref": "#/definitions/n"}}},
        }
    )
    assert not deep.passes(nested)
    assert deep.passes({"a": {"a": {}}})


def chart_with_schema(tmp_path: Path, change) -> ChartRenderer:
    """The run chart copied to ``tmp_path`` with its values schema changed by ``change``."""
    import shutil

    copy_dir = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, copy_dir)
    schema = json.loads((copy_dir / SCHEMA_FILE).read_text())
    change(schema)
    (copy_dir / SCHEMA_FILE).write_text(json.dumps(schema))
    return ChartRenderer(copy_dir, memo_size=0)


def test_a_format_in_the_schema_sends_every_render_to_helms_check(tmp_path, caplog) -> None:
    """Helm asserts ``format`` under draft 7; jsonschema's Draft7Validator without a format
    checker does not. A schema with one (here nested in an anyOf) must not take the lean copy,
    or a value Helm refuses would be rendered."""

    def runname_ipv4(schema: dict[str, Any]) -> None:
        schema["properties"]["runName"]["anyOf"] = [{"maxLength": 0}, {"format": "ipv4"}]

    with caplog.at_level("WARNING", logger="megdet.controller.render"):
        renderer = chart_with_schema(tmp_path, runname_ipv4)
    assert "checked by Helm on every render" in caplog.text
    assert "/properties/runName/anyOf/1/format" in caplog.text
    refused = merged_values(renderer, {"runName": "abc"})
    assert not helm_passes(renderer, refused)  # Helm checks the format
    with pytest.raises(InvalidRunError) as err:
        renderer.render("r", "ns", {"runName": "abc"})
    assert "runName" in str(err.value.problems)
    assert renderer.render("r", "ns", {"runName": "10.0.0.1"}).job["metadata"]["name"] == "r"
    assert renderer.prechecked == 0 and renderer._unchecked is None


def test_a_schema_helm_reads_as_another_draft_goes_to_helms_check(tmp_path) -> None:
    """Without a draft-07 ``$schema`` Helm's validator reads the schema as draft 2020-12, where
    the keywords beside a ``$ref`` apply; draft 7 (and the in-process check) ignores them."""

    def ref_with_sibling(schema: dict[str, Any]) -> None:
        schema["definitions"] = {"runName": schema["properties"]["runName"]}
        schema["properties"]["runName"] = {"$ref": "#/definitions/runName", "maxLength": 4}

    def without_draft(schema: dict[str, Any]) -> None:
        ref_with_sibling(schema)
        del schema["$schema"]

    renderer = chart_with_schema(tmp_path / "2020", without_draft)
    assert not helm_passes(renderer, merged_values(renderer, {"runName": "abcdefgh"}))
    with pytest.raises(InvalidRunError):
        renderer.render("r", "ns", {"runName": "abcdefgh"})
    assert renderer.prechecked == 0 and renderer._unchecked is None
    # Under draft 7 both ignore the sibling, and the lean copy is taken.
    renderer = chart_with_schema(tmp_path / "7", ref_with_sibling)
    assert helm_passes(renderer, merged_values(renderer, {"runName": "abcdefgh"}))
    renderer.render("r", "ns", {"runName": "abcdefgh"})
    assert renderer.prechecked == 1


@pytest.mark.parametrize(
    ("where", "keyword", "value"),
    [(("steps",), "uniqueItems", True), (("runName",), "not", {"const": "abc"}),
     (("steps", "items"), "multipleOf", 1000), (("runName",), "if", {"maxLength": 2})],
    ids=lambda v: str(v)[:20],
)  # fmt: skip
def test_a_keyword_off_the_list_sends_every_render_to_helms_check(tmp_path, where, keyword,
                                                                   value) -> None:  # fmt: skip
    def add(schema: dict[str, Any]) -> None:
        node = schema["properties"][where[0]]
        for part in where[1:]:
            node = node[part]
        node[keyword] = value

    renderer = chart_with_schema(tmp_path, add)
    assert renderer.render("r", "ns", plain({"gpus": 8})).job["metadata"]["name"] == "r"
    with pytest.raises(InvalidRunError):
        renderer.render("r", "ns", {"gpus": "eight"})
    assert renderer.prechecked == 0 and renderer._unchecked is None


def test_the_charts_schema_uses_only_keywords_checked_as_helm_checks_them() -> None:
    """The lean render (Helm's check skipped) is only taken for a schema with nothing but
    keywords the in-process check enforces as Helm does: a keyword added to the chart's schema
    off that list (``format``, ``oneOf``, ...) fails here rather than silently sending every
    render to Helm's slower check (or, before the list, letting a value Helm refuses through)."""
    assert unlisted_keywords(SCHEMA) == []
    assert unlike_helm(SCHEMA) is None
    assert ValuesSchema(SCHEMA).unlike_helm is None


def test_the_walk_finds_a_keyword_off_the_list_at_any_depth() -> None:
    string = {"type": "string"}
    schema = {
        "$schema": DRAFT7,
        "definitions": {"d": {"format": "ipv4"}},
        "properties": {
            "format": {"type": "string"},  # a property named format is no keyword
            "a": {"items": [string, {"format": "date"}], "additionalItems": string},
            "b": {"items": {"properties": {"c/d": {"format": "uri"}}}},
            "c": {"anyOf": [string, {"not": string}], "allOf": [{"if": string, "then": {}}]},
            "e": {"additionalProperties": {"patternProperties": {"^x": {"$ref": "other.json"}}}},
            "f": {"$ref": "#/definitions/d", "$schema": DRAFT7},
        },
        "dependencies": {"a": ["b"], "b": {"multipleOf": 2}},
    }
    assert unlisted_keywords(schema) == [
        "/definitions/d/format",
        "/properties/a/items/1/format",
        "/properties/a/additionalItems",
        "/properties/b/items/properties/c~1d/format",
        "/properties/c/anyOf/1/not",
        "/properties/c/allOf/0/if",
        "/properties/c/allOf/0/then",
        "/properties/e/additionalProperties/patternProperties/^x/$ref",
        "/properties/f/$schema",
        "/dependencies",
        "/dependencies/b/multipleOf",
    ]
    assert "/definitions/d/format" in (unlike_helm(schema) or "")
    refused = ValuesSchema(schema)
    assert refused.unlike_helm and not refused.passes({})


@pytest.mark.parametrize(
    "schema",
    [{"type": "object"}, {"$schema": "http://json-schema.org/draft/2020-12/schema"},
     {"$schema": ["x"]}, {"$schema": DRAFT7, "type": "strin"},
     {"$schema": DRAFT7, "properties": {"a": {"minimum": "5"}}}],
    ids=str,
)  # fmt: skip
def test_a_schema_helm_reads_otherwise_is_never_passed(schema) -> None:
    """No draft-7 ``$schema`` (Helm reads it as 2020-12), or not a valid draft-7 schema (Helm
    refuses every render): the in-process check answers no to everything."""
    checked = ValuesSchema(schema)
    assert checked.unlike_helm and not checked.passes({"a": 6})


def test_draft7_as_helms_validator_names_it() -> None:
    for uri in (
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft-07/schema#",
    ):
        assert ValuesSchema({"$schema": uri}).passes({})
    assert not ValuesSchema({"$schema": "http://json-schema.org/draft-07/schema#x"}).passes({})


# Patterns Python's re compiles but reads otherwise than RE2 (Go's regexp/syntax), or that
# RE2 refuses (then Helm refuses every render of the chart): with the value RE2 refuses and
# Python's re would match.
NOT_RE2 = [
    ("^a{,3}$", "aa"),  # RE2: a literal "a{,3}"; Python: up to three a's
    ("^[[:alpha:]]+$", "a]"),  # RE2: a POSIX class; Python: a set, then "]"
    ("^(?=a)a$", "a"),  # lookaround: RE2 has none
    ("^(a)\\1$", "aa"),  # backreference: RE2 has none
    ("^a{1001}$", "a" * 1001),  # RE2: at most 1000
    ("^a*+$", "aaa"),  # possessive: RE2 has none
    ("(?x)^a b$", "ab"),  # verbose flag: RE2 has none
    ("^a\\Z", "a"),  # RE2 has no \Z
    ("^[^\\S]$", "\x0b"),  # \S in a bracket expression: Python's leaves \v out
]


@pytest.mark.parametrize(("pattern", "value"), NOT_RE2, ids=lambda v: ascii(v)[:24])
def test_a_pattern_re2_reads_otherwise_sends_every_render_to_helms_check(
    tmp_path, pattern, value
) -> None:
    def runname_pattern(schema: dict[str, Any]) -> None:
        schema["properties"]["runName"]["pattern"] = pattern

    renderer = chart_with_schema(tmp_path, runname_pattern)
    merged = merged_values(renderer, {"runName": value})
    assert not helm_passes(renderer, merged)
    assert not renderer._schema.passes(merged)
    assert renderer._unchecked is None


def test_a_pattern_with_s_is_checked_in_process_as_re2_reads_it(tmp_path) -> None:
    def runname_pattern(schema: dict[str, Any]) -> None:
        schema["properties"]["runName"]["pattern"] = "^(a\\sb)?$"

    renderer = chart_with_schema(tmp_path, runname_pattern)
    assert renderer._unchecked is not None  # the lean copy is kept
    for value, helm in (("a\x0bb", False), ("a b", True), ("a\tb", True)):
        merged = merged_values(renderer, {"runName": value})
        assert helm_passes(renderer, merged) is helm
        assert renderer._schema.passes(merged) is helm


def test_go_pattern_reads_s_as_re2_does() -> None:
    """RE2's \\s is [\\t\\n\\f\\r ]; Python's ASCII \\s also takes \\v."""
    assert re.fullmatch(go_pattern(r"a\sb"), "a b") and not re.fullmatch(
        go_pattern(r"a\sb"), "a\vb"
    )
    assert re.fullmatch(go_pattern(r"a\Sb"), "a\vb") and not re.fullmatch(
        go_pattern(r"a\Sb"), "a b"
    )
    assert re.fullmatch(go_pattern(r"[^\s/]+"), "a\vb") and not re.fullmatch(
        go_pattern(r"[^\s/]+"), "a/"
    )


def test_a_pattern_outside_the_syntax_both_read_alike_is_named() -> None:
    schema = {
        "$schema": DRAFT7,
        "properties": {
            "a": {"pattern": "^a{,3}$"},
            "b": {"patternProperties": {"^(?=x)": {}, "^y$": {"pattern": "[\\pL]"}}},
            "c": {"pattern": "\\"},
        },
    }
    assert unlisted_keywords(schema) == [
        "/properties/a/pattern (a { that is no repetition {n}, {n,} or {n,m} of at most 1000)",
        "/properties/b/patternProperties/^(?=x) (a group flag or lookaround: (? other than (?:)",
        "/properties/b/patternProperties/^y$/pattern (\\p in a bracket expression)",
        "/properties/c/pattern (a trailing \\)",
    ]
    assert go_pattern("^[]a\\s]\\S$") == "(?a)^[\\]a\\t\\n\\f\\r ][^\\t\\n\\f\\r ]\\Z"
