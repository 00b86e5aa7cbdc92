"""The real control plane for the e2e tests (cluster, the same code as `make cluster`),
the users' own commands (the Helm CLI and kubectl built from upstream) and the controller run
on the host under the operator chart's ServiceAccount."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from cluster.control_plane import Cluster, ClusterError, free_port
from cluster.pki import kubeconfig

ROOT = Path(__file__).resolve().parents[2]
#: README.md's local example: its storage (namespace, claims), run values and MegDetRun.
EXAMPLE = ROOT / "examples" / "local"
#: One control plane per folder (MEGDET_E2E_ROOT: several sessions side by side on one machine).
E2E_ROOT = Path(os.environ.get("MEGDET_E2E_ROOT") or ROOT / "output" / "e2e").resolve()
#: Where the component logs stay after the suite (printed with every failure).
LOGS = E2E_ROOT / "logs"
OPERATOR_RELEASE = "megdet-operator"
OPERATOR_NAMESPACE = "megdet-system"
#: The user the controller runs as: the operator chart's ServiceAccount.
CONTROLLER_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_RELEASE}"


def eventually(
    check: Callable[[], Any], timeout: float = 60, interval: float = 0.5, message: str = "condition"
) -> Any:
    """Poll ``check`` until it returns something truthy; its last value on success."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:
            last = err
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{message} not reached in {timeout:.0f} s (last: {last!r})")


