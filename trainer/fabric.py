"""The fabric NCCL really uses on each rank, read from NCCL's own init log lines.

NCCL tries its network plugins in order (an external plugin, then InfiniBand, then TCP
sockets) and uses the first that initializes; when InfiniBand cannot (no device passed into
the container, no verbs provider, no locked memory) it takes sockets and says so only at INFO
level (pytorch/pytorch#111424). What NCCL writes, read in NVIDIA/nccl at tag v2.30.7-1
(commit 73cf112295c3):

* ``src/init.cc``: ``INFO(NCCL_INIT, "Using network %s", comm->ncclNet->name)`` once per
  communicator, after the network is chosen: the line this module trusts.
* The network names: ``"IB"`` (``src/transport/net_ib/common.cc``, ``ncclNetIb``; InfiniBand
  and RoCE alike), ``"Socket"`` (``src/transport/net_socket.cc``, ``ncclNetSocket``), or an
  external plugin's own name (``src/plugin/net.cc``: ``"Initialized NET plugin %s"``,
  ``"Failed to initialize NET plugin %s"``).
* ``src/transport/net_ib/init.cc``: ``"NET/IB : Using%s %s; OOB %s:%s"`` with
  ``" [%d]%s:%d"`` per device and ``"/%s"`` its link layer (IB or RoCE), or
  ``"NET/IB : No device found."``; ``src/transport/net_socket.cc``: ``"NET/Socket : Using%s"``
  with ``" [%d]%s:%s"`` per interface.
* The line prefix and ``NCCL_DEBUG_FILE``: :mod:`megdet.image.nccl_log`.

``megdet launch`` has NCCL write those lines to ``/tmp/megdet-nccl/nccl.<host>.<pid>``
(:func:`megdet.image.nccl_log.with_fabric_log`); each rank reads its own file once its
communicators exist (:func:`read_fabric`), the ranks share what they found
(:func:`gather_fabrics`), the exporter publishes ``megdet_train_fabric_info`` and rank 0's
progress report carries the run's summary (:func:`run_report`; the controller's
``FabricDegraded`` condition). A CPU run uses gloo, not NCCL, and says so.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from megdet.fabric_report import FabricReport
from megdet.image.nccl_log import debug_file_path, log_hostname, parse_line
from megdet.image.rdma import ib_requested

__all__ = [
    "ANY",
    "GLOO",
    "IB",
    "NONE",
    "SOCKET",
    "UNKNOWN",
    "Fabric",
    "fabric_from_lines",
    "gather_fabrics",
    "process_group_backend",
    "read_fabric",
    "report_fabric",
    "requested_fabric",
    "run_report",
    "summarize",
]

logger = logging.getLogger(__name__)

#: NCCL's names of its two built-in networks (``ncclNetIb.name``, ``ncclNetSocket.name``).
IB, SOCKET = "IB", "Socket"
#: Transports that are not an NCCL network name: a gloo (CPU) run, a world of one process
#: (no communicator), and a rank whose NCCL lines could not be read.
GLOO, NONE, UNKNOWN = "gloo", "none", "unknown"
#: ``requested`` when the env neither asks for InfiniBand nor turns it off.
ANY = "any"

_USING_NETWORK = re.compile(r"Using network (.+)")
_IB_USING = re.compile(r"NET/IB : Using(.*?) ?(\[RO\])?; OOB (.*)")
_SOCKET_USING = re.compile(r"NET/Socket : Using(.*)")
_DEVICE = re.compile(r"\[\d+\](\S+)")
#: NCCL messages that explain a fallback, kept for the report (at most this many).
_NOTE_PATTERNS = (
    re.compile(r"NET/IB : No device found\."),
    re.compile(r"Failed to initialize NET plugin .+"),
)
MAX_NOTES = 3


@dataclass(frozen=True)
class Fabric:
    """What one rank uses: ``transport`` is NCCL's network name (``IB``, ``Socket``, a
    plugin's) or :data:`GLOO` / :data:`NONE` / :data:`UNKNOWN`; ``requested`` is :data:`IB`,
    :data:`SOCKET` or :data:`ANY` (:func:`requested_fabric`); ``detail`` is for people
    (devices, or why the transport is unknown); ``notes`` are NCCL's own words on a fallback."""

    transport: str
    requested: str
    detail: str = ""
    notes: tuple[str, ...] = ()
    rank: int = 0

    @property
    def degraded(self) -> bool:
        """InfiniBand was requested and NCCL took TCP sockets."""
        return self.requested == IB and self.transport == SOCKET

    def describe(self) -> str:
        """One line: the transport, what it runs on, and what went wrong."""
        name = {GLOO: "gloo (not NCCL)", NONE: "none", UNKNOWN: "unknown"}.get(
            self.transport, f"NCCL network {self.transport}"
        )
        text = f"rank {self.rank}: {name}"
        if self.detail:
            text += f" ({self.detail})"
        if self.degraded:
            text += (
                "; InfiniBand was requested (NCCL_IB_DISABLE=0 / NCCL_IB_HCA) but NCCL fell back "
                "to TCP sockets"
            )
        if self.notes:
            text += "; NCCL: " + " | ".join(self.notes)
        return text


