"""Start and stop a real Kubernetes control plane on this machine, from the binaries that
``megdet.cluster.build`` made.

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

import base64
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from megdet.cluster import build
from megdet.cluster.pki import CertificateAuthority, dns_names, kubeconfig, service_account_keys

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
#: Where the training operator lives and how its webhook is named (its v1.9 main.go).
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SECRET = "training-operator-webhook-cert"
OPERATOR_WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
SERVICE_CIDR = "10.96.0.0/16"
#: The CA names the operators' certificate rotators verify a given CA against (their CAName).
#: JobSet's, Trainer v2's and Kueue's are the caName constants of their pkg/util/cert/cert.go.
WEBHOOK_CA_NAMES = (
    "megdet-webhook-ca",
    "training-operator-ca",
    "jobset-ca",
    "kubeflow-trainer-ca",
    "kueue-ca",
)
#: The in-cluster names the rotators verify the serving certificate against (<svc>.<ns>.svc);
#: JobSet's, Trainer's and Kueue's from their default Service names and namespaces (below).
WEBHOOK_SERVICE_NAMES = (
    f"training-operator.{OPERATOR_NAMESPACE}.svc",
    "jobset-webhook-service.jobset-system.svc",
    "kubeflow-trainer-controller-manager.kubeflow-system.svc",
    "kueue-webhook-service.kueue-system.svc",
)
#: The restricted-profile init container template the operator chart ships for platforms.
PYTORCH_INIT_CONTAINER = (
    ROOT / "charts/megdet-operator/files/pytorch-init-container-restricted.yaml"
)
#: Hard-coded by the training operator's cert package (and by Trainer v2's and JobSet's):
#: in a pod it is the Secret's volume mount.
WEBHOOK_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
#: kwok's upstream stages (kustomize/stage in its module) that the cluster loads.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
)

#: Kubeflow Trainer v2, JobSet and Kueue (Cluster(trainer_v2=True, kueue=True)). Each one's
#: certificate rotator reads a Secret in a namespace and checks certificates against names that
#: the operator hard-codes or defaults; webhook_pki() issues certificates that pass, and
#: webhook_secret() hands them over. Out of a pod (no ServiceAccount namespace file) JobSet and
#: Trainer fall back to these namespaces: jobset v0.12.0 pkg/util/cert/cert.go
#: (defaultNamespace, caName "jobset-ca", the two configuration names) and
#: api/config/v1alpha1/defaults.go (the Secret and Service names); trainer v2.3.0
#: pkg/util/cert/cert.go (defaultNamespace, caName "kubeflow-trainer-ca"),
#: cmd/trainer-controller-manager/main.go (the configuration names) and
#: pkg/apis/config/v1alpha1/defaults.go; kueue v0.19.0 pkg/util/cert/cert.go (caName
#: "kueue-ca", the names derived from the Service name) and apis/config/v1beta2/defaults.go.
JOBSET_NAMESPACE = "jobset-system"
JOBSET_SECRET = "jobset-webhook-server-cert"
JOBSET_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration",
    "MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
}
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_SECRET = "kubeflow-trainer-webhook-cert"
TRAINER_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
    "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
}
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SECRET = "kueue-webhook-server-cert"
KUEUE_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
}
#: The one Kueue integration the cluster turns on: the project's target: trainjob.
KUEUE_FRAMEWORKS = ("trainer.kubeflow.org/trainjob",)
#: A pod's ServiceAccount namespace file: JobSet and Trainer use it over their defaults.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: Trainer v2.3.0's alpha feature gate for its status server and the TrainJobStatus plugin
#: (pkg/features/features.go; off by default), and the ServiceAccount whose token its manager
#: reads its issuer from (pkg/statusserver/auth.go, getClusterOIDCIssuerURL).
TRAINER_STATUS_GATE = "TrainJobStatus"
TRAINER_SERVICE_ACCOUNT = "kubeflow-trainer-controller-manager"
#: Run in its own mount namespace, Trainer's manager sees the folder given as $1 where a pod
#: has its ServiceAccount files (a tmpfs over /run, which /var/run points to, holds the mount
#: point); nothing on the host changes.
POD_FILES_SCRIPT = (
    'run=$(readlink -f /var/run) && mount -t tmpfs -o mode=0755,size=1m megdet-pod-run "$run"'
    ' && mkdir -p "$run/secrets/kubernetes.io/serviceaccount"'
    ' && mount --bind "$1" "$run/secrets/kubernetes.io/serviceaccount" && shift && exec "$@"'
)


class ClusterError(RuntimeError):
    """Something stopped the cluster from starting; the message names the fix."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def stop_process_group(pid: int, grace: float = 15) -> bool:
    """SIGTERM ``pid``'s process group, SIGKILL it after ``grace`` seconds; reap it if it is our
    child. Returns whether it was running."""
    if not _alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; read its state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


