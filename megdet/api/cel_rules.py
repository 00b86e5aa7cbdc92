"""The MegDetRun's generated CEL rules (``x-kubernetes-validations``) and their resolution.

The hand-written rules live in ``charts/megdet/values.schema.json``, on the node they guard
(Helm ignores the keyword), each with a ``messageRef`` into :data:`megdet.messages.MESSAGES`.
This module makes the rules that are generated from another single source: the unrolled
strictly-increasing steps rules (from the schema's ``maxItems``) and the rescaled-schedule rules
(the plan's integer rescaling), the ``extraOverrides`` key rules (``OWNED_OVERRIDES``), the
chart's reserved pod label and annotation keys (read from ``_plan.tpl``), transition rules
(``self == oldSelf``) on the fields that define the experiment (:data:`IMMUTABLE_FIELDS`), and
the rules on the run's name, which its job and pods are named after. :func:`resolve_rules`
turns each ``messageRef`` into its message and each ``generated`` entry into rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from megdet.controller.api import DROPPED_VALUES
from megdet.messages import cel_message
from megdet.naming import MAX_JOB_NAME_LENGTH
from megdet.overrides import OWNED_OVERRIDES
from megdet.run_values import immutable_fields

__all__ = [
    "ELASTIC_FIELDS",
    "GENERATED",
    "IMMUTABLE_FIELDS",
    "OVERRIDE_VALUE_NOTE",
    "overrides_map",
    "owned_override_cel_message",
    "pod_metadata_rules",
    "rescaled_schedule_rules",
    "resolve_rules",
    "root_rules",
    "steps_rules",
    "transition_rules",
]

#: Spec fields that must not change after creation, and why (the transition rules' messages):
#: the run values with an ``immutable`` reason (megdet/run_values.py).
IMMUTABLE_FIELDS: dict[str, str] = immutable_fields()
#: Immutable fields that an elastic run may change on a live run (within the bounds that
#: ``elastic`` declares; the spec's bounds rule, ``elasticBounds``, refuses other values): the
#: transition rule of each sits on the spec (it reads ``elastic``), with the field's message.
ELASTIC_FIELDS = ("gpus",)
#: CEL, on the old spec: the run declared elastic bounds at creation (``elastic`` is immutable).
ELASTIC_RUN = "has(oldSelf.elastic) && oldSelf.elastic.maxGpus > 0"

# Integer rescaling exactly as megdet.plan does it: round_half_up(n * reference / batch)
# == (2 * n * reference + batch) / (2 * batch) in integer arithmetic (CEL's int is int64; the
# schema's maxima keep every product far below 2^63).
_BATCH = "(self.gpus * self.imagesPerGpu * self.accumulationSteps)"


def _rescaled(expr: str) -> str:
    return f"((2 * ({expr}) * self.referenceBatch + {_BATCH}) / (2 * {_BATCH}))"


#: The one structural type whose CEL declaration is `dyn` (apiserver pkg/cel/common/schemas.go
#: SchemaDeclType): a map whose values had no type would have no CEL declaration at all, and
#: every rule on it (or on its parent naming it) would fail to compile.
OVERRIDE_VALUE_NOTE = (
    "In a MegDetRun the values are integers or strings (the API server can type-check no "
    'other union): quote floats and booleans, e.g. "0.05" or "True"; detectron2 parses '
    "them as it parses command-line overrides."
)


def owned_override_cel_message(key: str) -> str:
    """Why a MegDetRun may not set the detectron2 key ``key`` in extraOverrides."""
    value = OWNED_OVERRIDES[key]
    rule_id = "ownedOverridePolicy" if value in DROPPED_VALUES else "ownedOverrideField"
    return cel_message(rule_id, key=key, value=value)


def overrides_map(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``patternProperties`` (no OpenAPI 3.0 equivalent): a map of int-or-string values whose
    keys CEL rules check."""
    ((pattern, value_schema),) = node["patternProperties"].items()
    out["description"] = f"{out.get('description', '')} {OVERRIDE_VALUE_NOTE}".strip()
    out["additionalProperties"] = {
        "x-kubernetes-int-or-string": True,
        "description": value_schema.get("description", ""),
    }
    rules = [
        {
            "rule": f"self.all(k, k.matches({json.dumps(pattern)}))",
            "message": cel_message("overrideKeys", pattern=pattern),
        },
    ]
    rules += [
        {
            "rule": f"!({json.dumps(key)} in self)",
            "message": owned_override_cel_message(key),
        }
        for key, value in sorted(OWNED_OVERRIDES.items())
    ]
    out["x-kubernetes-validations"] = rules


