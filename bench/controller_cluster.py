"""The real-API-server side of ``bench/controller_reconcile.py`` (``--api cluster``).

A throwaway control plane (:class:`cluster.control_plane.Cluster`, the same code as
``make cluster`` and the e2e tests: etcd, kube-apiserver with RBAC and an audit log,
kube-controller-manager, kube-scheduler, kwok fake 8-GPU nodes), without the training operator:
the benchmark measures our controller, whose jobs nobody needs to run. What the controller
creates must be served, so the CRDs are installed from upstream, server-side:

- PyTorchJob from the training operator's module (``manifests/base/crds``);
- TrainJob and TrainingRuntime (and ClusterTrainingRuntime) from Trainer v2's module
  (``manifests/base/crds``);
- MegDetRun from the operator chart (``charts/megdet-operator/crds``).

The operator chart is installed with the real Helm CLI (Helm installs the chart's kopf peering
CRDs and leaves the MegDetRun CRD applied above as it is), and the controller logs in with a
token of the chart's ServiceAccount, as ``tests/e2e`` does: the API server enforces the
chart's RBAC on every call and the audit log names the controller's requests by that user.

The client side lives here too: the runs are created through the official client with the
admin kubeconfig (one POST after another), and a watch of MegDetRuns in all namespaces stamps
the moment each run's ``status.jobName`` first appears.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench import harness
from megdet.controller.api import GROUP, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "megdet-operator"
CONTROLLER_NAMESPACE = "megdet-system"
#: The user the controller's requests carry: the operator chart's ServiceAccount.
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{RELEASE}"
RUN_CRD = ROOT / "charts/megdet-operator/crds/megdetruns.megdet.io.yaml"
#: Nodes the cluster starts with; the rest are added with Cluster.add_nodes in batches.
FIRST_NODES = 4
NODE_BATCH = 50


def available() -> str | None:
    """None when a cluster can start here, else why not (binaries not built, no Go)."""
    from cluster import build

    try:
        build.find_go()  # the upstream CRDs are read from Go's module cache
    except build.BuildError as err:
        return str(err)
    missing = [c for c in ("kubernetes", "etcd", "kwok", "helm") if not build.is_built(c)]
    if missing:
        return f"control plane not built ({', '.join(missing)}): run `make cluster` once"
    return None


def _log(message: str) -> None:
    print(f"  [cluster] {message}", file=sys.stderr, flush=True)


class BenchCluster:
    """A control plane for one benchmark: start, install, hand out kubeconfigs, stop."""

    def __init__(
        self, nodes: int = 4, root: Path | None = None, training_operator: bool = False
    ) -> None:
        from cluster.control_plane import Cluster

        self.nodes = nodes
        self.training_operator = training_operator
        # A new folder of this user's (mkdtemp), not a name others can guess and make first.
        self.root = root or Path(tempfile.mkdtemp(prefix="megdet-bench-cluster-"))
        self.kube = Cluster(
            root=self.root,
            ports_mode="auto",
            nodes=min(nodes, FIRST_NODES),
            training_operator=training_operator,
            echo=_log,
        )
        self.controller_kubeconfig = self.root / "controller.kubeconfig"
        self.startup_s: dict[str, float] = {}

    # --- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> BenchCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self.kube.down()  # what an interrupted earlier run with this root left behind
        step = time.perf_counter()
        self.kube.up(timeout=300)
        self.startup_s["control_plane"] = time.perf_counter() - step
        step = time.perf_counter()
        first = min(self.nodes, FIRST_NODES)
        while first < self.nodes:
            count = min(NODE_BATCH, self.nodes - first)
            self.kube.add_nodes(first, count, timeout=300)
            first += count
        self.startup_s["nodes"] = time.perf_counter() - step
        step = time.perf_counter()
        self.install_crds()
        self.install_operator_chart()
        self.startup_s["crds_and_chart"] = time.perf_counter() - step
        _log(
            f"ready: {self.nodes} nodes, CRDs and the operator chart installed "
            f"({sum(self.startup_s.values()):.0f} s)"
        )

    def stop(self, keep_logs: Path | None = None) -> None:
        self.kube.down(keep_logs=keep_logs)

    # --- what the controller needs -----------------------------------------------------------
    def crd_files(self) -> dict[str, Path]:
        """CRD name -> upstream file: PyTorchJob, Trainer v2's kinds, MegDetRun."""
        operator = self.kube.module_dir("training_operator") / "manifests/base/crds"
        trainer = self.kube.module_dir("trainer") / "manifests/base/crds"
        return {
            "pytorchjobs.kubeflow.org": operator / "kubeflow.org_pytorchjobs.yaml",
            "trainjobs.trainer.kubeflow.org": trainer / "trainer.kubeflow.org_trainjobs.yaml",
            "trainingruntimes.trainer.kubeflow.org": (
                trainer / "trainer.kubeflow.org_trainingruntimes.yaml"
            ),
            "clustertrainingruntimes.trainer.kubeflow.org": (
                trainer / "trainer.kubeflow.org_clustertrainingruntimes.yaml"
            ),
            "megdetruns.megdet.io": RUN_CRD,
        }

    def install_crds(self) -> None:
        files = self.crd_files()
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise RuntimeError(f"CRD files missing: {', '.join(missing)}")
        for path in files.values():
            # Server-side: the upstream CRDs are too large for the last-applied annotation.
            self.kube.apply(path.read_text(), server_side=True)
        for name in files:
            self.kube.wait_established(name)
        # Established is not yet served: until a new CRD's watch cache is initialized, lists
        # and watches answer 429 "storage is (re)initializing" (the controller would retry).
        deadline = time.monotonic() + 60
        for name in files:
            while self.kube.kubectl("get", name, "-A", check=False, timeout=20).returncode:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not listable 60 s after it was established")
                time.sleep(0.2)

    def helm(self, *args: str, timeout: float = 180) -> str:
        proc = subprocess.run(
            [self.kube.binary("helm"), *args],
            env=self.kube.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def install_operator_chart(self) -> None:
        """`helm install` as a platform team runs it (Helm skips CRDs that exist), then a
        kubeconfig with a token of the chart's ServiceAccount for the controller."""
        self.helm(
            "install",
            RELEASE,
            "charts/megdet-operator",
            "-n",
            CONTROLLER_NAMESPACE,
            "--create-namespace",
        )
        from cluster.pki import kubeconfig

        token = self.kube.kubectl(
            "create", "token", RELEASE, "-n", CONTROLLER_NAMESPACE, "--duration=3h"
        ).stdout.strip()
        self.controller_kubeconfig.write_text(
            kubeconfig(
                self.kube.server,
                self.kube.pki / "ca.crt",
                f"{CONTROLLER_NAMESPACE}:{RELEASE}",
                token=token,
            )
        )
        self.controller_kubeconfig.chmod(0o600)

    def create_namespaces(self, names: Iterable[str]) -> None:
        docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names]
        self.kube.apply(docs)

    # --- counting ----------------------------------------------------------------------------
    def controller_requests(self, since: float, until: float) -> dict[str, Any]:
        """The controller's requests in [since, until] (wall clock), from the audit log."""
        by_verb: collections.Counter[str] = collections.Counter()
        by_call: collections.Counter[str] = collections.Counter()
        by_agent: collections.Counter[str] = collections.Counter()
        codes: collections.Counter[str] = collections.Counter()
        for event in self.kube.audit_events(CONTROLLER_USER):
            if event.get("stage") != "ResponseComplete":
                continue
            received = _timestamp(event.get("requestReceivedTimestamp"))
            if received is None or not since <= received <= until:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource") or event.get("requestURI", "?")
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            code = (event.get("responseStatus") or {}).get("code")
            by_verb[event["verb"]] += 1
            by_call[f"{event['verb']} {resource}"] += 1
            by_agent[(event.get("userAgent") or "?").split(" ")[0]] += 1
            if code is not None and code >= 300:
                codes[f"{event['verb']} {resource} {code}"] += 1
        return {
            "total": sum(by_verb.values()),
            "by_verb": dict(by_verb.most_common()),
            "by_call": dict(by_call.most_common()),
            "by_user_agent": dict(by_agent.most_common()),
            "non_2xx": dict(codes.most_common()),
        }

    def component_cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each control-plane process has used so far."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, pid in (self.kube.state() or {"pids": {}})["pids"].items():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return out

    def operator_requests(self) -> dict[str, float]:
        """The training operator's API requests so far, by method and answer code: client-go's
        ``rest_client_requests_total`` on its metrics endpoint (the audit log leaves the
        operators' user out). Empty without the training operator."""
        if not self.training_operator:
            return {}
        import urllib.request

        port = (self.kube.state() or {"ports": {}})["ports"]["training-operator-metrics"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return client_requests(resp.read().decode())

    def wait_quiet(
        self, pids: Iterable[int], quiet_s: float = 3.0, below: float = 0.05, timeout: float = 300
    ) -> float:
        """Wait until the processes ``pids`` together use less than ``below`` of a core for
        ``quiet_s`` in a row (the training operator and the controller done with the jobs'
        pods and status changes). Returns the seconds waited."""
        return harness.wait_quiet(list(pids), quiet_s, below, timeout, log=_log)

    def count_pods(self) -> dict[str, int]:
        """Pods by phase in every namespace (what the training operator made of the jobs)."""
        out = self.kube.kubectl(
            "get",
            "pods",
            "-A",
            "--no-headers",
            "-o",
            "custom-columns=P:.status.phase",
            timeout=120,
        ).stdout
        return dict(collections.Counter(out.split()))

    def expected_pods(self) -> int:
        """The pods the PyTorchJobs ask for: every replica spec's ``replicas``, summed."""
        out = self.kube.kubectl(
            "get", "pytorchjobs.kubeflow.org", "-A", "-o", "json", timeout=120
        ).stdout
        return sum(
            int(spec.get("replicas", 1))
            for job in json.loads(out).get("items", [])
            for spec in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        )

    def wait_for_pods(self, expected: int, timeout: float, every: float = 5.0) -> float:
        """Wait until the cluster holds ``expected`` pods (the training operator has made every
        job's); returns the seconds waited. The training operator's client is rate-limited, so
        it can look idle long before it is done: a wait for quiet alone stopped at 431 of
        2,750 pods."""
        started = time.perf_counter()
        while True:
            made = sum(self.count_pods().values())
            if made >= expected:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{made} of {expected} pods made in {timeout:.0f} s")
            _log(f"... {made} of {expected} pods")
            time.sleep(every)

    def jobs_by_kind(self) -> dict[str, int]:
        """PyTorchJobs and TrainJobs in every namespace."""
        out = {}
        for kind, resource in (
            ("PyTorchJob", "pytorchjobs.kubeflow.org"),
            ("TrainJob", "trainjobs.trainer.kubeflow.org"),
        ):
            text = self.kube.kubectl("get", resource, "-A", "-o", "name", timeout=120).stdout
            out[kind] = len(text.split())
        return out

    def count_jobs(self) -> int:
        return sum(self.jobs_by_kind().values())


def client_requests(metrics_text: str) -> dict[str, float]:
    """client-go's ``rest_client_requests_total`` samples in a Prometheus text page, summed by
    "METHOD CODE" (over hosts)."""
    import re

    out: dict[str, float] = collections.defaultdict(float)
    sample = re.compile(r"^rest_client_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
    for line in metrics_text.splitlines():
        found = sample.match(line)
        if found:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group("labels")))
            out[f"{labels.get('method', '?')} {labels.get('code', '?')}"] += float(
                found.group("value")
            )
    return dict(out)


