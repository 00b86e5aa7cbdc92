"""The cluster's MegDet policy: what creating a MegDetRun lets its author put into pods.

The policy's values (:class:`Policy`) and the controller's :func:`check` of a run's spec
against its rules (rules.py, knobs.py). How and why: docs/operations.md, "Who may
do what: the cluster's MegDet policy".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from megdet.policy.cel import Rule, context, evaluate, read_fields
from megdet.policy.knobs import KNOB_USES, grant_message
from megdet.policy.rules import RULES

__all__ = [
    "KNOB_USES",
    "RULES",
    "Policy",
    "PolicyError",
    "Rule",
    "check",
    "grant_message",
]

#: An entry of policy.reservedNodeLabels: a label key, or key=value (a value holds no "=").
_NODE_LABEL = re.compile(r"^[^=\s]+(=[^=\s]*)?$")


#: An entry of policy.mountPrefixes: an absolute, normalized folder ending in "/".
_MOUNT_PREFIX = re.compile(r"^(/[^/]+)*/$")
_DOT_SEGMENT = re.compile(r"(^|/)\.\.?(/|$)")
#: Python regular expression syntax RE2 (the API server's CEL) does not have: lookaround and
#: backreferences.
_NOT_RE2 = re.compile(r"\(\?(=|!|<=|<!|P=)|\\[1-9]")


class PolicyError(ValueError):
    """A policy value that is not one; the message names ``policy.<key>`` and what it takes."""


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"policy.{key}: must be a list of strings, got {value!r}")
    return tuple(value)


def _check_re2(key: str, pattern: str) -> None:
    """Refuse a pattern that is no regular expression, or one RE2 would not take."""
    try:
        re.compile(pattern)
    except re.error as err:
        raise PolicyError(
            f"policy.{key}: {pattern!r} is not a regular expression ({err})"
        ) from None
    if _NOT_RE2.search(pattern):
        raise PolicyError(
            f"policy.{key}: {pattern!r} uses lookaround or a backreference, which RE2 (the API "
            "server's CEL) does not have"
        )


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"policy.{key}: must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class Privileged:
    """Privileged knobs the cluster allows at all (each also needs the RBAC grant)."""

    hostNetwork: bool = False
    ibRootMode: bool = False
    podSecurity: bool = False
    hostPath: bool = False
    anyMountPath: bool = False


@dataclass(frozen=True)
class Policy:
    """The operator chart's ``policy`` values; what each lets a run set: docs/operations.md,
    "Who may do what". The defaults are the chart's (a test holds
    ``charts/megdet-operator/values.yaml`` equal to them): secure by default. Lists of names
    accept ``"*"`` for "any"."""

    #: Image repositories; an entry ending in "/" allows everything under it.
    imageRepositories: tuple[str, ...] = ("ghcr.io/megdet/",)
    #: ServiceAccounts of the run's namespace; "" is the namespace default.
    serviceAccounts: tuple[str, ...] = ("",)
    #: Volume types of spec.extraVolumes (hostPath is a privileged knob).
    volumeTypes: tuple[str, ...] = ("configMap", "emptyDir", "persistentVolumeClaim")
    #: Whether spec.extraEnv may read Secrets.
    secretRefs: bool = False
    #: PriorityClasses a run may name besides none ("").
    priorityClasses: tuple[str, ...] = ()
    #: Kueue LocalQueues a run may name ([]: any of its namespace).
    queues: tuple[str, ...] = ()
    #: Whether every run must name a Kueue LocalQueue.
    requireQueue: bool = False
    #: Gang schedulers (spec.gang.schedulerName).
    schedulers: tuple[str, ...] = ("volcano",)
    #: Volcano queues (cluster-wide) a gang-scheduled run may name; "" is the default queue.
    gangQueues: tuple[str, ...] = ("",)
    #: Taint keys a run may tolerate; a toleration without a key needs "*".
    tolerationKeys: tuple[str, ...] = ("nvidia.com/gpu",)
    #: Namespaces of the networks spec.network.multusNetworks names ("": the run's own).
    multusNamespaces: tuple[str, ...] = ("",)
    #: Whether spec.podAnnotations may set Multus' default network.
    multusDefaultNetwork: bool = False
    #: Whether spec.extraEnv may set the loader's variables (reserved.LOADER_ENV).
    loaderEnv: bool = False
    #: Whether extra volumes and mounts may reach the run's output volume again.
    outputMounts: bool = False
    #: Folders spec.extraVolumeMounts may mount strictly under (absolute, ending in "/").
    mountPrefixes: tuple[str, ...] = ("/mnt/",)
    #: RE2 patterns a spec.extraEnv name must match (reserved names stay refused).
    envNames: tuple[str, ...] = (r"^[A-Z][A-Z0-9_]*$",)
    #: Key prefixes spec.podLabels may use.
    labelPrefixes: tuple[str, ...] = ("user.megdet.io/",)
    #: Key prefixes spec.podAnnotations may use.
    annotationPrefixes: tuple[str, ...] = ("user.megdet.io/",)
    #: Extended resources spec.gpuResource may name.
    gpuResources: tuple[str, ...] = ("nvidia.com/gpu",)
    #: Extended resources spec.nccl.ib.rdmaResourceName may name.
    rdmaResources: tuple[str, ...] = (
        "nvidia.com/hostdev",
        "rdma/hca_shared_devices_a",
        "rdma/rdma_shared_device_a",
    )
    #: Node labels ("key" or "key=value") a run may not select: a deny list, "*" means nothing.
    reservedNodeLabels: tuple[str, ...] = (
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    )
    #: The run chart's allowUnsafeWeights for every run (not a MegDetRun field).
    unsafeWeights: bool = False
    privileged: Privileged = field(default_factory=Privileged)

    @classmethod
    def from_values(cls, values: Any) -> Policy:
        """The policy from the chart's ``policy`` mapping; unknown or mistyped keys raise
        :class:`PolicyError` naming the key and the allowed ones. Missing keys take defaults."""
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise PolicyError(f"policy: must be a mapping, got {values!r}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known) - {"admission"})
        if unknown:
            raise PolicyError(
                f"policy.{unknown[0]}: unknown key; allowed: {', '.join(sorted(known))}, admission"
            )
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name == "admission":
                continue
            if name == "privileged":
                if not isinstance(value, Mapping):
                    raise PolicyError(f"policy.privileged: must be a mapping, got {value!r}")
                allowed = [f.name for f in fields(Privileged)]
                extra = sorted(set(value) - set(allowed))
                if extra:
                    raise PolicyError(
                        f"policy.privileged.{extra[0]}: unknown key; allowed: {', '.join(allowed)}"
                    )
                kwargs[name] = Privileged(
                    **{k: _bool(f"privileged.{k}", v) for k, v in value.items()}
                )
            elif isinstance(getattr(cls(), name), bool):
                kwargs[name] = _bool(name, value)
            else:
                kwargs[name] = _strings(name, value)
        for label in kwargs.get("reservedNodeLabels", ()):
            if not _NODE_LABEL.match(label):
                raise PolicyError(
                    f"policy.reservedNodeLabels: {label!r} is not a label key or key=value"
                )
        for prefix in kwargs.get("mountPrefixes", ()):
            if not _MOUNT_PREFIX.match(prefix) or _DOT_SEGMENT.search(prefix):
                raise PolicyError(
                    f"policy.mountPrefixes: {prefix!r} is not a normalized absolute folder "
                    'ending in "/" (e.g. "/mnt/"; no "//", "." or ".." segment)'
                )
        for pattern in kwargs.get("envNames", ()):
            _check_re2("envNames", pattern)
        return cls(**kwargs)

    def values(self) -> dict[str, Any]:
        """The chart-values form (lists, camelCase keys)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Privileged):
                out[f.name] = {p.name: getattr(value, p.name) for p in fields(Privileged)}
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


#: The spec fields the rules read.
_READ_FIELDS = read_fields(RULES)


@functools.cache
def _values(policy: Policy) -> dict[str, Any]:
    return policy.values()


def check(spec: Any, policy: Policy) -> list[tuple[str, str]]:
    """The policy problems of a run's spec, as ``(field path, message)``; [] when it passes.
    Every rule of :data:`RULES`, in one CEL context; never raises."""
    if not isinstance(spec, Mapping):
        return []
    ctx = context(spec, _values(policy), _READ_FIELDS)
    problems = []
    for rule in RULES:
        message = evaluate(rule, ctx)
        if message:
            problems.append((rule.path, message))
    return problems


#: The spec field a run's owner may always change, whatever the policy says now.
SUSPEND_FIELD = ("runPolicy", "suspend")
