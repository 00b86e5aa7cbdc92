"""The cluster's MegDet policy: what creating a MegDetRun lets its author put into pods.

The controller creates a run's job with its own rights, so every spec field that reaches a pod is
a question of who may set it. A platform team states the answer once, in the operator chart's
``policy`` values; two engines enforce it:

- the controller (:func:`check`, before it creates a run's job: condition ``Valid=False``,
  reason ``PolicyDenied``, and a Warning event);
- the API server, through a ValidatingAdmissionPolicy on MegDetRuns whose validations are
  generated from :data:`RULES` (``make policy`` writes ``charts/megdet-operator/files/
  policy-validations.yaml``), so ``kubectl apply`` is refused at once. Its matchCondition
  (:func:`match_conditions`) checks a run's creation and every update of its spec against the
  policy as it is now, except a change of ``runPolicy.suspend`` alone: a revoked grant or a
  stricter policy applies to an existing run at its next spec change, and its owner can still
  suspend, resume and delete it. The controller re-checks a run whose job exists the same way.
  The admission policy also checks the grant for the privileged knobs: ``use`` on
  ``megdetruns/privileged`` in the run's namespace, asked of the cluster's own authorizer for
  the requesting user. The controller never learns who wrote a run, so that check exists only
  at admission.

Each rule is written once below, as a Python check and the CEL expression that says the same;
the real-cluster tests hold the two verdicts and messages equal. This module is pure Python.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "PRIVILEGED_KNOBS",
    "RULES",
    "Policy",
    "PolicyError",
    "Rule",
    "check",
    "validations",
]

#: What the privileged knobs are, by their policy key (``policy.privileged.<key>``).
PRIVILEGED_KNOBS: dict[str, str] = {
    "hostNetwork": "spec.network.hostNetwork",
    "ibRootMode": "spec.nccl.ib.memlock",
    "podSecurity": "spec.podSecurityContext",
    "hostPath": "spec.extraVolumes",
}
#: The subresource whose ``use`` verb grants the privileged knobs (RBAC, checked at admission).
PRIVILEGED_SUBRESOURCE = "megdetruns/privileged"


#: An entry of policy.reservedNodeLabels: a label key, or key=value (a value holds no "=").
_NODE_LABEL = re.compile(r"^[^=\s]+(=[^=\s]*)?$")


class PolicyError(ValueError):
    """A policy value that is not one; the message names ``policy.<key>`` and what it takes."""


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"policy.{key}: must be a list of strings, got {value!r}")
    return tuple(value)


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


@dataclass(frozen=True)
class Policy:
    """The operator chart's ``policy`` values. The defaults here are the chart's defaults
    (a test holds ``charts/megdet-operator/values.yaml`` equal to them): secure by default.

    Lists of names accept ``"*"`` for "any".
    """

    #: Image repositories a run may use: an entry ending in "/" allows everything under it.
    imageRepositories: tuple[str, ...] = ("ghcr.io/megdet/",)
    #: ServiceAccounts (of the run's namespace) its pods may run as; "" is the namespace default.
    serviceAccounts: tuple[str, ...] = ("",)
    #: Volume types of spec.extraVolumes (hostPath is a privileged knob, never listed here).
    volumeTypes: tuple[str, ...] = ("configMap", "emptyDir", "persistentVolumeClaim")
    #: Whether spec.extraEnv may read Secrets (valueFrom.secretKeyRef).
    secretRefs: bool = False
    #: PriorityClasses a run may name besides none ("").
    priorityClasses: tuple[str, ...] = ()
    #: Kueue LocalQueues a run may name ([]: any LocalQueue of its namespace).
    queues: tuple[str, ...] = ()
    #: Whether every run must name a Kueue LocalQueue (spec.kueue.queueName).
    requireQueue: bool = False
    #: Gang schedulers a run may ask for (spec.gang.schedulerName, with gang.enabled).
    schedulers: tuple[str, ...] = ("volcano",)
    #: Volcano queues (cluster-wide) a gang-scheduled run may name; "" is the default queue.
    gangQueues: tuple[str, ...] = ("",)
    #: Taint keys a run may tolerate; a toleration without a key (tolerate all) needs "*".
    tolerationKeys: tuple[str, ...] = ("nvidia.com/gpu",)
    #: Namespaces whose NetworkAttachmentDefinitions spec.network.multusNetworks may name: ""
    #: is the run's own (a network named without a namespace); "*" any, and Multus' JSON form,
    #: which can name any namespace. A secondary network is outside every NetworkPolicy.
    multusNamespaces: tuple[str, ...] = ("",)
    #: Whether spec.podAnnotations may set Multus' v1.multus-cni.io/default-network, which
    #: replaces the pods' cluster network (and so every NetworkPolicy on it).
    multusDefaultNetwork: bool = False
    #: Whether spec.extraEnv may set the variables that make the dynamic loader, Python, NCCL,
    #: CUDA or OpenSSL load code from a path (:data:`LOADER_ENV`: LD_PRELOAD, PYTHONPATH, ...),
    #: e.g. from a mounted ConfigMap: any code in an allowed image.
    loaderEnv: bool = False
    #: Whether spec.extraVolumeMounts may mount the run's output volume again or put anything at
    #: or under /output, and spec.extraVolumes may mount the output PVC again: both reach other
    #: runs' folders past the controller's output-folder check.
    outputMounts: bool = False
    #: Extended resources spec.gpuResource may name (a device plugin's resource).
    gpuResources: tuple[str, ...] = ("nvidia.com/gpu",)
    #: Extended resources spec.nccl.ib.rdmaResourceName may name (with nccl.ib.enabled).
    rdmaResources: tuple[str, ...] = (
        "nvidia.com/hostdev",
        "rdma/hca_shared_devices_a",
        "rdma/rdma_shared_device_a",
    )
    #: Node labels ("key", any value, or "key=value") that spec.nodeSelector and the node
    #: affinity of spec.affinity may not select: nodes reserved for other uses. Not a list of
    #: allowed names: "*" has no meaning here.
    reservedNodeLabels: tuple[str, ...] = (
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    )
    #: Whether the trainer may load MODEL.WEIGHTS from a URL or a pickle (.pkl), which can run
    #: code: the run chart's allowUnsafeWeights for every run (not a MegDetRun field).
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


# ------------------------------------------------------------------------------------------
# The rules: each a Python check and the same rule in CEL for the admission policy. In CEL,
# ``s`` is the run's spec and ``variables.<key>`` the policy value of that key; a failing rule's
# messageExpression builds the same message as the Python check.


@dataclass(frozen=True)
class Rule:
    """One policy rule: ``check(spec, policy)`` -> a problem message or None, and its CEL."""

    name: str
    path: str
    check: Callable[[Mapping[str, Any], Policy], str | None]
    #: CEL that is true when the spec passes (the policy values are ``variables.*``).
    expression: str
    #: CEL building the message when it fails (the Python check's message, word for word).
    message: str


def _get(spec: Mapping[str, Any], *path: str) -> Any:
    value: Any = spec
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _allowed(name: str, allowed: Iterable[str]) -> bool:
    allowed = tuple(allowed)
    return "*" in allowed or name in allowed


def _join(values: Iterable[str]) -> str:
    # Quoted as the CEL message builds it ('"' + x + '"'): not json.dumps, which escapes the
    # quotes inside a value (Multus' JSON form) and non-ASCII, and would differ from the server.
    return ", ".join(f'"{v}"' for v in values) or "none"


# CEL: the same rendering of a list of names as _join (each in double quotes, or "none").
def _cel_join(expr: str) -> str:
    return f"({expr}.size() == 0 ? 'none' : {expr}.map(x, '\"' + x + '\"').join(', '))"


def _image(spec: Mapping[str, Any], policy: Policy) -> str | None:
    repo = _get(spec, "image", "repository")
    if not isinstance(repo, str):
        return None
    for allowed in policy.imageRepositories:
        if (
            allowed == "*"
            or repo == allowed
            or (allowed.endswith("/") and repo.startswith(allowed))
        ):
            return None
    return (
        f"image repository {json.dumps(repo)} is not allowed by the cluster's MegDet policy "
        f"(policy.imageRepositories: {_join(policy.imageRepositories)})"
    )


def _service_account(spec: Mapping[str, Any], policy: Policy) -> str | None:
    account = _get(spec, "serviceAccountName")
    if not isinstance(account, str) or _allowed(account, policy.serviceAccounts):
        return None
    return (
        f"ServiceAccount {json.dumps(account)} is not allowed by the cluster's MegDet policy "
        f"(policy.serviceAccounts: {_join(policy.serviceAccounts)})"
    )


def _volume_types(volume: Any) -> list[str]:
    return [k for k in volume if k != "name"] if isinstance(volume, Mapping) else []


def _volumes(spec: Mapping[str, Any], policy: Policy) -> str | None:
    bad = [
        str(v.get("name"))
        for v in _list(_get(spec, "extraVolumes"))
        if isinstance(v, Mapping)
        and any(t != "hostPath" and not _allowed(t, policy.volumeTypes) for t in _volume_types(v))
    ]
    if not bad:
        return None
    return (
        f"volumes {_join(bad)} are of types the cluster's MegDet policy does not allow "
        f"(policy.volumeTypes: {_join(policy.volumeTypes)})"
    )


def _secret_refs(spec: Mapping[str, Any], policy: Policy) -> str | None:
    if policy.secretRefs:
        return None
    bad = [
        str(e.get("name"))
        for e in _list(_get(spec, "extraEnv"))
        if isinstance(e, Mapping)
        and isinstance(e.get("valueFrom"), Mapping)
        and "secretKeyRef" in e["valueFrom"]
    ]
    if not bad:
        return None
    return (
        f"env {_join(bad)} read Secrets, which the cluster's MegDet policy does not allow "
        "(policy.secretRefs: false)"
    )


def _priority(spec: Mapping[str, Any], policy: Policy) -> str | None:
    name = _get(spec, "priorityClassName")
    if not isinstance(name, str) or name == "" or _allowed(name, policy.priorityClasses):
        return None
    return (
        f"PriorityClass {json.dumps(name)} is not allowed by the cluster's MegDet policy "
        f"(policy.priorityClasses: {_join(policy.priorityClasses)})"
    )


def _require_queue(spec: Mapping[str, Any], policy: Policy) -> str | None:
    name = _get(spec, "kueue", "queueName")
    if not policy.requireQueue or (isinstance(name, str) and name != ""):
        return None
    return "the cluster's MegDet policy requires a Kueue LocalQueue (policy.requireQueue)"


def _queues(spec: Mapping[str, Any], policy: Policy) -> str | None:
    name = _get(spec, "kueue", "queueName")
    if not isinstance(name, str) or name == "" or not policy.queues:
        return None
    if _allowed(name, policy.queues):
        return None
    return (
        f"LocalQueue {json.dumps(name)} is not allowed by the cluster's MegDet policy "
        f"(policy.queues: {_join(policy.queues)})"
    )


def _gang_on(spec: Mapping[str, Any]) -> bool:
    return _get(spec, "gang", "enabled") is True


def _scheduler(spec: Mapping[str, Any], policy: Policy) -> str | None:
    scheduler = _get(spec, "gang", "schedulerName")
    if not _gang_on(spec) or not isinstance(scheduler, str):
        return None
    if _allowed(scheduler, policy.schedulers):
        return None
    return (
        f"scheduler {json.dumps(scheduler)} is not allowed by the cluster's MegDet policy "
        f"(policy.schedulers: {_join(policy.schedulers)})"
    )


def _gang_queue(spec: Mapping[str, Any], policy: Policy) -> str | None:
    queue = _get(spec, "gang", "queue")
    if not _gang_on(spec) or not isinstance(queue, str) or _allowed(queue, policy.gangQueues):
        return None
    return (
        f"Volcano queue {json.dumps(queue)} is not allowed by the cluster's MegDet policy "
        f"(policy.gangQueues: {_join(policy.gangQueues)})"
    )


def _tolerations(spec: Mapping[str, Any], policy: Policy) -> str | None:
    bad = [
        str(t.get("key") or "")
        for t in _list(_get(spec, "tolerations"))
        if isinstance(t, Mapping) and not _allowed(str(t.get("key") or ""), policy.tolerationKeys)
    ]
    if not bad:
        return None
    return (
        f"tolerations of taint keys {_join(bad)} are not allowed by the cluster's MegDet policy "
        f'(policy.tolerationKeys: {_join(policy.tolerationKeys)}; "" tolerates every taint)'
    )


# Multus (k8s.cni.cncf.io): a secondary network, or a replaced default one, is outside every
# NetworkPolicy. Multus reads k8s.v1.cni.cncf.io/networks as JSON when it holds any of [ { "
# (multus-cni pkg/k8sclient parsePodNetworkAnnotation), else as comma-separated
# [namespace/]name[@interface] entries.
MULTUS_DEFAULT_NETWORK = "v1.multus-cni.io/default-network"
_JSON_CHARS = ("[", "{", '"')


def _network_namespace(entry: str) -> str:
    """The namespace a comma-separated Multus entry names ("": the pod's own)."""
    return entry.split("/")[0] if "/" in entry else ""


def _multus(spec: Mapping[str, Any], policy: Policy) -> str | None:
    value = _get(spec, "network", "multusNetworks")
    if not isinstance(value, str) or value.strip() == "" or "*" in policy.multusNamespaces:
        return None
    if any(c in value for c in _JSON_CHARS):
        bad = [value]
    else:
        bad = [
            e.strip()
            for e in value.split(",")
            if e.strip() != "" and _network_namespace(e.strip()) not in policy.multusNamespaces
        ]
    if not bad:
        return None
    return (
        f"networks {_join(bad)} are not allowed by the cluster's MegDet policy "
        f"(policy.multusNamespaces: {_join(policy.multusNamespaces)}; a network of the run's "
        'own namespace is named without one, and the JSON form needs "*")'
    )


def _multus_default(spec: Mapping[str, Any], policy: Policy) -> str | None:
    annotations = _get(spec, "podAnnotations")
    if policy.multusDefaultNetwork or not isinstance(annotations, Mapping):
        return None
    if MULTUS_DEFAULT_NETWORK not in annotations:
        return None
    return (
        f'pod annotation "{MULTUS_DEFAULT_NETWORK}" replaces the pods\' network, round every '
        "NetworkPolicy, which the cluster's MegDet policy does not allow "
        "(policy.multusDefaultNetwork: false)"
    )


#: Environment variables that make a process load code from a path (besides every LD_* of the
#: dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...): Python's import path, startup
#: and user site (HOME holds ~/.local/lib/pythonX.Y/site-packages, whose .pth files run code),
#: the shells' startup files, glibc's iconv modules, CUDA's injection library, NCCL's plugins
#: and config file, OpenSSL's config and engines, and other interpreters' equivalents.
LOADER_ENV_PREFIXES = ("LD_",)
LOADER_ENV: tuple[str, ...] = (
    "BASH_ENV",
    "CUDA_INJECTION32_PATH",
    "CUDA_INJECTION64_PATH",
    "ENV",
    "GCONV_PATH",
    "HOME",
    "NCCL_CONF_FILE",
    "NCCL_ENV_PLUGIN",
    "NCCL_NET_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NODE_OPTIONS",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "PERL5LIB",
    "PERL5OPT",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONNOUSERSITE",
    "PYTHONPATH",
    "PYTHONPLATLIBDIR",
    "PYTHONPYCACHEPREFIX",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "RUBYOPT",
)


def is_loader_env(name: Any) -> bool:
    return isinstance(name, str) and (name.startswith(LOADER_ENV_PREFIXES) or name in LOADER_ENV)


def _loader_env(spec: Mapping[str, Any], policy: Policy) -> str | None:
    if policy.loaderEnv:
        return None
    bad = [
        str(e.get("name"))
        for e in _list(_get(spec, "extraEnv"))
        if isinstance(e, Mapping) and is_loader_env(e.get("name"))
    ]
    if not bad:
        return None
    return (
        f"env {_join(bad)} make the loader or the interpreter load code from a path, which the "
        "cluster's MegDet policy does not allow (policy.loaderEnv: false)"
    )


#: The run chart's output volume (mounted at /output) and what an extra mount may not reach:
#: /output or below it, or a path with a "." or ".." segment (which could reach it).
OUTPUT_VOLUME = "output"
_OUTPUT_PATH_RE = r"^/+output(/|$)|(^|/)\.\.?(/|$)"
_OUTPUT_PATH = re.compile(_OUTPUT_PATH_RE)


def _reaches_output(mount: Any) -> bool:
    if not isinstance(mount, Mapping):
        return False
    path = mount.get("mountPath")
    return mount.get("name") == OUTPUT_VOLUME or (
        isinstance(path, str) and _OUTPUT_PATH.search(path) is not None
    )


def _output_mounts(spec: Mapping[str, Any], policy: Policy) -> str | None:
    if policy.outputMounts:
        return None
    bad = [
        str(m.get("mountPath"))
        for m in _list(_get(spec, "extraVolumeMounts"))
        if _reaches_output(m)
    ]
    if not bad:
        return None
    return (
        f"volume mounts at {_join(bad)} reach the output volume or /output (other runs' "
        "folders), which the cluster's MegDet policy does not allow (policy.outputMounts: false)"
    )


def _output_claim(spec: Mapping[str, Any], policy: Policy) -> str | None:
    claim = _get(spec, "output", "claimName")
    if policy.outputMounts or not isinstance(claim, str):
        return None
    bad = [
        str(v.get("name"))
        for v in _list(_get(spec, "extraVolumes"))
        if isinstance(v, Mapping) and _get(v, "persistentVolumeClaim", "claimName") == claim
    ]
    if not bad:
        return None
    return (
        f"volumes {_join(bad)} mount the output PVC {json.dumps(claim)} again (other runs' "
        "folders), which the cluster's MegDet policy does not allow (policy.outputMounts: false)"
    )


def _gpu_resource(spec: Mapping[str, Any], policy: Policy) -> str | None:
    name = _get(spec, "gpuResource")
    if not isinstance(name, str) or _allowed(name, policy.gpuResources):
        return None
    return (
        f"GPU resource {json.dumps(name)} is not allowed by the cluster's MegDet policy "
        f"(policy.gpuResources: {_join(policy.gpuResources)})"
    )


def _rdma_resource(spec: Mapping[str, Any], policy: Policy) -> str | None:
    name = _get(spec, "nccl", "ib", "rdmaResourceName")
    if _get(spec, "nccl", "ib", "enabled") is not True or not isinstance(name, str) or not name:
        return None
    if _allowed(name, policy.rdmaResources):
        return None
    return (
        f"RDMA resource {json.dumps(name)} is not allowed by the cluster's MegDet policy "
        f"(policy.rdmaResources: {_join(policy.rdmaResources)})"
    )


def _reserves(entry: str, key: Any, value: Any) -> bool:
    """Whether the node label ``key=value`` is reserved by ``entry`` (key, or key=value)."""
    return key == entry.split("=")[0] and ("=" not in entry or value == entry.split("=")[1])


def _node_selector(spec: Mapping[str, Any], policy: Policy) -> str | None:
    selector = _get(spec, "nodeSelector")
    if not isinstance(selector, Mapping):
        return None
    bad = [
        str(k)
        for k, v in selector.items()
        if any(_reserves(r, k, v) for r in policy.reservedNodeLabels)
    ]
    if not bad:
        return None
    return (
        f"node labels {_join(bad)} select nodes the cluster's MegDet policy reserves "
        f"(policy.reservedNodeLabels: {_join(policy.reservedNodeLabels)})"
    )


def _selects_reserved(expression: Any, policy: Policy) -> bool:
    """Whether a nodeSelectorRequirement can select a reserved node: NotIn and DoesNotExist
    steer away from a label; In (with the reserved value, for a key=value entry), Exists, Gt
    and Lt select it."""
    if not isinstance(expression, Mapping):
        return False
    key, op = expression.get("key"), expression.get("operator")
    if not isinstance(key, str) or not isinstance(op, str) or op in ("NotIn", "DoesNotExist"):
        return False
    values = _list(expression.get("values"))
    return any(
        key == r.split("=")[0] and ("=" not in r or op != "In" or r.split("=")[1] in values)
        for r in policy.reservedNodeLabels
    )


def _node_terms(spec: Mapping[str, Any]) -> list[Any]:
    node = _get(spec, "affinity", "nodeAffinity")
    required = _list(
        _get(node, "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
    )
    preferred = [
        p.get("preference") if isinstance(p, Mapping) else None
        for p in _list(_get(node, "preferredDuringSchedulingIgnoredDuringExecution"))
    ]
    return required + preferred


def _node_affinity(spec: Mapping[str, Any], policy: Policy) -> str | None:
    if not any(
        isinstance(t, Mapping)
        and any(_selects_reserved(e, policy) for e in _list(t.get("matchExpressions")))
        for t in _node_terms(spec)
    ):
        return None
    return (
        "node affinity selects nodes the cluster's MegDet policy reserves "
        f"(policy.reservedNodeLabels: {_join(policy.reservedNodeLabels)})"
    )


# The privileged knobs: whether a spec uses each.
def uses_host_network(spec: Mapping[str, Any]) -> bool:
    return _get(spec, "network", "hostNetwork") is True


def uses_ib_root_mode(spec: Mapping[str, Any]) -> bool:
    return _get(spec, "nccl", "ib", "enabled") is True and _get(spec, "nccl", "ib", "memlock") == (
        "root"
    )


def uses_pod_security_context(spec: Mapping[str, Any]) -> bool:
    psc = _get(spec, "podSecurityContext")
    if not isinstance(psc, Mapping):
        return False
    return (
        psc.get("runAsUser") == 0
        or psc.get("runAsNonRoot") is False
        or _get(psc, "seccompProfile", "type") == "Unconfined"
        or _get(psc, "appArmorProfile", "type") == "Unconfined"
        or psc.get("seLinuxOptions") is not None
        or bool(_list(psc.get("sysctls")))
    )


#: The pod annotations that set an AppArmor or seccomp profile (the kubelet still honours the
#: AppArmor one, deprecated since Kubernetes 1.30 for securityContext.appArmorProfile), and the
#: values that confine: the runtime's default profile or one loaded on the node.
PROFILE_ANNOTATION_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
PROFILE_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/pod",)
CONFINED_PROFILES = ("runtime/default", "docker/default")


def unconfining_annotations(spec: Mapping[str, Any]) -> list[str]:
    """The keys of spec.podAnnotations that set an AppArmor or seccomp profile that does not
    confine (unconfined, or anything but the runtime's default or a localhost/ profile)."""
    annotations = _get(spec, "podAnnotations")
    if not isinstance(annotations, Mapping):
        return []
    return [
        str(k)
        for k, v in annotations.items()
        if isinstance(k, str)
        and (k.startswith(PROFILE_ANNOTATION_PREFIXES) or k in PROFILE_ANNOTATIONS)
        and not (v in CONFINED_PROFILES or (isinstance(v, str) and v.startswith("localhost/")))
    ]


def uses_host_path(spec: Mapping[str, Any]) -> bool:
    return any(
        isinstance(v, Mapping) and "hostPath" in v for v in _list(_get(spec, "extraVolumes"))
    )


@dataclass(frozen=True)
class KnobUse:
    """One way a spec uses a privileged knob: where, the Python test, its CEL, in words."""

    knob: str
    path: str
    uses: Callable[[Mapping[str, Any]], bool]
    #: True when the spec ``s`` uses it (``psc`` stands for s.podSecurityContext).
    cel: str
    what: str


_PROFILE_KEY_CEL = (
    "("
    + " || ".join(f"k.startsWith({_p!r})" for _p in PROFILE_ANNOTATION_PREFIXES)
    + "".join(f" || k == {_p!r}" for _p in PROFILE_ANNOTATIONS)
    + ")"
)

KNOB_USES: tuple[KnobUse, ...] = (
    KnobUse(
        "hostNetwork",
        "spec.network.hostNetwork",
        uses_host_network,
        "has(s.network) && has(s.network.hostNetwork) && s.network.hostNetwork == true",
        "host networking (spec.network.hostNetwork)",
    ),
    KnobUse(
        "ibRootMode",
        "spec.nccl.ib.memlock",
        uses_ib_root_mode,
        "has(s.nccl) && has(s.nccl.ib) && has(s.nccl.ib.enabled) && s.nccl.ib.enabled == true"
        " && has(s.nccl.ib.memlock) && s.nccl.ib.memlock == 'root'",
        "the InfiniBand root mode (spec.nccl.ib.memlock=root: root with IPC_LOCK)",
    ),
    KnobUse(
        "podSecurity",
        "spec.podSecurityContext",
        uses_pod_security_context,
        "has(s.podSecurityContext) && s.podSecurityContext != null && ("
        "(has(psc.runAsUser) && psc.runAsUser == 0)"
        " || (has(psc.runAsNonRoot) && psc.runAsNonRoot == false)"
        " || (has(psc.seccompProfile) && has(psc.seccompProfile.type)"
        " && psc.seccompProfile.type == 'Unconfined')"
        " || (has(psc.appArmorProfile) && has(psc.appArmorProfile.type)"
        " && psc.appArmorProfile.type == 'Unconfined')"
        " || (has(psc.seLinuxOptions) && psc.seLinuxOptions != null)"
        " || (has(psc.sysctls) && psc.sysctls != null && psc.sysctls.size() > 0))",
        "a podSecurityContext outside the restricted profile (root, Unconfined "
        "seccomp or AppArmor, seLinuxOptions or sysctls)",
    ),
    KnobUse(
        "podSecurity",
        "spec.podAnnotations",
        lambda spec: bool(unconfining_annotations(spec)),
        "has(s.podAnnotations) && s.podAnnotations.exists(k, "
        + _PROFILE_KEY_CEL
        + " && !(s.podAnnotations[k] in "
        + json.dumps(list(CONFINED_PROFILES))
        + " || s.podAnnotations[k].startsWith('localhost/')))",
        "an AppArmor or seccomp annotation that does not confine the pods (unconfined; "
        "confined are runtime/default and localhost/<profile>)",
    ),
    KnobUse(
        "hostPath",
        "spec.extraVolumes",
        uses_host_path,
        "has(s.extraVolumes) && s.extraVolumes.exists(v, has(v.hostPath))",
        "a hostPath volume (spec.extraVolumes)",
    ),
)

#: Each knob in words (the first way it is used).
KNOB_WHAT: dict[str, str] = {}
for _use in KNOB_USES:
    KNOB_WHAT.setdefault(_use.knob, _use.what)


def _knob_rule(use: KnobUse) -> Callable[[Mapping[str, Any], Policy], str | None]:
    def rule(spec: Mapping[str, Any], policy: Policy) -> str | None:
        if not use.uses(spec) or getattr(policy.privileged, use.knob):
            return None
        return (
            f"{use.what} is not allowed by the cluster's MegDet policy "
            f"(policy.privileged.{use.knob}: false)"
        )

    return rule


def _q(text: str) -> str:
    """A Python string as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# CEL pieces of the rules below (``s`` is the spec).
_M = "s.network.multusNetworks"
_M_JSON = f"({_M}.contains('[') || {_M}.contains('{{') || {_M}.contains('\"'))"
_M_OK = (
    "(e.trim() == '' || (e.trim().contains('/') ? e.trim().split('/')[0] : '') in "
    "variables.multusNamespaces)"
)
_LOADER_CEL = f"(e.name.startsWith('LD_') || e.name in {json.dumps(list(LOADER_ENV))})"
_REACHES_OUTPUT = (
    f"((has(m.name) && m.name == {_q(OUTPUT_VOLUME)}) || "
    f"(has(m.mountPath) && string(m.mountPath).matches({_q(_OUTPUT_PATH_RE)})))"
)
_OUTPUT_CLAIM = (
    "(has(v.persistentVolumeClaim) && has(v.persistentVolumeClaim.claimName) && "
    "v.persistentVolumeClaim.claimName == s.output.claimName)"
)
_RESERVED_KEY = (
    "variables.reservedNodeLabels.exists(r, r.split('=')[0] == k && (!r.contains('=') || "
    "s.nodeSelector[k] == r.split('=')[1]))"
)
_NA = "s.affinity.nodeAffinity"
_REQ = f"{_NA}.requiredDuringSchedulingIgnoredDuringExecution"
_PREF = f"{_NA}.preferredDuringSchedulingIgnoredDuringExecution"
_NODE_TERMS = (
    f"((has({_REQ}) && has({_REQ}.nodeSelectorTerms)) ? {_REQ}.nodeSelectorTerms : []) + "
    f"(has({_PREF}) ? {_PREF}.map(p, has(p.preference) ? p.preference : {{}}) : [])"
)
_SELECTS_RESERVED = (
    "(has(e.key) && has(e.operator) && !(e.operator in ['NotIn', 'DoesNotExist']) && "
    "variables.reservedNodeLabels.exists(r, r.split('=')[0] == e.key && (!r.contains('=') || "
    "e.operator != 'In' || (has(e.values) && r.split('=')[1] in e.values))))"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "imageRepositories",
        "spec.image.repository",
        _image,
        "!has(s.image) || !has(s.image.repository) || variables.imageRepositories.exists(r, "
        "r == '*' || s.image.repository == r"
        " || (r.endsWith('/') && s.image.repository.startsWith(r)))",
        "'image repository \"' + s.image.repository + '\" is not allowed by the cluster\\'s "
        "MegDet policy (policy.imageRepositories: ' + "
        + _cel_join("variables.imageRepositories")
        + " + ')'",
    ),
    Rule(
        "serviceAccounts",
        "spec.serviceAccountName",
        _service_account,
        "!has(s.serviceAccountName) || variables.serviceAccounts.exists(a, a == '*' || "
        "a == s.serviceAccountName)",
        "'ServiceAccount \"' + s.serviceAccountName + '\" is not allowed by the cluster\\'s "
        "MegDet policy (policy.serviceAccounts: ' + "
        + _cel_join("variables.serviceAccounts")
        + " + ')'",
    ),
    Rule(
        "volumeTypes",
        "spec.extraVolumes",
        _volumes,
        "!has(s.extraVolumes) || s.extraVolumes.all(v, v.all(k, k == 'name' || k == 'hostPath'"
        " || k in variables.volumeTypes || '*' in variables.volumeTypes))",
        "'volumes ' + "
        + _cel_join(
            "s.extraVolumes.filter(v, !v.all(k, k == 'name' || k == 'hostPath' || k in "
            "variables.volumeTypes || '*' in variables.volumeTypes)).map(v, string(v.name))"
        )
        + " + ' are of types the cluster\\'s MegDet policy does not allow (policy.volumeTypes: ' + "
        + _cel_join("variables.volumeTypes")
        + " + ')'",
    ),
    Rule(
        "secretRefs",
        "spec.extraEnv",
        _secret_refs,
        "variables.secretRefs || !has(s.extraEnv) || !s.extraEnv.exists(e, has(e.valueFrom) "
        "&& has(e.valueFrom.secretKeyRef))",
        "'env ' + "
        + _cel_join(
            "s.extraEnv.filter(e, has(e.valueFrom) && has(e.valueFrom.secretKeyRef))"
            ".map(e, string(e.name))"
        )
        + " + ' read Secrets, which the cluster\\'s MegDet policy does not allow "
        "(policy.secretRefs: false)'",
    ),
    Rule(
        "priorityClasses",
        "spec.priorityClassName",
        _priority,
        "!has(s.priorityClassName) || s.priorityClassName == '' || "
        "variables.priorityClasses.exists(p, p == '*' || p == s.priorityClassName)",
        "'PriorityClass \"' + s.priorityClassName + '\" is not allowed by the cluster\\'s "
        "MegDet policy (policy.priorityClasses: ' + "
        + _cel_join("variables.priorityClasses")
        + " + ')'",
    ),
    Rule(
        "requireQueue",
        "spec.kueue.queueName",
        _require_queue,
        "!variables.requireQueue || (has(s.kueue) && has(s.kueue.queueName) && "
        "s.kueue.queueName != '')",
        _q("the cluster's MegDet policy requires a Kueue LocalQueue (policy.requireQueue)"),
    ),
    Rule(
        "queues",
        "spec.kueue.queueName",
        _queues,
        "!has(s.kueue) || !has(s.kueue.queueName) || s.kueue.queueName == '' || "
        "variables.queues.size() == 0 || variables.queues.exists(q, q == '*' || "
        "q == s.kueue.queueName)",
        "'LocalQueue \"' + s.kueue.queueName + '\" is not allowed by the cluster\\'s MegDet "
        "policy (policy.queues: ' + " + _cel_join("variables.queues") + " + ')'",
    ),
    Rule(
        "schedulers",
        "spec.gang.schedulerName",
        _scheduler,
        "!has(s.gang) || !has(s.gang.enabled) || s.gang.enabled != true || "
        "!has(s.gang.schedulerName) || variables.schedulers.exists(x, x == '*' || "
        "x == s.gang.schedulerName)",
        "'scheduler \"' + s.gang.schedulerName + '\" is not allowed by the cluster\\'s MegDet "
        "policy (policy.schedulers: ' + " + _cel_join("variables.schedulers") + " + ')'",
    ),
    Rule(
        "gangQueues",
        "spec.gang.queue",
        _gang_queue,
        "!has(s.gang) || !has(s.gang.enabled) || s.gang.enabled != true || !has(s.gang.queue)"
        " || variables.gangQueues.exists(q, q == '*' || q == s.gang.queue)",
        "'Volcano queue \"' + s.gang.queue + '\" is not allowed by the cluster\\'s MegDet "
        "policy (policy.gangQueues: ' + " + _cel_join("variables.gangQueues") + " + ')'",
    ),
    Rule(
        "tolerationKeys",
        "spec.tolerations",
        _tolerations,
        "!has(s.tolerations) || s.tolerations.all(t, variables.tolerationKeys.exists(k, "
        "k == '*' || k == (has(t.key) && t.key != null ? string(t.key) : '')))",
        "'tolerations of taint keys ' + "
        + _cel_join(
            "s.tolerations.filter(t, !variables.tolerationKeys.exists(k, k == '*' || "
            "k == (has(t.key) && t.key != null ? string(t.key) : ''))).map(t, "
            "has(t.key) && t.key != null ? string(t.key) : '')"
        )
        + " + ' are not allowed by the cluster\\'s MegDet policy (policy.tolerationKeys: ' + "
        + _cel_join("variables.tolerationKeys")
        + " + '; \"\" tolerates every taint)'",
    ),
    Rule(
        "multusNamespaces",
        "spec.network.multusNetworks",
        _multus,
        f"!has(s.network) || !has({_M}) || {_M}.trim() == '' || "
        f"'*' in variables.multusNamespaces || (!{_M_JSON} && {_M}.split(',').all(e, {_M_OK}))",
        "'networks ' + "
        + _cel_join(f"({_M_JSON} ? [{_M}] : {_M}.split(',').filter(e, !{_M_OK}).map(e, e.trim()))")
        + " + ' are not allowed by the cluster\\'s MegDet policy (policy.multusNamespaces: ' + "
        + _cel_join("variables.multusNamespaces")
        + " + "
        + _q(
            "; a network of the run's own namespace is named without one, and the JSON form "
            'needs "*")'
        ),
    ),
    Rule(
        "multusDefaultNetwork",
        "spec.podAnnotations",
        _multus_default,
        "variables.multusDefaultNetwork || !has(s.podAnnotations) || "
        f"!({_q(MULTUS_DEFAULT_NETWORK)} in s.podAnnotations)",
        _q(
            f'pod annotation "{MULTUS_DEFAULT_NETWORK}" replaces the pods\' network, round every '
            "NetworkPolicy, which the cluster's MegDet policy does not allow "
            "(policy.multusDefaultNetwork: false)"
        ),
    ),
    Rule(
        "loaderEnv",
        "spec.extraEnv",
        _loader_env,
        f"variables.loaderEnv || !has(s.extraEnv) || !s.extraEnv.exists(e, {_LOADER_CEL})",
        "'env ' + "
        + _cel_join(f"s.extraEnv.filter(e, {_LOADER_CEL}).map(e, e.name)")
        + " + "
        + _q(
            " make the loader or the interpreter load code from a path, which the cluster's "
            "MegDet policy does not allow (policy.loaderEnv: false)"
        ),
    ),
    Rule(
        "outputMounts",
        "spec.extraVolumeMounts",
        _output_mounts,
        "variables.outputMounts || !has(s.extraVolumeMounts) || "
        f"!s.extraVolumeMounts.exists(m, {_REACHES_OUTPUT})",
        "'volume mounts at ' + "
        + _cel_join(f"s.extraVolumeMounts.filter(m, {_REACHES_OUTPUT}).map(m, string(m.mountPath))")
        + " + "
        + _q(
            " reach the output volume or /output (other runs' folders), which the cluster's "
            "MegDet policy does not allow (policy.outputMounts: false)"
        ),
    ),
    Rule(
        "outputMounts",
        "spec.extraVolumes",
        _output_claim,
        "variables.outputMounts || !has(s.output) || !has(s.output.claimName) || "
        f"!has(s.extraVolumes) || !s.extraVolumes.exists(v, {_OUTPUT_CLAIM})",
        "'volumes ' + "
        + _cel_join(f"s.extraVolumes.filter(v, {_OUTPUT_CLAIM}).map(v, string(v.name))")
        + " + ' mount the output PVC \"' + s.output.claimName + '\" again' + "
        + _q(
            " (other runs' folders), which the cluster's MegDet policy does not allow "
            "(policy.outputMounts: false)"
        ),
    ),
    Rule(
        "gpuResources",
        "spec.gpuResource",
        _gpu_resource,
        "!has(s.gpuResource) || variables.gpuResources.exists(r, r == '*' || r == s.gpuResource)",
        "'GPU resource \"' + s.gpuResource + '\" is not allowed by the cluster\\'s MegDet "
        "policy (policy.gpuResources: ' + " + _cel_join("variables.gpuResources") + " + ')'",
    ),
    Rule(
        "rdmaResources",
        "spec.nccl.ib.rdmaResourceName",
        _rdma_resource,
        "!has(s.nccl) || !has(s.nccl.ib) || !has(s.nccl.ib.enabled) || "
        "s.nccl.ib.enabled != true || !has(s.nccl.ib.rdmaResourceName) || "
        "s.nccl.ib.rdmaResourceName == '' || variables.rdmaResources.exists(r, r == '*' || "
        "r == s.nccl.ib.rdmaResourceName)",
        "'RDMA resource \"' + s.nccl.ib.rdmaResourceName + '\" is not allowed by the "
        "cluster\\'s MegDet policy (policy.rdmaResources: ' + "
        + _cel_join("variables.rdmaResources")
        + " + ')'",
    ),
    Rule(
        "reservedNodeLabels",
        "spec.nodeSelector",
        _node_selector,
        f"!has(s.nodeSelector) || !s.nodeSelector.exists(k, {_RESERVED_KEY})",
        "'node labels ' + "
        + _cel_join(f"s.nodeSelector.filter(k, {_RESERVED_KEY})")
        + " + ' select nodes the cluster\\'s MegDet policy reserves "
        "(policy.reservedNodeLabels: ' + " + _cel_join("variables.reservedNodeLabels") + " + ')'",
    ),
    Rule(
        "reservedNodeLabels",
        "spec.affinity",
        _node_affinity,
        "!has(s.affinity) || !has(s.affinity.nodeAffinity) || "
        f"!({_NODE_TERMS}).exists(t, has(t.matchExpressions) && "
        f"t.matchExpressions.exists(e, {_SELECTS_RESERVED}))",
        "'node affinity selects nodes the cluster\\'s MegDet policy reserves "
        "(policy.reservedNodeLabels: ' + " + _cel_join("variables.reservedNodeLabels") + " + ')'",
    ),
    *(
        Rule(
            f"privileged.{use.knob}",
            use.path,
            _knob_rule(use),
            f"!({use.cel}) || variables.privileged.{use.knob}",
            _q(
                f"{use.what} is not allowed by the cluster's MegDet policy "
                f"(policy.privileged.{use.knob}: false)"
            ),
        )
        for use in KNOB_USES
    ),
)


def check(spec: Any, policy: Policy) -> list[tuple[str, str]]:
    """The policy problems of a run's spec, as ``(field path, message)``; [] when it passes.

    Never raises: a spec whose fields are mistyped is the schema's business, not the policy's.
    """
    if not isinstance(spec, Mapping):
        return []
    problems = []
    for rule in RULES:
        message = rule.check(spec, policy)
        if message:
            problems.append((rule.path, message))
    return problems


def grant_message(knob: str, what: str | None = None) -> str:
    """The admission refusal for a privileged knob the user holds no grant for (``what``: the
    way the spec uses it, default the knob's first)."""
    return (
        f"{what or KNOB_WHAT[knob]} needs the grant to use privileged MegDetRun settings: "
        f'verb "use" on {PRIVILEGED_SUBRESOURCE} (API group megdet.io) in the run\'s namespace'
    )


_SPEC = re.compile(r"\bs\.")
_PSC = re.compile(r"\bpsc\.")


def _cel(expression: str) -> str:
    """A rule's CEL with ``s`` (the spec, in the rules above) spelled ``object.spec``, and
    ``psc`` ``object.spec.podSecurityContext``."""
    return _SPEC.sub("object.spec.", _PSC.sub("s.podSecurityContext.", expression))


def validations() -> list[dict[str, Any]]:
    """The admission policy's validations: every rule, then the grant for each knob.

    The policy values are the admission policy's ``variables`` (rendered by the chart from its
    values), and ``variables.granted`` is the authorizer's answer for the requesting user.
    """
    out = []
    for rule in RULES:
        out.append(
            {
                "expression": _cel(rule.expression),
                "messageExpression": _cel(f"'{rule.path}: ' + {rule.message}"),
                "reason": "Forbidden",
            }
        )
    for use in KNOB_USES:
        out.append(
            {
                "expression": _cel(f"!({use.cel}) || variables.granted"),
                "messageExpression": _q(f"{use.path}: {grant_message(use.knob, use.what)}"),
                "reason": "Forbidden",
            }
        )
    return out


#: The spec field a run's owner may always change, whatever the policy says now.
SUSPEND_FIELD = ("runPolicy", "suspend")


def _same(field: str) -> str:
    """CEL: the spec field ``field`` (a dotted path under spec) is unchanged by the update."""
    new, old = f"object.spec.{field}", f"oldObject.spec.{field}"
    return f"(has({new}) ? has({old}) && {new} == {old} : !has({old}))"


def spec_changed(spec_schema: Mapping[str, Any]) -> str:
    """CEL, true when a request writes a run's spec, beyond ``runPolicy.suspend``.

    ``spec_schema``: the MegDetRun CRD's spec schema (its fields are compared one by one, CEL
    having no way to drop a key from an object). A run the policy no longer allows can still be
    suspended and resumed by its owner; any other spec change is checked against the policy
    as it is now.
    """
    parent, leaf = SUSPEND_FIELD
    properties = spec_schema.get("properties") or {}
    others = [_same(f) for f in properties if f != parent]
    inner = (properties.get(parent) or {}).get("properties") or {}
    parent_same = " && ".join(_same(f"{parent}.{f}") for f in inner if f != leaf) or "true"
    new, old = f"object.spec.{parent}", f"oldObject.spec.{parent}"
    others.append(
        f"(has({new}) && has({old}) ? ({parent_same}) : {_same(parent)})"
        if parent in properties
        else "true"
    )
    return "object.spec != oldObject.spec && !(" + " && ".join(others) + ")"


def match_conditions(spec_schema: Mapping[str, Any]) -> list[dict[str, str]]:
    """The admission policy's matchConditions: a run's creation, and every update that writes
    its spec (beyond suspend). Metadata and status writes (kopf's annotations, an earlier
    controller's finalizer removed, labels) and deletion are never checked."""
    return [
        {
            "name": "spec-written",
            "expression": f"request.operation == 'CREATE' || ({spec_changed(spec_schema)})",
        }
    ]


def generated(spec_schema: Mapping[str, Any]) -> dict[str, Any]:
    """What ``make policy`` writes into the operator chart (files/policy-validations.yaml)."""
    return {"matchConditions": match_conditions(spec_schema), "validations": validations()}


def main() -> None:
    """Print the generated matchConditions and validations (``make policy``)."""
    import yaml

    from megdet.controller.offline.crd import spec_schema

    print(
        "# Generated by `python -m megdet.controller.policy` (make policy) from\n"
        "# controller/policy.py and the MegDetRun CRD: edit the rules there. The operator chart's\n"
        "# ValidatingAdmissionPolicy takes its matchConditions and validations from here.\n"
        + yaml.safe_dump(generated(spec_schema()), sort_keys=False, width=1000),
        end="",
    )


if __name__ == "__main__":
    main()
