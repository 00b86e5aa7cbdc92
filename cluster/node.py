"""One real node beside the kwok nodes: containerd + runc, the CNI plugins, the kubelet,
kube-proxy and CoreDNS, all on this machine (docs/cluster.md, "The real node").

Pieces and where they come from: the kubelet and kube-proxy are built from the pinned
``k8s.io/kubernetes`` (cluster.build), CoreDNS from its Go module, the pause binary from
that module's ``build/pause/linux/pause.c``; containerd, runc, the CNI plugins and iptables are
Debian's (scripts/install_node_packages.sh). The images the node runs (pause, CoreDNS, a
busybox test image) are assembled here as OCI archives (cluster.oci) and imported into
the node's containerd: nothing is pulled.

Everything lives under ``<cluster>/node/``: containerd's root, state and socket, the kubelet's
root dir, pod logs, the CNI configuration and IPAM state. What is machine-wide and cannot be
put in a folder (iptables rules of kube-proxy, the CNI bridge, the pods' cgroups under
``megdet-node``, the kernel settings the kubelet and the node need) is one node's per machine:
a lock file in /run/megdet says whose, and ``teardown()`` undoes it. It does not start beside
another Kubernetes node (whose kubelet and kube-proxy use the same iptables chain names).

The node is tainted ``megdet.io/real-node=true:NoSchedule`` so the kwok-targeted pods of the
suite never land on it; pods that want it tolerate the taint and select it
(:func:`pod_placement`). It advertises ``nvidia.com/gpu`` and the RDMA resource by patching its
status (the documented way to advertise extended resources), but has no GPU: pods on it run on
the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cluster import build, oci, procs
from cluster.pki import CertificateAuthority, kubeconfig, write_private

if TYPE_CHECKING:
    from cluster.control_plane import Cluster

NODE_NAME = "megdet-node"
#: The taint and label that keep the suite's kwok-targeted pods off the real node.
TAINT_KEY = "megdet.io/real-node"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
NODE_LABEL = TAINT_KEY
#: Extended resources the node advertises (what the charts request); pods still run on CPU.
GPUS = 8
RDMA = "1k"
#: The node's pod network (one bridge; kwok's fake pods use 10.244.0.0/16).
POD_CIDR = "10.245.0.0/24"
BRIDGE = "megdet0"
CNI_NETWORK = "megdet"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
#: The cluster DNS Service (kube-dns, as kubeadm names it) and the pods' domain.
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
DNS_NAMESPACE = "kube-system"
#: Local image names (nothing resolves megdet.local: a pull of a missing tag fails fast).
REGISTRY = "megdet.local"
#: Ports of the node, offsets from the control plane's port base (fixed mode) like PORT_OFFSETS.
NODE_PORT_OFFSETS = {
    "kubelet": 30,
    "kubelet-healthz": 31,
    "kube-proxy-metrics": 32,
    "kube-proxy-healthz": 33,
    "coredns": 34,
    "coredns-health": 35,
    "coredns-ready": 36,
    "coredns-metrics": 37,
}
#: Which real node owns this machine's iptables rules, bridge and kubepods cgroups.
MACHINE_LOCK = Path(os.environ.get("MEGDET_NODE_LOCK", "/run/megdet/real-node.json"))
#: What the kubelet sets on the host kernel at start (pkg/kubelet/cm/container_manager_linux.go,
#: setupKernelTunables, with protectKernelDefaults false) and the node sets itself: saved
#: before, restored by teardown().
SYSCTLS = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: The node's cgroup, the kubelet's cgroupRoot: its pods' cgroups are under
#: <hierarchy>/megdet-node/kubepods, and teardown() kills and removes only what is under it
#: (a kubelet of another Kubernetes has /kubepods, or its own cgroupRoot).
CGROUP_PARENT = "megdet-node"
#: The programs of a Kubernetes node that own host-wide state (a kubelet's port and cgroups,
#: kube-proxy's iptables chains): one of another Kubernetes keeps the real node from starting.
KUBE_NODE_PROGRAMS = ("kubelet", "kube-proxy")
#: The kubelet port every Kubernetes uses (the real node's kubelet listens elsewhere).
KUBELET_PORT = 10250
#: cgroup v1 controllers the kubelet's cgroupfs manager and runc need.
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")
#: Debian package of each command the node runs (scripts/install_node_packages.sh installs them).
COMMANDS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "iptables-save": "iptables",
    "iptables-restore": "iptables",
    "ip": "iproute2",
}
BUSYBOX = Path("/bin/busybox")
#: The kubelet links every container's log here (DefaultContainerLogsDir, pkg/kubelet/kubelet.go).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
#: What host_problems() reads (tests point them elsewhere).
PROC_FILESYSTEMS = Path("/proc/filesystems")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


class NodeError(RuntimeError):
    """The real node cannot start; the message names what is missing."""


class MachineBusy(NodeError):
    """Another cluster's real node runs on this machine (one per machine)."""


# --- images ------------------------------------------------------------------------------------
def images_dir() -> Path:
    return build.cache_dir() / "images"


def pause_image() -> str:
    return f"{REGISTRY}/pause:{build.pause_tag()}"


def coredns_image() -> str:
    return f"{REGISTRY}/coredns:{build.pins()['coredns']}"


def busybox_image() -> str:
    """The test image: Debian's busybox-static (its version is the tag)."""
    return f"{REGISTRY}/busybox:{_busybox_version()}"


