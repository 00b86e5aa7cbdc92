"""The MegDetRun CRD, generated from the run chart's ``values.schema.json`` and ``values.yaml``.

A MegDetRun's spec uses the run chart's value names, so its schema is the chart's values schema
translated to a Kubernetes structural schema (``apiextensions.k8s.io/v1``):

- JSON Schema constructs without an OpenAPI v3.0 equivalent are mapped: ``type: [X, "null"]`` ->
  ``type: X, nullable: true``; draft-07 ``exclusiveMinimum: N`` -> ``minimum: N,
  exclusiveMinimum: true``; free-form objects -> ``x-kubernetes-preserve-unknown-fields``; the
  string-or-integer ``oneOf`` -> ``x-kubernetes-int-or-string`` with one enum; ``patternProperties``
  (``extraOverrides``) -> a map whose keys and scalar values CEL rules check;
- defaults come from ``values.yaml`` (so a sparse CR and ``helm install`` mean the same run);
- cross-field rules that JSON Schema cannot say are CEL ``x-kubernetes-validations``, written to
  agree with ``megdet.plan`` (a hypothesis test holds the two verdicts equal);
- fields that define the experiment get transition rules (``self == oldSelf``).

``make crd`` (``python -m megdet.controller.crd``) writes :data:`CRD_FILE`; a test fails when the
committed copy is stale. Generation fails, listing them, if any field lacks a description.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from megdet.controller.render import chart_dir
from megdet.controller.status import PHASES
from megdet.naming import MAX_JOB_NAME_LENGTH
from megdet.overrides import OWNED_OVERRIDES

__all__ = [
    "CRD_FILE",
    "DROPPED_VALUES",
    "GROUP",
    "IMMUTABLE_FIELDS",
    "KIND",
    "PLURAL",
    "VERSION",
    "MissingDescriptionsError",
    "build_crd",
    "crd_yaml",
    "missing_descriptions",
    "spec_schema",
]

GROUP = "megdet.io"
VERSION = "v1alpha1"
KIND = "MegDetRun"
PLURAL = "megdetruns"
SINGULAR = "megdetrun"
SHORT_NAMES = ["mdr"]
#: Where `make crd` writes the CRD (the operator chart installs it from crds/).
CRD_FILE = (
    Path(__file__).resolve().parents[1] / "charts/megdet-operator/crds/megdetruns.megdet.io.yaml"
)

#: Chart values that are not part of a run's spec: the controller names the job after the run;
#: whether unsafe MODEL.WEIGHTS may load, and the container's securityContext (privileged,
#: runAsUser 0, added capabilities), are the platform's to decide, not the run author's.
DROPPED_VALUES = (
    "global",
    "nameOverride",
    "fullnameOverride",
    "allowUnsafeWeights",
    "containerSecurityContext",
    # The controller's progress endpoint and CA (controller/progress.py): set per run by it.
    "progress",
)

_PLAN = (
    "the plan (world size, global batch, learning rate, schedule) and the checkpoints already "
    "written were made for it, so a resumed run would be a different experiment"
)
_MODEL = "the model and its checkpoints were built with it, so a resumed run would not match them"
_DATA = "the run resumes on the data it started with; a different dataset is a different run"
_OUTPUT = "the run's checkpoints live there; a new place would restart training from scratch"
#: Spec fields that must not change after creation, and why (the transition rules' messages).
IMMUTABLE_FIELDS: dict[str, str] = {
    "gpus": _PLAN,
    "gpusPerNode": _PLAN,
    "imagesPerGpu": _PLAN,
    "accumulationSteps": _PLAN,
    "baseLr": _PLAN,
    "referenceBatch": _PLAN,
    "scaling": _PLAN,
    "schedule": _PLAN,
    "maxIter": _PLAN,
    "steps": _PLAN,
    "warmupIters": _PLAN,
    "syncBN": _MODEL,
    "bnGroupSize": _MODEL,
    "config": _MODEL,
    "extraOverrides": _MODEL,
    "dataset": _DATA,
    "output": _OUTPUT,
    "runName": _OUTPUT,
    "target": "the controller owns one job of one kind; create a new MegDetRun for the other",
}

# Integer rescaling exactly as megdet.plan does it: round_half_up(n * reference / batch)
# == (2 * n * reference + batch) / (2 * batch) in integer arithmetic (CEL's int is int64; the
# schema's maxima keep every product far below 2^63).
_BATCH = "(self.gpus * self.imagesPerGpu * self.accumulationSteps)"


def _null_or_absent(obj: str, field: str) -> str:
    """CEL for "obj.field is unset". A null in a nullable field counts as absent for has(); the
    API server's type checker refuses ``x == null`` on a nullable scalar (it is typed int)."""
    return f"!has({obj}.{field})"


