"""The Pod Security Standards' checks (kubernetes/website content/en/docs/concepts/security/
pod-security-standards.md; k8s.io/pod-security-admission policy/check_*.go, level "latest"),
for a pod spec as the chart renders it.

:func:`violations` returns the names of the failed checks, each tagged with the lowest level that
forbids it; :func:`level` the strictest level a pod meets. Only what a chart can render is
checked (a Linux pod: Windows hostProcess counts, Windows-only fields are ignored).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

LEVELS = ("restricted", "baseline", "privileged")

# Baseline "Capabilities": the only ones a container may add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
# Restricted "Volume Types".
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
        "projected", "secret",
    }
)  # fmt: skip
# Baseline "SELinux": allowed types (container_engine_t since 1.31; "" = unset).
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def violations(pod: Mapping[str, Any]) -> dict[str, str]:
    """Failed checks of a pod template ({metadata, spec}) -> the lowest level forbidding them."""
    spec = pod.get("spec") or pod
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    psc = spec.get("securityContext") or {}
    out: dict[str, str] = {}

    def fail(check: str, level: str) -> None:
        # A check failed at baseline also fails restricted; keep the lowest level.
        if out.get(check) != "baseline":
            out[check] = level

    containers = list(_containers(spec))
    scs = [c.get("securityContext") or {} for c in containers]

    # --- baseline -----------------------------------------------------------------------------
    if psc.get("windowsOptions", {}).get("hostProcess") or any(
        sc.get("windowsOptions", {}).get("hostProcess") for sc in scs
    ):
        fail("hostProcess", "baseline")
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        fail("hostNamespaces", "baseline")
    if any(sc.get("privileged") for sc in scs):
        fail("privileged", "baseline")
    for sc in scs:
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            fail("capabilities_baseline", "baseline")
    volumes = spec.get("volumes") or []
    if any("hostPath" in v for v in volumes):
        fail("hostPathVolumes", "baseline")
    if any(p.get("hostPort") for c in containers for p in c.get("ports") or []):
        fail("hostPorts", "baseline")
    apparmor = [psc.get("appArmorProfile")] + [sc.get("appArmorProfile") for sc in scs]
    if any(a and a.get("type") == "Unconfined" for a in apparmor) or any(
        k.startswith("container.apparmor.security.beta.kubernetes.io/")
        and v not in ("runtime/default",)
        and not v.startswith("localhost/")
        for k, v in annotations.items()
    ):
        fail("appArmorProfile", "baseline")
    for se in [psc.get("seLinuxOptions")] + [sc.get("seLinuxOptions") for sc in scs]:
        if se and (se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role")):
            fail("seLinuxOptions", "baseline")
    if any(sc.get("procMount", "Default") != "Default" for sc in scs):
        fail("procMount", "baseline")
    seccomp = [psc.get("seccompProfile")] + [sc.get("seccompProfile") for sc in scs]
    if any(s and s.get("type") == "Unconfined" for s in seccomp):
        fail("seccompProfile_baseline", "baseline")
    if any(s.get("name") not in SAFE_SYSCTLS for s in psc.get("sysctls") or []):
        fail("sysctls", "baseline")

    # --- restricted ---------------------------------------------------------------------------
    if any(not (set(v) - {"name"}) <= RESTRICTED_VOLUMES for v in volumes):
        fail("restrictedVolumes", "restricted")
    if any(sc.get("allowPrivilegeEscalation") is not False for sc in scs):
        fail("allowPrivilegeEscalation", "restricted")
    # runAsNonRoot: true at pod level (and not false on a container), or true on every container.
    pod_non_root = psc.get("runAsNonRoot")
    explicit_root = pod_non_root is False or any(sc.get("runAsNonRoot") is False for sc in scs)
    unset = pod_non_root is not True and not all(sc.get("runAsNonRoot") is True for sc in scs)
    if explicit_root or unset:
        fail("runAsNonRoot", "restricted")
    if psc.get("runAsUser") == 0 or any(sc.get("runAsUser") == 0 for sc in scs):
        fail("runAsUser", "restricted")
    allowed = {"RuntimeDefault", "Localhost"}
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for sc in scs:
        mine = (sc.get("seccompProfile") or {}).get("type")
        effective = mine if mine is not None else pod_seccomp
        if effective not in allowed:
            fail("seccompProfile_restricted", "restricted")
    if pod_seccomp is not None and pod_seccomp not in allowed:
        fail("seccompProfile_restricted", "restricted")
    for sc in scs:
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {
            "NET_BIND_SERVICE"
        }:
            fail("capabilities_restricted", "restricted")
    return out


def level(pod: Mapping[str, Any]) -> str:
    """The strictest Pod Security level the pod meets: restricted, baseline or privileged."""
    failed = set(violations(pod).values())
    if "baseline" in failed:
        return "privileged"
    if "restricted" in failed:
        return "baseline"
    return "restricted"