def _busybox_version() -> str:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "busybox-static"],
        capture_output=True,
        text=True,
        check=False,
    )
    version = proc.stdout.strip() if proc.returncode == 0 else "local"
    # A tag allows [A-Za-z0-9_.-]: Debian's 1:1.35.0-4+deb12u1+b1 becomes 1.35.0-4-deb12u1-b1.
    version = version.split(":", 1)[-1]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in version)


def build_images(echo: Callable[[str], None] = print) -> dict[str, Path]:
    """The OCI archives the node imports: {image name: archive}; rebuilt when missing."""
    folder = images_dir()
    archives: dict[str, Path] = {}
    # upstream's build/pause/Dockerfile: the binary as /pause, USER 65535:65535.
    pause = oci.Entry("pause", source=build.build_pause(echo=echo), mode=0o755)
    archives[pause_image()] = _binary_image(folder, pause_image(), [pause], "65535:65535")
    # upstream's Dockerfile: the binary as /coredns, a non-root user, CA certificates.
    coredns = oci.Entry("coredns", source=build.binary_path("coredns"), mode=0o755)
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    certs = (
        oci.Entry(str(ca).lstrip("/"), source=ca)
        if ca.exists()
        else oci.Entry("etc/ssl/certs", directory=True, mode=0o755)
    )
    archives[coredns_image()] = _binary_image(
        folder, coredns_image(), [coredns, certs], "65532:65532"
    )
    if BUSYBOX.exists():
        name = busybox_image()
        archives[name] = _archive(folder, name, lambda path: write_busybox_image(path, name))
    return archives


def _binary_image(folder: Path, name: str, entries: list[oci.Entry], user: str) -> Path:
    """An image whose entrypoint is its first entry (a static binary), run as ``user``."""
    return _archive(
        folder,
        name,
        lambda path: oci.write_archive(
            path, name, entries, entrypoint=["/" + entries[0].path], user=user
        ),
    )


def _archive(folder: Path, name: str, write: Callable[[Path], str]) -> Path:
    path = folder / (name.split("/", 1)[1].replace(":", "_").replace("/", "_") + ".tar")
    if not path.exists():
        write(path)
    return path


def write_busybox_image(path: Path, name: str) -> str:
    """An image of Debian's static busybox with a symlink per applet (sh, wget, nslookup, ...)."""
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    entries = [oci.Entry("bin/busybox", source=BUSYBOX, mode=0o755)]
    entries += [oci.Entry(f"bin/{a}", symlink="busybox") for a in applets if a != "busybox"]
    entries += [
        oci.Entry("tmp", directory=True, mode=0o1777),
        oci.Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:\n"),
        oci.Entry("etc/group", data=b"root:x:0:\nnobody:x:65534:\n"),
    ]
    return oci.write_archive(path, name, entries, cmd=["sh"])


