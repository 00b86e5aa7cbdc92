"""Start and stop a real Kubernetes control plane on this machine, from the binaries that
``cluster.build`` made.

``make cluster`` and the e2e tests' fixture both use :class:`Cluster`: etcd, kube-apiserver
(the project's own TLS certificates and ServiceAccount keys, RBAC, the default admission
plugins including Pod Security, plus NodeRestriction), kube-controller-manager (garbage
collection, ServiceAccounts, Jobs, ...), kube-scheduler, kwok (fake nodes with 8
``nvidia.com/gpu`` and an RDMA resource each, pods that "run" until told otherwise) and the
Kubeflow training operator with its validating webhook served with the project's certificates.

Everything a cluster writes lives in one state folder (``.cluster/`` for ``make cluster``): the
PKI, etcd's data, the kubeconfigs, one log per component (``logs/<component>.log``) and
``state.json`` (the processes and ports). ``down()`` stops every process it started and deletes
the folder (the e2e fixture keeps the logs).

Why not ``kwokctl create cluster --runtime binary``: it makes its own certificates and
component flags, while the operators' webhooks must be served with certificates from the same
CA that the API server trusts, the admission plugins and authorization mode must be the ones a
production cluster runs, and the e2e fixture and ``make cluster`` must be one code path that the
tests can inspect. kwok itself (the node and pod simulator) is used as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cluster import build, procs
from cluster.operators import Operators
from cluster.pki import (
    CertificateAuthority,
    kubeconfig,
    private_dir,
    service_account_keys,
    write_private,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE = ROOT / ".cluster"

#: Ports of `make cluster`, offsets from MEGDET_CLUSTER_PORT_BASE (default below).
PORT_OFFSETS = {
    "etcd": 0,
    "etcd-peer": 1,
    "kube-apiserver": 2,
    "kube-controller-manager": 3,
    "kube-scheduler": 4,
    "kwok": 5,
    "training-operator-webhook": 6,
    "training-operator-metrics": 7,
    "training-operator-probe": 8,
    "jobset-webhook": 9,
    "jobset-metrics": 10,
    "jobset-probe": 11,
    "trainer-webhook": 12,
    "trainer-metrics": 13,
    "trainer-probe": 14,
    "kueue-webhook": 15,
    "kueue-metrics": 16,
    "kueue-probe": 17,
    "trainer-status": 18,
}
DEFAULT_PORT_BASE = 26440

#: Start order; down() stops them in reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "training-operator",
    "jobset",
    "trainer",
    "kueue",
)

#: The extended resource the fake nodes advertise for InfiniBand (the 16-GPU IB example's).
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
GPUS_PER_NODE = 8
#: kwok manages only nodes carrying this annotation.
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
#: The `kubernetes` Service's ClusterIP (the first address of SERVICE_CIDR).
KUBERNETES_SERVICE_IP = "10.96.0.1"
#: kwok's upstream stages (kustomize/stage in its module) that the cluster loads.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
)


#: The subject of the cluster's etcd CA (apart from the main CA: kubeadm's etcd/ca).
ETCD_CA_NAME = "megdet-etcd-ca"


class ClusterError(RuntimeError):
    """Something stopped the cluster from starting; the message names the fix."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The ports ``ports_mode="auto"`` draws from (:func:`listen_port`): from AUTO_PORT_LOW up to
#: the ephemeral range and below the API server's default NodePort range (30000-32767).
AUTO_PORT_LOW, AUTO_PORT_END = 10000, 30000


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range, which connect() takes ports from."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def listen_port(avoid: Iterable[int] = (), address: str = "127.0.0.1") -> int:
    """A port free now for a component that listens on it later (Kueue's, minutes after the
    cluster starts): drawn below the ephemeral range, so that no outgoing connection takes it in
    the meantime, as one did with a port the kernel handed out (``bind: address already in
    use`` when Kueue started); where that range leaves no room, one the kernel hands out."""
    avoid, high = set(avoid), min(ephemeral_low(), AUTO_PORT_END)
    if high - AUTO_PORT_LOW < 1000:
        return free_port()
    for _ in range(1000):
        port = random.randrange(AUTO_PORT_LOW, high)
        if port not in avoid and not port_taken(port) and not port_taken(port, address):
            return port
    raise ClusterError(f"no free port from {AUTO_PORT_LOW} to {high - 1} in 1,000 tries")


