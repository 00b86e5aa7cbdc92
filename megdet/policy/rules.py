"""The MegDet policy's rules, each written once, in CEL (``s``: the run's spec;
``variables.<key>``: the policy value of that key). A failing rule's message names the field,
what it holds and the allowed values.
"""

from __future__ import annotations

import json

from megdet.policy.cel import Rule
from megdet.policy.cel import cel_join as _cel_join
from megdet.policy.cel import cel_quote as _q
from megdet.policy.knobs import KNOB_USES, PROFILE_KEY_CEL
from megdet.policy.reserved import (
    LOADER_ENV,
    LOADER_ENV_PREFIXES,
    PLATFORM_KEY_PREFIXES,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    reserved_env_re,
)

__all__ = ["MULTUS_DEFAULT_NETWORK", "OUTPUT_VOLUME", "RULES"]

# Multus' annotations, read as docs/operations.md ("Who may do what", multusNamespaces) says.
MULTUS_DEFAULT_NETWORK = "v1.multus-cni.io/default-network"

#: The run chart's output volume (mounted at /output, which the mountPaths rule keeps extra
#: mounts off): mounted again, or its PVC again, it reaches other runs' folders.
OUTPUT_VOLUME = "output"

# CEL pieces of the rules below (``s`` is the spec).
_M = "s.network.multusNetworks"
_M_JSON = f"({_M}.contains('[') || {_M}.contains('{{') || {_M}.contains('\"'))"
_M_OK = (
    "(e.trim() == '' || (e.trim().contains('/') ? e.trim().split('/')[0] : '') in "
    "variables.multusNamespaces)"
)
_LOADER_CEL = (
    "("
    + "".join(f"e.name.startsWith({_q(p)}) || " for p in LOADER_ENV_PREFIXES)
    + f"e.name in {json.dumps(list(LOADER_ENV))})"
)
_REACHES_OUTPUT = f"(has(m.name) && m.name == {_q(OUTPUT_VOLUME)})"
# envNames: a name no pattern of policy.envNames matches, or a reserved one (the loader's are
# policy.loaderEnv's to allow).
_RESERVED_ENV_CEL = (
    f"(e.name in {json.dumps(list(RESERVED_ENV))} || e.name.matches({_q(reserved_env_re())}))"
)
_BAD_ENV_NAME = (
    "(has(e.name) && (!variables.envNames.exists(p, e.name.matches(p)) || "
    f"({_RESERVED_ENV_CEL} && !{_LOADER_CEL})))"
)
_PLATFORM_KEY = "(" + " || ".join(f"k.startsWith({_q(p)})" for p in PLATFORM_KEY_PREFIXES) + ")"


def _prefixed(values: str) -> str:
    """CEL: the key ``k`` is under one of the prefixes ``values`` ("*": any), and not the
    platform's."""
    return f"(('*' in {values} || {values}.exists(p, k.startsWith(p))) && !{_PLATFORM_KEY})"