# --- placement ---------------------------------------------------------------------------------
def pod_placement() -> dict[str, Any]:
    """The pod-spec fields that put a pod on the real node (merge them into ``spec``)."""
    return {
        "nodeSelector": {NODE_LABEL: "true"},
        "tolerations": [
            {"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
    }


# --- host checks -------------------------------------------------------------------------------
def _mounted_cgroups() -> tuple[set[str], bool]:
    """(cgroup v1 controllers mounted, whether a cgroup v2 hierarchy is at /sys/fs/cgroup)."""
    v1: set[str] = set()
    unified = False
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields = right.split()
            if not fields:
                continue
            mount_point = left.split()[4]
            if fields[0] == "cgroup":
                v1 |= set(fields[-1].split(",")) & set(CGROUP_V1)
            elif fields[0] == "cgroup2" and mount_point == "/sys/fs/cgroup":
                unified = True
    return v1, unified


def host_problems() -> list[str]:
    """What this machine lacks for the real node, one line each (empty: it can start)."""
    problems = []
    if os.geteuid() != 0:
        problems.append(
            "not root: containerd, runc, the CNI plugins and kube-proxy need root (CI runs as root)"
        )
    missing = sorted({pkg for cmd, pkg in COMMANDS.items() if shutil.which(cmd) is None})
    missing_cmds = sorted(cmd for cmd in COMMANDS if shutil.which(cmd) is None)
    plugins = [p for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
    if plugins:
        missing.append("containernetworking-plugins")
        missing_cmds += [str(CNI_BIN_DIR / p) for p in plugins]
    if missing:
        problems.append(
            f"missing {', '.join(missing_cmds)}: install the Debian package(s) "
            f"{', '.join(sorted(set(missing)))} (`scripts/install_node_packages.sh` as root)"
        )
    v1, unified = _mounted_cgroups()
    if unified:
        controllers = set()
        with contextlib.suppress(OSError):
            controllers = set(Path("/sys/fs/cgroup/cgroup.controllers").read_text().split())
        lacking = sorted({"cpu", "memory", "pids"} - controllers)
        if lacking:
            problems.append(f"cgroup v2 lacks the controllers {', '.join(lacking)}")
    elif not v1:
        problems.append("no cgroups mounted under /sys/fs/cgroup (the kubelet and runc need them)")
    else:
        lacking = sorted(set(CGROUP_V1) - v1)
        if lacking:
            problems.append(
                f"cgroup v1 controllers not mounted: {', '.join(lacking)} (under /sys/fs/cgroup)"
            )
    try:
        filesystems = PROC_FILESYSTEMS.read_text().split()
    except OSError:
        filesystems = []
    if "overlay" not in filesystems:
        problems.append(
            "no overlay filesystem in /proc/filesystems (containerd's overlayfs snapshotter; "
            "`modprobe overlay`)"
        )
    if not os.access(IP_FORWARD, os.W_OK):
        problems.append(f"{IP_FORWARD} is not writable (pods' traffic is routed by this host)")
    return problems


def other_kubernetes(root: Path) -> str:
    """What shows that another Kubernetes node runs here ('' when nothing does): a kubelet or
    kube-proxy process whose command line does not name this cluster's folder ``root``, or a
    listener on the kubelet's port 10250 (a kubelet built into another program: k3s, ...)."""
    from cluster.control_plane import port_taken

    found = [procs.describe(pid) for pid in procs.foreign(KUBE_NODE_PROGRAMS, str(root))]
    if port_taken(KUBELET_PORT, "0.0.0.0"):
        found.append(f"a listener on the kubelet port {KUBELET_PORT}")
    return "; ".join(found)


def node_ip() -> str:
    """This machine's address on its default route (what the node advertises)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.254", 9))  # no packet is sent: only a route lookup
            ip = sock.getsockname()[0]
        except OSError:
            ip = ""
    if not ip or ip.startswith("127."):
        raise NodeError(
            "no non-loopback IPv4 address with a route: the node needs one (the API server reaches "
            "the kubelet and pods reach CoreDNS through it)"
        )
    return ip


# --- the node ----------------------------------------------------------------------------------
@dataclasses.dataclass
class RealNode:
    """The real node of ``cluster`` (its processes are the cluster's, in its state.json)."""

    cluster: Cluster
    echo: Callable[[str], None] = print

    @property
    def root(self) -> Path:
        return self.cluster.root / "node"

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    def ports(self) -> dict[str, int]:
        state = self.cluster.state() or {}
        return state.get("node", {}).get("ports", {})

    # --- start ---------------------------------------------------------------------------------
    def start(self, timeout: float = 300) -> None:
        """Start the node and CoreDNS on the running control plane; NodeError says why not."""
        cluster = self.cluster
        state = cluster.state()
        if not state:
            raise NodeError(f"no running cluster in {cluster.root}: start it first")
        problems = host_problems()
        if problems:
            raise NodeError("the real node cannot start on this machine: " + "; ".join(problems))
        # Another cluster's real node first: the e2e fixture waits for that one to go.
        self._check_machine()
        other = other_kubernetes(cluster.root)
        if other:
            raise NodeError(
                f"another Kubernetes node runs on this machine: {other}. Its kubelet and "
                "kube-proxy share the host's iptables chains (KUBE-*, fixed names in every "
                "Kubernetes), cgroups and kernel settings with this one: stop it first, or use "
                "`python -m cluster up --no-real-node` (kwok nodes only)"
            )
        ip = node_ip()
        ports = self._choose_ports(state)
        start = time.monotonic()
        missing = [c for c in ("kubernetes", *build.NODE) if not build.is_built(c, node=True)]
        if missing:
            self.echo(f"building the real node's binaries ({', '.join(missing)}; first use only)")
            build.build_all(missing, echo=self.echo, node=True)
        archives = build_images(echo=self.echo)
        self._claim_machine()
        state["node"] = {"ports": ports, "ip": ip, "sysctls": self._read_sysctls()}
        cluster._save(state)
        try:
            self._write_sysctl("net/ipv4/ip_forward", "1")
            self._make_pki(ip)
            self._start_containerd(state)
            for archive in archives.values():
                import_image(self.socket, archive)
            self._start_kubelet(state, ip, ports, timeout)
            self._advertise_resources()
            self._start_kube_proxy(state, ports)
            self._start_coredns(ports, ip, timeout)
        except BaseException:
            self.echo(f"the real node failed to start; logs: {cluster.logs}")
            self.teardown()
            raise
        self.echo(
            f"real node {NODE_NAME} up in {time.monotonic() - start:.0f} s ({ip}; containerd "
            f"{self._containerd_version()}; pods run on the CPU, {GPUS} nvidia.com/gpu advertised)"
        )

    def _choose_ports(self, state: Mapping[str, Any]) -> dict[str, int]:
        from cluster.control_plane import DEFAULT_PORT_BASE, listen_port, port_taken

        if self.cluster.ports_mode == "auto":
            ports: dict[str, int] = {}
            for name in NODE_PORT_OFFSETS:
                ports[name] = listen_port([*ports.values(), *state["ports"].values()])
            return ports
        base = int(os.environ.get("MEGDET_CLUSTER_PORT_BASE", str(DEFAULT_PORT_BASE)))
        ports = {name: base + off for name, off in NODE_PORT_OFFSETS.items()}
        if max(ports.values()) > 65535:
            raise NodeError(
                f"MEGDET_CLUSTER_PORT_BASE={base} leaves no room for the real node's ports "
                f"(N+{min(NODE_PORT_OFFSETS.values())} to N+{max(NODE_PORT_OFFSETS.values())}); "
                f"pick a base up to {65535 - max(NODE_PORT_OFFSETS.values())}"
            )
        taken = [f"{port} ({name})" for name, port in ports.items() if port_taken(port)]
        if taken:
            raise NodeError(
                f"port(s) {', '.join(taken)} already taken by another process; stop it, or pick "
                "other ports with MEGDET_CLUSTER_PORT_BASE=N"
            )
        return ports

    def _check_machine(self) -> None:
        """MachineBusy when another cluster's real node holds this machine's lock."""
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads(MACHINE_LOCK.read_text())
            if owner["root"] != str(self.cluster.root) and _owner_alive(owner):
                raise MachineBusy(
                    f"another cluster's real node runs on this machine ({owner['root']}); "
                    "one real node per machine (its kube-proxy owns the host's iptables "
                    "rules): stop that cluster (`make cluster-down`, or its e2e session) first"
                )

    def _claim_machine(self) -> None:
        """Take this machine's real-node lock, or say whose node holds it."""
        MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(MACHINE_LOCK.with_suffix(".lock"), "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            self._check_machine()
            MACHINE_LOCK.write_text(
                json.dumps({"root": str(self.cluster.root), "pid": os.getpid()})
            )

    def _release_machine(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(MACHINE_LOCK.read_text())["root"] == str(self.cluster.root):
                MACHINE_LOCK.unlink()

    @staticmethod
    def _read_sysctls() -> dict[str, str]:
        values = {}
        for key in SYSCTLS:
            with contextlib.suppress(OSError):
                values[key] = Path("/proc/sys", key).read_text().strip()
        return values

    @staticmethod
    def _write_sysctl(key: str, value: str) -> None:
        Path("/proc/sys", key).write_text(value + "\n")

    def _make_pki(self, ip: str) -> None:
        pki = self.cluster.pki
        ca = CertificateAuthority(pki)
        server = self.cluster.server
        clients = {
            # The Node authorizer and NodeRestriction know a kubelet by this name and group.
            "kubelet": (f"system:node:{NODE_NAME}", ["system:nodes"]),
            # Bound to system:node-proxier by the API server's default RBAC.
            "kube-proxy": ("system:kube-proxy", []),
            "coredns": ("megdet:coredns", []),
        }
        for name, (cn, orgs) in clients.items():
            crt, key = ca.issue(f"node-{name}", cn, orgs, client=True)
            path = pki / f"node-{name}.kubeconfig"
            write_private(path, kubeconfig(server, ca.cert_path, cn, crt, key))
        ca.issue(
            "node-kubelet-serving",
            f"system:node:{NODE_NAME}",
            ["system:nodes"],
            server=True,
            dns=[NODE_NAME, "localhost"],
            ips=[ip, "127.0.0.1"],
        )

    # --- containerd ----------------------------------------------------------------------------
    def containerd_config(self) -> str:
        """containerd 1.6's config (version 2): its own root, state and socket under the node's
        folder, runc through the v2 shim with cgroupfs, the CNI config of this node only, and the
        local pause image as the sandbox image."""
        folder = self.root / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join(
            [
                "version = 2",
                f'root = "{folder / "root"}"',
                f'state = "{folder / "state"}"',
                "[grpc]",
                f'  address = "{self.socket}"',
                "[ttrpc]",
                '  address = ""',
                "[metrics]",
                '  address = ""',
                f"[{cri}]",
                f'  sandbox_image = "{pause_image()}"',
                # Root here lacks CAP_SYS_RESOURCE: no oom_score_adj below the runtime's own.
                "  restrict_oom_score_adj = true",
                # The pods' network namespaces under the state folder, not /var/run/netns.
                "  netns_mounts_under_state_dir = true",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                # Images go in by import_image, which lets the layers' compressed blobs go once
                # unpacked: the CRI is told so (newer CRIs report an image whose blobs are gone
                # as absent unless this is set).
                "  discard_unpacked_layers = true",
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.containerd.runtimes.runc.options]",
                "  SystemdCgroup = false",
                f'  BinaryName = "{shutil.which("runc")}"',
                f"[{cri}.cni]",
                f'  bin_dir = "{CNI_BIN_DIR}"',
                f'  conf_dir = "{self.root / "cni"}"',
                "",
            ]
        )

    def cni_config(self) -> dict[str, Any]:
        """bridge + host-local (IPAM state in the node's folder) + portmap, and loopback (which
        containerd runs for every sandbox). No ipMasq: nothing outside is reached from pods,
        and kube-proxy masquerades Service traffic itself (masqueradeAll)."""
        return {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _start_containerd(self, state: dict[str, Any]) -> None:
        folder = self.root / "containerd"
        folder.mkdir(parents=True, exist_ok=True)
        cni = self.root / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / f"10-{CNI_NETWORK}.conflist").write_text(json.dumps(self.cni_config(), indent=1))
        config = folder / "config.toml"
        config.write_text(self.containerd_config())
        proc = self.cluster._spawn(
            state, "containerd", [shutil.which("containerd") or "containerd", f"--config={config}"]
        )
        self.cluster._wait(
            "containerd",
            lambda: ctr(self.socket, "version", timeout=5).returncode == 0,
            60,
            proc,
        )

    def _containerd_version(self) -> str:
        out = ctr(self.socket, "version", timeout=5).stdout
        for line in out.splitlines()[::-1]:
            if line.strip().startswith("Version:"):
                return line.split(":", 1)[1].strip()
        return "?"

    # --- kubelet -------------------------------------------------------------------------------
    def kubelet_config(self, ip: str, ports: Mapping[str, int]) -> dict[str, Any]:
        pki = self.cluster.pki
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # v1.36 defaults it to true (pkg/kubelet/apis/config/v1beta1/defaults.go) and then
            # refuses a cgroup v1 host (validation/validation_linux.go); this machine is v1.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_PARENT}",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": ip,
            "port": ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports["kubelet-healthz"],
            "tlsCertFile": str(pki / "node-kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(pki / "node-kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "failSwapOn": False,
            "registerWithTaints": [TAINT],
            "podLogsDir": str(self.root / "pod-logs"),
            "podCIDR": POD_CIDR,
            "maxPods": 110,
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            # A shared build machine: no evictions for a full disk or busy memory, no image GC
            # (the imported images cannot be pulled back).
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "20s",
        }

    def _start_kubelet(
        self, state: dict[str, Any], ip: str, ports: Mapping[str, int], timeout: float
    ) -> None:
        folder = self.root / "kubelet"
        folder.mkdir(parents=True, exist_ok=True)
        (self.root / "pod-logs").mkdir(exist_ok=True)
        make_cgroup_parent()
        config = self.root / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config(ip, ports), sort_keys=False))
        proc = self.cluster._spawn(
            state,
            "kubelet",
            [
                self.cluster.binary("kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.cluster.pki / 'node-kubelet.kubeconfig'}",
                f"--root-dir={folder}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={ip}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=1",
            ],
        )

        def healthy() -> bool:
            url = f"http://127.0.0.1:{ports['kubelet-healthz']}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self.cluster._wait("kubelet", healthy, 90, proc)
        self.cluster._wait("the real node Ready", self._node_ready, timeout, proc, log="kubelet")

    def node(self) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "node", NODE_NAME, "-o", "json", timeout=20).stdout
        return json.loads(out)

    def _node_ready(self) -> bool:
        conditions = self.node()["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _advertise_resources(self) -> None:
        """Extended resources by a status patch (Kubernetes docs, "Advertise Extended Resources
        for a Node"); the kubelet keeps them in capacity and derives allocatable."""
        from cluster.control_plane import RDMA_RESOURCE

        def esc(name: str) -> str:
            return name.replace("~", "~0").replace("/", "~1")

        ops = [
            {"op": "add", "path": f"/status/capacity/{esc(k)}", "value": v}
            for k, v in (("nvidia.com/gpu", str(GPUS)), (RDMA_RESOURCE, RDMA))
        ]
        self.cluster.kubectl(
            "patch", "node", NODE_NAME, "--subresource=status", "--type=json", "-p", json.dumps(ops)
        )

        def advertised() -> bool:
            allocatable = self.node()["status"].get("allocatable", {})
            return allocatable.get("nvidia.com/gpu") == str(GPUS)

        self.cluster._wait("the real node's nvidia.com/gpu", advertised, 60, log="kubelet")

    # --- kube-proxy ----------------------------------------------------------------------------
    def kube_proxy_config(self, ip: str, ports: Mapping[str, int]) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.cluster.pki / "node-kube-proxy.kubeconfig")
            },
            "mode": "iptables",
            "hostnameOverride": NODE_NAME,
            "bindAddress": ip,
            "clusterCIDR": POD_CIDR,
            # NodePorts on the node's own address only (not on every address of the machine).
            "nodePortAddresses": ["primary"],
            "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
            "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
            # Pod -> Service -> pod on the same bridge: the reply must come back through the
            # host to be un-DNATed, so every Service connection is masqueraded.
            # No NodePorts on 127.0.0.1: kube-proxy would set route_localnet on the host for them.
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # The conntrack table and timeouts are the host's; kube-proxy leaves them alone
            # with zeros.
            "conntrack": {
                "maxPerCore": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }

    def _start_kube_proxy(self, state: dict[str, Any], ports: Mapping[str, int]) -> None:
        config = self.root / "kube-proxy-config.yaml"
        ip = state["node"]["ip"]
        config.write_text(yaml.safe_dump(self.kube_proxy_config(ip, ports), sort_keys=False))
        proc = self.cluster._spawn(
            state, "kube-proxy", [self.cluster.binary("kube-proxy"), f"--config={config}", "--v=1"]
        )

        def healthy() -> bool:
            url = f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self.cluster._wait("kube-proxy", healthy, 60, proc)

    # --- CoreDNS -------------------------------------------------------------------------------
    def corefile(self, ports: Mapping[str, int], ip: str) -> str:
        """CoreDNS's configuration. It listens on the node's address only (``bind``: without it
        CoreDNS serves on every interface, plugin/bind/README.md) and answers only the node's
        pods, the node and loopback (``acl``, plugin/acl/README.md): not a resolver for the
        machine's network. Health, readiness and metrics on 127.0.0.1."""
        return f""".:{ports["coredns"]} {{
    bind {ip}
    acl {{
        allow net {POD_CIDR} {ip}/32 127.0.0.0/8
        block
    }}
    errors
    health 127.0.0.1:{ports["coredns-health"]}
    ready 127.0.0.1:{ports["coredns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig /etc/coredns/kubeconfig megdet
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    prometheus 127.0.0.1:{ports["coredns-metrics"]}
    forward . /etc/resolv.conf
    cache 30
    reload
    loadbalance
}}
"""

    def coredns_manifests(self, ports: Mapping[str, int], ip: str) -> list[dict[str, Any]]:
        """CoreDNS as a Deployment on the real node, with the kubernetes plugin, behind the
        kube-dns Service at DNS_SERVICE_IP. It runs on the host network: the API server listens
        on 127.0.0.1 only, which a pod's own network namespace cannot reach; the Service's
        endpoint is then the node's address and the port CoreDNS serves on."""
        labels = {"k8s-app": "kube-dns"}
        meta = {"namespace": DNS_NAMESPACE}
        kubeconfig_text = (self.cluster.pki / "node-coredns.kubeconfig").read_text()
        rules = [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ]
        return [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "megdet:coredns"},
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "megdet:coredns"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "megdet:coredns",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "megdet:coredns",
                    }
                ],
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "coredns-kubeconfig", **meta},
                "stringData": {"kubeconfig": kubeconfig_text},
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "coredns", **meta},
                "data": {"Corefile": self.corefile(ports, ip)},
            },
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "coredns", "labels": labels, **meta},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            **pod_placement(),
                            "hostNetwork": True,
                            "dnsPolicy": "Default",
                            "priorityClassName": "system-cluster-critical",
                            "containers": [
                                {
                                    "name": "coredns",
                                    "image": coredns_image(),
                                    "imagePullPolicy": "Never",
                                    "args": ["-conf", "/etc/coredns/Corefile"],
                                    "ports": [
                                        {"containerPort": ports["coredns"], "protocol": p}
                                        for p in ("UDP", "TCP")
                                    ],
                                    "readinessProbe": {
                                        "httpGet": {
                                            "host": "127.0.0.1",
                                            "path": "/ready",
                                            "port": ports["coredns-ready"],
                                        },
                                        "periodSeconds": 1,
                                    },
                                    "livenessProbe": {
                                        "httpGet": {
                                            "host": "127.0.0.1",
                                            "path": "/health",
                                            "port": ports["coredns-health"],
                                        },
                                        "periodSeconds": 10,
                                    },
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "runAsNonRoot": True,
                                        "capabilities": {"drop": ["ALL"]},
                                    },
                                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                                    "volumeMounts": [
                                        {"name": "config", "mountPath": "/etc/coredns"}
                                    ],
                                }
                            ],
                            "volumes": [
                                {
                                    "name": "config",
                                    "projected": {
                                        "sources": [
                                            {"configMap": {"name": "coredns"}},
                                            {"secret": {"name": "coredns-kubeconfig"}},
                                        ]
                                    },
                                }
                            ],
                        },
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", "labels": labels, **meta},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "selector": labels,
                    "ports": [
                        {
                            "name": f"dns{'-tcp' if p == 'TCP' else ''}",
                            "port": 53,
                            "protocol": p,
                            "targetPort": ports["coredns"],
                        }
                        for p in ("UDP", "TCP")
                    ],
                },
            },
        ]

    def _start_coredns(self, ports: Mapping[str, int], ip: str, timeout: float) -> None:
        self.cluster.apply(self.coredns_manifests(ports, ip))

        def available() -> bool:
            out = self.cluster.kubectl(
                "get", "deployment", "coredns", "-n", DNS_NAMESPACE, "-o", "json", timeout=20
            ).stdout
            return json.loads(out).get("status", {}).get("availableReplicas", 0) >= 1

        self.cluster._wait(
            "CoreDNS (Deployment kube-system/coredns)", available, timeout, log="kubelet"
        )

    # --- stop ----------------------------------------------------------------------------------
    def teardown(self) -> list[str]:
        """Stop the node's processes and containers and undo what it did to the host (mounts,
        cgroups, iptables rules, the bridge, kernel settings); returns what it stopped. Every
        step runs even when an earlier one fails (each failure is reported)."""
        state = self.cluster.state() or {"pids": {}}
        pids = state.get("pids", {})
        stopped: list[str] = []

        def step(what: str, action: Callable[[], Any]) -> None:
            try:
                action()
            except Exception as err:
                self.echo(f"real node teardown: {what} failed: {err}")

        def stop(name: str) -> None:
            if name in pids and self.cluster.stop_component(name, state):
                stopped.append(name)

        step("stopping kube-proxy", lambda: stop("kube-proxy"))
        step("stopping the kubelet", lambda: stop("kubelet"))
        step("killing the pods' processes", lambda: _kill_cgroup_tree(CGROUP_PARENT))
        shims: list[tuple[int, int | None]] = []
        step("finding containerd's shims", lambda: shims.extend(_shims(self.socket)))
        step("stopping containerd", lambda: stop("containerd"))
        for pid, started in shims:
            if procs.start_time(pid) == started:  # still that shim, not a reused PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        step("unmounting", lambda: _unmount_under(self.root))
        step("removing the pods' cgroups", lambda: _remove_cgroup_tree(CGROUP_PARENT))
        step("removing log links", lambda: _remove_links_into(CONTAINER_LOG_LINKS, self.root))
        if "node" in state:
            others = procs.foreign(KUBE_NODE_PROGRAMS, str(self.cluster.root))
            proxy = build.binary_path("kube-proxy")
            if others:
                # The chains' names are upstream's constants, the same in every Kubernetes:
                # removing them now would cut that one's Services off.
                self.echo(
                    "real node teardown: left the KUBE-* iptables chains in place: another "
                    f"Kubernetes runs on this machine ({', '.join(map(procs.describe, others))})"
                    "; once it is gone, `kube-proxy --cleanup` removes them"
                )
            elif proxy.exists():
                cmd = [str(proxy), "--cleanup"]
                step(
                    "kube-proxy --cleanup",
                    lambda: subprocess.run(cmd, capture_output=True, timeout=60),
                )
            if not others:
                step("removing the KUBE-* chains", _remove_kube_chains)
            link = ["ip", "link", "delete", BRIDGE]
            step(
                "deleting the bridge", lambda: subprocess.run(link, capture_output=True, timeout=30)
            )
            for key, value in state["node"].get("sysctls", {}).items():
                step(f"restoring {key}", lambda k=key, v=value: self._write_sysctl(k, v))
            step("releasing the machine lock", self._release_machine)
        state.pop("node", None)
        for name in ("kube-proxy", "kubelet", "containerd"):
            state.get("pids", {}).pop(name, None)
        if self.cluster.state_file.exists():
            self.cluster._save(state)
        return stopped


