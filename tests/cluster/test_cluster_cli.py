"""`make cluster` / `make cluster-down` (python -m cluster): the failures a platform
engineer meets get a message that names the fix, and `down` cleans up after each. The happy
path (a whole cluster up) is what tests/e2e runs on."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cluster import build
from cluster.control_plane import PORT_OFFSETS, port_taken


def megdet_cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def free_base() -> int:
    """A port base whose whole range is free now."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base <= 65535 - len(PORT_OFFSETS) and not any(
            port_taken(base + i) for i in range(len(PORT_OFFSETS))
        ):
            return base


def test_a_taken_port_names_it_and_the_fix(tmp_path: Path) -> None:
    base = free_base()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", base + PORT_OFFSETS["kube-apiserver"]))
        sock.listen()
        proc = megdet_cluster(
            "up", "--state", str(tmp_path / "c"), env={"MEGDET_CLUSTER_PORT_BASE": str(base)}
        )
    assert proc.returncode == 1
    assert f"{base + PORT_OFFSETS['kube-apiserver']} (kube-apiserver)" in proc.stderr
    assert f"{base} (etcd)" not in proc.stderr  # only the taken one is named
    assert "MEGDET_CLUSTER_PORT_BASE" in proc.stderr and "make cluster-down" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "c").exists()  # nothing started, nothing written


def test_a_bad_port_base_is_refused(tmp_path: Path) -> None:
    proc = megdet_cluster(
        "up", "--state", str(tmp_path / "c"), env={"MEGDET_CLUSTER_PORT_BASE": "eighty"}
    )
    assert proc.returncode == 1
    assert "MEGDET_CLUSTER_PORT_BASE='eighty' must be a whole number from 1024" in proc.stderr


def test_a_half_started_cluster_is_named_and_down_cleans_it(tmp_path: Path) -> None:
    state = tmp_path / "c"
    state.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "state.json").write_text(
        json.dumps({"ports": {"kube-apiserver": 1}, "pids": {"etcd": dead.pid}})
    )
    proc = megdet_cluster("up", "--state", str(state))
    assert proc.returncode == 1
    assert "half-started cluster" in proc.stderr and "not running: etcd" in proc.stderr
    assert "make cluster-down" in proc.stderr
    down = megdet_cluster("down", "--state", str(state))
    assert down.returncode == 0, down.stderr
    assert not state.exists()


def test_leftover_files_without_state_are_named(tmp_path: Path) -> None:
    state = tmp_path / "c"
    (state / "pki").mkdir(parents=True)
    proc = megdet_cluster("up", "--state", str(state))
    assert proc.returncode == 1 and "no state.json" in proc.stderr
    assert megdet_cluster("down", "--state", str(state)).returncode == 0
    assert not state.exists()


def test_no_go_toolchain_says_how_to_get_one(tmp_path: Path) -> None:
    """Nothing built yet (an empty cache) and no `go` on PATH."""
    path = ":".join(p for p in os.environ["PATH"].split(":") if p and not (Path(p) / "go").exists())
    env = {
        "MEGDET_CLUSTER_CACHE": str(tmp_path / "cache"),
        "PATH": path,
        "GOROOT": "",
        "MEGDET_CLUSTER_PORT_BASE": str(free_base()),
    }
    proc = megdet_cluster("up", "--state", str(tmp_path / "c"), env=env)
    assert proc.returncode == 1, proc.stdout
    assert "no Go toolchain found" in proc.stderr and "go.dev/doc/install" in proc.stderr


def test_status_says_down_when_nothing_runs(tmp_path: Path) -> None:
    proc = megdet_cluster("status", "--state", str(tmp_path / "c"))
    assert (proc.returncode, proc.stdout.strip()) == (1, "down")


def test_the_build_pins_come_from_pyproject() -> None:
    pins = build.pins()
    assert set(pins) == set(build.COMPONENTS)
    assert pins["kubernetes"].startswith("v1.") and pins["etcd"].startswith("v3.6.")
    # Binaries are keyed by version in the cache, outside the work tree.
    path = build.binary_path("kube-apiserver")
    assert pins["kubernetes"] in str(path) and not str(path).startswith(str(build.ROOT))
    assert shutil.which("go") is None or build.find_go()