_LABEL_OK = _prefixed("variables.labelPrefixes")
# Annotations other rules govern: the AppArmor and seccomp profiles (the podSecurity knob: a
# confining one is free) and Multus' default network (policy.multusDefaultNetwork).
_ANNOTATION_OK = (
    f"({PROFILE_KEY_CEL} || k == {_q(MULTUS_DEFAULT_NETWORK)} || "
    f"{_prefixed('variables.annotationPrefixes')})"
)
_RESERVED_ENV_WORDS = ", ".join(
    [p + "*" for p in RESERVED_ENV_PREFIXES] + [n for n in RESERVED_ENV if n not in LOADER_ENV]
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

_NO_GANG = "!has(s.gang) || !has(s.gang.enabled) || s.gang.enabled != true"


def _one_of(key: str, path: str, what: str, exempt: str, match: str = "") -> Rule:
    """The rule that the string at ``path`` is an entry ``x`` of ``policy.<key>`` ("*": any),
    or matches it by ``match`` (CEL), unless ``exempt`` (CEL) holds."""
    value, entries = "s." + path.removeprefix("spec."), f"variables.{key}"
    return Rule(
        key,
        path,
        f"{exempt} || {entries}.exists(x, x == '*' || {match or 'x == ' + value})",
        f"'{what} \"' + {value} + '\" is not allowed by the cluster\\'s MegDet policy "
        f"(policy.{key}: ' + {_cel_join(entries)} + ')'",
    )


RULES: tuple[Rule, ...] = (
    _one_of(
        "imageRepositories",
        "spec.image.repository",
        "image repository",
        "!has(s.image) || !has(s.image.repository)",
        "x == s.image.repository || (x.endsWith('/') && s.image.repository.startsWith(x))",
    ),
    _one_of(
        "serviceAccounts", "spec.serviceAccountName", "ServiceAccount", "!has(s.serviceAccountName)"
    ),
    Rule(
        "volumeTypes",
        "spec.extraVolumes",
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
    _one_of(
        "priorityClasses",
        "spec.priorityClassName",
        "PriorityClass",
        "!has(s.priorityClassName) || s.priorityClassName == ''",
    ),
    Rule(
        "requireQueue",
        "spec.kueue.queueName",
        "!variables.requireQueue || (has(s.kueue) && has(s.kueue.queueName) && "
        "s.kueue.queueName != '')",
        _q("the cluster's MegDet policy requires a Kueue LocalQueue (policy.requireQueue)"),
    ),
    _one_of(
        "queues",
        "spec.kueue.queueName",
        "LocalQueue",
        "!has(s.kueue) || !has(s.kueue.queueName) || s.kueue.queueName == '' || "
        "variables.queues.size() == 0",
    ),
    _one_of(
        "schedulers",
        "spec.gang.schedulerName",
        "scheduler",
        f"{_NO_GANG} || !has(s.gang.schedulerName)",
    ),
    _one_of("gangQueues", "spec.gang.queue", "Volcano queue", f"{_NO_GANG} || !has(s.gang.queue)"),
    Rule(
        "tolerationKeys",
        "spec.tolerations",
        "!has(s.tolerations) || s.tolerations.all(t, variables.tolerationKeys.exists(k, "
        "k == '*' || k == (has(t.key) && type(t.key) != null_type ? string(t.key) : '')))",
        "'tolerations of taint keys ' + "
        + _cel_join(
            "s.tolerations.filter(t, !variables.tolerationKeys.exists(k, k == '*' || "
            "k == (has(t.key) && type(t.key) != null_type ? string(t.key) : ''))).map(t, "
            "has(t.key) && type(t.key) != null_type ? string(t.key) : '')"
        )
        + " + ' are not allowed by the cluster\\'s MegDet policy (policy.tolerationKeys: ' + "
        + _cel_join("variables.tolerationKeys")
        + " + '; \"\" tolerates every taint)'",
    ),
    Rule(
        "multusNamespaces",
        "spec.network.multusNetworks",
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
        "variables.outputMounts || !has(s.extraVolumeMounts) || "
        f"!s.extraVolumeMounts.exists(m, {_REACHES_OUTPUT})",
        "'volume mounts at ' + "
        + _cel_join(
            f"s.extraVolumeMounts.filter(m, {_REACHES_OUTPUT}).map(m, "
            "has(m.mountPath) ? string(m.mountPath) : '')"
        )
        + " + "
        + _q(
            " reach the output volume (other runs' folders), which the cluster's "
            "MegDet policy does not allow (policy.outputMounts: false)"
        ),
    ),
    Rule(
        "outputMounts",
        "spec.extraVolumes",
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
    _one_of("gpuResources", "spec.gpuResource", "GPU resource", "!has(s.gpuResource)"),
    _one_of(
        "rdmaResources",
        "spec.nccl.ib.rdmaResourceName",
        "RDMA resource",
        "!has(s.nccl) || !has(s.nccl.ib) || !has(s.nccl.ib.enabled) || s.nccl.ib.enabled != true"
        " || !has(s.nccl.ib.rdmaResourceName) || s.nccl.ib.rdmaResourceName == ''",
    ),
    Rule(
        "reservedNodeLabels",
        "spec.nodeSelector",
        f"!has(s.nodeSelector) || !s.nodeSelector.exists(k, {_RESERVED_KEY})",
        "'node labels ' + "
        + _cel_join(f"s.nodeSelector.filter(k, {_RESERVED_KEY})")
        + " + ' select nodes the cluster\\'s MegDet policy reserves "
        "(policy.reservedNodeLabels: ' + " + _cel_join("variables.reservedNodeLabels") + " + ')'",
    ),
    Rule(
        "reservedNodeLabels",
        "spec.affinity",
        "!has(s.affinity) || !has(s.affinity.nodeAffinity) || "
        f"!({_NODE_TERMS}).exists(t, has(t.matchExpressions) && "
        f"t.matchExpressions.exists(e, {_SELECTS_RESERVED}))",
        "'node affinity selects nodes the cluster\\'s MegDet policy reserves "
        "(policy.reservedNodeLabels: ' + " + _cel_join("variables.reservedNodeLabels") + " + ')'",
    ),
    *(
        Rule(
            use.rule or f"privileged.{use.knob}",
            use.path,
            f"!({use.cel}) || variables.privileged.{use.knob}",
            use.message
            or _q(
                f"{use.what} is not allowed by the cluster's MegDet policy "
                f"(policy.privileged.{use.knob}: false)"
            ),
        )
        for use in KNOB_USES
    ),
    Rule(
        "envNames",
        "spec.extraEnv",
        f"!has(s.extraEnv) || !s.extraEnv.exists(e, {_BAD_ENV_NAME})",
        "'env ' + "
        + _cel_join(f"s.extraEnv.filter(e, {_BAD_ENV_NAME}).map(e, e.name)")
        + " + ' are not allowed by the cluster\\'s MegDet policy: a name must match one of "
        "policy.envNames (' + "
        + _cel_join("variables.envNames")
        + " + "
        + _q(
            ") and not be one the image, Python, torch, iopath/fvcore, NCCL, CUDA or the "
            f"launcher reads ({_RESERVED_ENV_WORDS}; NCCL is set through spec.nccl, and the "
            "loader's variables are policy.loaderEnv's)"
        ),
    ),
    Rule(
        "labelPrefixes",
        "spec.podLabels",
        f"!has(s.podLabels) || s.podLabels.all(k, {_LABEL_OK})",
        "'pod labels ' + "
        + _cel_join(f"s.podLabels.filter(k, !{_LABEL_OK})")
        + " + ' are not allowed by the cluster\\'s MegDet policy (policy.labelPrefixes: ' + "
        + _cel_join("variables.labelPrefixes")
        + " + "
        + _q(f"; never under {', '.join(PLATFORM_KEY_PREFIXES)})"),
    ),
    Rule(
        "annotationPrefixes",
        "spec.podAnnotations",
        f"!has(s.podAnnotations) || s.podAnnotations.all(k, {_ANNOTATION_OK})",
        "'pod annotations ' + "
        + _cel_join(f"s.podAnnotations.filter(k, !{_ANNOTATION_OK})")
        + " + ' are not allowed by the cluster\\'s MegDet policy (policy.annotationPrefixes: ' + "
        + _cel_join("variables.annotationPrefixes")
        + " + "
        + _q(f"; never under {', '.join(PLATFORM_KEY_PREFIXES)})"),
    ),
)
