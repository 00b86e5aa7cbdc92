"""Can this process do RDMA? The user-space and kernel-side facts NCCL's InfiniBand transport needs.

NCCL opens ``libibverbs.so.1`` at run time (dlopen) and libibverbs loads a provider for the
HCA (``libmlx5-rdmav*.so`` for Mellanox/NVIDIA ConnectX). Missing either, NCCL logs
"NET/IB : No device found" and uses TCP sockets, silently at the default log level. RDMA also
pins (locks) its buffers in memory, which needs an unlimited ``RLIMIT_MEMLOCK`` (``ulimit -l``)
or an effective ``CAP_IPC_LOCK``; a capability added to a non-root container never reaches the
effective set (kubernetes/kubernetes#56374), so ``CapEff`` is read, not assumed.

:func:`probe_rdma` reads the facts (every input injectable for tests); :func:`rdma_lines` and
:func:`rdma_warnings` turn them into the doctor's report. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CAPABILITY_NAMES",
    "CAP_IPC_LOCK",
    "RdmaInfo",
    "decode_capabilities",
    "ib_requested",
    "probe_rdma",
    "rdma_lines",
    "rdma_warnings",
]

#: Linux capability numbers (linux/capability.h), index = bit in CapEff.
CAPABILITY_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
CAP_IPC_LOCK = CAPABILITY_NAMES.index("IPC_LOCK")  # 14

#: The verbs library NCCL dlopens (soname of rdma-core's libibverbs).
VERBS_LIBRARY = "libibverbs.so.1"
_PROVIDER = re.compile(r"^lib(?P<name>[a-z0-9_]+)-rdmav\d+\.so$")


@dataclass(frozen=True)
class RdmaInfo:
    """What this process has for RDMA."""

    verbs_error: str | None  # None: libibverbs.so.1 loaded
    providers: dict[str, str]  # provider name -> file, e.g. {"mlx5": ".../libmlx5-rdmav34.so"}
    uverbs_devices: tuple[str, ...] | None  # entries of /dev/infiniband; None: no such folder
    memlock: tuple[int, int]  # RLIMIT_MEMLOCK (soft, hard); resource.RLIM_INFINITY = unlimited
    cap_eff: int | None  # CapEff bit mask; None: not readable
    uid: int

    @property
    def verbs_loadable(self) -> bool:
        return self.verbs_error is None

    @property
    def memlock_unlimited(self) -> bool:
        return self.memlock[0] == resource.RLIM_INFINITY

    @property
    def ipc_lock(self) -> bool:
        return self.cap_eff is not None and bool(self.cap_eff >> CAP_IPC_LOCK & 1)


def decode_capabilities(mask: int) -> list[str]:
    """Capability names set in ``mask`` (unknown bits as CAP_<n>)."""
    names = []
    for bit in range(mask.bit_length()):
        if mask >> bit & 1:
            names.append(CAPABILITY_NAMES[bit] if bit < len(CAPABILITY_NAMES) else f"CAP_{bit}")
    return names


def read_cap_eff(status: Path = Path("/proc/self/status")) -> int | None:
    """The CapEff mask from a /proc/<pid>/status file, or None."""
    try:
        text = status.read_text()
    except OSError:
        return None
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", text, re.MULTILINE)
    return int(match.group(1), 16) if match else None


def _load_library(name: str) -> str | None:
    try:
        ctypes.CDLL(name)
    except OSError as err:
        return str(err)
    return None


def find_providers(lib_root: Path = Path("/usr")) -> dict[str, str]:
    """libibverbs providers installed under ``lib_root`` (Debian/Ubuntu and RHEL layouts)."""
    found: dict[str, str] = {}
    for pattern in ("lib*/*/libibverbs/lib*-rdmav*.so", "lib*/libibverbs/lib*-rdmav*.so"):
        for path in sorted(lib_root.glob(pattern)):
            match = _PROVIDER.match(path.name)
            if match:
                found.setdefault(match.group("name"), str(path))
    return found


def probe_rdma(
    *,
    load_library: Callable[[str], str | None] = _load_library,
    lib_root: Path = Path("/usr"),
    dev_root: Path = Path("/dev/infiniband"),
    proc_status: Path = Path("/proc/self/status"),
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
    uid: int | None = None,
) -> RdmaInfo:
    """Collect :class:`RdmaInfo` for this process."""
    devices = tuple(sorted(p.name for p in dev_root.iterdir())) if dev_root.is_dir() else None
    return RdmaInfo(
        verbs_error=load_library(VERBS_LIBRARY),
        providers=find_providers(lib_root),
        uverbs_devices=devices,
        memlock=getrlimit(resource.RLIMIT_MEMLOCK),
        cap_eff=read_cap_eff(proc_status),
        uid=os.getuid() if uid is None else uid,
    )


def ib_requested(env: Mapping[str, str]) -> bool:
    """Whether the pod asks NCCL for InfiniBand (the chart's nccl.ib.enabled sets these)."""
    disable = env.get("NCCL_IB_DISABLE", "").strip()
    if disable:
        return disable == "0"
    return bool(env.get("NCCL_IB_HCA", "").strip())


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else f"{value} bytes"


def locked_memory_source(info: RdmaInfo) -> str | None:
    """How RDMA may pin memory here: the runtime's unlimited memlock, CAP_IPC_LOCK, or None."""
    if info.memlock_unlimited:
        return "RLIMIT_MEMLOCK is unlimited (granted by the container runtime or as root)"
    if info.ipc_lock:
        return "CAP_IPC_LOCK is effective (the memlock limit does not apply)"
    return None


def rdma_lines(info: RdmaInfo) -> list[str]:
    """The doctor's "RDMA" section."""
    verbs = "loadable" if info.verbs_loadable else f"NOT loadable ({info.verbs_error})"
    providers = "none found"
    if info.providers:
        mlx5 = info.providers.get("mlx5", "MISSING")
        providers = f"{', '.join(info.providers)}; mlx5: {mlx5}"
    if info.uverbs_devices is None:
        devices = "missing (no RDMA device passed into the container)"
    else:
        devices = ", ".join(info.uverbs_devices) or "empty"
    caps = "unreadable"
    if info.cap_eff is not None:
        named = decode_capabilities(info.cap_eff)
        # A root container has ~40; list them only when few (the non-root case that matters).
        shown = ", ".join(named) if len(named) <= 8 else f"{len(named)} capabilities"
        caps = f"0x{info.cap_eff:016x} ({shown or 'none'})"
    source = locked_memory_source(info)
    return [
        f"{VERBS_LIBRARY}: {verbs}",
        f"verbs providers: {providers}",
        f"/dev/infiniband: {devices}",
        f"RLIMIT_MEMLOCK (ulimit -l): soft {_limit(info.memlock[0])}, "
        f"hard {_limit(info.memlock[1])}",
        f"uid {info.uid}, effective capabilities {caps}; "
        f"IPC_LOCK {'yes' if info.ipc_lock else 'no'}",
        f"locked memory for RDMA: {source or 'NOT available'}",
    ]


def rdma_warnings(info: RdmaInfo, env: Mapping[str, str]) -> list[str]:
    """Why InfiniBand, when the env requests it, cannot work here; [] when it can or is off."""
    if not ib_requested(env):
        return []
    why = []
    if not info.verbs_loadable:
        why.append(f"{VERBS_LIBRARY} cannot be loaded (install rdma-core's libibverbs1)")
    if "mlx5" not in info.providers:
        why.append("no mlx5 verbs provider (install ibverbs-providers)")
    if not info.uverbs_devices:
        why.append("/dev/infiniband has no devices (request the RDMA device-plugin resource)")
    if locked_memory_source(info) is None:
        why.append(
            f"RLIMIT_MEMLOCK is {_limit(info.memlock[0])} and CAP_IPC_LOCK is not effective "
            f"(uid {info.uid}); RDMA cannot pin its buffers (see nccl.ib.memlock in docs/helm.md)"
        )
    if not why:
        return []
    return [
        "InfiniBand is requested (NCCL_IB_DISABLE=0 / NCCL_IB_HCA) but cannot work: "
        + "; ".join(why)
        + ". Expect NCCL to fall back to TCP sockets, or to fail registering memory"
    ]