@dataclasses.dataclass
class Cluster:
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
    #: Also one real node (megdet.cluster.node: kubelet, containerd, kube-proxy, CoreDNS);
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
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

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
    def is_up(self) -> bool:
        state = self.state()
        return (
            bool(state)
            and all(_alive(p) for p in state["pids"].values())
            and self._ready("/readyz")
        )

    def up(self, timeout: float = 180) -> None:
        """Start the cluster; a no-op when it is already up."""
        state = self.state()
        if state:
            dead = [n for n, pid in state["pids"].items() if not _alive(pid)]
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
        ports = self._choose_ports()  # before a long first build: a taken port fails at once
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
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        state = {
            "ports": ports,
            "pids": {},
            "started": time.time(),
            "versions": build.pins(),
            "nodes": self.nodes,
        }
        self._save(state)
        start = time.monotonic()
        try:
            self._make_pki(ports)
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
            from megdet.cluster.node import RealNode

            stopped += RealNode(self, echo=self.echo).teardown()
        # One at a time, in reverse start order: the API server stops in about a second while
        # etcd is still there, but waits out its whole grace period once etcd is gone first.
        for name in reversed(list(state["pids"])):
            if stop_process_group(state["pids"][name]):
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

    def _choose_ports(self) -> dict[str, int]:
        if self.ports_mode == "auto":
            ports: dict[str, int] = {}
            while len(ports) < len(PORT_OFFSETS):
                port = free_port()
                if port not in ports.values():
                    ports[list(PORT_OFFSETS)[len(ports)]] = port
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
        taken = [f"{port} ({name})" for name, port in ports.items() if port_taken(port)]
        if taken:
            raise ClusterError(
                f"port(s) {', '.join(taken)} already taken on 127.0.0.1 by another process; "
                f"stop it, or pick other ports with MEGDET_CLUSTER_PORT_BASE=N (the cluster uses "
                f"N to N+{len(PORT_OFFSETS) - 1}); if it is an earlier cluster, `make cluster-down`"
            )
        return ports

    def _make_pki(self, ports: Mapping[str, int]) -> None:
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
            ips=["127.0.0.1", "10.96.0.1"],
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
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        for name, (cn, orgs) in clients.items():
            crt, key = ca.issue(name, cn, orgs, client=True)
            path = self.kubeconfig if name == "admin" else self.pki / f"{name}.kubeconfig"
            path.write_text(kubeconfig(server, ca.cert_path, cn, crt, key))
            path.chmod(0o600)
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

    def _start_etcd(self, state: dict[str, Any]) -> None:
        ports = state["ports"]
        client = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        proc = self._spawn(
            state,
            "etcd",
            [
                self.binary("etcd"),
                "--name=megdet",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=megdet={peer}",
                "--listen-metrics-urls=",
                # A throwaway cluster: no fsync (etcd's own test setting), a small backend quota.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self._wait("etcd", healthy, 60, proc)

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return ctx

    def _ready(self, path: str, port_name: str = "kube-apiserver") -> bool:
        try:
            port = self.ports[port_name]
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", timeout=3, context=self._ssl()
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
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
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
                f"--service-account-issuer={self.issuer(ports)}",
                f"--service-account-jwks-uri={self.issuer(ports)}/openid/v1/jwks",
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

    @staticmethod
    def issuer(ports: Mapping[str, int]) -> str:
        """The ServiceAccount token issuer (the `iss` of every token this cluster signs)."""
        return f"https://127.0.0.1:{ports['kube-apiserver']}"

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
                "run `python -m megdet.cluster.build kwok` again"
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

    # --- the Kubeflow training operator -------------------------------------------------------
    def module_dir(self, pin: str) -> Path:
        """An upstream module's source in Go's module cache (manifests, CRDs, stages)."""
        return build.module_source(pin)

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until the API server serves ``crd`` (its Established condition is True)."""

        def established() -> bool:
            out = self.kubectl("get", "crd", crd, "-o", "json", check=False, timeout=10)
            conditions = json.loads(out.stdout or "{}").get("status", {}).get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        self._wait(f"CRD {crd}", established, timeout, log="kube-apiserver")

    @staticmethod
    def webhook_pki() -> Path:
        """The operators' webhook CA and serving certificate: one per machine, in the build
        cache, so that every cluster on the machine writes the same files into the folder the
        operators hard-code (see WEBHOOK_CERT_DIR)."""
        import fcntl

        folder = build.cache_dir() / "webhook-pki"
        folder.mkdir(parents=True, exist_ok=True)
        dns = ["localhost", *WEBHOOK_SERVICE_NAMES]
        # Clusters on the machine may start at the same time: one issues, the others wait.
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ca = CertificateAuthority(folder, names=WEBHOOK_CA_NAMES)
            # A cache from before an operator was added lacks its CAName: re-sign the CA with
            # the same key (so caBundles of clusters already running stay valid) ...
            renewed = ca.add_names(WEBHOOK_CA_NAMES)
            crt = folder / "webhook.crt"
            if (
                renewed
                or not crt.exists()
                or not set(dns) <= set(dns_names(x509.load_pem_x509_certificate(crt.read_bytes())))
            ):
                # ... and issue a serving certificate valid for 127.0.0.1 (the webhook
                # configurations use url: https://127.0.0.1:PORT) and for the Service names
                # each operator's rotator checks the certificate against.
                ca.issue("webhook", "megdet-webhooks", server=True, ips=["127.0.0.1"], dns=dns)
        return folder

    def mount_webhook_certs(self) -> None:
        """What the operator's Deployment gets from its Secret volume: tls.crt and tls.key in
        the folder its webhook server reads (cert-controller only checks they exist)."""
        pki = self.webhook_pki()
        WEBHOOK_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name, source in (
            ("tls.crt", "webhook.crt"),
            ("tls.key", "webhook.key"),
            ("ca.crt", "ca.crt"),
        ):
            data = (pki / source).read_bytes()
            target = WEBHOOK_CERT_DIR / name
            if not target.exists() or target.read_bytes() != data:
                tmp = target.with_suffix(".tmp")
                tmp.write_bytes(data)
                tmp.replace(target)

    def webhook_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """A cert-controller style Secret holding the project's webhook certificate and CA, so
        the operator's certificate rotator finds a valid one and serves it instead of its own."""

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        pki = self.webhook_pki()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
            "data": {
                "ca.crt": b64(pki / "ca.crt"),
                "ca.key": b64(pki / "ca.key"),
                "tls.crt": b64(pki / "webhook.crt"),
                "tls.key": b64(pki / "webhook.key"),
            },
        }

    def webhook_configuration(self, name: str, port: int, source: Path) -> dict[str, Any]:
        """The upstream ValidatingWebhookConfiguration, pointed at the operator on this host."""
        upstream = yaml.safe_load(source.read_text())
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        for hook in upstream["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
        upstream["metadata"] = {"name": name}
        return upstream

    def _start_training_operator(self, state: dict[str, Any], timeout: float) -> None:
        ports = state["ports"]
        module = self.module_dir("training_operator")
        crd = module / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
        self.kubectl("create", "namespace", OPERATOR_NAMESPACE)
        self.apply(crd.read_text(), server_side=True)
        self.wait_established("pytorchjobs.kubeflow.org")
        hooks = self.webhook_configuration(
            OPERATOR_WEBHOOK_CONFIG,
            ports["training-operator-webhook"],
            module / "manifests/base/webhook/manifests.yaml",
        )
        # Only PyTorchJob is served (--enable-scheme=pytorchjob); the other kinds' hooks would
        # point at paths nobody serves.
        hooks["webhooks"] = [h for h in hooks["webhooks"] if "pytorchjob" in h["name"]]
        self.apply([self.webhook_secret(OPERATOR_NAMESPACE, OPERATOR_SECRET), hooks])
        self.mount_webhook_certs()
        proc = self._spawn(
            state,
            "training-operator",
            [
                self.binary("training-operator"),
                "--enable-scheme=pytorchjob",
                f"--kubeconfig={self.pki / 'operators.kubeconfig'}",
                f"--webhook-server-port={ports['training-operator-webhook']}",
                f"--metrics-bind-address=127.0.0.1:{ports['training-operator-metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{ports['training-operator-probe']}",
                # Its built-in init container for Worker pods fails `restricted` Pod Security;
                # the operator chart ships one that passes (docs/operations.md, Pod Security).
                f"--pytorch-init-container-template-file={PYTORCH_INIT_CONTAINER}",
            ],
            env={"MY_POD_NAMESPACE": OPERATOR_NAMESPACE, "KUBEFLOW_NAMESPACE": ""},
        )

        def ready() -> bool:
            url = f"http://127.0.0.1:{ports['training-operator-probe']}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self._wait("training-operator", ready, timeout, proc)

    # --- JobSet, Kubeflow Trainer v2 and Kueue -------------------------------------------------
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
        from megdet.cluster.node import NodeError, RealNode

        state = self.state()
        if state and "node" in state and _alive(state["pids"].get("kubelet", -1)):
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
        todo = [n for n in names if not (n in state["pids"] and _alive(state["pids"][n]))]
        missing = [n for n in todo if not build.is_built(n)]
        if missing:
            self.echo(f"building {', '.join(missing)} (first use on this machine only)")
            build.build_all(missing, echo=self.echo)
        for name in PORT_OFFSETS:  # a cluster started before these components existed
            if name not in state["ports"]:
                state["ports"][name] = free_port()
        self._save(state)
        for name in todo:
            self._extra_starters()[name](state, timeout)
        return todo

    @staticmethod
    def _pod_namespace(default: str) -> str:
        """The namespace JobSet's and Trainer's certificate code looks in: a pod's ServiceAccount
        namespace file if there is one, else its default (getOperatorNamespace in both)."""
        with contextlib.suppress(OSError):
            if namespace := SERVICE_ACCOUNT_NAMESPACE.read_text().strip():
                return namespace
        return default

    @staticmethod
    def json_patch(doc: Any, ops: Iterable[Mapping[str, Any]]) -> Any:
        """RFC 6902 add/replace/remove on ``doc`` in place: the kustomize patches upstream's
        manifests come with (the subset they use)."""
        for op in ops:
            parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            *parents, last = parts
            target = doc
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target[part]
            if isinstance(target, list):
                index = len(target) if last == "-" else int(last)
                if op["op"] == "add":
                    target.insert(index, op["value"])
                elif op["op"] == "replace":
                    target[index] = op["value"]
                else:
                    del target[index]
            elif op["op"] in ("add", "replace"):
                target[last] = op["value"]
            else:
                del target[last]
        return doc

    def webhook_configurations(
        self,
        source: Path,
        port: int,
        names: Mapping[str, str],
        patches: Mapping[str, Sequence[Path]] | None = None,
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Upstream's Mutating- and ValidatingWebhookConfiguration (kubebuilder's
        manifests.yaml), with the JSON patches its kustomization applies to each kind, named
        as its rotator expects (``names``: kind -> name) and pointed at the operator on this
        host with the project's CA; ``keep`` picks the hooks of what the cluster serves."""
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        configs = []
        for doc in yaml.safe_load_all(source.read_text()):
            if not doc:
                continue
            kind = doc["kind"]
            for patch in (patches or {}).get(kind, ()):
                self.json_patch(doc, yaml.safe_load(patch.read_text()))
            doc["metadata"] = {"name": names[kind]}
            doc["webhooks"] = [h for h in doc["webhooks"] if keep is None or keep(h)]
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            configs.append(doc)
        return configs

    def install_crds(self, kustomization: Path, port: int | None = None) -> list[str]:
        """The CRDs a kustomization lists (``resources``), with the conversion webhooks its
        ``patches`` add (pointed at ``port`` on this host with the project's CA; other patch
        content, cert-manager annotations, is left out); server-side applied, then waited for.
        Returns the CRD names."""
        folder = kustomization.parent
        spec = yaml.safe_load(kustomization.read_text())
        crds = [yaml.safe_load((folder / rel).read_text()) for rel in spec.get("resources", [])]
        by_name = {crd["metadata"]["name"]: crd for crd in crds}
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        for entry in spec.get("patches", []):
            patch = yaml.safe_load((folder / entry["path"]).read_text())
            conversion = (patch.get("spec") or {}).get("conversion")
            if not conversion or port is None:
                continue
            client = conversion["webhook"]["clientConfig"]
            path = client["service"].get("path", "/convert")
            conversion["webhook"]["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": ca,
            }
            by_name[patch["metadata"]["name"]]["spec"]["conversion"] = conversion
        self.apply(crds, server_side=True)
        for name in by_name:
            self.wait_established(name)
        return list(by_name)

    def _operator_config(self, name: str, source: Path, overrides: Mapping[str, Any]) -> Path:
        """Upstream's controller-manager configuration file with ``overrides`` merged in."""

        def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
            for key, value in extra.items():
                if isinstance(value, Mapping) and isinstance(base.get(key), dict):
                    merge(base[key], value)
                else:
                    base[key] = value
            return base

        config = merge(yaml.safe_load(source.read_text()), overrides)
        path = self.root / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _install_webhooks(
        self, namespace: str, secret: str, configs: Sequence[Mapping[str, Any]]
    ) -> None:
        """The operator's namespace, its pre-made Secret and webhook configurations, and the
        serving certificate where its webhook server reads it."""
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        self.apply([ns, self.webhook_secret(namespace, secret), *configs])
        self.mount_webhook_certs()

    def _wait_operator(
        self,
        name: str,
        proc: subprocess.Popen,
        probe_port: int,
        webhook_port: int,
        configs: Sequence[Mapping[str, Any]],
        timeout: float,
    ) -> None:
        """Until its /readyz answers (certificates ready, webhook server started) and every
        hook path is registered: the controllers and webhooks are set up in a goroutine after
        the certificates, so /readyz can pass before a path answers anything but 404."""

        def ready() -> bool:
            url = f"http://127.0.0.1:{probe_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self._wait(name, ready, timeout, proc)
        ctx = ssl.create_default_context(cafile=str(self.webhook_pki() / "ca.crt"))
        urls = {h["clientConfig"]["url"] for c in configs for h in c["webhooks"]}
        paths = sorted(urllib.parse.urlsplit(url).path for url in urls)

        def served() -> bool:
            for path in paths:
                request = urllib.request.Request(
                    f"https://127.0.0.1:{webhook_port}{path}",
                    data=b"{}",
                    headers={"Content-Type": "application/json"},
                )
                try:
                    urllib.request.urlopen(request, timeout=2, context=ctx).close()
                except urllib.error.HTTPError as err:
                    if err.code == 404:
                        return False
            return True

        self._wait(f"{name} webhooks", served, timeout, proc, log=name)

    def _start_jobset(self, state: dict[str, Any], timeout: float) -> None:
        """JobSet v0.12.0: its CRD, webhooks and Secret, then its manager (main.go) with
        upstream's config file (config/components/manager) bound to 127.0.0.1."""
        ports = state["ports"]
        module = self.module_dir("jobset")
        components = module / "config/components"
        self.install_crds(components / "crd/kustomization.yaml", ports["jobset-webhook"])
        webhook = components / "webhook"
        configs = self.webhook_configurations(
            webhook / "manifests.yaml",
            ports["jobset-webhook"],
            JOBSET_WEBHOOK_CONFIGS,
            # The patches give the pod hooks an objectSelector (pods of a JobSet only).
            patches={
                "MutatingWebhookConfiguration": [webhook / "patches/mutating-patch.yaml"],
                "ValidatingWebhookConfiguration": [webhook / "patches/validating-patch.yaml"],
            },
        )
        self._install_webhooks(self._pod_namespace(JOBSET_NAMESPACE), JOBSET_SECRET, configs)
        self._run_manager(
            state,
            "jobset",
            "jobset",
            components / "manager/controller_manager_config.yaml",
            configs,
            timeout,
        )

    def _start_trainer(self, state: dict[str, Any], timeout: float) -> None:
        """Kubeflow Trainer v2.3.0's controller manager: its CRDs (manifests/base/crds), its
        webhooks with upstream's kustomize patches (manifests/base/webhook), its Secret, and
        upstream's config file (manifests/base/manager) bound to 127.0.0.1. No
        ClusterTrainingRuntimes: the controller creates a TrainingRuntime per run. JobSet's CRD
        must be served first (its jobset plugin only logs when it is not, then never watches)."""
        ports = state["ports"]
        base = self.module_dir("trainer") / "manifests/base"
        self.install_crds(base / "crds/kustomization.yaml")
        webhook = base / "webhook"
        configs = self.webhook_configurations(
            webhook / "manifests.yaml",
            ports["trainer-webhook"],
            TRAINER_WEBHOOK_CONFIGS,
            patches={
                "MutatingWebhookConfiguration": [webhook / "patch_mutating.yaml"],
                "ValidatingWebhookConfiguration": [webhook / "patch_validating.yaml"],
            },
        )
        namespace = self._pod_namespace(TRAINER_NAMESPACE)
        self._install_webhooks(namespace, TRAINER_SECRET, configs)
        # The TrainJobStatus gate: the status server on its own port (it binds ":<port>", all
        # interfaces: StatusServer has no host field) and the plugin that gives the trainer's
        # pods its URL, CA and a token (docs/trainer-v2.md, Progress).
        proc = self._run_manager(
            state,
            "trainer",
            "trainer-controller-manager",
            base / "manager/controller_manager_config.yaml",
            configs,
            timeout,
            extra={
                "featureGates": {TRAINER_STATUS_GATE: True},
                "statusServer": {"port": ports["trainer-status"]},
            },
            wrapper=self._pod_files_wrapper(namespace),
        )
        # It listens once its token authorizer found the issuer (OIDC discovery through the
        # manager's own client: no anonymous access to the discovery endpoints is needed).
        port = ports["trainer-status"]
        self._wait(
            "trainer status server",
            lambda: self._status_server_up(port),
            timeout,
            proc,
            log="trainer",
        )

    def _pod_files_wrapper(self, namespace: str) -> list[str]:
        """The command prefix that runs Trainer's manager as if in a pod of its own
        ServiceAccount: Trainer v2.3.0 reads the token issuer from
        /var/run/secrets/kubernetes.io/serviceaccount/token (getClusterOIDCIssuerURL in
        pkg/statusserver/auth.go, a fixed path) and fails its status server without it. The
        token is a real one (TokenRequest), in the state folder; the namespace file holds what
        the pod's would (the namespace Trainer's certificate code uses, see _pod_namespace)."""
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": TRAINER_SERVICE_ACCOUNT, "namespace": namespace},
                }
            ]
        )
        token = self.kubectl(
            "create", "token", TRAINER_SERVICE_ACCOUNT, "-n", namespace, "--duration=24h"
        ).stdout.strip()
        folder = self.root / "trainer-serviceaccount"
        folder.mkdir(exist_ok=True)
        for name, text in (("token", token), ("namespace", namespace)):
            (folder / name).write_text(text)
            (folder / name).chmod(0o600)
        # Root may make a mount namespace; anyone else needs a user namespace for it.
        user = [] if os.geteuid() == 0 else ["--map-root-user"]
        return ["unshare", "--mount", *user, "--", "sh", "-c", POD_FILES_SCRIPT, "sh", str(folder)]

    def _status_server_up(self, port: int) -> bool:
        """Trainer's status server answers (404 for a path it does not serve), over TLS with
        the webhook serving certificate it shares (pkg/util/cert SetupTLSConfig)."""
        ctx = ssl.create_default_context(cafile=str(self.webhook_pki() / "ca.crt"))
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=2, context=ctx).close()
        except urllib.error.HTTPError as err:
            return err.code == 404
        return False

    def _run_manager(
        self,
        state: dict[str, Any],
        name: str,
        binary: str,
        manager_config: Path,
        configs: list[dict[str, Any]],
        timeout: float,
        extra: Mapping[str, Any] | None = None,
        cert_dir: bool = False,
        wrapper: Sequence[str] = (),
    ) -> subprocess.Popen:
        """A controller-runtime manager from upstream's config file, bound to 127.0.0.1 with
        this cluster's ports and no leader election, then its readiness (and its webhooks');
        ``wrapper``: a command prefix it runs under."""
        ports = state["ports"]
        webhook: dict[str, Any] = {"port": ports[f"{name}-webhook"], "host": "127.0.0.1"}
        if cert_dir:
            webhook["certDir"] = str(WEBHOOK_CERT_DIR)
        config = self._operator_config(
            name,
            manager_config,
            {
                "leaderElection": {"leaderElect": False},
                "webhook": webhook,
                "metrics": {"bindAddress": f"127.0.0.1:{ports[f'{name}-metrics']}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{ports[f'{name}-probe']}"},
                **(extra or {}),
            },
        )
        proc = self._spawn(
            state,
            name,
            [
                *wrapper,
                self.binary(binary),
                f"--config={config}",
                f"--kubeconfig={self.pki / 'operators.kubeconfig'}",
                "--zap-log-level=2",
            ],
        )
        self._wait_operator(
            name, proc, ports[f"{name}-probe"], ports[f"{name}-webhook"], configs, timeout
        )
        return proc

    def _start_kueue(self, state: dict[str, Any], timeout: float) -> None:
        """Kueue v0.19.0 with only its TrainJob integration: its CRDs with their conversion
        webhooks (config/components/crd; its rotator injects the CA into five of them and
        fails without their clientConfig), the webhooks of its own kinds and of TrainJob,
        its Secret and upstream's config file (config/components/manager) bound to
        127.0.0.1, without the visibility API server (an aggregated API on :8082)."""
        ports = state["ports"]
        components = self.module_dir("kueue") / "config/components"
        self.install_crds(components / "crd/kustomization.yaml", ports["kueue-webhook"])
        namespace = KUEUE_NAMESPACE

        def keep(hook: Mapping[str, Any]) -> bool:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            return bool(groups & {"kueue.x-k8s.io", "trainer.kubeflow.org"})

        configs = self.webhook_configurations(
            components / "webhook/manifests.yaml",
            ports["kueue-webhook"],
            KUEUE_WEBHOOK_CONFIGS,
            keep=keep,
        )
        # Upstream's kustomization gives every job kind's hooks this namespaceSelector.
        for config in configs:
            for hook in config["webhooks"]:
                if "trainer.kubeflow.org" in hook["rules"][0]["apiGroups"]:
                    hook["namespaceSelector"] = {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/metadata.name",
                                "operator": "NotIn",
                                "values": ["kube-system", namespace],
                            }
                        ]
                    }
        self._install_webhooks(namespace, KUEUE_SECRET, configs)
        self._run_manager(
            state,
            "kueue",
            "kueue",
            components / "manager/controller_manager_config.yaml",
            configs,
            timeout,
            extra={
                "namespace": namespace,
                "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
                "featureGates": {"VisibilityOnDemand": False},
            },
            cert_dir=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m megdet.cluster",
        description="A real Kubernetes control plane on this machine (make cluster).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build (first time) and start the cluster; no-op when up")
    up.add_argument("--nodes", type=int, default=4, help="fake 8-GPU nodes (default 4)")
    up.add_argument(
        "--trainer-v2",
        action="store_true",
        help="also JobSet and Kubeflow Trainer v2 (target: trainjob); starts them on a running "
        "cluster too",
    )
    up.add_argument("--kueue", action="store_true", help="also Kueue (with JobSet and Trainer v2)")
    up.add_argument(
        "--no-real-node",
        dest="real_node",
        action="store_false",
        help="only kwok nodes: no kubelet, containerd, kube-proxy and CoreDNS (docs/cluster.md)",
    )
    sub.add_parser("down", help="stop every process the cluster started and delete its state")
    sub.add_parser("status", help="say whether the cluster is up")
    for p in sub.choices.values():
        p.add_argument(
            "--state", type=Path, default=DEFAULT_STATE, help="state folder (default .cluster)"
        )
    args = parser.parse_args(argv)
    if getattr(args, "nodes", 1) < 1:
        parser.error("--nodes must be at least 1")
    cluster = Cluster(
        root=args.state.resolve(),
        nodes=getattr(args, "nodes", 4),
        trainer_v2=getattr(args, "trainer_v2", False),
        kueue=getattr(args, "kueue", False),
        real_node=getattr(args, "real_node", False),
    )
    try:
        if args.command == "up":
            cluster.up()
            # A cluster that was up already gets what the flags add (a no-op otherwise).
            if cluster._extra_components():
                started = cluster._start_extras(cluster._extra_components(), 180)
                if started:
                    print(f"started {', '.join(started)}")
        elif args.command == "down":
            stopped = cluster.down()
            print(
                f"cluster down (stopped: {', '.join(stopped) or 'nothing was running'}; "
                f"deleted {cluster.root})"
            )
        else:
            print("up" if cluster.is_up() else "down")
            return 0 if cluster.is_up() else 1
    except (ClusterError, build.BuildError) as err:
        print(f"megdet cluster {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0