def _owner_alive(owner: Mapping[str, Any]) -> bool:
    """Whether the cluster that holds the machine lock still runs its node (its kubelet or
    containerd, known by start time and command line: procs.is_ours)."""
    try:
        state = json.loads((Path(owner["root"]) / "state.json").read_text())
    except (OSError, ValueError):
        return False
    records = state.get("procs", {})
    return any(
        procs.is_ours(state["pids"][n], owner["root"], records.get(n))
        for n in ("kubelet", "containerd")
        if n in state["pids"]
    )


def _cgroup_roots() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    roots = [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
    return [*roots, base]


def make_cgroup_parent() -> None:
    """The node's own cgroup (CGROUP_PARENT) in every cgroup hierarchy mounted under
    /sys/fs/cgroup: the kubelet checks that its cgroupRoot exists in each
    (``cgroupV1impl.Validate``, pkg/kubelet/cm/cgroup_v1_manager_linux.go) and puts
    ``kubepods`` under it. In the v1 cpu hierarchy it weighs what the kubelet gives kubepods
    (:func:`node_cpu_shares`)."""
    for root in _cgroup_roots():
        if (root / "cgroup.procs").exists():
            (root / CGROUP_PARENT).mkdir(exist_ok=True)
            # A new v1 cpuset cgroup has no CPUs or memory nodes: none of its tasks could run.
            for name in ("cpuset.cpus", "cpuset.mems"):
                mine = root / CGROUP_PARENT / name
                if mine.exists() and not mine.read_text().strip():
                    mine.write_text((root / name).read_text())
            shares = root / CGROUP_PARENT / "cpu.shares"
            if shares.exists():
                shares.write_text(f"{node_cpu_shares()}\n")


def node_cpu_shares() -> int:
    """The v1 cpu.shares of the node's cgroup: the machine's CPUs, 1024 each, which the
    kubelet gives its kubepods cgroup so that "the default limits for cpu shares" do not
    starve the pods beside the host's processes (createNodeAllocatableCgroups and
    getCgroupConfig, MilliCPUToShares of the capacity: kubernetes
    pkg/kubelet/cm/node_container_manager_linux.go). A kubelet whose cgroupRoot is ``/`` has
    that weight beside the host's processes; under CGROUP_PARENT with the default 1024, the
    node's pods together would weigh as one host thread."""
    return (os.cpu_count() or 1) * 1024


def _kill_cgroup_tree(name: str) -> None:
    """SIGKILL every process in the ``name`` cgroup subtree (the node's pods: CGROUP_PARENT)."""
    for root in _cgroup_roots():
        # os.walk skips what disappears under it (runc removes cgroups as containers die).
        for folder, _, files in os.walk(root / name):
            if "cgroup.procs" not in files:
                continue
            with contextlib.suppress(OSError):
                for pid in (Path(folder) / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)


def _remove_cgroup_tree(name: str, timeout: float = 10) -> None:
    """Remove the ``name`` cgroup subtree, deepest first (a cgroup goes once it is empty)."""
    deadline = time.monotonic() + timeout
    for root in _cgroup_roots():
        for folder, _, _ in os.walk(root / name, topdown=False):
            while True:
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)  # processes killed a moment ago are still leaving