def _strictly_increasing(items: str, max_items: int, rescale: bool) -> str:
    """CEL for "items is strictly increasing", unrolled up to maxItems (CEL's list macros carry
    no index). Nested conditionals stop at the list's end, so a short list costs little."""

    def value(i: int) -> str:
        return _rescaled(f"{items}[{i}]") if rescale else f"{items}[{i}]"

    expr = "true"
    for i in reversed(range(max_items - 1)):
        expr = f"(size({items}) <= {i + 1} ? true : ({value(i)} < {value(i + 1)} && {expr}))"
    return expr


def rescaled_schedule_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's rules on the schedule rescaled to the global batch (megdet.plan.plan_run)."""
    max_steps = spec["properties"]["steps"].get("maxItems", 16)
    rescaled_steps = _strictly_increasing("self.steps", max_steps, rescale=True)
    return [
        {
            "rule": f"{_rescaled('self.maxIter')} >= 1",
            "fieldPath": ".maxIter",
            "reason": "FieldValueInvalid",
            "message": cel_message("maxIterTooShort"),
        },
        {
            # Rescaling keeps the order, so with increasing steps the first and the last
            # bound them all.
            "rule": f"self.schedule != 'step' || size(self.steps) == 0 || "
            f"({_rescaled('self.steps[0]')} >= 1 && "
            f"{_rescaled('self.steps[size(self.steps) - 1]')} < {_rescaled('self.maxIter')} "
            f"&& {rescaled_steps})",
            "fieldPath": ".steps",
            "reason": "FieldValueInvalid",
            "message": cel_message("stepsCollapse"),
        },
    ]


#: ``{"generated": name}`` entries a values-schema node's rules may hold: name -> the rules, made
#: from the converted spec schema, that take the entry's place (keeping the rules' order).
GENERATED = {"rescaledSchedule": rescaled_schedule_rules}


def _with_message(rule: Mapping[str, Any]) -> dict[str, Any]:
    """``rule`` with its ``messageRef`` replaced, in place, by the message."""
    out: dict[str, Any] = {}
    for key, value in rule.items():
        if key == "messageRef":
            out["message"] = cel_message(value)
        else:
            out[key] = value
    return out


def resolve_rules(node: dict[str, Any], spec: Mapping[str, Any]) -> None:
    """Every ``x-kubernetes-validations`` under ``node`` (a converted schema), in place: a
    ``messageRef`` becomes its message (:func:`megdet.messages.cel_message`), a ``generated``
    entry the rules of :data:`GENERATED`."""
    rules = node.get("x-kubernetes-validations")
    if isinstance(rules, list):
        resolved: list[dict[str, Any]] = []
        for rule in rules:
            if "generated" in rule:
                make = GENERATED.get(rule["generated"])
                if make is None:
                    raise ValueError(
                        f"x-kubernetes-validations: unknown generated rules {rule['generated']!r}"
                        f"; known: {', '.join(sorted(GENERATED))}"
                    )
                resolved += make(spec)
            elif "messageRef" in rule:
                resolved.append(_with_message(rule))
            else:
                resolved.append(rule)
        node["x-kubernetes-validations"] = resolved
    for child in (node.get("properties") or {}).values():
        resolve_rules(child, spec)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            resolve_rules(node[key], spec)


