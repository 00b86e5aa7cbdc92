"""Helpers for the controller tests: kmock as the API server, the operator in its own thread.

No kube-apiserver can run on this machine, so these tests talk to kmock (an in-memory emulator
of the Kubernetes API by kopf's author): real HTTP, list/watch/create/patch/delete, but no
schema validation, no defaulting, no garbage collection, no uids or resourceVersions. The tests
therefore create MegDetRuns with a ``uid`` and ``generation`` as the API server would assign.

The operator is the real one (:func:`megdet.controller.operator.build_registry`, real kopf,
the official ``kubernetes`` client), run by ``kopf.operator`` in a thread with its own event
loop while kmock serves from the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import jsonpatch
import kmock as kmock_lib
import kopf
import pytest_asyncio
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.diffbase import FIELD as HANDLED_FIELD
from megdet.controller.kubeapi import Backoff, Cluster
from megdet.controller.operator import build_registry, configure, limit_workers
from megdet.controller.reconciler import Reconciler
from megdet.policy import Policy

NAMESPACE = "vision"
RUNS = "megdet.io/v1alpha1/megdetruns"
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
RUNTIMES = "trainer.kubeflow.org/v1alpha1/trainingruntimes"
NETWORKPOLICIES = "networking.k8s.io/v1/networkpolicies"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
NS_PEERINGS = "kopf.dev/v1/kopfpeerings"  # an operator serving some namespaces peers in each
PEERING_NAME = "megdet-test"

#: Short delays so a retry or a kopf batch costs tens of milliseconds, not seconds.
FAST_BACKOFF = Backoff(base=0.05, cap=0.4, conflict_delay=0.3)

#: The resources the emulator serves, as an API server with the operator's CRDs would.
RESOURCES: dict[str, dict[str, Any]] = {
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "v1/events": {"kind": "Event", "namespaced": True},
    RUNS: {
        "kind": "MegDetRun",
        "namespaced": True,
        "shortnames": ["mdr"],
        "subresources": ["status"],
    },
    PYTORCHJOBS: {"kind": "PyTorchJob", "namespaced": True, "subresources": ["status"]},
    TRAINJOBS: {"kind": "TrainJob", "namespaced": True, "subresources": ["status"]},
    RUNTIMES: {"kind": "TrainingRuntime", "namespaced": True},
    NETWORKPOLICIES: {"kind": "NetworkPolicy", "namespaced": True},
    WORKLOADS: {"kind": "Workload", "namespaced": True},
    # The progress endpoint (OperatorThread(progress=...)): the CA ConfigMaps, the shared CA
    # Secret, the pods a report's token is bound to (and the active replica's own pod).
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "v1/pods": {"kind": "Pod", "namespaced": True},
    # As the chart's CRD declares it: no status subresource (kopf patches the object itself).
    PEERINGS: {"kind": "ClusterKopfPeering", "namespaced": False},
    NS_PEERINGS: {"kind": "KopfPeering", "namespaced": True},
}
VERBS = ["list", "watch", "get", "create", "patch", "delete"]


def declare_resources(api: Any) -> None:
    """Declare every resource the controller touches, with discovery info."""
    for key, info in RESOURCES.items():
        api.resources[key] = kmock_lib.ResourceInfo(verbs=VERBS, **info)


class Emulator(kmock_lib.KubernetesEmulator):
    """kmock's emulator plus what every API server does and kmock does not.

    - ``metadata.generateName``: kopf names its Events that way; kmock would store them all
      under no name and answer 409 from the second Event on.
    - ``metadata.resourceVersion`` bumped on every write: kopf skips watch events older than
      its own last patch by this number; with a constant version it re-handles stale events.
      A JSON-patch ``test`` of an outdated version fails with 422, as kopf expects; a merge
      patch that carries an outdated ``metadata.resourceVersion`` fails with 409 Conflict, as
      the API server's optimistic concurrency does.
      A list reports the current version, and a watch from that version sends only objects
      changed since (kmock re-sends every object, so kopf saw each run twice at start-up).
    - ``metadata.uid`` on create when absent (owner references point at uids).
    """

    _versions = itertools.count(1000)
    _latest = 1000
    #: Called with every write request before the emulator applies it; tests stage races by
    #: changing objects there (:meth:`write_quietly`), between a client's read and its write.
    before_write: list[Callable[[Any], None]]
    #: Called with every delete request first: the first answer that is not None is the
    #: response, and the object stays (as the API server keeps an object being deleted in the
    #: foreground until its dependents are gone).
    before_delete: list[Callable[[Any], Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.before_write = []
        self.before_delete = []

    def write_quietly(self, resource: str, name: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a stored object as a write whose watch event was already
        handled: the resourceVersion moves on, no watcher hears of it."""
        stored = self._objects[kmock_lib.resource(resource), NAMESPACE, name]
        stored.patch({**changes, "metadata": {"resourceVersion": self._next_version()}})

    def _next_version(self) -> str:
        Emulator._latest = next(self._versions)
        return str(Emulator._latest)

    async def _serve_list(self, request: Any) -> Any:
        listed = await super()._serve_list(request)
        listed["metadata"]["resourceVersion"] = str(Emulator._latest)
        return listed

    async def _serve_watch(self, request: Any) -> Any:
        since = request.params.get("resourceVersion", "")
        async for event in super()._serve_watch(request):
            added = isinstance(event, dict) and event.get("type") == "ADDED"
            obj = event.get("object") if added else None
            if since.isdigit() and isinstance(obj, dict):
                version = (obj.get("metadata") or {}).get("resourceVersion", "")
                if version.isdigit() and int(version) <= int(since):
                    continue  # listed already: a real watch from `since` does not repeat it
            yield event

    def _check_precondition(self, request: Any, wanted: Any) -> None:
        """A merge patch that carries a resourceVersion applies only to that version."""
        if wanted is None:
            return
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return  # kmock answers 404 itself
        stored = self._objects[key]
        current = (stored.get("metadata") or {}).get("resourceVersion")
        if str(wanted) != str(current):
            raise kmock_lib.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"the object has been modified (resourceVersion {current}, "
                f"not {wanted}); please apply your changes to the latest version and try again",
            )

    async def _handle(self, request: Any) -> Any:
        if request.action in (kmock_lib.action.CREATE, kmock_lib.action.UPDATE):
            for hook in list(self.before_write):
                hook(request)
        if request.action == kmock_lib.action.DELETE:
            for hook in list(self.before_delete):
                answer = hook(request)
                if answer is not None:
                    return answer
        data = request.data
        version = self._next_version()
        if request.action == kmock_lib.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = version
        elif request.action == kmock_lib.action.UPDATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            self._check_precondition(request, meta.get("resourceVersion"))
            meta["resourceVersion"] = version
        elif request.action == kmock_lib.action.UPDATE and isinstance(data, list):
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as err:
            raise kmock_lib.KubernetesError(
                status=422, reason="Invalid", message=str(err)
            ) from None