def _rescaled(expr: str) -> str:
    return f"((2 * ({expr}) * self.referenceBatch + {_BATCH}) / (2 * {_BATCH}))"


class MissingDescriptionsError(ValueError):
    """Fields of the values schema without a description (kubectl explain would be empty)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        super().__init__(
            "every field needs a description in charts/megdet/values.schema.json; missing: "
            + ", ".join(paths)
        )


def _load_chart(chart: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = json.loads((chart / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    return schema, defaults


def missing_descriptions(schema: Mapping[str, Any], path: str = "spec") -> list[str]:
    """Paths of properties (at any depth) that have no description."""
    missing: list[str] = []
    for name, prop in (schema.get("properties") or {}).items():
        if path == "spec" and name in DROPPED_VALUES:
            continue
        child = f"{path}.{name}"
        if not prop.get("description"):
            missing.append(child)
        missing += missing_descriptions(prop, child)
    items = schema.get("items")
    if isinstance(items, Mapping):
        missing += missing_descriptions(items, f"{path}[]")
    return missing


def _scalar_keywords(node: Mapping[str, Any], out: dict[str, Any]) -> None:
    for key in ("enum", "pattern", "minLength", "maxLength", "minimum", "maximum"):
        if key in node:
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


def _convert(node: Mapping[str, Any], default: Any, path: str) -> dict[str, Any]:
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
        _convert_object(node, default, path, out)
    elif kind == "array":
        out["items"] = _convert(node.get("items") or {}, None, f"{path}[]")
    if default is not None and kind != "object":
        out["default"] = copy.deepcopy(default)
    return out


def _convert_object(node: Mapping[str, Any], default: Any, path: str, out: dict[str, Any]) -> None:
    props = node.get("properties") or {}
    extra = node.get("additionalProperties", True)
    defaults = default if isinstance(default, Mapping) else {}
    if "patternProperties" in node:
        _pattern_map(node, out)
    elif props:
        out["properties"] = {
            name: _convert(prop, defaults.get(name), f"{path}.{name}")
            for name, prop in props.items()
            if not (path == "spec" and name in DROPPED_VALUES)
        }
        if extra is not False:
            # JSON Schema allows any other key here (e.g. an EnvVar's value/valueFrom).
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, Mapping):
        out["additionalProperties"] = _convert(extra, None, f"{path}.*")
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


#: The one structural type whose CEL declaration is `dyn` (apiserver pkg/cel/common/schemas.go
#: SchemaDeclType): a map whose values had no type would have no CEL declaration at all, and
#: every rule on it (or on its parent naming it) would fail to compile.
OVERRIDE_VALUE_NOTE = (
    "In a MegDetRun the values are integers or strings (the API server can type-check no "
    'other union): quote floats and booleans, e.g. "0.05" or "True"; detectron2 parses '
    "them as it parses command-line overrides."
)


def owned_override_message(key: str) -> str:
    """Why a MegDetRun may not set the detectron2 key ``key`` in extraOverrides."""
    value = OWNED_OVERRIDES[key]
    if value in DROPPED_VALUES:
        return (
            f"{key} is the operator's policy (the run chart's value {value}), not a MegDetRun field"
        )
    return f"{key} is set by the value {value}; use spec.{value}"


def _pattern_map(node: Mapping[str, Any], out: dict[str, Any]) -> None:
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
            "message": f"keys must be detectron2 config keys matching {pattern}, e.g. "
            "TEST.EVAL_PERIOD",
        },
    ]
    rules += [
        {
            "rule": f"!({json.dumps(key)} in self)",
            "message": owned_override_message(key),
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


def _chart_spec_rules(props: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run chart's cross-field `fail`s that span several spec fields."""
    rules = [
        {
            "rule": "self.kueue.queueName == '' || !self.runPolicy.suspend",
            "fieldPath": ".runPolicy.suspend",
            "reason": "FieldValueForbidden",
            "message": "runPolicy.suspend=true with kueue.queueName: Kueue owns suspend (its "
            "webhook creates the job suspended and resumes it on admission); to hold the run, "
            "hold its queue (stopPolicy: Hold)",
        }
    ]
    if "target" in props:
        deadline = "self.runPolicy.activeDeadlineSeconds"
        old_deadline = "oldSelf.runPolicy.activeDeadlineSeconds"
        rules.append(
            {
                # Trainer v2 makes a TrainJob's spec immutable but for suspend.
                "rule": f"self.target != 'trainjob' || "
                f"({_null_or_absent('self.runPolicy', 'activeDeadlineSeconds')} ? 0 : {deadline})"
                f" == ({_null_or_absent('oldSelf.runPolicy', 'activeDeadlineSeconds')} ? 0 : "
                f"{old_deadline})",
                "fieldPath": ".runPolicy.activeDeadlineSeconds",
                "reason": "FieldValueForbidden",
                "message": "runPolicy.activeDeadlineSeconds is immutable with target=trainjob: it "
                "cannot change on a TrainJob (Trainer v2)",
            }
        )
    return rules