def write_costs(bench: BenchCluster, client: RunClient, count: int) -> dict[str, dict[str, float]]:
    """The API server's CPU and the wall time per request of each kind a reconcile makes,
    ``count`` of each, one after another, with no controller running: which requests make
    the server's share of a run. In a namespace of its own (``write-costs``)."""
    from bench.controller_runs import cluster_body
    from megdet.controller.api import OWNED_KINDS
    from megdet.controller.planning import plan_children

    ns = "write-costs"
    bench.create_namespaces([ns])
    api = client.creator
    runs: list[dict[str, Any]] = []
    names = [f"cost-{i:04d}" for i in range(count)]

    def body(i: int) -> dict[str, Any]:
        run = cluster_body(i, count, 1)
        run["metadata"] = {"name": names[i], "namespace": ns}
        return run

    def make_run(i: int) -> None:
        runs.append(api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body(i)))

    owned: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)

    def plan(i: int) -> None:
        for obj in plan_children(runs[i]).objects:
            owned[obj["kind"]].append(obj)

    def create_owned(obj: dict[str, Any]) -> None:
        group, version = obj["apiVersion"].split("/")
        plural = OWNED_KINDS[(obj["apiVersion"], obj["kind"])]
        api.create_namespaced_custom_object(group, version, ns, plural, obj)

    def get_missing(i: int) -> None:
        with contextlib.suppress(client._k8s.ApiException):
            api.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", f"no-{i}")

    def patch_annotation(i: int) -> None:
        patch = {"metadata": {"annotations": {"megdet.io/bench": str(i)}}}
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, names[i], patch)

    def patch_status(i: int) -> None:
        patch = {"status": {"phase": "Pending", "jobName": names[i]}}
        api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, names[i], patch)

    out: dict[str, dict[str, float]] = {}

    def measure(label: str, calls: list[Callable[[], None]]) -> None:
        if not calls:
            return
        before = bench.component_cpu_s()
        started = time.perf_counter()
        for call in calls:
            call()
        wall = time.perf_counter() - started
        after = bench.component_cpu_s()
        out[label] = {
            "n": len(calls),
            "wall_ms": wall / len(calls) * 1e3,
            "apiserver_cpu_ms": (after["kube-apiserver"] - before["kube-apiserver"])
            / len(calls)
            * 1e3,
            "etcd_cpu_ms": (after["etcd"] - before["etcd"]) / len(calls) * 1e3,
        }

    idle_before = bench.component_cpu_s()
    time.sleep(3)
    idle_after = bench.component_cpu_s()
    out["idle (per second)"] = {
        "n": 3,
        "wall_ms": 1000.0,
        "apiserver_cpu_ms": (idle_after["kube-apiserver"] - idle_before["kube-apiserver"]) / 3e-3,
        "etcd_cpu_ms": (idle_after["etcd"] - idle_before["etcd"]) / 3e-3,
    }
    measure("create MegDetRun", [lambda i=i: make_run(i) for i in range(count)])
    for i in range(count):
        plan(i)
    measure("get PyTorchJob (404)", [lambda i=i: get_missing(i) for i in range(count)])
    for kind in ("PyTorchJob", "TrainingRuntime", "TrainJob"):
        measure(f"create {kind}", [lambda o=o: create_owned(o) for o in owned[kind]])
    measure("patch MegDetRun annotation", [lambda i=i: patch_annotation(i) for i in range(count)])
    measure("patch MegDetRun status", [lambda i=i: patch_status(i) for i in range(count)])
    return out


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return None