def _template_define(chart: Path, name: str) -> str:
    """The body of ``{{- define "name" -}}...{{- end -}}`` in the run chart's _plan.tpl: the
    chart's reserved pod label pattern and annotation keys are written once, there."""
    text = (chart / "templates/_plan.tpl").read_text()
    match = re.search(
        r'\{\{-? define "' + re.escape(name) + r'" -?\}\}(.*?)\{\{-? end -?\}\}', text, re.S
    )
    if not match:
        raise ValueError(f"charts/megdet/templates/_plan.tpl has no define {name!r}")
    return match.group(1).strip()


def pod_metadata_rules(props: dict[str, Any], chart: Path) -> None:
    """The chart's reserved podLabels keys and podAnnotations, as CEL on those maps."""
    pattern = _template_define(chart, "megdet.reservedLabelPattern")
    reserved = yaml.safe_load(_template_define(chart, "megdet.reservedAnnotations"))
    props["podLabels"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(k, !k.matches({json.dumps(pattern)}))",
            "reason": "FieldValueForbidden",
            "message": cel_message("reservedLabel"),
        }
    ]
    keys = sorted(reserved["keys"])
    prefixes = list(reserved["prefixes"])
    checks = [f"!(k in {json.dumps(keys)})"] + [
        f"!k.startsWith({json.dumps(prefix)})" for prefix in prefixes
    ]
    props["podAnnotations"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(k, {' && '.join(checks)})",
            "reason": "FieldValueForbidden",
            "message": cel_message(
                "reservedAnnotations", keys=", ".join(keys), prefixes=", ".join(prefixes)
            ),
        }
    ]


def steps_rules(props: dict[str, Any]) -> None:
    """steps is strictly increasing, unrolled up to its maxItems."""
    props["steps"].setdefault("x-kubernetes-validations", []).append(
        {
            "rule": _strictly_increasing("self", props["steps"].get("maxItems", 16), False),
            "message": cel_message("stepsIncreasing"),
        }
    )


def transition_rules(spec: dict[str, Any]) -> None:
    """``self == oldSelf`` on each field of :data:`IMMUTABLE_FIELDS`, with the reason; for the
    fields of :data:`ELASTIC_FIELDS`, a rule on the spec that lets an elastic run change them
    (same message, ``fieldPath`` the field)."""
    props = spec["properties"]
    for name, reason in IMMUTABLE_FIELDS.items():
        if name not in props:
            continue
        message = f"{name} is immutable: {reason}"
        if name in ELASTIC_FIELDS and "elastic" in props:
            spec.setdefault("x-kubernetes-validations", []).append(
                {
                    "rule": f"self.{name} == oldSelf.{name} || ({ELASTIC_RUN})",
                    "fieldPath": f".{name}",
                    "message": message,
                }
            )
            continue
        props[name].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": message}
        )


def root_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rules on the whole object: the job is named after the run (metadata.name).

    No ``fieldPath``: the API server resolves it against the schema as written (its
    ValidFieldPath), and the root ``metadata`` is a bare ``{type: object}``."""
    rules = [
        {
            "rule": f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
            "reason": "FieldValueInvalid",
            "message": cel_message("nameLength", max=MAX_JOB_NAME_LENGTH),
        },
        {
            # Both job APIs refuse other names: the PyTorchJob webhook (kubeflow/trainer v1.9.x,
            # pkg/webhooks/pytorch/pytorchjob_webhook.go, NameIsDNS1035Label) and the TrainJob
            # CRD's own CEL rule. The API server alone accepts e.g. "1run" or "a.b" for a
            # MegDetRun, whose job creation would then fail.
            "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "reason": "FieldValueInvalid",
            "message": cel_message("nameLabel"),
        },
    ]
    if "target" in spec["properties"]:
        trainjob = "!has(self.spec.target) || self.spec.target != 'trainjob' || "
        nodes = "((self.spec.gpus + self.spec.gpusPerNode - 1) / self.spec.gpusPerNode)"
        rules += [
            {
                # JobSet names pods <job>-node-0-<nodes - 1>-<5 random>: 14 characters + digits.
                "rule": trainjob
                + f"size(self.metadata.name) + size(string({nodes} - 1)) + 14 <= 63",
                "reason": "FieldValueInvalid",
                "message": cel_message("trainjobNameLength"),
            },
        ]
    return rules
