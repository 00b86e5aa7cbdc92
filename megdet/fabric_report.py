"""The run's fabric in a progress report, for both sides: what rank 0 sends, what the
controller makes of it (the MegDetRun's ``FabricDegraded`` condition). Stdlib only.

Rank 0 knows every rank's fabric (``megdet.trainer.fabric``: the network each rank's NCCL
logged at init). It sends the run's summary as five Kubeflow Trainer metrics, name/value
strings of 1..64 characters (:mod:`megdet.progress`), so Trainer's own status server stores
them too (``TrainJob.status.trainerStatus.metrics``, ``target: trainjob``) and the MegDet
controller's endpoint takes them (``target: pytorchjob``). They are not part of
``status.progress``: the controller turns them into the condition (:func:`condition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONDITION",
    "FABRIC_METRICS",
    "REASON_AS_REQUESTED",
    "REASON_NOT_NCCL",
    "REASON_SOCKET_FALLBACK",
    "FabricReport",
    "condition",
    "from_metrics",
    "to_metrics",
]

#: The metric names, in the order :func:`to_metrics` writes them.
FABRIC_METRICS = ("fabric", "fabricRequested", "fabricRanks", "fabricDegradedRanks", "fabricNote")
#: The MegDetRun condition and its reasons.
CONDITION = "FabricDegraded"
REASON_SOCKET_FALLBACK = "SocketFallback"
REASON_AS_REQUESTED = "FabricAsRequested"
REASON_NOT_NCCL = "NotNCCL"
#: Transport names that are not NCCL networks (``megdet.trainer.fabric``).
_NOT_NCCL = ("gloo", "none")
_MAX = 64


@dataclass(frozen=True)
class FabricReport:
    """The run's fabric: ``transports`` the ranks' distinct transports joined by ``,`` (NCCL's
    network names, ``gloo``, ``none`` or ``unknown``), ``requested`` IB / Socket / any, how
    many ``ranks`` and how many of them use TCP sockets although InfiniBand was requested
    (``degraded_ranks``), and ``note``: NCCL's own words on the first such rank's fallback."""

    transports: str
    requested: str
    ranks: int
    degraded_ranks: int = 0
    note: str = ""


def _clip(text: str) -> str:
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def to_metrics(report: FabricReport) -> list[dict[str, str]]:
    """The metrics to append to a report's ``trainerStatus.metrics`` (values clipped to 64
    characters; an empty note is left out, as Trainer refuses an empty value)."""
    values = (
        report.transports,
        report.requested,
        str(report.ranks),
        str(report.degraded_ranks),
        report.note,
    )
    return [
        {"name": name, "value": _clip(value)}
        for name, value in zip(FABRIC_METRICS, values, strict=True)
        if value
    ]


def from_metrics(metrics: Any) -> FabricReport | None:
    """The report in a ``trainerStatus.metrics`` list; None without one. Never raises."""
    if not isinstance(metrics, list | tuple):
        return None
    found: dict[str, str] = {}
    for item in metrics:
        if isinstance(item, Mapping) and item.get("name") in FABRIC_METRICS:
            value = item.get("value")
            if isinstance(value, str) and item["name"] not in found:
                found[item["name"]] = value
    transports, requested = found.get("fabric"), found.get("fabricRequested")
    ranks, degraded = _count(found.get("fabricRanks")), _count(found.get("fabricDegradedRanks"))
    if not transports or not requested or ranks is None or degraded is None or degraded > ranks:
        return None
    return FabricReport(transports, requested, ranks, degraded, found.get("fabricNote", ""))


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and len(text) <= 9 else None


def condition(report: FabricReport) -> tuple[bool, str, str] | None:
    """``FabricDegraded``'s (status, reason, message) for ``report``; None when the fabric is
    not known on some rank and none is degraded (nothing to say either way)."""
    names = report.transports.split(",")
    if report.degraded_ranks:
        said = f" NCCL said: {report.note.rstrip('.')}." if report.note else ""
        return (
            True,
            REASON_SOCKET_FALLBACK,
            f"{report.degraded_ranks} of {report.ranks} ranks use NCCL network Socket (TCP) "
            "although the run asked for InfiniBand (nccl.ib.enabled: NCCL_IB_DISABLE=0, or "
            f"NCCL_IB_HCA): collectives between nodes run over TCP.{said} Check that the pods "
            "get the RDMA resource (nccl.ib.rdmaResourceName) and run `megdet doctor` in one; "
            "rank 0's 'Fabric:' log line names the ranks.",
        )
    if "unknown" in names:
        return None
    if names == ["none"]:
        return False, REASON_NOT_NCCL, "one process: no collective traffic"
    if all(name in _NOT_NCCL for name in names):
        return False, REASON_NOT_NCCL, f"{report.transports} (not NCCL) on {report.ranks} ranks"
    return (
        False,
        REASON_AS_REQUESTED,
        f"NCCL network {report.transports} on {report.ranks} ranks (requested: {report.requested})",
    )