def _spec_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Cross-field rules on the spec: the same rules, in the same order, as megdet.plan."""
    max_steps = spec["properties"]["steps"].get("maxItems", 16)
    rescaled_steps = _strictly_increasing("self.steps", max_steps, rescale=True)
    return [
        {
            "rule": "self.gpus <= self.gpusPerNode || self.gpus % self.gpusPerNode == 0",
            "fieldPath": ".gpus",
            "reason": "FieldValueInvalid",
            "message": "gpus above gpusPerNode must be a multiple of gpusPerNode "
            "(multi-node runs use whole nodes)",
        },
        {
            "rule": "self.steps.all(s, s < self.maxIter)",
            "fieldPath": ".steps",
            "reason": "FieldValueInvalid",
            "message": "steps must all be below maxIter",
        },
        {
            "rule": "self.warmupIters < self.maxIter",
            "fieldPath": ".warmupIters",
            "reason": "FieldValueInvalid",
            "message": "warmupIters must be below maxIter",
        },
        {
            "rule": f"{_rescaled('self.maxIter')} >= 1",
            "fieldPath": ".maxIter",
            "reason": "FieldValueInvalid",
            "message": "maxIter iterations at referenceBatch is less than one iteration at the "
            "global batch (gpus x imagesPerGpu x accumulationSteps)",
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
            "message": "steps collapse when rescaled to the global batch (two steps on one "
            "iteration, or a step at or after the last iteration); use a longer maxIter or a "
            "smaller batch",
        },
    ]


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


def _pod_metadata_rules(props: dict[str, Any], chart: Path) -> None:
    """The chart's reserved podLabels keys and podAnnotations, as CEL on those maps."""
    pattern = _template_define(chart, "megdet.reservedLabelPattern")
    reserved = yaml.safe_load(_template_define(chart, "megdet.reservedAnnotations"))
    props["podLabels"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(k, !k.matches({json.dumps(pattern)}))",
            "reason": "FieldValueForbidden",
            "message": "keys under kubernetes.io/, k8s.io/, x-k8s.io/, kubeflow.org/, volcano.sh/ "
            "or a subdomain of them are reserved (the chart, the monitors and alerts, Kueue, the "
            "job operators and the gang schedulers select a run's pods by them); use a key of "
            "your own, e.g. team or example.com/team",
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
            "message": f"reserved keys: {', '.join(keys)} (the chart or the training operator "
            f"set them; use network.multusNetworks for networks) and keys under "
            f"{', '.join(prefixes)}",
        }
    ]


