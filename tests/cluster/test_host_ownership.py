"""`make cluster-down` undoes what its cluster did and nothing else: PIDs are checked by start
time and command line before a signal, the pods' cgroups are the node's own, and the
machine's KUBE-* iptables chains are left alone while another Kubernetes runs; the real node
refuses to start beside another kubelet. Plus what else faces the host: etcd's TLS and
CoreDNS's listener."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from cluster import build, node, procs
from cluster.control_plane import Cluster

SLEEPER = "import time; time.sleep(120)"


def fake_process(proc_root: Path, pid: int, argv: list[str], start: int, comm: str = "x") -> None:
    folder = proc_root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    # Fields 3..: state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt,
    # cmajflt, utime, stime, cutime, cstime, priority, nice, threads, itrealvalue, starttime.
    rest = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(start), "0", "0"]
    (folder / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")


def sleeper(*args: str) -> subprocess.Popen:
    """A process in a session of its own, once its command line shows (it reads empty for a
    moment after the spawn)."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args], start_new_session=True)
    deadline = time.monotonic() + 10
    while SLEEPER not in procs.command_line(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def gone(proc: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


# --- process identity --------------------------------------------------------------------------
def test_alive_counts_a_zombie_child_as_gone() -> None:
    """The stale-folder sweep of the Go cache and stop_process_group both ask procs.alive."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert procs.alive(os.getpid())
    deadline = time.monotonic() + 10
    while procs.alive(child.pid) and time.monotonic() < deadline:  # exited, not yet reaped
        time.sleep(0.01)
    assert not procs.alive(child.pid)
    assert (procs.PROC / str(child.pid)).exists()  # still a zombie: os.kill alone says alive
    child.wait()
    assert not procs.alive(child.pid)


def test_start_time_is_field_22_counted_after_the_command_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "PROC", tmp_path)
    fake_process(tmp_path, 77, ["/bin/x"], start=123456, comm="a) b (c")
    assert procs.start_time(77) == 123456
    assert procs.start_time(78) is None
    assert procs.start_time(os.getpid()) is None  # not in the fake /proc


def test_a_process_is_ours_by_start_time_and_a_command_line_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "PROC", tmp_path / "proc")
    root = "/work/.cluster"
    fake_process(tmp_path / "proc", 10, ["etcd", f"--data-dir={root}/etcd"], start=500)
    fake_process(tmp_path / "proc", 11, ["etcd", "--data-dir=/work/.cluster2/etcd"], start=500)
    assert procs.is_ours(10, root, {"start": 500})
    assert procs.is_ours(10, root)  # a state.json from before start times were recorded
    assert not procs.is_ours(10, root, {"start": 499})  # the PID was handed out again
    assert not procs.is_ours(11, root, {"start": 500})  # a sibling folder is not this one
    assert not procs.is_ours(12, root, {"start": 500})  # no such process


def test_real_processes_are_told_apart(tmp_path: Path) -> None:
    proc = sleeper(f"{tmp_path}/marker")
    try:
        record = procs.identity(proc.pid)
        assert isinstance(record["start"], int)
        assert procs.is_ours(proc.pid, str(tmp_path), record)
        assert not procs.is_ours(proc.pid, str(tmp_path), {"start": record["start"] + 1})
    finally:
        proc.kill()
        proc.wait()


# --- make cluster-down --------------------------------------------------------------------------
def write_state(root: Path, pids: dict[str, int], records: dict[str, dict] | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    state = {"ports": {"kube-apiserver": 1}, "pids": pids, "procs": records or {}}
    (root / "state.json").write_text(json.dumps(state))


def test_down_leaves_a_pid_that_is_no_longer_its_process_alone(tmp_path: Path) -> None:
    """After a reboot (or the process's death) the saved PID may be any program's."""
    stranger = sleeper()  # its command line names no cluster folder
    root = tmp_path / "c"
    write_state(root, {"etcd": stranger.pid})
    said: list[str] = []
    try:
        assert Cluster(root=root, echo=said.append).down() == []
        assert stranger.poll() is None
        assert f"not stopping etcd: pid {stranger.pid}" in said[0]
    finally:
        stranger.kill()
        stranger.wait()


def test_down_leaves_a_recycled_pid_alone_even_when_the_command_line_matches(
    tmp_path: Path,
) -> None:
    root = tmp_path / "c"
    twin = sleeper(f"--config={root}/x.yaml")
    start = procs.start_time(twin.pid)
    write_state(root, {"kubelet": twin.pid}, {"kubelet": {"start": start - 1}})
    try:
        assert Cluster(root=root, echo=lambda _: None).down() == []
        assert twin.poll() is None
    finally:
        twin.kill()
        twin.wait()


def test_down_stops_its_own_process(tmp_path: Path) -> None:
    root = tmp_path / "c"
    mine = sleeper(f"--data-dir={root}/etcd")
    write_state(root, {"etcd": mine.pid}, {"etcd": procs.identity(mine.pid)})
    try:
        assert Cluster(root=root, echo=lambda _: None).down() == ["etcd"]
        assert gone(mine)
        assert not root.exists()
    finally:
        if mine.poll() is None:
            os.killpg(mine.pid, signal.SIGKILL)


def test_spawn_records_the_start_time(tmp_path: Path) -> None:
    cluster = Cluster(root=tmp_path / "c")
    cluster.root.mkdir()
    cluster.logs.mkdir()
    state: dict = {"pids": {}}
    proc = cluster._spawn(state, "sleeper", [sys.executable, "-c", SLEEPER, f"{cluster.root}/"])
    try:
        assert state["procs"]["sleeper"] == {"start": procs.start_time(proc.pid)}
        while SLEEPER not in procs.command_line(proc.pid):
            time.sleep(0.01)
        assert json.loads(cluster.state_file.read_text())["procs"] == state["procs"]
        assert cluster.running("sleeper", state)
    finally:
        proc.kill()
        proc.wait()


# --- the real node's cgroups and iptables chains ----------------------------------------------
def quiet_teardown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """Run teardown's host steps against fakes; returns the commands it ran."""
    ran: list[list[str]] = []

    def record(cmd, *args, **kwargs):
        ran.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(node.subprocess, "run", record)
    monkeypatch.setattr(node, "MACHINE_LOCK", tmp_path / "lock.json")
    monkeypatch.setattr(node, "CONTAINER_LOG_LINKS", tmp_path / "links")
    monkeypatch.setattr(node.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(build, "binary_path", lambda name: Path(sys.executable))
    # Never the machine's real cgroups (a real node may run beside the tests).
    monkeypatch.setattr(node, "_kill_cgroup_tree", lambda name: ran.append(["kill", name]))
    monkeypatch.setattr(
        node, "_remove_cgroup_tree", lambda name, timeout=10: ran.append(["rm", name])
    )
    return ran


def test_teardown_kills_and_removes_only_the_nodes_own_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = quiet_teardown(monkeypatch, tmp_path)
    cluster = Cluster(root=tmp_path / "c")
    write_state(cluster.root, {})
    node.RealNode(cluster, echo=lambda _: None).teardown()
    assert [c for c in ran if c[0] in ("kill", "rm")] == [
        ["kill", "megdet-node"],
        ["rm", "megdet-node"],
    ]
    kubelet = node.RealNode(cluster).kubelet_config(
        "192.0.2.2", {"kubelet": 1, "kubelet-healthz": 2}
    )
    assert kubelet["cgroupRoot"] == "/megdet-node"


def test_the_cgroup_parent_is_made_in_every_mounted_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hierarchies = [tmp_path / "cpu,cpuacct", tmp_path / "cpuset"]
    for folder in hierarchies:
        folder.mkdir()
        (folder / "cgroup.procs").write_text("")
    # cgroupfs fills a new cpuset cgroup's files, empty; here the test does.
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp_path / "cpuset" / "megdet-node").mkdir()
    (tmp_path / "cpuset" / "megdet-node" / "cpuset.cpus").write_text("\n")
    # A new v1 cpu cgroup has the default weight, 1024 shares.
    (tmp_path / "cpu,cpuacct" / "megdet-node").mkdir()
    (tmp_path / "cpu,cpuacct" / "megdet-node" / "cpu.shares").write_text("1024\n")
    plain = tmp_path / "not-a-hierarchy"
    plain.mkdir()
    monkeypatch.setattr(node, "_cgroup_roots", lambda: [*hierarchies, plain])
    monkeypatch.setattr(node.os, "cpu_count", lambda: 2)
    node.make_cgroup_parent()
    node.make_cgroup_parent()  # again: already there
    assert [(f / "megdet-node").is_dir() for f in hierarchies] == [True, True]
    assert (tmp_path / "cpuset" / "megdet-node" / "cpuset.cpus").read_text() == "0-1\n"
    # The kubelet's weight for kubepods on 2 CPUs (2000 millicores: 2048 shares).
    assert (tmp_path / "cpu,cpuacct" / "megdet-node" / "cpu.shares").read_text() == "2048\n"
    assert not (tmp_path / "cpuset" / "megdet-node" / "cpu.shares").exists()
    assert not (plain / "megdet-node").exists()


def node_state(root: Path) -> None:
    write_state(root, {})
    state = json.loads((root / "state.json").read_text())
    state["node"] = {"ports": {}, "ip": "192.0.2.2", "sysctls": {}}
    (root / "state.json").write_text(json.dumps(state))


def test_teardown_leaves_the_kube_chains_while_another_kubernetes_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = quiet_teardown(monkeypatch, tmp_path)
    monkeypatch.setattr(procs, "PROC", tmp_path / "proc")
    fake_process(tmp_path / "proc", 4242, ["/usr/local/bin/kube-proxy", "--v=2"], start=9)
    cluster = Cluster(root=tmp_path / "c")
    node_state(cluster.root)
    said: list[str] = []
    node.RealNode(cluster, echo=said.append).teardown()
    assert not [c for c in ran if "--cleanup" in c or c[0] in ("iptables", "ip6tables")]
    assert [c for c in ran if c[:3] == ["ip", "link", "delete"]]  # its bridge still goes
    assert "left the KUBE-* iptables chains in place" in said[0] and "pid 4242" in said[0]


def test_teardown_removes_the_kube_chains_when_it_is_the_only_kubernetes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = quiet_teardown(monkeypatch, tmp_path)
    monkeypatch.setattr(procs, "PROC", tmp_path / "proc")
    cluster = Cluster(root=tmp_path / "c")
    # The node's own kube-proxy (its command line names the cluster's folder) is no stranger.
    fake_process(
        tmp_path / "proc", 4243, ["kube-proxy", f"--config={cluster.root}/node/kp.yaml"], start=9
    )
    node_state(cluster.root)
    node.RealNode(cluster, echo=lambda _: None).teardown()
    assert [c for c in ran if c[-1] == "--cleanup"]
    assert [c for c in ran if c[:3] == ["iptables", "-t", "filter"]]


# --- another kubelet on the machine -------------------------------------------------------------
def test_the_node_refuses_to_start_beside_another_kubelet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "PROC", tmp_path / "proc")
    fake_process(tmp_path / "proc", 555, ["/usr/bin/kubelet", "--config=/var/lib/kubelet/c"], 1)
    monkeypatch.setattr(node, "host_problems", lambda: [])
    monkeypatch.setattr(node, "KUBELET_PORT", 1)  # nothing listens there
    # Not the machine's lock: an e2e session's real node may hold it meanwhile (make test runs
    # the e2e tests on another xdist worker), which would make this MachineBusy.
    monkeypatch.setattr(node, "MACHINE_LOCK", tmp_path / "run" / "real-node.json")
    cluster = Cluster(root=tmp_path / "c")
    write_state(cluster.root, {})
    with pytest.raises(node.NodeError) as err:
        node.RealNode(cluster).start()
    message = str(err.value)
    assert "another Kubernetes node runs on this machine: pid 555 (/usr/bin/kubelet" in message
    assert "--no-real-node" in message
    assert "node" not in cluster.state()  # refused before anything started


def test_another_clusters_real_node_is_waited_for_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its kubelet is not this cluster's, but it holds the machine lock: MachineBusy, which
    the e2e fixture waits out, rather than the refusal meant for another Kubernetes."""
    monkeypatch.setattr(node, "MACHINE_LOCK", tmp_path / "run" / "real-node.json")
    monkeypatch.setattr(node, "host_problems", lambda: [])
    other = tmp_path / "other"
    (tmp_path / "kubelet").symlink_to(sys.executable)  # a process named kubelet
    kubelet = subprocess.Popen(
        [str(tmp_path / "kubelet"), "-c", SLEEPER, f"--config={other}/node/kubelet-config.yaml"]
    )
    try:
        while SLEEPER not in procs.command_line(kubelet.pid):
            time.sleep(0.01)
        assert kubelet.pid in procs.foreign(node.KUBE_NODE_PROGRAMS, str(tmp_path / "c"))
        write_state(other, {"kubelet": kubelet.pid}, {"kubelet": procs.identity(kubelet.pid)})
        node.MACHINE_LOCK.parent.mkdir()
        node.MACHINE_LOCK.write_text(json.dumps({"root": str(other), "pid": 1}))
        cluster = Cluster(root=tmp_path / "c")
        write_state(cluster.root, {})
        with pytest.raises(node.MachineBusy, match=f"another cluster's real node.*{other}"):
            node.RealNode(cluster).start()
    finally:
        kubelet.kill()
        kubelet.wait()


def test_a_listener_on_the_kubelet_port_counts_as_another_kubelet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procs, "PROC", tmp_path / "proc")
    (tmp_path / "proc").mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        monkeypatch.setattr(node, "KUBELET_PORT", sock.getsockname()[1])
        assert "a listener on the kubelet port" in node.other_kubernetes(tmp_path / "c")
    own = ["kubelet", f"--config={tmp_path}/c/node/kubelet-config.yaml"]
    fake_process(tmp_path / "proc", 556, own, 1)
    monkeypatch.setattr(node, "KUBELET_PORT", 1)
    assert node.other_kubernetes(tmp_path / "c") == ""  # its own kubelet is not another


def test_the_machine_lock_goes_by_the_owners_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock whose holder's saved PIDs now name other programs (after a reboot) is stale."""
    monkeypatch.setattr(node, "MACHINE_LOCK", tmp_path / "run" / "real-node.json")
    other = tmp_path / "other"
    other.mkdir()
    node.MACHINE_LOCK.parent.mkdir()
    node.MACHINE_LOCK.write_text(json.dumps({"root": str(other), "pid": 1}))
    mine = node.RealNode(Cluster(root=tmp_path / "mine"))
    stranger = sleeper()
    try:
        (other / "state.json").write_text(json.dumps({"pids": {"kubelet": stranger.pid}}))
        mine._claim_machine()  # that PID is not the other cluster's kubelet: stale
        assert json.loads(node.MACHINE_LOCK.read_text())["root"] == str(tmp_path / "mine")
    finally:
        stranger.kill()
        stranger.wait()


# --- listeners -----------------------------------------------------------------------------------
def test_coredns_listens_on_the_node_address_and_answers_only_the_node(tmp_path: Path) -> None:
    real = node.RealNode(Cluster(root=tmp_path / "c"))
    ports = {name: 40000 + i for i, name in enumerate(node.NODE_PORT_OFFSETS)}
    corefile = real.corefile(ports, "192.0.2.2")
    assert "    bind 192.0.2.2\n" in corefile
    assert f"allow net {node.POD_CIDR} 192.0.2.2/32 127.0.0.0/8\n        block\n" in corefile
    for plugin in ("health", "ready", "prometheus"):
        assert f"{plugin} 127.0.0.1:" in corefile


# --- etcd ----------------------------------------------------------------------------------------
def test_etcd_serves_tls_and_asks_every_client_for_a_certificate(tmp_path: Path) -> None:
    cluster = Cluster(root=tmp_path / "c")
    args = cluster.etcd_args({"etcd": 2379, "etcd-peer": 2380})
    etcd_pki = cluster.root / "pki" / "etcd"
    for flag in (
        "--listen-client-urls=https://127.0.0.1:2379",
        "--advertise-client-urls=https://127.0.0.1:2379",
        "--listen-peer-urls=https://127.0.0.1:2380",
        "--client-cert-auth=true",
        "--peer-client-cert-auth=true",
        f"--trusted-ca-file={etcd_pki / 'ca.crt'}",
        f"--peer-trusted-ca-file={etcd_pki / 'ca.crt'}",
        f"--cert-file={etcd_pki / 'server.crt'}",
        f"--key-file={etcd_pki / 'server.key'}",
    ):
        assert flag in args, flag
    assert not [a for a in args if "http://" in a]


def test_the_api_server_reaches_etcd_with_its_own_client_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(root=tmp_path / "c")
    cluster.root.mkdir()
    seen: dict[str, list[str]] = {}
    monkeypatch.setattr(
        Cluster, "_spawn", lambda self, state, name, args, **kw: seen.update({name: args})
    )
    monkeypatch.setattr(Cluster, "_wait", lambda *a, **k: None)
    monkeypatch.setattr(Cluster, "_audit_policy", lambda self: tmp_path / "audit.yaml")
    monkeypatch.setattr(Cluster, "issuer", lambda self: "https://192.0.2.2:6443")
    state = {"ports": {"etcd": 2379, "kube-apiserver": 6443}, "address": "192.0.2.2", "pids": {}}
    cluster._start_apiserver(state, 1)
    etcd_pki = cluster.root / "pki" / "etcd"
    args = seen["kube-apiserver"]
    assert "--etcd-servers=https://127.0.0.1:2379" in args
    assert f"--etcd-cafile={etcd_pki / 'ca.crt'}" in args
    assert f"--etcd-certfile={etcd_pki / 'apiserver-etcd-client.crt'}" in args
    assert f"--etcd-keyfile={etcd_pki / 'apiserver-etcd-client.key'}" in args


def test_etcd_trusts_its_own_ca_only(tmp_path: Path) -> None:
    """The admin's or a kubelet's certificate (the cluster CA's) opens no door to etcd."""
    cluster = Cluster(root=tmp_path / "c")
    cluster.root.mkdir()
    cluster._make_pki({"kube-apiserver": 6443}, "127.0.0.1")
    etcd_pki = cluster.root / "pki" / "etcd"

    def issuer(path: Path) -> str:
        return x509.load_pem_x509_certificate(path.read_bytes()).issuer.rfc4514_string()

    assert issuer(etcd_pki / "apiserver-etcd-client.crt") == "CN=megdet-etcd-ca"
    assert issuer(etcd_pki / "server.crt") == "CN=megdet-etcd-ca"
    assert issuer(cluster.root / "pki" / "admin.crt") == "CN=megdet-cluster-ca"

    def load(path: Path) -> x509.Certificate:
        return x509.load_pem_x509_certificate(path.read_bytes())

    etcd_ca = load(etcd_pki / "ca.crt")
    load(etcd_pki / "apiserver-etcd-client.crt").verify_directly_issued_by(etcd_ca)
    for other in ("admin.crt", "node-kubelet.crt", "operators.crt"):
        if (cluster.root / "pki" / other).exists():
            with pytest.raises(ValueError):
                load(cluster.root / "pki" / other).verify_directly_issued_by(etcd_ca)


def test_teardown_checks_a_shims_start_time_before_killing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet_teardown(monkeypatch, tmp_path)
    cluster = Cluster(root=tmp_path / "c")
    write_state(cluster.root, {})
    real = node.RealNode(cluster, echo=lambda _: None)
    shim = sleeper()
    monkeypatch.setattr(node, "_shims", lambda sock: [(shim.pid, procs.start_time(shim.pid) + 1)])
    try:
        real.teardown()
        time.sleep(0.2)
        assert shim.poll() is None  # another start time: a PID handed out again, not the shim
    finally:
        shim.kill()
        shim.wait()