def helm(
    kube: Cluster, *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    try:
        return kube.helm(*args, check=check, timeout=timeout)
    except ClusterError as err:
        raise AssertionError(str(err)) from None


def get_json(kube: Cluster, *args: str) -> dict[str, Any]:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def get_or_none(kube: Cluster, *args: str) -> dict[str, Any] | None:
    proc = kube.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def token_kubeconfig(kube: Cluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that logs in with a ServiceAccount token (TokenRequest, as a pod gets)."""
    token = kube.kubectl(
        "create", "token", service_account, "-n", namespace, "--duration=3h"
    ).stdout.strip()
    path.write_text(
        kubeconfig(kube.server, kube.pki / "ca.crt", f"{namespace}:{service_account}", token=token)
    )
    path.chmod(0o600)
    return path


class ControllerProcess:
    """`megdet controller` on the host with the args of the chart's Deployment, logged in as
    the chart's ServiceAccount, so the API server enforces the chart's RBAC on every call."""

    def __init__(
        self,
        kube: Cluster,
        workdir: Path,
        *,
        pod_id: str = "e2e-host",
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """``pod_id``: kopf's peering identity (two processes playing two replicas need two);
        ``extra_args`` come after the Deployment's (the last of a repeated flag wins);
        ``extra_env``: e.g. POD_NAME/POD_NAMESPACE of a Deployment pod it plays."""
        self.kube = kube
        self.workdir = workdir
        self.pod_id = pod_id
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(extra_env or {})
        name = "megdet-controller" if pod_id == "e2e-host" else f"megdet-controller-{pod_id}"
        self.log = kube.logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.health_port = 0
        #: "https" unless the Deployment says --no-metrics-secure (the chart's metrics.secure).
        self.metrics_scheme = "https"
        #: time.monotonic() of the last start: the controller serves the job kinds it finds
        #: then (kopf's cluster scanning is off), so a kind installed later needs a restart.
        self.started_at = 0.0

    def deployment_args(self) -> list[str]:
        deploy = get_json(self.kube, "deployment", "-n", OPERATOR_NAMESPACE, OPERATOR_RELEASE)
        (container,) = deploy["spec"]["template"]["spec"]["containers"]
        return list(container.get("args") or [])

    def host_policy_file(self, arg: str) -> str:
        """``--policy-file`` names the Deployment's mount of the policy ConfigMap: on the host,
        the same ConfigMap's content, read now (as a pod reads it when it starts)."""
        config = get_json(
            self.kube, "configmap", "-n", OPERATOR_NAMESPACE, f"{OPERATOR_RELEASE}-policy"
        )
        name = Path(arg.split("=", 1)[1]).name
        local = self.workdir / name
        local.write_text(config["data"][name])
        return f"--policy-file={local}"

    def start(self, *once: str) -> None:
        """Start it; ``once``: flags for this start only, after ``extra_args``."""
        self.started_at = time.monotonic()
        self.metrics_port, self.health_port = free_port(), free_port()
        args = [
            a
            for a in self.deployment_args()
            if not a.startswith(("--metrics-port=", "--health-port=", "--progress-port="))
        ]
        # The progress endpoint (tests/e2e/test_progress.py) on a free port of this host too.
        self.progress_port = free_port()
        args.append(f"--progress-port={self.progress_port}")
        self.metrics_scheme = "http" if "--no-metrics-secure" in args else "https"
        args = [self.host_policy_file(a) if a.startswith("--policy-file=") else a for a in args]
        config = token_kubeconfig(
            self.kube, OPERATOR_NAMESPACE, OPERATOR_RELEASE, self.workdir / "controller.kubeconfig"
        )
        env = {**os.environ, "KUBECONFIG": str(config), "POD_ID": self.pod_id, **self.extra_env}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "megdet",
                    *args,
                    f"--metrics-port={self.metrics_port}",
                    f"--health-port={self.health_port}",
                    *self.extra_args,
                    *once,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        import urllib.request

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited {self.proc.returncode}; log {self.log}")
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        eventually(healthy, timeout=60, message="controller /healthz")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def restart(self, *once: str) -> None:
        self.stop()
        self.start(*once)

    def metrics(self, token: str | None = None) -> str:
        """/metrics as a scraper gets it: over HTTPS with ``token`` (a bearer token with get on
        /metrics) when secure; the self-signed certificate is not verified (insecureSkipVerify).
        Raises urllib.error.HTTPError for a refusal (401, 403)."""
        import ssl
        import urllib.request

        url = f"{self.metrics_scheme}://127.0.0.1:{self.metrics_port}/metrics"
        context = None
        if self.metrics_scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.read().decode()


def mdr(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def apply_objects(
    kube: Cluster, *objects: dict[str, Any], check: bool = True, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return kube.kubectl(
        "apply", *extra, "-f", "-", input=yaml.safe_dump_all(list(objects)), check=check
    )


def namespace(kube: Cluster, name: str, labels: dict[str, str] | None = None) -> str:
    obj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }
    apply_objects(kube, obj)
    eventually(
        lambda: kube.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
        == 0,
        message=f"default ServiceAccount in {name}",
    )
    return name


def run_namespace(kube: Cluster, name: str, gpus: int = 0) -> str:
    """A namespace for runs: Pod Security's ``restricted`` level enforced, the dataset and
    output claims bound (:func:`claim_volumes`) and, with ``gpus``, that many GPUs free."""
    namespace(kube, name, {"pod-security.kubernetes.io/enforce": "restricted"})
    apply_objects(kube, *claim_volumes(name))
    if gpus:
        ensure_free_gpus(kube, gpus)
    return name


def pods_of(kube: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    return get_json(kube, "pods", "-n", ns, "-l", selector)["items"]


def iter_docs(text: str) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(text):
        if doc:
            yield doc


def free_gpus(kube: Cluster) -> int:
    """GPUs the untainted nodes have that no scheduled, unfinished pod requests (a tainted node,
    such as the real node, takes only the pods that tolerate it: the charts' do not)."""
    nodes = {
        n["metadata"]["name"]: n
        for n in get_json(kube, "nodes")["items"]
        if not any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in n["spec"].get("taints", [])
        )
    }
    total = sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes.values())
    used = 0
    for pod in get_json(kube, "pods", "-A")["items"]:
        if pod["spec"].get("nodeName") in nodes and pod["status"].get("phase") not in (
            "Succeeded",
            "Failed",
        ):
            for container in pod["spec"]["containers"]:
                requests = container.get("resources", {}).get("requests", {})
                used += int(requests.get("nvidia.com/gpu", 0))
    return total - used


def ensure_free_gpus(kube: Cluster, gpus: int) -> None:
    """Add fake 8-GPU nodes until ``gpus`` are free: earlier modules' runs keep theirs (a
    PyTorchJob's pods run until deleted), and the session's cluster starts with 32."""
    missing = gpus - free_gpus(kube)
    if missing > 0:
        first = len(get_json(kube, "nodes")["items"])
        kube.add_nodes(first, -(-missing // 8))


def token_audience(pod: dict[str, Any]) -> str:
    """The audience of the progress token the run chart gave ``pod`` (its projected volume)."""
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "megdet-progress"]
    return volume["projected"]["sources"][0]["serviceAccountToken"]["audience"]


def resolve_env(pod: dict[str, Any]) -> dict[str, str]:
    """The first container's env as the kubelet would set it: values, and the fieldRefs the
    operators use (the pod's name, namespace and IP; an annotation or label, such as the Job's
    completion index)."""
    container = pod["spec"]["containers"][0]
    meta = pod["metadata"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "status.podIP": pod.get("status", {}).get("podIP", ""),
    }
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif (ref := item.get("valueFrom", {}).get("fieldRef")) is not None:
            path = ref["fieldPath"]
            env[item["name"]] = fields.get(path, "")
            for field in ("annotations", "labels"):
                prefix = f"metadata.{field}['"
                if path.startswith(prefix):
                    env[item["name"]] = meta.get(field, {}).get(path[len(prefix) : -2], "")
    return env


def launch_dry_run(env: dict[str, str]) -> list[str]:
    """`megdet launch --dry-run` with a pod's env (nothing of this machine's PET_/MASTER_):
    the words of what it prints, torchrun's arguments among them."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "megdet", "launch", "--dry-run", "train", "--config", "x"],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def claim_volumes(ns: str, claims: tuple[str, ...] = ("coco", "megdet-output")) -> list[dict]:
    """PVCs for the dataset and the output, pre-bound to hostPath PVs (kwok mounts nothing)."""
    objects: list[dict] = []
    for claim in claims:
        pv = f"{ns}-{claim}"
        objects += [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                      "hostPath": {"path": f"/tmp/{pv}"}, "storageClassName": "",
                      "claimRef": {"namespace": ns, "name": claim}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": claim, "namespace": ns},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                      "resources": {"requests": {"storage": "1Ti"}}}},
        ]  # fmt: skip
    return objects


def run_phase(kube: Cluster, ns: str, name: str) -> str | None:
    """A MegDetRun's status.phase, None while it (or its status) does not exist."""
    run = get_or_none(kube, "mdr", name, "-n", ns)
    return ((run or {}).get("status") or {}).get("phase")


def condition(obj: dict | None, kind: str) -> dict | None:
    """The status condition of type ``kind`` of ``obj``, if it has one."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def preemptor(name: str, namespace: str, queue: str, gpus: int) -> dict[str, Any]:
    """A bare Kueue Workload of priority 1000 for ``gpus`` GPUs in LocalQueue ``queue``: Kueue
    admits it (preempting lower priorities where its ClusterQueue allows) and nothing runs."""
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": queue,
            "priority": 1000,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                }
            ],
        },
    }