def port_taken(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return True
    return False


def api_address() -> str:
    """The address the API server binds and advertises: ``MEGDET_CLUSTER_ADDRESS``, else this
    machine's address on its default route (as a kubeadm node's API server advertises its node
    IP), else 127.0.0.1. Not loopback where it can be helped: the `kubernetes` Service's endpoint
    is the advertised address, and a loopback endpoint is refused by the API server and would be
    the pod's own loopback in its network namespace (the real node's pods reach the API server
    through that Service: the controller's pod, the trainer's progress token)."""
    chosen = os.environ.get("MEGDET_CLUSTER_ADDRESS", "")
    if chosen:
        try:
            ip = ipaddress.IPv4Address(chosen)
        except ValueError:
            raise ClusterError(
                f"MEGDET_CLUSTER_ADDRESS={chosen!r} must be an IPv4 address of this machine"
            ) from None
        return str(ip)
    from cluster.node import NodeError, node_ip

    try:
        return node_ip()
    except NodeError:
        return "127.0.0.1"


def stop_process_group(
    pid: int, grace: float = 15, owned: Callable[[], bool] = lambda: True
) -> bool:
    """SIGTERM ``pid``'s process group, SIGKILL it after ``grace`` seconds; reap it if it is our
    child. ``owned`` is asked before each signal (whether ``pid`` is still the process meant:
    procs.is_ours). Returns whether it was running and signalled."""
    if not procs.alive(pid) or not owned():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.alive(pid) and owned():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return True


@dataclasses.dataclass
class Cluster(Operators):
    """One control plane whose state lives in ``root``."""

    root: Path = DEFAULT_STATE
    #: "fixed": MEGDET_CLUSTER_PORT_BASE + offsets (make cluster); "auto": free ports (tests)
    ports_mode: str = "fixed"
    nodes: int = 4
    training_operator: bool = True
    #: Also JobSet and Kubeflow Trainer v2 (target: trainjob); off for `make cluster`.
    trainer_v2: bool = False
    #: Also Kueue with its TrainJob integration (starts JobSet and Trainer v2 too).
    kueue: bool = False
    #: Only etcd and the API server (no controllers, nodes or operators): the older-server check.
    api_only: bool = False
    #: Which built kube-apiserver to run (build.COMPONENTS names the binaries).
    apiserver: str = "kube-apiserver"
    #: Also one real node (cluster.node: kubelet, containerd, kube-proxy, CoreDNS);
    #: `make cluster` starts it, the e2e suite only where a test asks (the real_node fixture).
    real_node: bool = False
    echo: Callable[[str], None] = print

    # --- paths -------------------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    @property
    def ports(self) -> dict[str, int]:
        state = self.state()
        if not state:
            raise ClusterError(f"no cluster in {self.root}: run `make cluster` first")
        return state["ports"]

    @property
    def address(self) -> str:
        """Where the API server listens and what it advertises (``api_address()``)."""
        state = self.state()
        if not state:
            raise ClusterError(f"no cluster in {self.root}: run `make cluster` first")
        return state.get("address", "127.0.0.1")

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.ports['kube-apiserver']}"

    # --- tools -------------------------------------------------------------------------------
    @staticmethod
    def binary(name: str) -> str:
        return str(build.binary_path(name))

    def env(self) -> dict[str, str]:
        """The environment for kubectl and helm against this cluster."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        helm_home = self.root / "helm"
        env.update(
            HELM_CACHE_HOME=str(helm_home / "cache"),
            HELM_CONFIG_HOME=str(helm_home / "config"),
            HELM_DATA_HOME=str(helm_home / "data"),
            # kubectl's and helm's discovery and HTTP caches, which default to ~/.kube/cache, one
            # folder per API server address: each cluster on a new port left one behind there
            # (201 MB after a day of test runs). Here they go with the cluster's state.
            KUBECACHEDIR=str(self.root / "kube-cache"),
        )
        return env

    def tool(
        self,
        binary: str,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run a pinned client (kubectl, helm) against this cluster, from the repository root."""
        env = self.env()
        if kubeconfig:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run(
            [self.binary(binary), *args],
            input=input,
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"{binary} {' '.join(args)} failed: {proc.stdout.strip()}\n{proc.stderr.strip()}"
            )
        return proc

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.tool("kubectl", *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.tool("helm", *args, **kwargs)

    def apply(self, objects: Iterable[Mapping[str, Any]] | str, server_side: bool = False) -> None:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(list(objects))
        args = ["apply", "-f", "-"] + (
            ["--server-side", "--force-conflicts"] if server_side else []
        )
        self.kubectl(*args, input=text)

    # --- lifecycle ---------------------------------------------------------------------------
    def owns(self, name: str, state: Mapping[str, Any]) -> bool:
        """Whether the process state.json holds for component ``name`` is still the one this
        cluster started (procs.is_ours: its start time, and its command line naming root)."""
        record = state.get("procs", {}).get(name)
        return procs.is_ours(state["pids"][name], str(self.root), record)

    def running(self, name: str, state: Mapping[str, Any]) -> bool:
        return name in state["pids"] and procs.alive(state["pids"][name]) and self.owns(name, state)

    def stop_component(self, name: str, state: Mapping[str, Any], grace: float = 15) -> bool:
        """Stop component ``name``'s process group if its process is still this cluster's;
        a PID that now names another process is left alone (and said so)."""
        pid = state["pids"][name]
        if procs.alive(pid) and not self.owns(name, state):
            self.echo(
                f"not stopping {name}: {procs.describe(pid)} is not the process this cluster "
                f"started (another start time, or a command line that does not name {self.root})"
            )
            return False
        return stop_process_group(pid, grace, lambda: self.owns(name, state))

    def is_up(self) -> bool:
        state = self.state()
        return (
            bool(state)
            and all(self.running(n, state) for n in state["pids"])
            and self._ready("/readyz")
        )

    def up(self, timeout: float = 180) -> None:
        """Start the cluster; a no-op when it is already up."""
        state = self.state()
        if state:
            dead = [n for n in state["pids"] if not self.running(n, state)]
            if not dead and self._ready("/readyz"):
                self.echo(f"cluster already up (kubeconfig: {self.kubeconfig})")
                if self.real_node:
                    self.start_real_node(timeout, required=False)
                return
            raise ClusterError(
                f"a half-started cluster from an earlier run is in {self.root} "
                f"(not running: {', '.join(dead) or 'the API server does not answer'}); run "
                "`make cluster-down` to stop what is left and delete it, then `make cluster`"
            )
        if self.root.exists() and any(self.root.iterdir()):
            raise ClusterError(
                f"{self.root} holds files of an earlier cluster but no state.json; run "
                "`make cluster-down` to delete it, then `make cluster`"
            )
        address = api_address()
        ports = self._choose_ports(address)  # before a long first build: a taken port fails at once
        needed = [c for c in build.CORE if self.training_operator or c != "training_operator"]
        needed += self._extra_components()
        if self.api_only:
            needed = ["etcd", build.component_of(self.apiserver), "kubernetes"]
        missing = [c for c in needed if not build.is_built(c)]
        if missing:
            self.echo(
                "building the control plane from the Go module proxy (first run on this machine "
                "only; about 12 min measured on 2 cores)"
            )
            build.build_all(missing, echo=self.echo)
        # Only its owner (root, for the real node) may open what the cluster writes: keys,
        # kubeconfigs, etcd's data, the audit log, containerd's socket.
        private_dir(self.root)
        self.logs.mkdir(exist_ok=True)
        state = {
            "ports": ports,
            "address": address,
            "pids": {},
            "started": time.time(),
            "versions": build.pins(),
            "nodes": self.nodes,
        }
        self._save(state)
        start = time.monotonic()
        try:
            self._make_pki(ports, address)
            self._start_etcd(state)
            self._start_apiserver(state, timeout)
            if self.api_only:
                self.echo(f"API server up: {self.server}")
                return
            self._start_controllers(state)
            self._start_kwok(state)
            self._create_nodes(timeout)
            if self.training_operator:
                self._start_training_operator(state, timeout)
            for name in self._extra_components():
                self._extra_starters()[name](state, timeout)
            self._wait_default_service_account(timeout)
        except BaseException:
            self.echo(f"cluster failed to start; component logs: {self.logs}")
            raise
        real = self.real_node and self.start_real_node(timeout, required=False)
        self.echo(
            f"cluster up in {time.monotonic() - start:.0f} s: {self.server}, {self.nodes} nodes "
            f"x {GPUS_PER_NODE} GPUs{' and the real node megdet-node' if real else ''}; "
            f"export KUBECONFIG={self.kubeconfig}"
        )

    def down(self, keep_logs: Path | None = None) -> list[str]:
        """Stop every process this cluster started and delete its state; returns what stopped.

        ``keep_logs``: copy the component logs there first.
        """
        state = self.state() or {"pids": {}}
        stopped = []
        if "node" in state or "containerd" in state["pids"]:
            from cluster.node import RealNode

            stopped += RealNode(self, echo=self.echo).teardown()
        # One at a time, in reverse start order: the API server stops in about a second while
        # etcd is still there, but waits out its whole grace period once etcd is gone first.
        for name in reversed(list(state["pids"])):
            if self.stop_component(name, state):
                stopped.append(name)
        if keep_logs and self.logs.exists():
            shutil.rmtree(keep_logs, ignore_errors=True)
            shutil.copytree(self.logs, keep_logs)
        shutil.rmtree(self.root, ignore_errors=True)
        return stopped

    # --- internals ---------------------------------------------------------------------------
    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    def _choose_ports(self, address: str = "127.0.0.1") -> dict[str, int]:
        if self.ports_mode == "auto":
            ports: dict[str, int] = {}
            for name in PORT_OFFSETS:
                where = address if name == "kube-apiserver" else "127.0.0.1"
                ports[name] = listen_port(ports.values(), where)
            return ports
        raw = os.environ.get("MEGDET_CLUSTER_PORT_BASE", str(DEFAULT_PORT_BASE))
        try:
            base = int(raw)
            if not 1024 <= base <= 65535 - len(PORT_OFFSETS):
                raise ValueError
        except ValueError:
            raise ClusterError(
                f"MEGDET_CLUSTER_PORT_BASE={raw!r} must be a whole number from 1024 to "
                f"{65535 - len(PORT_OFFSETS)}"
            ) from None
        ports = {name: base + off for name, off in PORT_OFFSETS.items()}
        taken = [
            f"{port} ({name})"
            for name, port in ports.items()
            if port_taken(port) or (name == "kube-apiserver" and port_taken(port, address))
        ]
        if taken:
            raise ClusterError(
                f"port(s) {', '.join(taken)} already taken on 127.0.0.1 by another process; "
                f"stop it, or pick other ports with MEGDET_CLUSTER_PORT_BASE=N (the cluster uses "
                f"N to N+{len(PORT_OFFSETS) - 1}); if it is an earlier cluster, `make cluster-down`"
            )
        return ports

    def _make_pki(self, ports: Mapping[str, int], address: str = "127.0.0.1") -> None:
        ca = CertificateAuthority(self.pki)
        ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ips=sorted({"127.0.0.1", address, KUBERNETES_SERVICE_IP}),
        )
        clients = {
            "admin": ("megdet-admin", ["system:masters"]),
            "controller-manager": ("system:kube-controller-manager", []),
            "scheduler": ("system:kube-scheduler", []),
            # kwok plays every node's kubelet; NodeRestriction would limit a system:node:<name>
            # identity to one node, so it runs as an administrator (as kwokctl does).
            "kwok": ("kwok-controller", ["system:masters"]),
            # The operators run on the host with the admin's rights; only the project's own
            # controller is run under its chart's ServiceAccount (the e2e RBAC test).
            "operators": ("kubeflow-operators", ["system:masters"]),
        }
        server = f"https://{address}:{ports['kube-apiserver']}"
        for name, (cn, orgs) in clients.items():
            crt, key = ca.issue(name, cn, orgs, client=True)
            path = self.kubeconfig if name == "admin" else self.pki / f"{name}.kubeconfig"
            write_private(path, kubeconfig(server, ca.cert_path, cn, crt, key))
        # Serving certificates of the controller-manager and scheduler (their /healthz), and the
        # aggregation layer's front-proxy client (kubeadm's set; without it both log errors
        # about a missing requestheader CA all the time).
        for name in ("controller-manager-serving", "scheduler-serving"):
            ca.issue(name, name, server=True, dns=["localhost"], ips=["127.0.0.1"])
        ca.issue("front-proxy-client", "front-proxy-client", client=True)
        # The API server's identity towards kubelets (logs, exec, port-forward): the real node's
        # kubelet authenticates it by this CA and authorizes it through the API server.
        ca.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            ["system:masters"],
            client=True,
        )
        service_account_keys(self.pki)
        self._make_etcd_pki()

    @property
    def etcd_pki(self) -> Path:
        return self.pki / "etcd"

    def _make_etcd_pki(self) -> None:
        """etcd's own CA (kubeadm's layout: a certificate of the cluster CA, the admin's or a
        kubelet's, must not open etcd), its serving and peer certificates (server and client
        use, as kubeadm issues them: etcd's gateway dials its own listener with them) and the
        API server's client certificate, the one client etcd accepts."""
        ca = CertificateAuthority(self.etcd_pki, cn=ETCD_CA_NAME)
        for name in ("server", "peer"):
            ca.issue(
                name, f"etcd-{name}", dns=["localhost"], ips=["127.0.0.1"], server=True, client=True
            )
        ca.issue("apiserver-etcd-client", "kube-apiserver-etcd-client", client=True)

    def _spawn(
        self,
        state: dict[str, Any],
        name: str,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            list(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, **(env or {})),
            cwd=cwd or self.root,
        )
        log.close()
        state["pids"][name] = proc.pid
        state.setdefault("procs", {})[name] = procs.identity(proc.pid)
        self._save(state)
        return proc

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        timeout: float,
        proc: subprocess.Popen | None = None,
        log: str | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = self._tail(log or what)
                raise ClusterError(f"{what} exited with {proc.returncode}; last log lines:\n{tail}")
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.25)
        raise ClusterError(
            f"{what} not ready after {timeout:.0f} s; log: "
            f"{self.logs / ((log or what) + '.log')}\n{self._tail(log or what)}"
        )

    def _tail(self, name: str, lines: int = 15) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def etcd_args(self, ports: Mapping[str, int]) -> list[str]:
        """etcd's command line: TLS with client-certificate authentication on its client and
        peer listeners, both on 127.0.0.1 (kubeadm's etcd flags): a local user without the
        API server's etcd client key can neither read nor write the cluster's objects."""
        pki = self.etcd_pki
        client = f"https://127.0.0.1:{ports['etcd']}"
        peer = f"https://127.0.0.1:{ports['etcd-peer']}"
        return [
            self.binary("etcd"),
            "--name=megdet",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--cert-file={pki / 'server.crt'}",
            f"--key-file={pki / 'server.key'}",
            f"--trusted-ca-file={pki / 'ca.crt'}",
            "--client-cert-auth=true",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=megdet={peer}",
            f"--peer-cert-file={pki / 'peer.crt'}",
            f"--peer-key-file={pki / 'peer.key'}",
            f"--peer-trusted-ca-file={pki / 'ca.crt'}",
            "--peer-client-cert-auth=true",
            "--listen-metrics-urls=",
            # A throwaway cluster: no fsync (etcd's own test setting), a small backend quota.
            "--unsafe-no-fsync",
            "--quota-backend-bytes=2147483648",
            "--log-level=warn",
        ]

    def _etcd_ssl(self) -> ssl.SSLContext:
        """The API server's view of etcd: its CA, and the one client certificate it accepts."""
        ctx = ssl.create_default_context(cafile=str(self.etcd_pki / "ca.crt"))
        ctx.load_cert_chain(
            self.etcd_pki / "apiserver-etcd-client.crt", self.etcd_pki / "apiserver-etcd-client.key"
        )
        return ctx

    def _start_etcd(self, state: dict[str, Any]) -> None:
        ports = state["ports"]
        proc = self._spawn(state, "etcd", self.etcd_args(ports))

        def healthy() -> bool:
            url = f"https://127.0.0.1:{ports['etcd']}/health"
            with urllib.request.urlopen(url, timeout=2, context=self._etcd_ssl()) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self._wait("etcd", healthy, 60, proc)

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return ctx

    def _ready(self, path: str, port_name: str = "kube-apiserver") -> bool:
        try:
            port = self.ports[port_name]
            host = self.address if port_name == "kube-apiserver" else "127.0.0.1"
            with urllib.request.urlopen(
                f"https://{host}:{port}{path}", timeout=3, context=self._ssl()
            ) as resp:
                return resp.status == 200
        except (OSError, ClusterError, urllib.error.URLError, ssl.SSLError):
            return False

    def _start_apiserver(self, state: dict[str, Any], timeout: float) -> None:
        ports, pki = state["ports"], self.pki
        proc = self._spawn(
            state,
            "kube-apiserver",
            [
                self.binary(self.apiserver),
                f"--etcd-servers=https://127.0.0.1:{ports['etcd']}",
                f"--etcd-cafile={self.etcd_pki / 'ca.crt'}",
                f"--etcd-certfile={self.etcd_pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={self.etcd_pki / 'apiserver-etcd-client.key'}",
                # The node's address (api_address()): what the real node's pods reach through
                # the `kubernetes` Service, whose endpoint is the advertised address.
                f"--bind-address={state['address']}",
                f"--advertise-address={state['address']}",
                f"--secure-port={ports['kube-apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # The defaults (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity,
                # Priority, DefaultTolerationSeconds, ResourceQuota, the admission webhooks and
                # policies, ...) plus what kubeadm adds.
                "--enable-admission-plugins=NodeRestriction",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The issuer is this API server's own URL, so its OIDC discovery document
                # (/.well-known/openid-configuration, /openid/v1/jwks) is reachable from the
                # host: Trainer v2's status server discovers the issuer from a token's `iss`
                # and fetches both to verify the pods' tokens (see _start_trainer).
                f"--service-account-issuer={self.issuer()}",
                f"--service-account-jwks-uri={self.issuer()}/openid/v1/jwks",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={pki / 'apiserver-generated'}",
                f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                # The real node's name resolves nowhere; its InternalIP is where its kubelet is.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # Every request of the users the tests care about (the controller's
                # ServiceAccount, the admin, helm) with its response code: logs/audit.log.
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.logs / 'audit.log'}",
                "--audit-log-format=json",
            ],
        )
        self._wait("kube-apiserver", lambda: self._ready("/readyz"), timeout, proc)

    def issuer(self) -> str:
        """The ServiceAccount token issuer (the `iss` of every token this cluster signs)."""
        return self.server

    def _audit_policy(self) -> Path:
        """Metadata-level audit of every request except the components' own chatter (and a
        MegDetRun's status writes at Request level, with their body)."""
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {
                    "level": "None",
                    "users": [
                        "kwok-controller",
                        "system:kube-scheduler",
                        "system:kube-controller-manager",
                        "system:apiserver",
                        "kubeflow-operators",
                    ],
                },
                {"level": "None", "userGroups": ["system:nodes"]},
                {
                    "level": "None",
                    "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
                },
                {
                    "level": "None",
                    "nonResourceURLs": [
                        "/healthz*",
                        "/readyz*",
                        "/livez*",
                        "/version",
                        "/openapi*",
                    ],
                },
                # A run's status writes with their body: the tests read what each write set
                # (and that none carries a resourceVersion precondition).
                {
                    "level": "Request",
                    "verbs": ["patch", "update"],
                    "resources": [{"group": "megdet.io", "resources": ["megdetruns/status"]}],
                },
                {"level": "Metadata"},
            ],
        }
        path = self.root / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return path

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The audit log's events (one JSON object a line), optionally for one user."""
        path = self.logs / "audit.log"
        if not path.exists():
            return []
        events = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if user is None or event.get("user", {}).get("username") == user:
                    events.append(event)
        return events

    def _start_controllers(self, state: dict[str, Any]) -> None:
        ports, pki = state["ports"], self.pki
        cm_config = str(pki / "controller-manager.kubeconfig")
        cm = self._spawn(
            state,
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={cm_config}",
                f"--authentication-kubeconfig={cm_config}",
                f"--authorization-kubeconfig={cm_config}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-controller-manager']}",
                f"--tls-cert-file={pki / 'controller-manager-serving.crt'}",
                f"--tls-private-key-file={pki / 'controller-manager-serving.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # A quota's usage of a custom resource (TrainJobs) is computed at the full
                # resync, 5 min by default: a throwaway cluster's quotas should count at once.
                "--resource-quota-sync-period=10s",
                "--profiling=false",
            ],
        )
        sched_config = str(pki / "scheduler.kubeconfig")
        sched = self._spawn(
            state,
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={sched_config}",
                f"--authentication-kubeconfig={sched_config}",
                f"--authorization-kubeconfig={sched_config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-scheduler']}",
                f"--tls-cert-file={pki / 'scheduler-serving.crt'}",
                f"--tls-private-key-file={pki / 'scheduler-serving.key'}",
                "--profiling=false",
            ],
        )
        for name, proc in (("kube-controller-manager", cm), ("kube-scheduler", sched)):
            self._wait(name, lambda n=name: self._ready("/healthz", n), 90, proc)

    def _stages(self) -> Path:
        """kwok's upstream stage files, read from its module in Go's module cache."""
        source = build.module_source("kwok") / "kustomize/stage"
        if not source.is_dir():
            raise ClusterError(
                f"kwok's stages are missing from the module cache ({source}); "
                "run `python -m cluster.build kwok` again"
            )
        docs = [(source / rel).read_text() for rel in KWOK_STAGES]
        path = self.root / "kwok-stages.yaml"
        path.write_text("\n---\n".join(docs))
        return path

    def _start_kwok(self, state: dict[str, Any]) -> None:
        ports = state["ports"]
        proc = self._spawn(
            state,
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={self.pki / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--config={self._stages()}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
            ],
            env={"HOME": str(self.root)},
        )  # keeps kwok away from the user's ~/.kwok/kwok.yaml

        def healthy() -> bool:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{ports['kwok']}/healthz", timeout=2
            ) as resp:
                return resp.status == 200

        self._wait("kwok", healthy, 60, proc)

    def node_manifest(self, index: int) -> dict[str, Any]:
        name = f"gpu-node-{index}"
        resources = {
            "cpu": "128",
            "memory": "1Ti",
            "pods": "110",
            "ephemeral-storage": "2Ti",
            "nvidia.com/gpu": str(GPUS_PER_NODE),
            RDMA_RESOURCE: "1k",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                },
            },
            "status": {"capacity": resources, "allocatable": resources},
        }

    def add_nodes(self, first: int, count: int, timeout: float = 120) -> None:
        self.apply(self.node_manifest(i) for i in range(first, first + count))
        self._wait_nodes_ready(first + count, timeout)

    def _create_nodes(self, timeout: float) -> None:
        self.add_nodes(0, self.nodes, timeout)

    def _wait_nodes_ready(self, count: int, timeout: float) -> None:
        def ready() -> bool:
            out = self.kubectl("get", "nodes", "-o", "json", timeout=20).stdout
            nodes = json.loads(out)["items"]
            ok = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", [])
                )
            ]
            return len(ok) >= count

        self._wait(f"{count} kwok nodes", ready, timeout, log="kwok")

    def _wait_default_service_account(self, timeout: float) -> None:
        self._wait(
            "the default ServiceAccount (kube-controller-manager)",
            lambda: self.kubectl(
                "get", "serviceaccount", "default", check=False, timeout=10
            ).returncode
            == 0,
            timeout,
            log="kube-controller-manager",
        )

    # --- the operators (cluster.operators) -------------------------------------------
    def _extra_components(self) -> list[str]:
        """The optional operators this cluster runs, in start order (build.COMPONENTS names)."""
        names = ["jobset", "trainer"] if self.trainer_v2 or self.kueue else []
        return names + (["kueue"] if self.kueue else [])

    def _extra_starters(self) -> dict[str, Callable[[dict[str, Any], float], None]]:
        return {
            "jobset": self._start_jobset,
            "trainer": self._start_trainer,
            "kueue": self._start_kueue,
        }

    def start_trainer_v2(self, timeout: float = 180) -> list[str]:
        """Start JobSet and Trainer v2 on this running cluster (what ``trainer_v2=True`` starts
        in up()); returns what it started (nothing when both run already)."""
        return self._start_extras(["jobset", "trainer"], timeout)

    def start_kueue(self, timeout: float = 180) -> list[str]:
        """Start Kueue (and JobSet and Trainer v2, whose TrainJobs it queues) on this running
        cluster; returns what it started."""
        return self._start_extras(["jobset", "trainer", "kueue"], timeout)

    def start_real_node(self, timeout: float = 300, required: bool = True) -> bool:
        """Start the real node on this running cluster (a no-op when it runs); returns whether
        it runs. ``required=False`` (make cluster): a node that cannot start is reported, with
        what is missing, and the cluster stays up with its kwok nodes."""
        from cluster.node import NodeError, RealNode

        state = self.state()
        if state and "node" in state and self.running("kubelet", state):
            return True
        try:
            RealNode(self, echo=self.echo).start(timeout)
        except (NodeError, ClusterError, build.BuildError) as err:
            if required:
                raise
            self.echo(f"real node not started (the kwok nodes work without it): {err}")
            return False
        return True

    def _start_extras(self, names: Sequence[str], timeout: float) -> list[str]:
        state = self.state()
        if not state or not self._ready("/readyz"):
            raise ClusterError(f"no running cluster in {self.root}: start it first")
        todo = [n for n in names if not self.running(n, state)]
        missing = [n for n in todo if not build.is_built(n)]
        if missing:
            self.echo(f"building {', '.join(missing)} (first use on this machine only)")
            build.build_all(missing, echo=self.echo)
        for name in PORT_OFFSETS:  # a cluster started before these components existed
            if name not in state["ports"]:
                state["ports"][name] = listen_port(state["ports"].values())
        self._save(state)
        for name in todo:
            self._extra_starters()[name](state, timeout)
        return todo
