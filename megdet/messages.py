"""The messages of the run spec's cross-field rules: each written once, here, for every engine.

A rule is checked by three engines, each with its own arithmetic: Python (:mod:`megdet.plan`,
:mod:`megdet.overrides`), the run chart's Go templates (``charts/megdet/templates/_plan.tpl``)
and the API server's CEL (``x-kubernetes-validations`` in the MegDetRun CRD). The words they
answer with come from :data:`MESSAGES`, rendered per engine:

- Python: :func:`python_message` (a :class:`~megdet.plan.SpecError` names the field, so the
  rule's own field shows as its value only; other fields by their snake_case names);
- Helm: ``python -m megdet.messages`` writes ``charts/megdet/templates/_messages.tpl`` (``make
  messages``), one ``megdet.msg.<rule id>`` template per chart rule, which the chart's ``fail``
  calls ``include`` with a dict of values;
- CEL: :func:`cel_message`. The API server's message is fixed text (it cannot show the values),
  so a rule either names the fields where the other engines show their values, or has its own
  wording (``cel``) when naming the fields would not make a sentence.

Placeholders in the templates, by a value's name (the chart's dotted value path):

- ``{name}``: ``name=value`` (Helm), ``snake_name value`` (Python), ``name`` (CEL);
- ``{name:q}``: the same with the value quoted (Go's ``%q``);
- ``{name:n}``: the name alone, in every engine;
- ``{name:v}`` and ``{name:qv}``: the value alone (quoted), also in CEL, where the generator
  supplies it (e.g. the reserved keys).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHART_FILE",
    "MESSAGES",
    "Message",
    "cel_message",
    "chart_templates",
    "python_message",
]

#: Where the chart's message templates are generated (relative to the repository root).
CHART_FILE = "charts/megdet/templates/_messages.tpl"

_PLACEHOLDER = re.compile(r"\{([A-Za-z][\w.]*)(?::(n|q|v|qv))?\}")


@dataclass(frozen=True)
class Message:
    """One rule's message.

    ``text``: the message with values (Python and Helm). ``cel``: the API server's wording when
    it differs from ``text`` with the fields named. ``tail``: the end both share. ``field``: the
    rule's own field (Python's SpecError names it). ``chart``: the chart has a template for it.
    """

    text: str
    cel: str | None = None
    tail: str = ""
    field: str | None = None
    chart: bool = True


_WHOLE_NODES = " (multi-node runs use whole nodes)"
_RESERVED_LABEL_DOMAINS = (
    "keys under kubernetes.io/, k8s.io/, x-k8s.io/, kubeflow.org/, volcano.sh/ or a subdomain of "
    "them"
)
_POD_SELECTORS = (
    "the chart, the monitors and alerts, Kueue, the job operators and the gang schedulers"
)
_RFC1035 = (
    "must start with a letter and be lower-case letters, digits and '-' (an RFC 1035 label: the "
    "PyTorchJob webhook and the TrainJob CRD refuse other"
)

#: Rule id -> message. The ids name the chart's templates (megdet.msg.<id>) and the rules'
#: ``messageRef`` in charts/megdet/values.schema.json.
MESSAGES: dict[str, Message] = {
    # The plan's rules (megdet.plan, the chart's megdet.validate, the CRD's spec rules).
    "gpusMultiple": Message(
        "{gpus} is not a multiple of {gpusPerNode}",
        cel="gpus above gpusPerNode must be a multiple of gpusPerNode",
        tail=_WHOLE_NODES,
        field="gpus",
    ),
    "elasticBounds": Message(
        "{gpus} is outside {elastic.minGpus}..{elastic.maxGpus}",
        cel="gpus must be within elastic.minGpus..elastic.maxGpus, the bounds the run declared",
        tail=": an elastic run sets both bounds, 1 <= elastic.minGpus <= gpus <= "
        "elastic.maxGpus, and may be resized within them; with both 0 the run has a fixed size",
    ),
    "stepsIncreasing": Message("{steps} must be strictly increasing", field="steps"),
    "stepsBelowMaxIter": Message("{steps} must all be below {maxIter}", field="steps"),
    "warmupBelowMaxIter": Message("{warmupIters} must be below {maxIter}", field="warmupIters"),
    "maxIterTooShort": Message(
        "{maxIter} iterations at batch {referenceBatch:v} is less than one iteration at global "
        "batch {globalBatch:v}",
        cel="maxIter iterations at referenceBatch is less than one iteration at the global "
        "batch (gpus x imagesPerGpu x accumulationSteps)",
        field="maxIter",
    ),
    "stepsCollapse": Message(
        "{steps} collapse to {plannedSteps:v} at global batch {globalBatch:v} "
        "({maxIter:n} {plannedMaxIter:v})",
        cel="steps collapse when rescaled to the global batch (two steps on one iteration, or a "
        "step at or after the last iteration)",
        tail="; use a longer {maxIter:n} or a smaller batch",
        field="steps",
    ),
    # The chart's own rules (its megdet.validate*, the CRD's rules on the nodes they concern).
    "ibResource": Message(
        "{nccl.ib.enabled} needs {nccl.ib.rdmaResourceName:n}: the extended resource your RDMA "
        "device plugin advertises (e.g. rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, "
        "nvidia.com/hostdev)"
    ),
    "valDataset": Message(
        "{dataset.valJson:q} and {dataset.valImages:q}: set both",
        cel="set both dataset.valJson and dataset.valImages",
        tail=" (evaluate) or neither (train only)",
    ),
    "guaranteedCpu": Message(
        "{resources.cpu:q} is not a whole number of CPUs; with resources.qos=Guaranteed the "
        'kubelet\'s static CPU manager pins whole CPUs only: use e.g. "32", or set '
        "resources.qos=Burstable"
    ),
    "guaranteedMemoryLimit": Message(
        "{resources.memoryLimit:q}: with resources.qos=Guaranteed the memory limit equals "
        "resources.memory ({resources.memory:v})",
        cel="with resources.qos=Guaranteed the memory limit equals resources.memory",
        tail="; leave memoryLimit empty or set resources.qos=Burstable",
    ),
    "volcanoTimeout": Message(
        "{gang.scheduleTimeoutSeconds} has no effect with gang.schedulerName=volcano: the "
        "training operator copies it only into scheduler-plugins' PodGroup; remove it"
    ),
    "gangQueue": Message(
        "{gang.queue:q} has no effect with {gang.schedulerName}",
        cel="gang.queue has no effect unless gang.schedulerName=volcano",
        tail=": the training operator copies the queue only into Volcano's PodGroup; remove it, "
        "or use Kueue (kueue.queueName) for queueing",
    ),
    "kueueSuspend": Message(
        "runPolicy.suspend=true with {kueue.queueName:q}: Kueue owns suspend (its webhook "
        "creates the job suspended and resumes it on admission); to hold the run, hold its queue "
        "(stopPolicy: Hold)"
    ),
    "gangQueueImmutable": Message(
        "gang.queue is immutable: the job's schedulingPolicy.queue cannot change on a running "
        "job (kubeflow.org/v1); delete the run and create it again (checkpoints on the output "
        "volume stay)",
        chart=False,
    ),
    "gangQueueUpgrade": Message(
        "gang.queue: the existing PyTorchJob {namespace:v}/{name:v} has schedulingPolicy.queue "
        "{oldQueue:qv} and this upgrade sets {newQueue:qv}; the queue cannot change on a running "
        "job (immutable in kubeflow.org/v1). Keep gang.queue={oldQueue:qv}, or delete the job "
        "(checkpoints on /output stay) and install again"
    ),
    "trainjobDeadline": Message(
        "runPolicy.activeDeadlineSeconds is immutable with target=trainjob: it cannot change on "
        "a TrainJob (Trainer v2)",
        chart=False,
    ),
    "reservedLabel": Message(
        "podLabels: {key:qv} is reserved: "
        + _RESERVED_LABEL_DOMAINS
        + " (app.kubernetes.io/, kueue.x-k8s.io/, training.kubeflow.org/, trainer.kubeflow.org/, "
        "jobset.sigs.k8s.io/, ...) are how " + _POD_SELECTORS + " select a run's pods",
        cel=_RESERVED_LABEL_DOMAINS + " are reserved (" + _POD_SELECTORS + " select a run's pods "
        "by them)",
        tail="; use a key of your own, e.g. team or example.com/team",
    ),
    "reservedAnnotationKey": Message("podAnnotations: {key:qv} is reserved: {reason:v}"),
    "reservedAnnotationPrefix": Message(
        "podAnnotations: {key:qv} is reserved: the job operators annotate their pods under "
        "{prefixes:v}; use a key of your own"
    ),
    "reservedAnnotations": Message(
        "reserved keys: {keys:v} (the chart or the training operator set them; use "
        "network.multusNetworks for networks) and keys under {prefixes:v}",
        chart=False,
    ),
    "networkPolicyHostNetwork": Message(
        "networkPolicy.enabled=true with network.hostNetwork=true: a NetworkPolicy does not apply "
        "to host-network pods (their traffic is the node's), so it would isolate nothing; turn "
        "one of them off"
    ),
    "networkPolicyExtraEgress": Message(
        "networkPolicy.extraEgress: its rules take effect only with networkPolicy.enabled=true "
        "and networkPolicy.restrictEgress=true (otherwise egress is open); set both, or remove it"
    ),
    # extraOverrides keys that a named value owns (megdet.overrides.OWNED_OVERRIDES).
    "ownedOverride": Message("{field:v}: {key:v} is set by the value {value:v}; use {value:v}"),
    "overrideKeys": Message(
        "keys must be detectron2 config keys matching {pattern:v}, e.g. TEST.EVAL_PERIOD",
        chart=False,
    ),
    "ownedOverrideField": Message(
        "{key:v} is set by the value {value:v}; use spec.{value:v}", chart=False
    ),
    "ownedOverridePolicy": Message(
        "{key:v} is the operator's policy (the run chart's value {value:v}), not a MegDetRun field",
        chart=False,
    ),
    # networkPolicy.extraEgress (NetworkPolicyEgressRule fields the API server would refuse
    # in the run's NetworkPolicy: refused in the MegDetRun first).
    "cidr": Message(
        "must be an IPv4 or IPv6 CIDR: an address and a prefix length, e.g. 10.20.0.0/16 or "
        "2001:db8::/64 (IPv4 prefix at most 32, IPv6 at most 128; no leading zeros)",
        chart=False,
    ),
    "labelExpressionValues": Message(
        "values: In and NotIn need at least one value; Exists and DoesNotExist take none",
        chart=False,
    ),
    "egressPeer": Message(
        "a destination needs an ipBlock, a podSelector or a namespaceSelector", chart=False
    ),
    "egressIpBlockAlone": Message(
        "ipBlock stands alone: it cannot be combined with podSelector or namespaceSelector in one "
        "destination (give them as separate destinations)",
        chart=False,
    ),
    "egressEndPort": Message("endPort needs a port and must be at least port", chart=False),
    # The MegDetRun's name, which its job and pods are named after (the CRD's root rules).
    "nameLength": Message(
        "metadata.name must be at most {max:v} characters, so that the training operator's "
        "Services <name>-worker-<index> stay within 63",
        chart=False,
    ),
    "nameLabel": Message("metadata.name " + _RFC1035 + " job names)", chart=False),
    "trainjobNameLength": Message(
        "with target=trainjob, metadata.name is too long for this many nodes: JobSet's pod "
        "names <name>-node-0-<nodes - 1>-<5 characters> must fit in 63",
        chart=False,
    ),
}


def _rule(rule_id: str) -> Message:
    try:
        return MESSAGES[rule_id]
    except KeyError:
        raise KeyError(f"no message for rule {rule_id!r} in megdet/messages.py") from None


def _snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), name)


def _value(rule_id: str, values: Mapping[str, Any], name: str) -> Any:
    if name not in values:
        raise KeyError(f"message {rule_id!r} needs a value for {name!r}")
    return values[name]


def python_message(rule_id: str, **values: Any) -> str:
    """The message of ``rule_id`` with ``values`` (keyed by the chart's names), as Python
    reports it: the rule's own field as its value alone (its SpecError names it), other fields
    by their snake_case names."""
    message = _rule(rule_id)

    def sub(match: re.Match[str]) -> str:
        name, flag = match.group(1), match.group(2) or ""
        if flag == "n":
            return _snake(name)
        value = _value(rule_id, values, name)
        shown = json.dumps(value) if "q" in flag else str(value)
        if "v" in flag or name == message.field:
            return shown
        return f"{_snake(name)} {shown}"

    return _PLACEHOLDER.sub(sub, message.text + message.tail)


def python_field(rule_id: str) -> str:
    """The snake_case field a Python rule names."""
    field = _rule(rule_id).field
    if field is None:
        raise ValueError(f"message {rule_id!r} names no field")
    return _snake(field)


def cel_message(rule_id: str, **values: Any) -> str:
    """The API server's message for ``rule_id``: fields named, ``{x:v}`` values from
    ``values`` (known when the CRD is generated)."""
    message = _rule(rule_id)

    def sub(match: re.Match[str]) -> str:
        name, flag = match.group(1), match.group(2) or ""
        if "v" in flag:
            value = _value(rule_id, values, name)
            return json.dumps(value) if "q" in flag else str(value)
        return name

    template = message.text if message.cel is None else message.cel
    return _PLACEHOLDER.sub(sub, template + message.tail)


def _go_printf(rule_id: str) -> str:
    """``printf "<format>" <args>`` for a chart rule: its values come in a dict by name."""
    message = _rule(rule_id)
    template = message.text + message.tail
    parts: list[str] = []
    args: list[str] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(template):
        parts.append(template[pos : match.start()].replace("%", "%%"))
        pos = match.end()
        name, flag = match.group(1), match.group(2) or ""
        if flag == "n":
            parts.append(name)
            continue
        verb = "%q" if "q" in flag else "%v"
        parts.append(verb if "v" in flag else f"{name}={verb}")
        args.append(f"(index . {json.dumps(name)})")
    parts.append(template[pos:].replace("%", "%%"))
    return " ".join(["printf", json.dumps("".join(parts), ensure_ascii=True), *args])


def chart_templates() -> str:
    """The text of :data:`CHART_FILE`: one ``megdet.msg.<id>`` template per chart rule."""
    lines = [
        "{{/*",
        f"Generated by `make messages` (python -m megdet.messages > {CHART_FILE})",
        "from megdet/messages.py (MESSAGES); do not edit. A test fails when this copy is stale.",
        "Each template takes a dict of the values its message shows, by the chart's value names:",
        '  fail (include "megdet.msg.<id>" (dict "gpus" $gpus "gpusPerNode" $gpn))',
        "*/}}",
    ]
    for rule_id, message in MESSAGES.items():
        if message.chart:
            lines.append(
                f'{{{{- define "megdet.msg.{rule_id}" -}}}}'
                f"{{{{ {_go_printf(rule_id)} }}}}"
                "{{- end -}}"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    """Print the chart's message templates (``make messages`` writes them to CHART_FILE)."""
    sys.stdout.write(chart_templates())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
