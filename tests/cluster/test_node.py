"""The real node's parts that need no kubelet: the OCI archives it imports, the host checks
that name what is missing, its component configurations, the machine lock, and the builder's
incremental builds. tests/e2e/test_real_node.py runs the node itself."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from cluster import build, node, oci, procs
from cluster.control_plane import Cluster


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_an_oci_archive_is_a_valid_image_layout(tmp_path: Path) -> None:
    binary = tmp_path / "hello"
    binary.write_bytes(b"#!/bin/sh\necho hi\n")
    path = tmp_path / "img.tar"
    digest = oci.write_archive(
        path,
        "megdet.local/hello:1",
        [oci.Entry("bin/hello", source=binary, mode=0o755), oci.Entry("bin/hi", symlink="hello")],
        entrypoint=["/bin/hello"],
        user="65532:65532",
    )
    files = read_archive(path)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    # Every blob is stored under its own digest.
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (desc,) = index["manifests"]
    assert desc["digest"] == digest
    assert desc["annotations"]["io.containerd.image.name"] == "megdet.local/hello:1"
    manifest = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
    assert config["config"]["User"] == "65532:65532"
    (layer,) = manifest["layers"]
    layer_data = files[f"blobs/sha256/{layer['digest'].split(':')[1]}"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # uncompressed: diff_id = digest
    with tarfile.open(fileobj=io.BytesIO(layer_data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin"].isdir()
    assert members["bin/hello"].mode == 0o755 and members["bin/hello"].uid == 0
    assert members["bin/hi"].issym() and members["bin/hi"].linkname == "hello"
    assert oci.archive_names(path) == ["megdet.local/hello:1"]


def test_the_same_inputs_give_the_same_digest(tmp_path: Path) -> None:
    entries = [oci.Entry("a", data=b"x")]
    first = oci.write_archive(tmp_path / "1.tar", "megdet.local/a:1", entries)
    second = oci.write_archive(tmp_path / "2.tar", "megdet.local/a:1", entries)
    assert first == second


def test_an_image_name_needs_a_tag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a tag"):
        oci.write_archive(tmp_path / "x.tar", "megdet.local/a", [oci.Entry("a", data=b"")])


def test_import_refuses_an_archive_without_image_names(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    oci.write_archive(path, "megdet.local/a:1", [oci.Entry("a", data=b"")])
    files = read_archive(path)
    index = json.loads(files["index.json"])
    index["manifests"][0].pop("annotations")
    files["index.json"] = json.dumps(index).encode()
    bare = tmp_path / "bare.tar"
    with tarfile.open(bare, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(node.NodeError, match="names no image"):
        node.import_image(tmp_path / "no.sock", bare)


def test_the_busybox_image_has_a_shell(tmp_path: Path) -> None:
    if not node.BUSYBOX.exists():
        pytest.skip("Debian's busybox-static is not installed (scripts/install_node_packages.sh)")
    path = tmp_path / "bb.tar"
    node.write_busybox_image(path, "megdet.local/busybox:t")
    files = read_archive(path)
    manifest = json.loads(files[f"blobs/sha256/{_manifest_digest(files)}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        names = set(tar.getnames())
    assert {"bin/busybox", "bin/sh", "bin/wget", "bin/nslookup", "bin/httpd", "tmp"} <= names


def _manifest_digest(files: dict[str, bytes]) -> str:
    return json.loads(files["index.json"])["manifests"][0]["digest"].split(":")[1]


# --- host checks -------------------------------------------------------------------------------
def test_missing_packages_are_named_with_the_debian_package_and_the_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(node.shutil, "which", lambda cmd: None)
    monkeypatch.setattr(node, "CNI_BIN_DIR", tmp_path / "cni")
    problems = "; ".join(node.host_problems())
    for package in ("containerd", "runc", "iptables", "containernetworking-plugins"):
        assert package in problems
    assert "containerd-shim-runc-v2" in problems and str(tmp_path / "cni" / "bridge") in problems
    assert "scripts/install_node_packages.sh" in problems


def test_no_cgroups_no_overlay_no_forwarding_are_each_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(node, "_mounted_cgroups", lambda: (set(), False))
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\tproc\n\text4\n")
    monkeypatch.setattr(node, "PROC_FILESYSTEMS", filesystems)
    monkeypatch.setattr(node, "IP_FORWARD", tmp_path / "missing" / "ip_forward")
    problems = node.host_problems()
    assert any("no cgroups mounted under /sys/fs/cgroup" in p for p in problems)
    assert any("no overlay filesystem" in p for p in problems)
    assert any("ip_forward is not writable" in p for p in problems)


def test_missing_cgroup_v1_controllers_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "_mounted_cgroups", lambda: ({"cpu", "memory"}, False))
    problems = "; ".join(node.host_problems())
    assert "cgroup v1 controllers not mounted: cpuacct, cpuset, devices, freezer, pids" in problems


def test_a_node_that_cannot_start_leaves_the_kwok_cluster_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """make cluster: the reason is printed, nothing of the node started, up() goes on."""
    root = tmp_path / "c"
    root.mkdir()
    (root / "state.json").write_text(json.dumps({"ports": {"kube-apiserver": 1}, "pids": {}}))
    monkeypatch.setattr(node, "host_problems", lambda: ["no overlay filesystem (test)"])
    said: list[str] = []
    cluster = Cluster(root=root, echo=said.append)
    assert cluster.start_real_node(required=False) is False
    assert said == [
        "real node not started (the kwok nodes work without it): the real node cannot start "
        "on this machine: no overlay filesystem (test)"
    ]
    assert "node" not in cluster.state()
    with pytest.raises(node.NodeError, match="no overlay filesystem"):
        cluster.start_real_node(required=True)


def test_one_real_node_per_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(node, "MACHINE_LOCK", tmp_path / "run" / "real-node.json")
    other = tmp_path / "other"
    other.mkdir()
    # That cluster's kubelet: a process whose command line names its folder.
    kubelet = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--config={other}/kubelet.yaml"]
    )
    while f"--config={other}/kubelet.yaml" not in procs.command_line(kubelet.pid):
        time.sleep(0.01)  # it reads empty for a moment after the spawn
    (other / "state.json").write_text(json.dumps({"pids": {"kubelet": kubelet.pid}}))
    node.MACHINE_LOCK.parent.mkdir()
    node.MACHINE_LOCK.write_text(json.dumps({"root": str(other), "pid": os.getpid()}))
    mine = node.RealNode(Cluster(root=tmp_path / "mine"))
    try:
        with pytest.raises(node.MachineBusy, match=f"another cluster's real node.*{other}"):
            mine._claim_machine()
    finally:
        kubelet.kill()
        kubelet.wait()
    # Once that node's processes are gone, the lock is stale and taken over.
    (other / "state.json").write_text(json.dumps({"pids": {}}))
    mine._claim_machine()
    assert json.loads(node.MACHINE_LOCK.read_text())["root"] == str(tmp_path / "mine")
    mine._release_machine()
    assert not node.MACHINE_LOCK.exists()


# --- configurations ----------------------------------------------------------------------------
def test_the_component_configs(tmp_path: Path) -> None:
    cluster = Cluster(root=tmp_path / "c")
    real = node.RealNode(cluster)
    ports = {name: 40000 + i for i, name in enumerate(node.NODE_PORT_OFFSETS)}
    kubelet = real.kubelet_config("192.0.2.2", ports)
    # v1.36 refuses cgroup v1 by default; this machine's cgroups are v1.
    assert kubelet["failCgroupV1"] is False and kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["clusterDNS"] == [node.DNS_SERVICE_IP]
    assert kubelet["registerWithTaints"] == [node.TAINT]
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{real.socket}"
    assert "staticPodPath" not in kubelet and kubelet["failSwapOn"] is False
    assert str(real.socket).startswith(str(tmp_path))
    proxy = real.kube_proxy_config("192.0.2.2", ports)
    assert proxy["mode"] == "iptables" and proxy["iptables"]["masqueradeAll"] is True
    cni = real.cni_config()
    assert [p["type"] for p in cni["plugins"]] == ["bridge", "portmap"]
    assert cni["plugins"][0]["ipam"]["dataDir"].startswith(str(tmp_path))
    containerd = real.containerd_config()
    assert f'address = "{real.socket}"' in containerd
    assert "SystemdCgroup = false" in containerd and "netns_mounts_under_state_dir" in containerd
    corefile = real.corefile(ports, "192.0.2.2")
    assert f".:{ports['coredns']} " in corefile and "kubernetes cluster.local" in corefile


def test_pods_that_want_the_real_node_tolerate_its_taint() -> None:
    placement = node.pod_placement()
    (toleration,) = placement["tolerations"]
    assert (toleration["key"], toleration["value"], toleration["effect"]) == (
        node.TAINT["key"],
        node.TAINT["value"],
        node.TAINT["effect"],
    )
    assert placement["nodeSelector"] == {node.NODE_LABEL: "true"}


# --- the builder -------------------------------------------------------------------------------
FAKE_GO = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, sys
    with open(os.environ["FAKE_GO_LOG"], "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    if sys.argv[1] == "install":
        pkg = sys.argv[-1].split("@")[0]
        with open(os.path.join(os.environ["GOBIN"], pkg.rsplit("/", 1)[-1]), "w") as out:
            out.write("built")
    """
)