def requested_fabric(env: Mapping[str, str] = os.environ) -> str:
    """:data:`IB` when the env asks NCCL for InfiniBand (the run chart's ``nccl.ib.enabled``
    sets ``NCCL_IB_DISABLE=0``; so does naming ``NCCL_IB_HCA``), :data:`SOCKET` when it turns
    InfiniBand off (``NCCL_IB_DISABLE`` not 0), :data:`ANY` when NCCL picks."""
    if ib_requested(env):
        return IB
    if env.get("NCCL_IB_DISABLE", "").strip():
        return SOCKET
    return ANY


def fabric_from_lines(
    lines: Iterable[str], requested: str, pid: int | None = None, rank: int = 0
) -> Fabric:
    """The fabric NCCL's log ``lines`` name (only ``pid``'s lines when given).

    The transport is the network of ``"Using network %s"``; several communicators on
    different networks give their names joined by ``+`` in the order NCCL logged them.
    """
    networks: list[str] = []
    devices: dict[str, list[str]] = {IB: [], SOCKET: []}
    notes: list[str] = []
    for raw in lines:
        line = parse_line(raw)
        if line is None or (pid is not None and line.pid is not None and line.pid != pid):
            continue
        message = line.message.strip()
        if line.level == "WARN":
            _note(notes, message)
            continue
        if line.level != "INFO":
            continue
        if m := _USING_NETWORK.fullmatch(message):
            if m.group(1) not in networks:
                networks.append(m.group(1))
        elif m := _IB_USING.fullmatch(message):
            devices[IB] = _DEVICE.findall(m.group(1))
        elif m := _SOCKET_USING.fullmatch(message):
            devices[SOCKET] = _DEVICE.findall(m.group(1))
        elif any(p.fullmatch(message) for p in _NOTE_PATTERNS):
            _note(notes, message)
    if not networks:
        return Fabric(
            UNKNOWN,
            requested,
            "no 'Using network' line in NCCL's log: no NCCL communicator yet",
            tuple(notes),
            rank,
        )
    transport = "+".join(networks)
    used = [d for name in networks for d in devices.get(name, [])]
    return Fabric(transport, requested, ", ".join(used), tuple(notes), rank)


def _note(notes: list[str], message: str) -> None:
    if message not in notes and len(notes) < MAX_NOTES:
        notes.append(message)


def _logs_init_info(env: Mapping[str, str]) -> str | None:
    """Why NCCL's env prints no INIT INFO line, or None when it does."""
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if level not in ("INFO", "ABORT", "TRACE"):
        return f"NCCL_DEBUG={level or '(unset)'} prints no INFO line"
    subsys = [s.strip().upper() for s in env.get("NCCL_DEBUG_SUBSYS", "").split(",") if s.strip()]
    if not subsys:
        return None  # NCCL's default subsystems include INIT
    if subsys[0].startswith("^"):
        excluded = {subsys[0][1:], *subsys[1:]}
        return "NCCL_DEBUG_SUBSYS excludes INIT" if excluded & {"INIT", "ALL"} else None
    return None if {"INIT", "ALL"} & set(subsys) else "NCCL_DEBUG_SUBSYS lacks INIT"