def _remove_kube_chains() -> None:
    """Delete the KUBE-* iptables chains that `kube-proxy --cleanup` leaves: the kubelet's own
    (KUBE-FIREWALL, KUBE-KUBELET-CANARY; pkg/kubelet/kubelet_network_linux.go), and the
    built-in chains' jumps to them."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            proc = subprocess.run(
                [tool, "-t", table, "-S"], capture_output=True, text=True, timeout=30, check=False
            )
            if proc.returncode != 0:
                continue
            lines = proc.stdout.splitlines()
            for line in lines:
                args = shlex.split(line)
                if args[:1] == ["-A"] and not args[1].startswith("KUBE-") and "KUBE-" in line:
                    subprocess.run(
                        [tool, "-t", table, "-D", *args[1:]], capture_output=True, check=False
                    )
            chains = [ln.split()[1] for ln in lines if ln.startswith("-N KUBE-")]
            for flag in ("-F", "-X"):
                for chain in chains:
                    cmd = [tool, "-t", table, flag, chain]
                    subprocess.run(cmd, capture_output=True, check=False)


def _remove_links_into(folder: Path, target: Path) -> None:
    """Delete the symlinks in ``folder`` that point under ``target``."""
    with contextlib.suppress(OSError):
        for link in folder.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(link.readlink()).startswith(str(target)):
                    link.unlink()


def _shims(sock: Path) -> list[tuple[int, int | None]]:
    """The containerd shims of this node's containerd (they outlive it): (PID, start time)."""
    found = []
    for proc in procs.PROC.iterdir():
        if not proc.name.isdigit():
            continue
        argv = procs.command_line(int(proc.name))
        if argv and argv[0].endswith("containerd-shim-runc-v2") and str(sock) in argv:
            found.append((int(proc.name), procs.start_time(int(proc.name))))
    return found