class RunClient:
    """The user's side: POST MegDetRuns with the admin kubeconfig and watch for their status.

    ``applied[(ns, name)]`` is when the create returned, ``status_seen[(ns, name)]`` when the
    watch first delivered the run with ``status.jobName`` set (both ``time.perf_counter``).
    """

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        config = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
        self._k8s = k8s
        self.creator = k8s.CustomObjectsApi(k8s.ApiClient(config))
        self.watcher = k8s.CustomObjectsApi(k8s.ApiClient(config))
        self.applied: dict[tuple[str, str], float] = {}
        self.status_seen: dict[tuple[str, str], float] = {}
        #: runs the watch saw deleted
        self.gone: set[tuple[str, str]] = set()
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._watching = threading.Event()
        #: lists made after the watch was told its version is too old (410 Gone)
        self.relists = 0

    def start_watch(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="run-watch", daemon=True)
        self._thread.start()
        if not self._watching.wait(30):
            raise RuntimeError(f"the MegDetRun watch did not start: {self._error!r}")

    def _watch(self) -> None:
        from kubernetes import watch

        try:
            version = self._relist()
            self._watching.set()
            while not self._stop.is_set():
                stream = watch.Watch().stream(
                    self.watcher.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    resource_version=version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    now = time.perf_counter()
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        # 410 Gone: the server's watch cache no longer holds our version (a
                        # burst of events between two watches). As an informer does: list
                        # again and watch from there; what the list shows is seen now.
                        self.relists += 1
                        version = self._relist()
                        break
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion", version)
                    if event["type"] == "DELETED":
                        with self.changed:
                            self.gone.add((meta["namespace"], meta["name"]))
                            self.changed.notify_all()
                        continue
                    if event["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    if (obj.get("status") or {}).get("jobName"):
                        key = (meta["namespace"], meta["name"])
                        if key not in self.status_seen:
                            with self.changed:
                                self.status_seen[key] = now
                                self.changed.notify_all()
                    if self._stop.is_set():
                        break
        except BaseException as err:  # reported by wait_for
            self._error = err
            self._watching.set()
            with self.changed:
                self.changed.notify_all()

    def _relist(self) -> str:
        """List every run; note those with a status naming their job, and those gone since
        the last list; returns the list's resourceVersion to watch from."""
        started = time.perf_counter()
        listed = self.watcher.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        now = time.perf_counter()
        present = set()
        with self.changed:
            for obj in listed.get("items") or []:
                meta = obj.get("metadata") or {}
                key = (meta.get("namespace"), meta.get("name"))
                present.add(key)
                if (obj.get("status") or {}).get("jobName") and key not in self.status_seen:
                    self.status_seen[key] = now
            # (a run created while the list was read may be missing from it, not gone)
            self.gone.update(
                k for k, at in list(self.applied.items()) if at < started and k not in present
            )
            self.changed.notify_all()
        return listed["metadata"]["resourceVersion"]

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one run; returns it as the server stored it (defaults applied)."""
        meta = body["metadata"]
        created = self.creator.create_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], PLURAL, body
        )
        self.applied[(meta["namespace"], meta["name"])] = time.perf_counter()
        return created

    def delete_all(self, timeout: float, threads: int = 8) -> float:
        """Delete every run this client created (the garbage collector takes what they own) and
        wait until the watch has seen each one go. Returns the seconds it took."""
        import concurrent.futures

        started = time.perf_counter()
        keys = sorted(self.applied)

        def delete(key: tuple[str, str]) -> None:
            self.creator.delete_namespaced_custom_object(GROUP, VERSION, key[0], PLURAL, key[1])

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(delete, keys))
        self.wait_for(lambda: self.gone.issuperset(keys), timeout, f"all {len(keys)} runs gone")
        return time.perf_counter() - started

    def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.perf_counter() + timeout
        last_report = time.perf_counter()
        with self.changed:
            while not done():
                if self._error is not None:
                    raise RuntimeError(f"the MegDetRun watch failed: {self._error!r}")
                now = time.perf_counter()
                if now > deadline:
                    raise RuntimeError(f"{what} not reached in {timeout:.0f} s")
                if now - last_report > 10:
                    _log(f"... {len(self.status_seen)} runs reconciled")
                    last_report = now
                self.changed.wait(min(1.0, deadline - now))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
