"""Which processes on this machine are a cluster's own, known by more than their PID.

A PID in ``state.json`` may name another program by the time ``make cluster-down`` runs: the
cluster's process died and the kernel handed its number out again, or the machine rebooted.
A process is the cluster's when it is the one that was started (its start time, field 22 of
``/proc/<pid>/stat``, in clock ticks since boot, is the one recorded at start) and its command
line names the cluster's state folder (every component's does: its data folder, its
kubeconfig or its configuration file is there). Anything else is not signalled.

The same test tells a kubelet or kube-proxy of another Kubernetes on this machine from the
real node's own (cluster.node refuses to start beside one, and leaves the machine's
KUBE-* iptables chains alone while one runs).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Where processes are read (tests point it at a folder of their own).
PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (field 22 of /proc/<pid>/stat, clock ticks since boot); None when
    no such process runs. The command name (field 2) may hold spaces and parentheses: the
    fields are counted from its closing parenthesis."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is field 3 (the state): field 22 is fields[19].
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists (another user's counts) and is no zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; read its state.
    with contextlib.suppress(OSError):
        stat = (PROC / str(pid) / "stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments (empty for a zombie, a kernel thread, or no such process)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def identity(pid: int) -> dict[str, Any]:
    """What state.json records of a process the cluster just started."""
    return {"start": start_time(pid)}


def is_ours(pid: int, marker: str, record: Mapping[str, Any] | None = None) -> bool:
    """Whether ``pid`` is the process that was started (``record``'s start time, when one was
    recorded) and its command line names ``marker`` (the cluster's state folder)."""
    started = start_time(pid)
    if started is None:
        return False
    if record and record.get("start") is not None and record["start"] != started:
        return False
    return _names(command_line(pid), marker)


def _names(argv: list[str], marker: str) -> bool:
    """Whether an argument names a path under the folder ``marker``."""
    folder = marker.rstrip("/") + "/"
    return any(folder in arg for arg in argv)


def describe(pid: int) -> str:
    """``pid`` and its command line, shortened, for a message."""
    cmd = " ".join(command_line(pid)) or "?"
    return f"pid {pid} ({cmd[:120]}{'...' if len(cmd) > 120 else ''})"


def foreign(names: tuple[str, ...], marker: str) -> list[int]:
    """PIDs of running programs whose executable name is one of ``names`` and whose command
    line does not name ``marker``: another Kubernetes's kubelet or kube-proxy."""
    found = []
    with contextlib.suppress(OSError):
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            argv = command_line(int(entry.name))
            if not argv or Path(argv[0]).name not in names:
                continue
            if not _names(argv, marker):
                found.append(int(entry.name))
    return sorted(found)
