"""The allow-list: every leaf of the MegDetRun CRD's spec is classified in megdet/api/fields.py,
every rule and knob the table names is one the policy has, and docs/operations.md shows the
table as it is."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from megdet import policy
from megdet.api import fields
from megdet.api.crd import committed_spec_schema

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema():
    return committed_spec_schema()


def test_every_leaf_of_the_crd_is_classified(schema) -> None:
    assert fields.unclassified(schema) == []


def test_every_entry_is_a_leaf_of_the_crd(schema) -> None:
    """A stale entry (a field renamed or dropped) fails too: the table is the CRD's, exactly."""
    assert set(fields.by_path()) - set(fields.leaves(schema)) == set()


def test_a_new_field_is_reported_until_it_is_classified(schema) -> None:
    grown = copy.deepcopy(dict(schema))
    grown["properties"]["image"]["properties"]["digest"] = {"type": "string"}
    grown["properties"]["network"]["properties"]["dns"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    grown["properties"]["extraEnv"]["items"]["properties"]["source"] = {"type": "string"}
    assert fields.unclassified(grown) == [
        "spec.image.digest",
        "spec.network.dns.*",
        "spec.extraEnv[].source",
    ]
    # A new key inside a free-form object (a Volume's new type) is no new leaf: the entry of
    # the object covers it, and says which rules bound it.
    volumes = fields.by_path()["spec.extraVolumes[].*"]
    assert "volumeTypes" in volumes.rules and volumes.knobs == ("hostPath",)


def test_the_walk_sees_free_form_objects_and_maps(schema) -> None:
    found = set(fields.leaves(schema))
    for leaf in (
        "spec.extraVolumes[].*",
        "spec.extraVolumeMounts[].*",
        "spec.extraEnv[].*",
        "spec.extraEnv[].name",
        "spec.podSecurityContext.*",
        "spec.affinity.*",
        "spec.tolerations[].*",
        "spec.nodeSelector.*",
        "spec.podLabels.*",
        "spec.podAnnotations.*",
        "spec.extraOverrides.*",
        "spec.networkPolicy.metricsFrom[].*",
    ):
        assert leaf in found, leaf


def test_what_a_run_can_put_in_a_free_form_object_is_bounded_by_a_rule(schema) -> None:
    """A key Kubernetes adds to a Volume, an EnvVar or a PodSecurityContext later needs no new
    entry: the object's entry covers it, so that entry must name the rules that bound it."""
    open_objects = fields.unknown_fields(schema)
    assert "spec.extraVolumes[].*" in open_objects and "spec.nodeSelector.*" not in open_objects
    table = fields.by_path()
    assert [p for p in open_objects if not table[p].rules] == []


def _rule_names() -> set[str]:
    return {r.name for r in policy.RULES if not r.name.startswith("privileged.")}


def _knobs() -> set[str]:
    return {use.knob for use in policy.KNOB_USES}


def _unknown_names(table: tuple[fields.Fields, ...]) -> set[str]:
    rules = {r for e in table for r in e.rules} - _rule_names()
    knobs = {k for e in table for k in e.knobs} - _knobs()
    return rules | {f"privileged.{k}" for k in knobs}


def test_every_rule_and_knob_the_table_names_exists() -> None:
    assert _unknown_names(fields.TABLE) == set()
    # A name the policy does not have (mistyped, or a rule renamed) is reported.
    wrong = fields.Fields(("spec.x",), fields.GRANTED, "x", ("mountPath",), ("anyPath",))
    assert _unknown_names((*fields.TABLE, wrong)) == {"mountPath", "privileged.anyPath"}


def test_every_rule_and_knob_of_the_policy_bounds_a_field_it_names() -> None:
    """The other way round: a policy rule (or a knob's use) on spec.X is named by an entry of a
    field at or under spec.X, so the table cannot forget what the policy checks."""

    def named(name: str, path: str, attr: str) -> bool:
        return any(
            name in getattr(entry, attr)
            and any(p == path or p.startswith((f"{path}.", f"{path}[")) for p in entry.paths)
            for entry in fields.TABLE
        )

    missing = [
        (rule.name, rule.path)
        for rule in policy.RULES
        if not rule.name.startswith("privileged.") and not named(rule.name, rule.path, "rules")
    ]
    missing += [
        (use.knob, use.path) for use in policy.KNOB_USES if not named(use.knob, use.path, "knobs")
    ]
    assert missing == []


def test_an_entry_states_its_class_consistently() -> None:
    with pytest.raises(ValueError, match="bounded means rules"):
        fields.Fields(("spec.x",), fields.BOUNDED, "no rule")
    with pytest.raises(ValueError, match="granted means a knob"):
        fields.Fields(("spec.x",), fields.GRANTED, "no knob", ("imageRepositories",))
    with pytest.raises(ValueError, match="classified twice"):
        fields.by_path((*fields.TABLE, fields.Fields(("spec.gpus",), fields.FREE, "again")))


def test_the_docs_show_the_table() -> None:
    """docs/operations.md's section "Every field a run can set" holds fields.markdown() as
    generated (regenerate: python -m megdet.api.fields)."""
    text = (ROOT / "docs/operations.md").read_text()
    section = re.search(r"\n#### Every field a run can set\n(.*?)(?=\n#{2,4} )", text, re.S)
    assert section, 'docs/operations.md has no "#### Every field a run can set" section'
    assert fields.markdown() in section.group(1), (
        "docs/operations.md's field table differs from megdet/api/fields.py: "
        "python -m megdet.api.fields prints it"
    )