@contextlib.asynccontextmanager
async def emulated() -> AsyncIterator[Any]:
    """The emulator, served, with the controller's resources declared and the run namespace
    present."""
    async with Emulator() as kmock, kmock_lib.Server(kmock):
        declare_resources(kmock)
        kmock.objects["v1/namespaces", None, NAMESPACE] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE},
        }
        yield kmock


@pytest_asyncio.fixture()
async def cluster() -> AsyncIterator[Any]:
    """:func:`emulated`, for a test."""
    async with emulated() as kmock:
        yield kmock


def run_body(name: str, spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    """A MegDetRun as the API server would store it (with a uid and a generation)."""
    return {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": meta.pop("uid", str(uuid.uuid4())),
            "generation": meta.pop("generation", 1),
            **meta,
        },
        "spec": spec if spec is not None else {"gpus": 8},
    }


async def apply(api: Any, body: dict[str, Any]) -> None:
    """POST an object to the emulator (its watchers see ADDED, as from `kubectl apply`)."""
    meta = body["metadata"]
    group, version = (
        body["apiVersion"].rsplit("/", 1) if "/" in body["apiVersion"] else ("", body["apiVersion"])
    )
    plural = {
        "MegDetRun": "megdetruns",
        "PyTorchJob": "pytorchjobs",
        "TrainJob": "trainjobs",
        "TrainingRuntime": "trainingruntimes",
        "Pod": "pods",
    }[body["kind"]]
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    resp = await api.post(f"{prefix}/namespaces/{meta['namespace']}/{plural}", json=body)
    assert resp.status in (200, 201), await resp.text()