@pytest.fixture
def fake_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """FAKE_GO as `go` on PATH, the cluster cache in tmp_path, and pin "demo" at v1.0.0 (put a
    build.Component of that name in build.COMPONENTS); returns the log of go's arguments."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (bindir / "go").write_text(FAKE_GO)
    (bindir / "go").chmod(0o755)
    log = tmp_path / "go.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "pins", lambda: {"demo": "v1.0.0"})
    return log


def test_a_component_that_gains_a_binary_builds_only_that_one(
    monkeypatch: pytest.MonkeyPatch, fake_go: Path
) -> None:
    comp = build.Component("demo", "example.com/demo", {"one": "example.com/demo/cmd/one"})
    monkeypatch.setitem(build.COMPONENTS, "demo", comp)
    out = build.build("demo", echo=lambda _: None)
    assert (out / "one").read_text() == "built"
    (out / "one").write_text("kept")  # the earlier build's binary
    grown = build.Component(
        "demo",
        "example.com/demo",
        {"one": "example.com/demo/cmd/one", "two": "example.com/demo/cmd/two"},
    )
    monkeypatch.setitem(build.COMPONENTS, "demo", grown)
    said: list[str] = []
    build.build("demo", echo=said.append)
    assert (out / "one").read_text() == "kept" and (out / "two").read_text() == "built"
    installs = [line for line in fake_go.read_text().splitlines() if line.startswith("install")]
    assert len(installs) == 2 and installs[-1].endswith("example.com/demo/cmd/two@v1.0.0")
    assert said[0].startswith("building demo v1.0.0 (two)")
    assert not out.with_name(out.name + ".partial").exists()


@pytest.mark.usefixtures("fake_go")
def test_the_node_binaries_are_built_only_for_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kwok-only cluster's build leaves the kubelet out; the node's start builds it."""
    comp = build.Component(
        "demo",
        "example.com/demo",
        {"server": "example.com/demo/cmd/server", "agent": "example.com/demo/cmd/agent"},
        node_binaries=frozenset({"agent"}),
    )
    monkeypatch.setitem(build.COMPONENTS, "demo", comp)
    out = build.build("demo", echo=lambda _: None)
    assert (out / "server").exists() and not (out / "agent").exists()
    assert build.is_built("demo") and not build.is_built("demo", node=True)
    build.build("demo", echo=lambda _: None, node=True)
    assert (out / "server").exists() and (out / "agent").exists()
    assert build.is_built("demo", node=True)


def test_the_node_pins_live_with_the_others() -> None:
    pins = build.pins()
    assert pins["coredns"].startswith("v1.")
    kubernetes = build.COMPONENTS["kubernetes"]
    assert {"kubelet", "kube-proxy"} == kubernetes.node_binaries <= set(kubernetes.binaries)
    assert set(build.NODE) <= set(build.COMPONENTS)


def test_a_taken_node_port_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1] - node.NODE_PORT_OFFSETS["kubelet"]
    monkeypatch.setenv("MEGDET_CLUSTER_PORT_BASE", str(base))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", base + node.NODE_PORT_OFFSETS["kubelet"]))
        sock.listen()
        real = node.RealNode(Cluster(root=tmp_path / "c"))
        with pytest.raises(node.NodeError, match=rf"{base + 30} \(kubelet\).*PORT_BASE"):
            real._choose_ports({"ports": {}})


def test_a_port_base_without_room_for_the_node_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEGDET_CLUSTER_PORT_BASE", "65500")
    real = node.RealNode(Cluster(root=tmp_path / "c"))
    with pytest.raises(node.NodeError, match="MEGDET_CLUSTER_PORT_BASE=65500 leaves no room"):
        real._choose_ports({"ports": {}})
