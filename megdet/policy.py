"""The cluster's MegDet policy: what creating a MegDetRun lets its author put into pods.

The controller creates a run's job with its own rights, so every spec field that reaches a pod is
a question of who may set it. A platform team states the answer once, in the operator chart's
``policy`` values; two engines enforce it:

- the controller (:func:`check`, before it creates a run's job: condition ``Valid=False``,
  reason ``PolicyDenied``, and a Warning event);
- the API server, through a ValidatingAdmissionPolicy on MegDetRuns whose validations are
  generated from :data:`RULES` (``make generate`` writes ``charts/megdet-operator/files/
  policy-validations.yaml``), so ``kubectl apply`` is refused at once. The admission policy also
  checks the grant for the privileged knobs: ``use`` on ``megdetruns/privileged`` in the run's
  namespace, asked of the cluster's own authorizer for the requesting user. The controller never
  learns who wrote a run, so that check exists only at admission.

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
    "privileged_knobs",
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
    return ", ".join(json.dumps(v) for v in values) or "none"


# CEL: the same rendering of a list of names as _join (JSON strings, or "none").
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


# The privileged knobs: whether a spec uses each.
def uses_host_network(spec: Mapping[str, Any]) -> bool:
    return _get(spec, "network", "hostNetwork") is True


def uses_ib_root_mode(spec: Mapping[str, Any]) -> bool:
    return _get(spec, "nccl", "ib", "enabled") is True and _get(spec, "nccl", "ib", "memlock") == (
        "root"
    )


def uses_pod_security(spec: Mapping[str, Any]) -> bool:
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


def uses_host_path(spec: Mapping[str, Any]) -> bool:
    return any(
        isinstance(v, Mapping) and "hostPath" in v for v in _list(_get(spec, "extraVolumes"))
    )


KNOB_USE: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "hostNetwork": uses_host_network,
    "ibRootMode": uses_ib_root_mode,
    "podSecurity": uses_pod_security,
    "hostPath": uses_host_path,
}
#: The same, in CEL over the spec ``s``.
KNOB_CEL: dict[str, str] = {
    "hostNetwork": "has(s.network) && has(s.network.hostNetwork) && s.network.hostNetwork == true",
    "ibRootMode": (
        "has(s.nccl) && has(s.nccl.ib) && has(s.nccl.ib.enabled) && s.nccl.ib.enabled == true"
        " && has(s.nccl.ib.memlock) && s.nccl.ib.memlock == 'root'"
    ),
    # ``psc`` stands for s.podSecurityContext.
    "podSecurity": (
        "has(s.podSecurityContext) && s.podSecurityContext != null && ("
        "(has(psc.runAsUser) && psc.runAsUser == 0)"
        " || (has(psc.runAsNonRoot) && psc.runAsNonRoot == false)"
        " || (has(psc.seccompProfile) && has(psc.seccompProfile.type)"
        " && psc.seccompProfile.type == 'Unconfined')"
        " || (has(psc.appArmorProfile) && has(psc.appArmorProfile.type)"
        " && psc.appArmorProfile.type == 'Unconfined')"
        " || (has(psc.seLinuxOptions) && psc.seLinuxOptions != null)"
        " || (has(psc.sysctls) && psc.sysctls != null && psc.sysctls.size() > 0))"
    ),
    "hostPath": "has(s.extraVolumes) && s.extraVolumes.exists(v, has(v.hostPath))",
}
KNOB_WHAT: dict[str, str] = {
    "hostNetwork": "host networking (spec.network.hostNetwork)",
    "ibRootMode": "the InfiniBand root mode (spec.nccl.ib.memlock=root: root with IPC_LOCK)",
    "podSecurity": "a podSecurityContext outside the restricted profile (root, Unconfined "
    "seccomp or AppArmor, seLinuxOptions or sysctls)",
    "hostPath": "a hostPath volume (spec.extraVolumes)",
}


def _knob_rule(knob: str) -> Callable[[Mapping[str, Any], Policy], str | None]:
    def rule(spec: Mapping[str, Any], policy: Policy) -> str | None:
        if not KNOB_USE[knob](spec) or getattr(policy.privileged, knob):
            return None
        return (
            f"{KNOB_WHAT[knob]} is not allowed by the cluster's MegDet policy "
            f"(policy.privileged.{knob}: false)"
        )

    return rule


def _q(text: str) -> str:
    """A Python string as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
    *(
        Rule(
            f"privileged.{knob}",
            PRIVILEGED_KNOBS[knob],
            _knob_rule(knob),
            f"!({KNOB_CEL[knob]}) || variables.privileged.{knob}",
            _q(
                f"{KNOB_WHAT[knob]} is not allowed by the cluster's MegDet policy "
                f"(policy.privileged.{knob}: false)"
            ),
        )
        for knob in PRIVILEGED_KNOBS
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


def privileged_knobs(spec: Any) -> list[str]:
    """The privileged knobs a spec uses (keys of :data:`PRIVILEGED_KNOBS`)."""
    if not isinstance(spec, Mapping):
        return []
    return [knob for knob, uses in KNOB_USE.items() if uses(spec)]


def grant_message(knob: str) -> str:
    """The admission refusal for a privileged knob the user holds no grant for."""
    return (
        f"{KNOB_WHAT[knob]} needs the grant to use privileged MegDetRun settings: "
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
    for knob in PRIVILEGED_KNOBS:
        out.append(
            {
                "expression": _cel(f"!({KNOB_CEL[knob]}) || variables.granted"),
                "messageExpression": _q(f"{PRIVILEGED_KNOBS[knob]}: {grant_message(knob)}"),
                "reason": "Forbidden",
            }
        )
    return out


def main() -> None:
    """Print the generated validations (``make generate`` writes them into the operator chart)."""
    import yaml

    print(
        "# Generated by `python -m megdet.policy` (make generate) from megdet/policy.py: edit the\n"
        "# rules there. The operator chart's ValidatingAdmissionPolicy includes this list.\n"
        + yaml.safe_dump(validations(), sort_keys=False, width=1000),
        end="",
    )


if __name__ == "__main__":
    main()