async def patch(
    api: Any, resource: str, name: str, body: dict[str, Any], *, status: bool = False
) -> None:
    """A merge patch on an object (or its status), as a user or another controller would."""
    group_version, plural = resource.rsplit("/", 1)
    prefix = (
        f"/apis/{group_version}" if "." in group_version.split("/")[0] else f"/api/{group_version}"
    )
    url = f"{prefix}/namespaces/{NAMESPACE}/{plural}/{name}" + ("/status" if status else "")
    resp = await api.patch(url, json=body, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200, await resp.text()


async def edit(api: Any, name: str, generation: int, spec: dict[str, Any]) -> None:
    """A spec edit of run ``name``, with the generation the API server would give it (kmock
    does not)."""
    await patch(api, RUNS, name, {"metadata": {"generation": generation}, "spec": spec})


def run_status(api: Any, name: str) -> dict[str, Any]:
    """A MegDetRun's status as stored ({} before the first write)."""
    return (get(api, RUNS, name) or {}).get("status") or {}


def phase(api: Any, name: str) -> str | None:
    return run_status(api, name).get("phase")


def condition(api: Any, name: str, kind: str) -> dict[str, Any] | None:
    """The run's condition of type ``kind``, if it has one."""
    conditions = run_status(api, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def cond(kind: str, status: str = "True", reason: str = "") -> dict[str, Any]:
    """A PyTorchJob condition as the Kubeflow training operator writes it."""
    return {
        "type": kind,
        "status": status,
        "reason": reason or f"PyTorchJob{kind}",
        "message": kind,
    }


async def job_condition(api: Any, name: str, *conditions: dict[str, Any], **extra: Any) -> None:
    """Write a PyTorchJob's status as the Kubeflow training operator would."""
    await patch(
        api, PYTORCHJOBS, name, {"status": {"conditions": list(conditions), **extra}}, status=True
    )


def delay(api: Any, match: Callable[[Any], bool], seconds: float) -> list[float]:
    """Hold the first request that ``match``es for ``seconds`` before the emulator serves it.

    Returns a list that gets the ``time.monotonic()`` of its arrival, then of its release.
    """
    held: list[float] = []

    async def react(request: Any) -> Any:
        if held or not match(request):
            raise NotImplementedError  # not ours: kmock serves it
        held.append(time.monotonic())
        await asyncio.sleep(seconds)
        held.append(time.monotonic())
        raise NotImplementedError  # served now, after the hold

    api << react
    return held


def arrivals(api: Any, match: Callable[[Any], bool]) -> list[float]:
    """The ``time.monotonic()`` of every later request that ``match``es (it grows)."""
    seen: list[float] = []

    async def react(request: Any) -> Any:
        if match(request):
            seen.append(time.monotonic())
        raise NotImplementedError  # kmock serves it

    api << react
    return seen


async def delete(api: Any, resource: str, name: str) -> None:
    group_version, plural = resource.rsplit("/", 1)
    resp = await api.delete(f"/apis/{group_version}/namespaces/{NAMESPACE}/{plural}/{name}")
    assert resp.status == 200, await resp.text()


async def collect_garbage(api: Any) -> list[str]:
    """Delete every object whose owners are all gone, as the cluster's garbage collector does
    (kmock runs none; tests/e2e/test_faults.py shows the real one). Runs carry no finalizer and
    the controller deletes nothing of a deleted run: on kmock, a test that needs a deleted
    run's job gone calls this. Returns "kind/name" of each object deleted."""
    items = [(key, dict(obj.raw)) for key, obj in list(api.objects.items()) if not obj.deleted]
    live = {(body.get("metadata") or {}).get("uid") for _key, body in items}
    collected = []
    for (res, ns, name), body in items:
        owners = (body.get("metadata") or {}).get("ownerReferences") or []
        if not owners or any(ref.get("uid") in live for ref in owners):
            continue
        prefix = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        resp = await api.delete(f"{prefix}/namespaces/{ns}/{res.plural}/{name}")
        assert resp.status == 200, await resp.text()
        collected.append(f"{body.get('kind')}/{name}")
    return collected


def objects(api: Any, resource: str) -> dict[str, dict[str, Any]]:
    """Live (not deleted) objects of a resource in the test namespace, by name."""
    out = {}
    for (res, ns, name), obj in list(api.objects.items()):
        if res == kmock_lib.resource(resource) and ns == NAMESPACE and not obj.deleted:
            out[name] = dict(obj.raw)
    return out


def get(api: Any, resource: str, name: str) -> dict[str, Any] | None:
    return objects(api, resource).get(name)


async def eventually(
    check: Callable[[], Any], timeout: float = 15.0, message: str = "condition"
) -> Any:
    """Poll ``check`` (on the test's loop, so kmock keeps serving) until it returns truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}; last value: {value!r}")
        await asyncio.sleep(0.02)


async def settle(seconds: float = 0.5) -> None:
    """Let the operator act on whatever it could still act on. Never enough on its own before
    a 'nothing else happens' check (that passes while the operator has simply not acted yet):
    wait first for something positive, e.g. :func:`reconciled` or :func:`counted`."""
    await asyncio.sleep(seconds)


#: kopf's record of the run's last handled spec/labels: in its status (controller/diffbase.py);
#: earlier controllers kept it in this annotation.
LAST_HANDLED = "megdet.io/last-handled-configuration"


def handled(api: Any, name: str) -> bool:
    """Whether kopf recorded the run's current spec and labels as handled: its reconcile ran to
    an end (success or a final refusal) for them and nothing is left to retry."""
    run = get(api, RUNS, name)
    if run is None:
        return False
    meta = run.get("metadata") or {}
    last = (run.get("status") or {}).get(HANDLED_FIELD)
    if not last:
        last = (meta.get("annotations") or {}).get(LAST_HANDLED)
    if not last:
        return False
    essence = json.loads(last)
    labels = (essence.get("metadata") or {}).get("labels") or {}
    return essence.get("spec") == run.get("spec") and labels == (meta.get("labels") or {})


async def reconciled(api: Any, *names: str, timeout: float = 15.0) -> None:
    """Wait until the reconcile of each run's current spec finished (:func:`handled`)."""
    for name in names:
        await eventually(lambda n=name: handled(api, n), timeout, f"{name} reconciled")


RECONCILE_COUNT = "megdet_controller_reconcile_duration_seconds_count"


def reconciles() -> float:
    """Reconcile calls so far (every one, whatever its result), across operator threads."""
    return metrics.sample(RECONCILE_COUNT)


async def counted(before: float, more: int = 1, name: str = RECONCILE_COUNT, **labels: str) -> None:
    """Wait until the metric ``name`` grew by ``more`` from ``before`` (default: reconciles)."""
    await eventually(
        lambda: metrics.sample(name, labels) >= before + more,
        message=f"{name}{labels or ''} to reach {before + more}",
    )


def run_reads(source: str | None = None) -> float:
    """Runs the status writer read (``source``: watch, server or stale; None: watch and
    server, every read) so far, across operator threads."""
    sources = (source,) if source else ("watch", "server")
    return sum(metrics.sample("megdet_controller_run_reads_total", {"source": s}) for s in sources)


async def run_read_after(before: float) -> None:
    """Wait until the status writer reads a run after ``before`` :func:`run_reads` (the job
    mirror reads its run, from its watch or the API server, for every job status event it
    handles)."""
    await eventually(lambda: run_reads() > before, message="the operator to read a run")


def events_for(api: Any, name: str) -> list[dict[str, Any]]:
    """Kubernetes Events posted about the object called ``name``."""
    return [
        e
        for e in objects(api, "v1/events").values()
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def requests_to(api: Any, method: str, path_suffix: str) -> list[Any]:
    """Requests the emulator received with this HTTP method and a path ending so."""
    return [r for r in list(api) if r.method == method and r.url.path.endswith(path_suffix)]


def is_create(plural: str) -> Callable[[Any], bool]:
    return lambda r: r.method == "POST" and r.url.path.endswith(f"/{plural}")


def is_status_patch(name: str) -> Callable[[Any], bool]:
    return lambda r: r.method == "PATCH" and r.url.path.endswith(f"/megdetruns/{name}/status")


def inject(api: Any, match: Callable[[Any], bool], fault: str, times: int) -> list[Any]:
    """Fail the first ``times`` requests that ``match``: "500", "409" or "timeout".

    kmock stores a created or patched object before any reaction answers, so an injected
    failure on a POST is a create whose answer was lost: the object exists, the client saw an
    error. "timeout" answers after the controller's client timeout (2 s in these tests).
    Returns the list of failed requests (it grows as they happen).
    """
    failed: list[Any] = []

    async def react(request: Any) -> Any:
        if not match(request) or len(failed) >= times:
            # "Matched, nothing to answer": kmock goes on to its emulated API and keeps this
            # reaction (returning None would disable it for good).
            raise NotImplementedError
        failed.append(request)
        if fault == "timeout":
            await asyncio.sleep(2.5)
            raise kmock_lib.KubernetesError(status=504, reason="Timeout", message="too late")
        status = int(fault)
        raise kmock_lib.KubernetesError(
            status=status, reason="Injected", message=f"injected {status}"
        )

    api << react
    return failed


def peers(api: Any, resource: Any, namespace: str | None) -> set[str]:
    """The identities in the peering object ``PEERING_NAME`` (kopf's records, by its status)."""
    for (res, ns, name), obj in list(api.objects.items()):
        if res == resource and ns == namespace and name == PEERING_NAME and not obj.deleted:
            return set((obj.raw.get("status") or {}).keys())
    return set()


class OperatorThread:
    """The real operator (kopf + our handlers) in a thread with its own event loop."""

    _ids = itertools.count()

    def __init__(
        self,
        url: str,
        *,
        peering: str | None = None,
        priority: int = 0,
        timeout: float = 2.0,
        job_cache: bool = True,
        backoff: Backoff = FAST_BACKOFF,
        policy: Policy | None = None,
        namespaces: list[str] | None = None,
        progress: str | None = None,
        progress_url: str = "",
        worker_limit: int = 0,
    ) -> None:
        """``progress``: also serve the progress endpoint (on 127.0.0.1, a free port), its CA
        in this Secret (NAMESPACE/NAME), from watches of its own whatever the peering says, as
        ``megdet controller`` does; ``progress_url``: the Reconciler's (``--progress-url``,
        given to the runs);
        ``worker_limit``: ``--worker-limit`` (0: none, as the other tests run kopf)."""
        self.url = url
        self.progress = progress
        self.progress_url = progress_url
        self.progress_service: Any = None
        self.reconciler: Reconciler | None = None
        self.namespaces = namespaces or []
        self.peering = peering
        self.priority = priority
        self.identity = f"operator-{next(self._ids)}"
        self.user_agent = f"megdet-controller/{self.identity}"
        self.timeout = timeout
        self.job_cache = job_cache
        self.backoff = backoff
        self.policy = policy
        self.worker_limit = worker_limit
        self.limit: Any = None  # the IndexedWorkerLimit, with worker_limit
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=self.identity, daemon=True)

    def _client(self) -> k8s.ApiClient:
        config = k8s.Configuration()
        config.host = self.url
        api = k8s.ApiClient(config)
        api.user_agent = self.user_agent
        return api

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # surfaced by stop()
            self.error = err

    async def _main(self) -> None:
        self.reconciler = Reconciler(
            Cluster(self._client(), timeout=self.timeout, cache=self.job_cache),
            self.backoff,
            policy=self.policy,
            progress_url=self.progress_url,
        )
        if self.progress is not None:
            self._start_progress()
        registry = build_registry(self.reconciler)

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True, default_namespace=NAMESPACE)

        settings = kopf.OperatorSettings()
        configure(settings, diffbase=self.reconciler.diffbase, peering=self.peering, fast=True)
        settings.peering.priority = self.priority
        if self.worker_limit:
            self.limit = limit_workers(registry, settings, self.worker_limit)
        await kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=not self.namespaces,
            namespaces=self.namespaces,
            identity=self.identity,
            stop_flag=self.stop_flag,
            ready_flag=self.ready_flag,
        )

    def _start_progress(self) -> None:
        from megdet.controller import progress_server

        self.progress_service = progress_server.start(
            self._client(),
            url="https://megdet-operator-progress.ops.svc:8443",
            port=0,
            addr="127.0.0.1",
            cert_dir=None,
            ca_secret=self.progress or "",
            interval=0.2,
            timeout=self.timeout,
            namespaces=list(self.namespaces),
        )

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(15)
        if self.progress_service is not None:
            self.progress_service.stop()
        if self.error is not None:
            raise self.error


async def start_operator(url: str, **kwargs: Any) -> OperatorThread:
    """Start an operator thread and wait (on the test's loop, so kmock serves) until ready."""
    op = OperatorThread(url, **kwargs)
    op.thread.start()
    await eventually(op.ready_flag.is_set, message=f"{op.identity} to start")
    return op


async def stop_operator(op: OperatorThread) -> None:
    """Stop an operator thread without blocking the loop kmock serves from."""
    await asyncio.to_thread(op.stop)


@pytest_asyncio.fixture()
async def operator(cluster: Any) -> AsyncIterator[OperatorThread]:
    """One operator (standalone, no peering) against the emulator."""
    op = await start_operator(str(cluster.url))
    yield op
    await stop_operator(op)
