"""Pods for real: the kubelet on the real node (cluster.node) runs a locally built image,
CoreDNS resolves Service names, kube-proxy carries a Service's traffic to another pod, `kubectl
logs` shows what a container printed, and a missing image shows the kubelet's own reason."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, get_json

from cluster import node as real_node_module
from cluster import oci
from cluster.node import NODE_NAME, busybox_image, pod_placement


@pytest.fixture
def namespace(kube):
    name = f"real-node-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, namespace: str, command: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            **pod_placement(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": busybox_image(),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", command],
                    **spec.pop("container", {}),
                }
            ],
            **spec,
        },
    }


def phase(kube, namespace: str, name: str) -> str:
    return get_json(kube, "pod", name, "-n", namespace)["status"].get("phase", "")


def test_the_real_node_is_tainted_and_advertises_the_charts_resources(
    kube, real_node, namespace
) -> None:
    status = real_node.node()
    assert real_node_module.TAINT in status["spec"]["taints"]
    assert status["status"]["allocatable"]["nvidia.com/gpu"] == str(real_node_module.GPUS)
    assert status["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    # A pod that does not tolerate the taint goes to a kwok node, as the rest of the suite's do.
    plain = pod("plain", namespace, "true")
    del plain["spec"]["tolerations"], plain["spec"]["nodeSelector"]
    kube.apply([plain])
    node_name = eventually(
        lambda: get_json(kube, "pod", "plain", "-n", namespace)["spec"].get("nodeName"),
        timeout=60,
        message="the plain pod scheduled",
    )
    assert node_name != NODE_NAME and node_name.startswith("gpu-node-")


def test_a_pod_resolves_a_service_and_reaches_another_pod_through_it(
    kube, real_node, namespace
) -> None:
    server = pod(
        "web",
        namespace,
        "mkdir -p /tmp/www && echo megdet-real-node-ok > /tmp/www/index.html "
        "&& exec httpd -f -p 8080 -h /tmp/www",
        container={
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        },
    )
    server["spec"]["restartPolicy"] = "Always"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    kube.apply([server, service])
    eventually(
        lambda: get_json(kube, "pod", "web", "-n", namespace)["status"]
        .get("containerStatuses", [{}])[0]
        .get("ready"),
        timeout=180,
        message="the web pod ready on the real node",
    )
    cluster_ip = get_json(kube, "service", "web", "-n", namespace)["spec"]["clusterIP"]
    fqdn = f"web.{namespace}.svc.cluster.local"
    # The client asks for a GPU: the node advertises them, the pod runs on its CPU.
    client = pod(
        "client",
        namespace,
        # (busybox 1.35's `wget -T` crashes in Debian's static build: the timeout applet instead)
        f"nslookup {fqdn} && timeout 20 wget -q -O - http://web/ "
        f"&& timeout 20 wget -q -O - http://{fqdn}/ && echo client-done",
        container={"resources": {"limits": {"nvidia.com/gpu": "1"}}},
    )
    kube.apply([client])
    eventually(
        lambda: phase(kube, namespace, "client") in ("Succeeded", "Failed"),
        timeout=180,
        message="the client pod finished",
    )
    logs = kube.kubectl("logs", "client", "-n", namespace).stdout
    status = get_json(kube, "pod", "client", "-n", namespace)
    assert status["status"]["phase"] == "Succeeded", (logs, json.dumps(status["status"]))
    assert status["spec"]["nodeName"] == NODE_NAME
    assert cluster_ip in logs  # CoreDNS answered with the Service's IP
    assert logs.count("megdet-real-node-ok") == 2  # by the short name and the full one
    assert logs.strip().endswith("client-done")


def test_a_bad_image_tag_shows_the_kubelets_reason(kube, real_node, namespace) -> None:
    bad = pod("bad-image", namespace, "true")
    bad["spec"]["containers"][0]["image"] = busybox_image().rsplit(":", 1)[0] + ":no-such-tag"
    kube.apply([bad])

    def waiting_reason() -> str | None:
        statuses = get_json(kube, "pod", "bad-image", "-n", namespace)["status"].get(
            "containerStatuses", []
        )
        reason = statuses[0].get("state", {}).get("waiting", {}).get("reason") if statuses else None
        return reason if reason in ("ErrImagePull", "ImagePullBackOff") else None

    reason = eventually(waiting_reason, timeout=120, message="ErrImagePull or ImagePullBackOff")
    assert reason in ("ErrImagePull", "ImagePullBackOff")
    assert phase(kube, namespace, "bad-image") == "Pending"


def test_an_image_built_elsewhere_is_imported_and_runs(
    kube, real_node, namespace, tmp_path
) -> None:
    """The seam for `make image`'s archives: an OCI archive whose index names only a tag (as
    some tools write it) goes into the node's containerd with a base name, and a pod runs it
    with imagePullPolicy Never."""
    archive = tmp_path / "hello.tar"
    oci.write_archive(
        archive,
        "megdet.local/ignored:0",
        [
            oci.Entry("bin/busybox", source=real_node_module.BUSYBOX, mode=0o755),
            oci.Entry("bin/sh", symlink="busybox"),
            oci.Entry("hello.sh", data=b"echo hello-from-an-imported-image\n", mode=0o755),
        ],
        entrypoint=["/bin/sh", "/hello.sh"],
    )
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar]
    bare = tmp_path / "bare.tar"
    with tarfile.open(bare, "w") as tar:
        for member, data in members:
            if member.name == "index.json":
                index = json.loads(data)
                index["manifests"][0]["annotations"] = {"org.opencontainers.image.ref.name": "7"}
                data = json.dumps(index).encode()
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    names = real_node_module.import_image(real_node.socket, bare, base_name="megdet.local/hello")
    assert names == ["megdet.local/hello:7"]
    # Unpacked, its layer blob is let go (what the training image's 3.2 GB were); the pod below
    # runs from the snapshot that the image's config keeps.
    manifest = json.loads(next(d for m, d in members if m.name == f"blobs/{_blob(index)}"))
    layers = [layer["digest"] for layer in manifest["layers"]]
    held = real_node_module._content_labels(real_node.socket)
    assert layers and not [d for d in layers if d in held], (layers, sorted(held))
    assert manifest["config"]["digest"] in held
    hello = pod("hello", namespace, "unused")
    container = hello["spec"]["containers"][0]
    container.update(image="megdet.local/hello:7", imagePullPolicy="Never")
    del container["command"]
    kube.apply([hello])
    eventually(
        lambda: phase(kube, namespace, "hello") == "Succeeded", timeout=120, message="hello ran"
    )
    logs = kube.kubectl("logs", "hello", "-n", namespace).stdout
    assert logs.strip() == "hello-from-an-imported-image"


def test_stopping_the_node_leaves_the_host_as_it_found_it(kube, real_node) -> None:
    """What teardown() (make cluster-down) undoes; the node is started again afterwards for
    any later test of the session."""
    saved = kube.state()["node"]["sysctls"]
    sock = real_node.socket
    # The pods' cgroups are under the node's own parent (the kubelet's cgroupRoot), none
    # under the machine-wide /kubepods another kubelet would use.
    parent = real_node_module.CGROUP_PARENT
    roots = real_node_module._cgroup_roots()
    assert any((root / parent / "kubepods").is_dir() for root in roots)
    assert not [root for root in roots if (root / "kubepods").exists()]
    # The parent weighs what the kubelet gave kubepods under it (the machine's CPUs), not the
    # default 1024 shares of one host thread.
    weights = {
        (folder / "cpu.shares").read_text().strip()
        for root in roots
        for folder in (root / parent, root / parent / "kubepods")
        if (folder / "cpu.shares").exists()
    }
    assert weights == {str(real_node_module.node_cpu_shares())}, weights
    try:
        stopped = real_node.teardown()
        assert {"kube-proxy", "kubelet", "containerd"} <= set(stopped)
        assert real_node_module._shims(sock) == []
        mounts = Path("/proc/self/mountinfo").read_text()
        assert str(real_node.root) not in mounts
        leftover = [str(root) for root in roots if (root / parent).exists()]
        assert leftover == []
        for table in ("filter", "nat", "mangle"):
            rules = subprocess.run(
                ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True
            ).stdout
            assert "KUBE-" not in rules, (table, rules)
        link = subprocess.run(["ip", "link", "show", real_node_module.BRIDGE], capture_output=True)
        assert link.returncode != 0
        for key, value in saved.items():
            assert Path("/proc/sys", key).read_text().strip() == value, key
        assert not real_node_module.MACHINE_LOCK.exists()
        assert "node" not in kube.state()
    finally:
        kube.start_real_node(timeout=600)


def _blob(index: dict) -> str:
    """The path under blobs/ of an OCI index's (only) manifest."""
    algo, _, hexd = index["manifests"][0]["digest"].partition(":")
    return f"{algo}/{hexd}"