def read_fabric(
    backend: str | None,
    world_size: int,
    rank: int = 0,
    env: Mapping[str, str] = os.environ,
    pid: int | None = None,
    hostname: str | None = None,
) -> Fabric:
    """This rank's fabric: none (no process group, or a world of one), gloo, or what its NCCL
    log file says. ``backend`` is the process group's (None: no process group).

    Call it after the process group's first collective (NCCL creates a communicator lazily).
    Never raises: a file that is missing or unreadable gives :data:`UNKNOWN` and the reason.
    """
    requested = requested_fabric(env)
    if backend is None or world_size <= 1:
        return Fabric(NONE, requested, "one process: nothing to talk to", rank=rank)
    if backend != "nccl":
        return Fabric(GLOO, requested, f"{backend} backend: CPU ranks talk over TCP", rank=rank)
    pattern = env.get("NCCL_DEBUG_FILE", "").strip()
    if not pattern:
        return Fabric(
            UNKNOWN,
            requested,
            "NCCL logs to stdout (NCCL_DEBUG_FILE unset; `megdet launch` sets it unless "
            "NCCL_DEBUG is INFO or TRACE)",
            rank=rank,
        )
    why = _logs_init_info(env)
    if why:
        return Fabric(UNKNOWN, requested, why, rank=rank)
    pid = os.getpid() if pid is None else pid
    path = debug_file_path(pattern, log_hostname(hostname), pid)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError as err:
        return Fabric(UNKNOWN, requested, f"cannot read {path}: {err.strerror}", rank=rank)
    return fabric_from_lines(lines, requested, pid=pid, rank=rank)


def gather_fabrics(fabric: Fabric) -> list[Fabric]:
    """Every rank's fabric, by rank. Collective: call on every rank."""
    from detectron2.utils import comm

    return list(comm.all_gather(fabric))


def summarize(fabrics: Sequence[Fabric]) -> tuple[str, bool]:
    """One line for the run's log, and whether any rank is degraded."""
    by_transport: dict[str, list[int]] = {}
    for f in fabrics:
        by_transport.setdefault(f.transport, []).append(f.rank)
    parts = [f"{_ranks(ranks)} on {t}" for t, ranks in by_transport.items()]
    degraded = [f for f in fabrics if f.degraded]
    text = "Fabric: " + "; ".join(parts)
    if fabrics and fabrics[0].transport == GLOO:
        text += " (not NCCL)"
    if degraded:
        text += (
            f". DEGRADED: {_ranks([f.rank for f in degraded])} use TCP sockets although "
            "InfiniBand was requested; " + degraded[0].describe()
        )
    unknown = [f for f in fabrics if f.transport == UNKNOWN]
    if unknown:
        text += f". Unknown on {_ranks([f.rank for f in unknown])}: {unknown[0].detail}"
    return text, bool(degraded)


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def run_report(fabrics: Sequence[Fabric]) -> FabricReport:
    """The run's fabric for the progress report (megdet/fabric_report.py)."""
    degraded = [f for f in fabrics if f.degraded]
    requested = {f.requested for f in fabrics}
    return FabricReport(
        transports=",".join(dict.fromkeys(f.transport for f in fabrics)),
        requested=IB if IB in requested else (requested.pop() if len(requested) == 1 else ANY),
        ranks=len(fabrics),
        degraded_ranks=len(degraded),
        note=degraded[0].notes[0] if degraded and degraded[0].notes else "",
    )


def process_group_backend() -> str | None:
    """The default process group's backend ("nccl", "gloo"), None without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return str(dist.get_backend())


def report_fabric(metrics=None) -> list[Fabric]:
    """Read, share, log and export (``megdet_train_fabric_info``) every rank's fabric.

    Collective. ``metrics`` is the rank's :class:`~megdet.trainer.metrics.TrainerMetrics`
    (None: metrics off). Returns every rank's fabric (rank 0 reports the run's).
    """
    from detectron2.utils import comm

    mine = read_fabric(process_group_backend(), comm.get_world_size(), comm.get_rank())
    fabrics = gather_fabrics(mine)
    if metrics is not None:
        metrics["megdet_train_fabric_info"].labels(
            rank=str(mine.rank), transport=mine.transport, requested=mine.requested
        ).set(1)
    if comm.is_main_process():
        text, degraded = summarize(fabrics)
        (logger.warning if degraded else logger.info)("%s", text)
    return fabrics
