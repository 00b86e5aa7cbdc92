"""The MegDetRun's CEL rules (``x-kubernetes-validations``): what JSON Schema cannot say.

Cross-field rules written to agree with ``megdet.plan`` (a hypothesis test holds the two
verdicts equal) and with the run chart's own ``fail``s; the chart's reserved pod label and
annotation keys; ``extraOverrides`` keys; transition rules (``self == oldSelf``) on the fields
that define the experiment (:data:`IMMUTABLE_FIELDS`); and rules on the run's name, which its
job and pods are named after.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from megdet.controller.api import DROPPED_VALUES
from megdet.naming import MAX_JOB_NAME_LENGTH
from megdet.overrides import OWNED_OVERRIDES

__all__ = [
    "IMMUTABLE_FIELDS",
    "OVERRIDE_VALUE_NOTE",
    "chart_spec_rules",
    "nested_rules",
    "overrides_map",
    "owned_override_message",
    "pod_metadata_rules",
    "root_rules",
    "spec_rules",
    "transition_rules",
]

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


def chart_spec_rules(props: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def spec_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def pod_metadata_rules(props: dict[str, Any], chart: Path) -> None:
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


def nested_rules(props: dict[str, Any]) -> None:
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


def transition_rules(props: dict[str, Any]) -> None:
    for name, reason in IMMUTABLE_FIELDS.items():
        if name in props:
            props[name].setdefault("x-kubernetes-validations", []).append(
                {"rule": "self == oldSelf", "message": f"{name} is immutable: {reason}"}
            )


def root_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
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