def _nested_rules(props: dict[str, Any]) -> None:
    """The run chart's own cross-field `fail`s, on the nodes they concern."""
    ib = props["nccl"]["properties"]["ib"]
    ib["x-kubernetes-validations"] = [
        {
            "rule": "!self.enabled || self.rdmaResourceName != ''",
            "fieldPath": ".rdmaResourceName",
            "reason": "FieldValueRequired",
            "message": "nccl.ib.enabled needs nccl.ib.rdmaResourceName: the extended resource "
            "your RDMA device plugin advertises (e.g. rdma/rdma_shared_device_a, "
            "rdma/hca_shared_devices_a, nvidia.com/hostdev)",
        }
    ]
    props["dataset"]["x-kubernetes-validations"] = [
        {
            "rule": "(self.valJson == '') == (self.valImages == '')",
            "fieldPath": ".valJson",
            "reason": "FieldValueInvalid",
            "message": "set both dataset.valJson and dataset.valImages (evaluate) or neither "
            "(train only)",
        }
    ]
    resources = props["resources"]
    if "qos" in resources.get("properties", {}):
        resources["x-kubernetes-validations"] = [
            {
                "rule": "self.qos != 'Guaranteed' || "
                "self.cpu.matches('^([1-9][0-9]*|[1-9][0-9]*000m)$')",
                "fieldPath": ".cpu",
                "reason": "FieldValueInvalid",
                "message": "resources.cpu is not a whole number of CPUs; with "
                "resources.qos=Guaranteed the kubelet's static CPU manager pins whole CPUs "
                'only: use e.g. "32", or set resources.qos=Burstable',
            },
            {
                "rule": "self.qos != 'Guaranteed' || self.memoryLimit == ''",
                "fieldPath": ".memoryLimit",
                "reason": "FieldValueForbidden",
                "message": "with resources.qos=Guaranteed the memory limit equals "
                "resources.memory; leave memoryLimit empty or set resources.qos=Burstable",
            },
        ]
    props["gang"]["x-kubernetes-validations"] = [
        {
            "rule": f"!self.enabled || self.schedulerName != 'volcano' || "
            f"{_null_or_absent('self', 'scheduleTimeoutSeconds')}",
            "fieldPath": ".scheduleTimeoutSeconds",
            "reason": "FieldValueForbidden",
            "message": "gang.scheduleTimeoutSeconds has no effect with gang.schedulerName=volcano: "
            "the training operator copies it only into scheduler-plugins' PodGroup; remove it",
        },
        {
            "rule": "!self.enabled || self.schedulerName == 'volcano' || self.queue == ''",
            "fieldPath": ".queue",
            "reason": "FieldValueForbidden",
            "message": "gang.queue has no effect unless gang.schedulerName=volcano: the training "
            "operator copies the queue only into Volcano's PodGroup; remove it, or use Kueue "
            "(kueue.queueName) for queueing",
        },
        {
            # kubeflow.org/v1 makes schedulingPolicy.queue immutable ("self == oldSelf").
            "rule": "(oldSelf.enabled ? oldSelf.queue : '') == (self.enabled ? self.queue : '')",
            "fieldPath": ".queue",
            "message": "gang.queue is immutable: the job's schedulingPolicy.queue cannot change "
            "on a running job (kubeflow.org/v1); delete the run and create it again "
            "(checkpoints on the output volume stay)",
        },
    ]
    props["steps"].setdefault("x-kubernetes-validations", []).append(
        {
            "rule": _strictly_increasing("self", props["steps"].get("maxItems", 16), False),
            "message": "steps must be strictly increasing",
        }
    )


def _transition_rules(props: dict[str, Any]) -> None:
    for name, reason in IMMUTABLE_FIELDS.items():
        if name in props:
            props[name].setdefault("x-kubernetes-validations", []).append(
                {"rule": "self == oldSelf", "message": f"{name} is immutable: {reason}"}
            )


def spec_schema(chart: Path | None = None) -> dict[str, Any]:
    """The MegDetRun spec schema (structural OpenAPI v3) for the run chart at ``chart``."""
    values_schema, defaults = _load_chart(chart or chart_dir())
    missing = missing_descriptions(values_schema)
    if missing:
        raise MissingDescriptionsError(missing)
    spec = _convert(values_schema, defaults, "spec")
    spec.pop("default", None)
    spec["description"] = (
        "The run: the run chart's values (charts/megdet/values.yaml), minus nameOverride and "
        "fullnameOverride (the job is named after the MegDetRun)."
    )
    _nested_rules(spec["properties"])
    _pod_metadata_rules(spec["properties"], chart or chart_dir())
    _transition_rules(spec["properties"])
    spec["x-kubernetes-validations"] = _spec_rules(spec) + _chart_spec_rules(spec["properties"])
    return spec


