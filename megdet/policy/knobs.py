"""The MegDet policy's privileged knobs: each way a spec uses one, in CEL.

Each :class:`KnobUse` makes one rule of :data:`megdet.policy.rules.RULES` (the
cluster allows the knob: ``policy.privileged.<knob>``) and one admission validation (the user
holds the grant, checked by the API server's authorizer; docs/operations.md, "Who may do what").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from megdet.policy.cel import cel_join, cel_quote
from megdet.policy.reserved import RESERVED_MOUNTS, reserved_mount_re

__all__ = [
    "CONFINED_PROFILES",
    "KNOB_USES",
    "KNOB_WHAT",
    "PRIVILEGED_SUBRESOURCE",
    "PROFILE_ANNOTATIONS",
    "PROFILE_ANNOTATION_PREFIXES",
    "KnobUse",
    "grant_message",
]

#: The subresource whose ``use`` verb grants the privileged knobs (RBAC, checked at admission).
PRIVILEGED_SUBRESOURCE = "megdetruns/privileged"

#: The pod annotations that set an AppArmor (deprecated since Kubernetes 1.30, still honoured)
#: or seccomp profile, and the values that confine (runtime default, or loaded on the node).
PROFILE_ANNOTATION_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
PROFILE_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/pod",)
CONFINED_PROFILES = ("runtime/default", "docker/default")


@dataclass(frozen=True)
class KnobUse:
    """One way a spec uses a privileged knob: where, its CEL, in words."""

    knob: str
    path: str
    #: CEL, true when the spec ``s`` uses it.
    cel: str
    what: str
    #: The name of its policy rule ("": ``privileged.<knob>``).
    rule: str = ""
    #: CEL building the policy rule's message, when it says more than ``what``.
    message: str = ""


_PSC = "s.podSecurityContext"

#: CEL: an annotation key ``k`` that sets an AppArmor or seccomp profile.
PROFILE_KEY_CEL = (
    "("
    + " || ".join(f"k.startsWith({cel_quote(p)})" for p in PROFILE_ANNOTATION_PREFIXES)
    + "".join(f" || k == {cel_quote(p)}" for p in PROFILE_ANNOTATIONS)
    + ")"
)

#: CEL: a mount ``m`` of spec.extraVolumeMounts that needs the anyMountPath knob: a mountPath
#: not normalized, not strictly under policy.mountPrefixes, or near a reserved path.
_MOUNT_PATH = "string(m.mountPath)"
_DOT_SEGMENT = r"(^|/)\.\.?(/|$)"
OUTSIDE_MOUNT_CEL = (
    f"(has(m.mountPath) && (!{_MOUNT_PATH}.matches('^(/[^/]+)+$')"
    f" || {_MOUNT_PATH}.matches({cel_quote(_DOT_SEGMENT)})"
    f" || !variables.mountPrefixes.exists(r, {_MOUNT_PATH}.startsWith(r))"
    f" || {_MOUNT_PATH}.matches({cel_quote(reserved_mount_re())})))"
)
_GROUP_ZERO = (
    "has(s.podSecurityContext) && type(s.podSecurityContext) != null_type && ("
    f"(has({_PSC}.runAsGroup) && {_PSC}.runAsGroup == 0)"
    f" || (has({_PSC}.fsGroup) && {_PSC}.fsGroup == 0)"
    f" || (has({_PSC}.supplementalGroups) && type({_PSC}.supplementalGroups) == list"
    f" && {_PSC}.supplementalGroups.exists(g, g == 0)))"
)

KNOB_USES: tuple[KnobUse, ...] = (
    KnobUse(
        "hostNetwork",
        "spec.network.hostNetwork",
        "has(s.network) && has(s.network.hostNetwork) && s.network.hostNetwork == true",
        "host networking (spec.network.hostNetwork)",
    ),
    KnobUse(
        "ibRootMode",
        "spec.nccl.ib.memlock",
        "has(s.nccl) && has(s.nccl.ib) && has(s.nccl.ib.enabled) && s.nccl.ib.enabled == true"
        " && has(s.nccl.ib.memlock) && s.nccl.ib.memlock == 'root'",
        "the InfiniBand root mode (spec.nccl.ib.memlock=root: root with IPC_LOCK)",
    ),
    KnobUse(
        "podSecurity",
        "spec.podSecurityContext",
        "has(s.podSecurityContext) && type(s.podSecurityContext) != null_type && ("
        f"(has({_PSC}.runAsUser) && {_PSC}.runAsUser == 0)"
        f" || (has({_PSC}.runAsNonRoot) && {_PSC}.runAsNonRoot == false)"
        f" || (has({_PSC}.seccompProfile) && has({_PSC}.seccompProfile.type)"
        f" && {_PSC}.seccompProfile.type == 'Unconfined')"
        f" || (has({_PSC}.appArmorProfile) && has({_PSC}.appArmorProfile.type)"
        f" && {_PSC}.appArmorProfile.type == 'Unconfined')"
        f" || (has({_PSC}.seLinuxOptions) && type({_PSC}.seLinuxOptions) != null_type)"
        f" || (has({_PSC}.sysctls) && type({_PSC}.sysctls) != null_type"
        f" && {_PSC}.sysctls.size() > 0))",
        "a podSecurityContext outside the restricted profile (root, Unconfined "
        "seccomp or AppArmor, seLinuxOptions or sysctls)",
    ),
    KnobUse(
        "podSecurity",
        "spec.podAnnotations",
        "has(s.podAnnotations) && s.podAnnotations.exists(k, "
        + PROFILE_KEY_CEL
        + " && !(s.podAnnotations[k] in "
        + json.dumps(list(CONFINED_PROFILES))
        + " || s.podAnnotations[k].startsWith('localhost/')))",
        "an AppArmor or seccomp annotation that does not confine the pods (unconfined; "
        "confined are runtime/default and localhost/<profile>)",
    ),
    KnobUse(
        "hostPath",
        "spec.extraVolumes",
        "has(s.extraVolumes) && s.extraVolumes.exists(v, has(v.hostPath))",
        "a hostPath volume (spec.extraVolumes)",
    ),
    KnobUse(
        "podSecurity",
        "spec.podSecurityContext",
        _GROUP_ZERO,
        "group id 0 (spec.podSecurityContext runAsGroup, fsGroup or supplementalGroups)",
        rule="groupIds",
        message=cel_quote(
            "group id 0 (spec.podSecurityContext runAsGroup, fsGroup or supplementalGroups: any "
            "id but 0) is not allowed by the cluster's MegDet policy "
            "(policy.privileged.podSecurity: false)"
        ),
    ),
    KnobUse(
        "anyMountPath",
        "spec.extraVolumeMounts",
        f"has(s.extraVolumeMounts) && s.extraVolumeMounts.exists(m, {OUTSIDE_MOUNT_CEL})",
        "a volume mount outside policy.mountPrefixes (spec.extraVolumeMounts)",
        rule="mountPaths",
        message="'volume mounts at ' + "
        + cel_join(
            f"s.extraVolumeMounts.filter(m, {OUTSIDE_MOUNT_CEL}).map(m, string(m.mountPath))"
        )
        + " + ' are not allowed by the cluster\\'s MegDet policy: a mountPath must be a "
        "normalized absolute path (no //, . or .. segment, no trailing /) strictly under one "
        "of policy.mountPrefixes (' + "
        + cel_join("variables.mountPrefixes")
        + " + "
        + cel_quote(
            ") and not at, above, under or beside a path the image or the run chart uses ("
            + ", ".join(RESERVED_MOUNTS)
            + "); anything else needs policy.privileged.anyMountPath and the grant"
        ),
    ),
)

#: Each knob in words (the first way it is used).
KNOB_WHAT: dict[str, str] = {}
for _use in KNOB_USES:
    KNOB_WHAT.setdefault(_use.knob, _use.what)


def grant_message(knob: str, what: str | None = None) -> str:
    """The admission refusal for a privileged knob the user holds no grant for (``what``: the
    way the spec uses it, default the knob's first)."""
    return (
        f"{what or KNOB_WHAT[knob]} needs the grant to use privileged MegDetRun settings: "
        f'verb "use" on {PRIVILEGED_SUBRESOURCE} (API group megdet.io) in the run\'s namespace'
    )