def _unmount_under(folder: Path) -> None:
    """Lazily unmount everything mounted under ``folder`` (snapshots, netns, shm), deepest first."""
    prefix = str(folder.resolve()) + "/"
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


# --- the seam for images built elsewhere -------------------------------------------------------
def ctr(sock: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """containerd's own client against the node's containerd, in the CRI's namespace."""
    return subprocess.run(
        ["ctr", f"--address={sock}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def import_image(
    sock: Path,
    archive: Path,
    base_name: str | None = None,
    timeout: float = 600,
    keep_layers: bool = False,
) -> list[str]:
    """Import an OCI archive (``buildah push oci-archive:``, ``podman save --format
    oci-archive``, or cluster.oci) into the node's containerd, where the kubelet finds it;
    returns the image names it holds. Pods then use them with ``imagePullPolicy: IfNotPresent``
    or ``Never``: nothing is pulled. An archive whose index names only a tag (``ref.name`` "1")
    needs ``base_name`` ("megdet.local/trainer"), as ``ctr images import --base-name``.

    Once unpacked, the layers' compressed blobs are let go (``discard_layers``) unless
    ``keep_layers``: for the training image that is 3.2 GB of the 9.2 GB the node held."""
    names = oci.archive_names(archive)
    if not names:
        raise NodeError(
            f"{archive}: its index.json names no image (io.containerd.image.name or "
            "org.opencontainers.image.ref.name annotation); save it with a full name"
        )
    args = ["images", "import"]
    if base_name:
        args.append(f"--base-name={base_name}")
        names = [n if "/" in n or ":" in n else f"{base_name}:{n}" for n in names]
    proc = ctr(sock, *args, str(archive), timeout=timeout)
    if proc.returncode != 0:
        raise NodeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")
    held = images(sock)
    absent = [n for n in names if n not in held]
    if absent:
        raise NodeError(
            f"{archive} imported, but containerd holds no image named {', '.join(absent)} "
            f"(it holds: {', '.join(held)}); give the archive full names (registry/repo:tag), "
            "or a base_name for bare tags"
        )
    if not keep_layers:
        discard_layers(sock, names)
    return names


#: The labels by which a manifest keeps its layers' blobs from containerd's garbage collector.
LAYER_GC_LABEL = re.compile(r"^containerd\.io/gc\.ref\.content\.l\.\d+$")
#: ... and an index its manifests.
MANIFEST_GC_LABEL = re.compile(r"^containerd\.io/gc\.ref\.content\.m\.\d+$")


def discard_layers(sock: Path, names: Sequence[str]) -> list[str]:
    """Let containerd delete the compressed layer blobs of the images ``names`` now that they
    are unpacked; returns the blobs' digests. Containers start from the unpacked snapshots,
    which the image's config keeps (its ``gc.ref.snapshot`` label); the layer blobs are only
    read to unpack again, which an imported image never needs (nothing to pull from).

    It is what containerd 1.7's ``WithDiscardUnpackedLayers`` import option and the CRI's
    ``discard_unpacked_layers`` pulls do (containerd's ``ChildGCLabelsFilterLayers``: the
    manifest keeps no ``containerd.io/gc.ref.content.l.<n>`` label); 1.6's ``ctr images import``
    (Debian 12's) has no such flag, so the labels are removed after the import, then a
    synchronous garbage collection runs."""
    content = _content_labels(sock)
    listed = ctr(sock, "images", "ls")
    targets = [
        parts[2]
        for parts in (line.split() for line in listed.stdout.splitlines()[1:])
        if len(parts) > 2 and parts[0] in names
    ]
    manifests: list[str] = []
    for digest in targets:
        labels = content.get(digest, {})
        children = [v for k, v in labels.items() if MANIFEST_GC_LABEL.match(k)]
        manifests += children or [digest]
    released: list[str] = []
    for digest in manifests:
        layers = {k: v for k, v in content.get(digest, {}).items() if LAYER_GC_LABEL.match(k)}
        if not layers:
            continue
        proc = ctr(sock, "content", "label", digest, *[f"{key}=" for key in sorted(layers)])
        if proc.returncode != 0:
            raise NodeError(f"ctr content label {digest} failed: {proc.stderr.strip()}")
        released += layers.values()
    if released and names:
        # Deleting an image with --sync waits for a garbage collection: a second name of one
        # of these images, deleted at once, runs one now rather than at containerd's leisure.
        trigger = f"megdet.local/gc:{os.getpid()}"
        for step in (("tag", "--force", names[0], trigger), ("rm", "--sync", trigger)):
            proc = ctr(sock, "images", *step)
            if proc.returncode != 0:
                raise NodeError(
                    f"ctr images {' '.join(step)} (the garbage collection after discarding "
                    f"{names[0]}'s layer blobs) failed: {proc.stderr.strip()}"
                )
    return released


def _content_labels(sock: Path) -> dict[str, dict[str, str]]:
    """Each blob in the node's content store: digest -> its labels (``ctr content ls``)."""
    out = ctr(sock, "content", "ls")
    blobs: dict[str, dict[str, str]] = {}
    for line in out.stdout.splitlines()[1:]:
        parts = line.split()
        if not parts:
            continue
        labels = parts[-1] if "=" in parts[-1] else ""
        blobs[parts[0]] = dict(item.split("=", 1) for item in labels.split(",") if "=" in item)
    return blobs


def images(sock: Path) -> list[str]:
    """The image names the node's containerd holds."""
    return [line for line in ctr(sock, "images", "ls", "-q").stdout.splitlines() if line]


__all__: Sequence[str] = (
    "NODE_NAME",
    "NodeError",
    "RealNode",
    "busybox_image",
    "discard_layers",
    "host_problems",
    "import_image",
    "pod_placement",
)