def _field(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def status_schema() -> dict[str, Any]:
    """The status the controller writes (plan, phase, conditions, job)."""
    phases = list(PHASES)
    condition = _field(
        "object",
        "One aspect of the run's state (Kubernetes condition conventions).",
        required=["type", "status"],
        properties={
            "type": _field("string", "Condition type, e.g. Valid, JobCreated, Running, Succeeded."),
            "status": _field(
                "string", "True, False or Unknown.", enum=["True", "False", "Unknown"]
            ),
            "reason": _field("string", "Machine-readable CamelCase reason for the last change."),
            "message": _field("string", "Human-readable details; names the field for Invalid."),
            "lastTransitionTime": _field("string", "When status last changed.", format="date-time"),
            "observedGeneration": _field(
                "integer", "metadata.generation this condition was computed from.", format="int64"
            ),
        },
    )
    time = {"format": "date-time"}
    return _field(
        "object",
        "What the controller observed and planned. Written only by the controller.",
        properties={
            "phase": _field("string", "The run's phase, mirrored from its job.", enum=phases),
            "conditions": _field(
                "array",
                "Conditions of the run, one per type.",
                items=condition,
                **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
            ),
            "observedGeneration": _field(
                "integer", "metadata.generation the status was computed from.", format="int64"
            ),
            "worldSize": _field("integer", "Planned world size (training processes)."),
            "nodes": _field("integer", "Planned nodes (pods)."),
            "globalBatch": _field("integer", "Images per optimizer step across the run."),
            "lr": _field("number", "Planned peak learning rate for the global batch."),
            "maxIter": _field("integer", "Planned iterations at the global batch."),
            "steps": _field("array", "Planned LR decay iterations.", items={"type": "integer"}),
            "warmupIters": _field("integer", "Planned warmup iterations."),
            "jobName": _field("string", "Name of the job the controller created."),
            "target": _field("string", "Kind of job: pytorchjob or trainjob."),
            "startTime": _field("string", "When the job started running.", **time),
            "completionTime": _field("string", "When the job succeeded or failed.", **time),
            "restarts": _field("integer", "Times the job restarted its pods."),
            "progress": progress_schema(),
        },
    )


def progress_schema() -> dict[str, Any]:
    """``status.progress``: what the trainer last reported (``megdet.progress.to_status``)."""
    time = {"format": "date-time"}
    return _field(
        "object",
        "Training progress the trainer reported: to the controller's endpoint (target "
        "pytorchjob) or to Kubeflow Trainer (target trainjob, mirrored from the TrainJob's "
        "status.trainerStatus). Written at most once per run every --progress-interval "
        "seconds (pytorchjob), or when Trainer stores a report, which the trainer sends at most "
        "every MEGDET_PROGRESS_INTERVAL seconds besides evaluations and checkpoints (trainjob).",
        properties={
            "iteration": _field("integer", "Iterations done.", format="int64"),
            "maxIter": _field("integer", "Iterations planned (SOLVER.MAX_ITER).", format="int64"),
            "percent": _field("integer", "Percent of maxIter done, 0-100.", minimum=0, maximum=100),
            "imagesSeen": _field("integer", "Training images seen so far.", format="int64"),
            "plannedImages": _field("integer", "Training images planned.", format="int64"),
            "imagesPerSecond": _field("number", "Training throughput, images per second."),
            "etaSeconds": _field("integer", "Estimated seconds until maxIter.", format="int64"),
            "etaTime": _field("string", "Estimated end: updatedTime + etaSeconds.", **time),
            "ap": _field("number", "COCO box AP of the last evaluation, in percent."),
            "ap50": _field("number", "COCO box AP50 of the last evaluation, in percent."),
            "evalIteration": _field("integer", "Iteration of the last evaluation.", format="int64"),
            "checkpointIteration": _field(
                "integer", "Iteration of the last complete checkpoint.", format="int64"
            ),
            "checkpointTime": _field("string", "When the last checkpoint was written.", **time),
            "updatedTime": _field("string", "When the trainer measured this progress.", **time),
        },
    )


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus"},
        {"name": "World", "type": "integer", "jsonPath": ".status.worldSize"},
        {"name": "Batch", "type": "integer", "jsonPath": ".status.globalBatch"},
        {"name": "LR", "type": "number", "jsonPath": ".status.lr"},
        # Progress: percent, the estimated end as a time (a `date` column prints a future time
        # as "<invalid>": kubectl shows the age of a past one only), the last evaluation's AP.
        {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percent"},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.etaTime"},
        {"name": "AP", "type": "number", "jsonPath": ".status.progress.ap"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        # kubectl get -o wide.
        {
            "name": "Iteration",
            "type": "integer",
            "jsonPath": ".status.progress.iteration",
            "priority": 1,
        },
        {
            "name": "Images/s",
            "type": "number",
            "jsonPath": ".status.progress.imagesPerSecond",
            "priority": 1,
        },
        {"name": "AP50", "type": "number", "jsonPath": ".status.progress.ap50", "priority": 1},
        {
            "name": "Checkpoint",
            "type": "integer",
            "jsonPath": ".status.progress.checkpointIteration",
            "priority": 1,
        },
        {
            "name": "Reported",
            "type": "date",
            "jsonPath": ".status.progress.updatedTime",
            "priority": 1,
        },
    ]


def _root_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rules on the whole object: the job is named after the run (metadata.name).

    No ``fieldPath``: the API server resolves it against the schema as written (its
    ValidFieldPath), and the root ``metadata`` is a bare ``{type: object}``."""
    rules = [
        {
            "rule": f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
            "reason": "FieldValueInvalid",
            "message": f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters, so "
            "that the training operator's Services <name>-worker-<index> stay within 63",
        },
        {
            # Both job APIs refuse other names: the PyTorchJob webhook (kubeflow/trainer v1.9.x,
            # pkg/webhooks/pytorch/pytorchjob_webhook.go, NameIsDNS1035Label) and the TrainJob
            # CRD's own CEL rule. The API server alone accepts e.g. "1run" or "a.b" for a
            # MegDetRun, whose job creation would then fail.
            "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "reason": "FieldValueInvalid",
            "message": "metadata.name must start with a letter and be lower-case letters, "
            "digits and '-' (an RFC 1035 label: the PyTorchJob webhook and the TrainJob CRD "
            "refuse other job names)",
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
                "message": "with target=trainjob, metadata.name is too long for this many nodes: "
                "JobSet's pod names <name>-node-0-<nodes - 1>-<5 characters> must fit in 63",
            },
        ]
    return rules


def build_crd(chart: Path | None = None) -> dict[str, Any]:
    """The MegDetRun CustomResourceDefinition, generated from the run chart."""
    schema_spec = spec_schema(chart)
    schema = {
        "type": "object",
        "description": "A MegDet training run: the controller validates it, plans it and "
        "creates its job with the run chart.",
        "required": ["spec"],
        "properties": {
            "apiVersion": _field("string", "API version of this object (megdet.io/v1alpha1)."),
            "kind": _field("string", "Kind of this object (MegDetRun)."),
            "metadata": {"type": "object"},
            "spec": schema_spec,
            "status": status_schema(),
        },
        "x-kubernetes-validations": _root_rules(schema_spec),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["megdet"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def crd_yaml(crd: Mapping[str, Any] | None = None) -> str:
    """The CRD as the YAML file `make crd` writes."""
    header = (
        "# Generated by `make crd` (python -m megdet.controller.crd) from charts/megdet/"
        "values.schema.json\n# and values.yaml; do not edit. A test fails when this copy is "
        "stale.\n"
    )
    body = yaml.safe_dump(
        dict(crd or build_crd()), sort_keys=False, width=100, default_flow_style=False
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    """Write the CRD to CRD_FILE (or --output; '-' for stdout)."""
    parser = argparse.ArgumentParser(prog="python -m megdet.controller.crd")
    parser.add_argument("--output", default=str(CRD_FILE), help="file to write; - for stdout")
    args = parser.parse_args(argv)
    try:
        text = crd_yaml()
    except MissingDescriptionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
