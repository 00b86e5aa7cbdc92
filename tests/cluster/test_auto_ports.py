"""``ports_mode="auto"``: the ports a component listens on minutes after the cluster starts
(Kueue's, the real node's) are drawn below the kernel's ephemeral range, where no outgoing
connection can take them in the meantime, and never twice or where something listens."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cluster import control_plane
from cluster.control_plane import (
    AUTO_PORT_END,
    AUTO_PORT_LOW,
    PORT_OFFSETS,
    Cluster,
    ephemeral_low,
    listen_port,
)


def test_the_cluster_and_its_late_components_get_ports_outside_the_ephemeral_range(
    tmp_path: Path,
) -> None:
    ports = Cluster(root=tmp_path, ports_mode="auto", echo=lambda _: None)._choose_ports()
    assert set(ports) == set(PORT_OFFSETS)
    assert len(set(ports.values())) == len(ports)
    high = min(ephemeral_low(), AUTO_PORT_END)
    assert all(AUTO_PORT_LOW <= port < high for port in ports.values()), ports


def test_a_drawn_port_is_neither_avoided_nor_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, 20001, 20002])
        monkeypatch.setattr(control_plane, "ephemeral_low", lambda: 65536)
        monkeypatch.setattr(control_plane.random, "randrange", lambda low, high: next(draws))
        assert listen_port(avoid=[20001]) == 20002


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(str(ranges)) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
