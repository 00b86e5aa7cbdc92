"""The MegDetRun operator: kopf handlers that validate a run, create its job and mirror it.

Three layers, so that most of it is tested without an API server:

- :func:`plan_children` (pure): a MegDetRun body -> :class:`Invalid` (field-named problems) or
  :class:`Planned` (every object the run chart renders, adopted: owner reference, namespace).
  It calls :func:`~megdet.controller.validation.validate_run` and
  :func:`~megdet.controller.render.render_run`; nothing here builds a job.
- :class:`Cluster` (the I/O seam): reads and writes objects with the official ``kubernetes``
  client (``CustomObjectsApi``), as kopf's own examples do from sync handlers.
- :func:`build_registry`: the kopf handlers, thin, wiring the two together.

Handlers are sync functions: kopf runs them in its thread pool, so the blocking client and the
in-process Helm render never stall kopf's event loop. kopf keeps its own bookkeeping in
annotations (see :func:`configure`), so ``status`` holds only the fields the CRD declares.
"""

from __future__ import annotations

import copy
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import urllib3.exceptions
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.problems import InvalidRunError, Problem
from megdet.controller.render import RenderedRun, render_run
from megdet.controller.status import (
    TERMINAL_PHASES,
    JobState,
    invalid_status,
    job_state,
    next_status,
    set_condition,
)
from megdet.controller.validation import validate_run, validate_update

__all__ = [
    "GROUP",
    "JOB_KINDS",
    "OWNED_KINDS",
    "PLURAL",
    "VERSION",
    "Backoff",
    "Cluster",
    "Invalid",
    "Planned",
    "build_registry",
    "configure",
    "owned_by",
    "plan_children",
]

logger = logging.getLogger(__name__)

GROUP = "megdet.io"
VERSION = "v1alpha1"
PLURAL = "megdetruns"
KIND = "MegDetRun"
RUN_API_VERSION = f"{GROUP}/{VERSION}"
#: kopf's finalizer on MegDetRuns: the delete handler runs before the run goes away.
FINALIZER = "megdet.io/controller"

#: Kinds the chart renders for a run -> their plural (the API path segment).
OWNED_KINDS: dict[tuple[str, str], str] = {
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjobs",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjobs",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainingruntimes",
}
#: The owned kinds that are the run's job (the rest are helpers such as the TrainingRuntime).
JOB_KINDS = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob"}
#: Conditional status writes tried before a reconcile gives up for now (kopf retries it).
STATUS_WRITE_ATTEMPTS = 5
#: Where each job kind keeps its suspend flag (PyTorchJob: runPolicy; TrainJob: spec).
SUSPEND_PATH = {"PyTorchJob": ("spec", "runPolicy", "suspend"), "TrainJob": ("spec", "suspend")}


# ------------------------------------------------------------------------------------------
# The pure part: a run -> the objects to own, or the problems that stop it.


@dataclass(frozen=True)
class Invalid:
    """A run the controller refuses; every problem names a field (``spec.gpus``)."""

    problems: tuple[Problem, ...]

    @property
    def messages(self) -> list[str]:
        return [str(p) for p in self.problems]


@dataclass(frozen=True)
class Planned:
    """What the controller creates for a valid run: the adopted objects, job first."""

    rendered: RenderedRun
    objects: tuple[dict[str, Any], ...]

    @property
    def job(self) -> dict[str, Any]:
        return self.objects[0]

    @property
    def target(self) -> str:
        return JOB_KINDS[self.job["kind"]]


def plan_children(run: Mapping[str, Any], old_spec: Any = None) -> Invalid | Planned:
    """Validate a MegDetRun and render what it owns. Never raises for any run body.

    ``old_spec`` (on an update) adds the transition rules: fields fixed at creation.
    """
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        missing = "metadata.name" if not isinstance(name, str) or not name else "metadata.namespace"
        return Invalid((Problem(missing, "a MegDetRun needs a name and a namespace"),))
    spec = run.get("spec")
    if spec is None:
        spec = {}
    try:
        if old_spec is not None:
            problems = validate_update(old_spec, spec, name=name, namespace=namespace)
        else:
            problems = validate_run(spec, name=name, namespace=namespace)
        if problems:
            return Invalid(tuple(problems))
        rendered = render_run(name, namespace, spec)
    except InvalidRunError as err:
        return Invalid(tuple(err.problems))
    job = rendered.job
    if (job.get("apiVersion"), job.get("kind")) not in OWNED_KINDS or job["kind"] not in JOB_KINDS:
        return Invalid((Problem("spec.target", f"the chart rendered a {job.get('kind')}"),))
    objects = [copy.deepcopy(o) for o in rendered.objects]
    unknown = [
        o.get("kind") for o in objects if (o.get("apiVersion"), o.get("kind")) not in OWNED_KINDS
    ]
    if unknown:
        # A kind outside the ClusterRole: creating it would fail with 403 on every retry.
        return Invalid(
            (Problem("spec", f"the chart rendered kinds the controller cannot own: {unknown}"),)
        )
    kopf.adopt(objects, owner=dict(run))
    return Planned(rendered=rendered, objects=tuple(objects))


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``obj`` carries an owner reference to the object with ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(ref.get("uid") == uid for ref in refs)


def run_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The MegDetRun owner reference of ``obj``, if it has one."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion") == RUN_API_VERSION:
            return ref
    return None


def suspend_of(obj: Mapping[str, Any]) -> bool:
    """The job's suspend flag (False when unset)."""
    value: Any = obj
    for key in SUSPEND_PATH[obj["kind"]]:
        value = value.get(key) if isinstance(value, Mapping) else None
    return bool(value)


def suspend_patch(kind: str, suspend: bool) -> dict[str, Any]:
    """A merge patch that sets the job's suspend flag."""
    patch: dict[str, Any] = {}
    node = patch
    *parents, leaf = SUSPEND_PATH[kind]
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = suspend
    return patch


def planned_status(
    old: Mapping[str, Any],
    planned: Planned,
    job: Mapping[str, Any] | None,
    now: str,
    generation: Any,
) -> dict[str, Any]:
    """Status for a run whose job exists (``job``) or was just created (``job=None``)."""
    status: dict[str, Any] = dict(planned.rendered.status_plan())
    status["jobName"] = planned.job["metadata"]["name"]
    status["target"] = planned.target
    status["observedGeneration"] = generation
    conditions = set_condition(
        old.get("conditions") or [],
        "Valid",
        True,
        "SpecValid",
        "the spec passed validation",
        now,
        generation,
    )
    conditions = set_condition(
        conditions,
        "Created",
        True,
        "JobCreated",
        f"{planned.job['kind']} {status['jobName']}",
        now,
        generation,
    )
    state = job_state(job) if job is not None else JobState("Pending", "JobCreated", "job created")
    status.update(next_status({**old, "conditions": conditions}, state, now, generation))
    return status


def not_created_status(
    old: Mapping[str, Any], reason: str, message: str, now: str, generation: Any
) -> dict[str, Any]:
    """Status for a valid run whose objects could not be created: ``Created=False``."""
    conditions = set_condition(
        old.get("conditions") or [], "Created", False, reason, message, now, generation
    )
    return {
        "phase": old.get("phase") or "Pending",
        "conditions": conditions,
        "observedGeneration": generation,
    }


def conflict_status(
    old: Mapping[str, Any], kind: str, name: str, now: str, generation: Any
) -> dict[str, Any]:
    """Status for a run whose job name is taken by an object it does not own."""
    return not_created_status(old, "JobNameConflict", conflict_message(kind, name), now, generation)


def conflict_message(kind: str, name: str) -> str:
    return (
        f"{kind} {name} already exists and is not owned by this MegDetRun; "
        "the controller never overwrites it: delete or rename that object"
    )


#: Who serves each kind the controller creates (for the message when a cluster lacks it).
KIND_PROVIDERS = {
    "PyTorchJob": "the Kubeflow training operator (kubeflow.org/v1)",
    "TrainJob": "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1)",
    "TrainingRuntime": "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1)",
}


class KindNotServed(Exception):
    """The API server answered 404 to creating an object: its kind is not installed."""

    def __init__(self, obj: Mapping[str, Any]) -> None:
        kind = obj["kind"]
        target = JOB_KINDS.get(kind, "trainjob")
        other = "pytorchjob" if target == "trainjob" else "trainjob"
        self.message = (
            f"{obj['apiVersion']} {kind} is not served by this cluster (creating it answered "
            f"404): install {KIND_PROVIDERS.get(kind, 'its operator')} or set "
            f"spec.target: {other} (spec.target is {target}); the controller watches the job "
            "kinds present when it starts, so restart it after installing"
        )
        super().__init__(self.message)


# ------------------------------------------------------------------------------------------
# The I/O seam.


class Cluster:
    """The API calls the controller makes, through the official ``kubernetes`` client.

    Every method raises ``kubernetes.client.ApiException`` or a urllib3 error on failure,
    except that reads return ``None``/``[]`` for 404. :func:`retryable` sorts the errors.
    """

    def __init__(self, api_client: k8s.ApiClient, timeout: float = 10.0) -> None:
        self.api = k8s.CustomObjectsApi(api_client)
        self.timeout = timeout

    @staticmethod
    def _ref(api_version: str, kind: str) -> tuple[str, str, str]:
        group, version = api_version.split("/", 1)
        return group, version, OWNED_KINDS[(api_version, kind)] if kind != KIND else PLURAL

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        """The object, or None when it does not exist."""
        group, version, plural = self._ref(api_version, kind)
        try:
            return self.api.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self.timeout
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise

    def create(self, obj: Mapping[str, Any]) -> dict:
        group, version, plural = self._ref(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"]["namespace"]
        return self.api.create_namespaced_custom_object(
            group, version, namespace, plural, dict(obj), _request_timeout=self.timeout
        )

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: Mapping) -> dict:
        group, version, plural = self._ref(api_version, kind)
        return self.api.patch_namespaced_custom_object(
            group, version, namespace, plural, name, dict(body), _request_timeout=self.timeout
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        group, version, plural = self._ref(api_version, kind)
        try:
            self.api.delete_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                body=k8s.V1DeleteOptions(propagation_policy="Background"),
                _request_timeout=self.timeout,
            )
        except k8s.ApiException as err:
            if err.status != 404:
                raise

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict]:
        """Objects of a kind in a namespace; [] when the kind is not installed."""
        group, version, plural = self._ref(api_version, kind)
        try:
            found = self.api.list_namespaced_custom_object(
                group, version, namespace, plural, _request_timeout=self.timeout
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return []
            raise
        return list(found.get("items") or [])

    def get_run(self, namespace: str, name: str) -> dict | None:
        return self.get(RUN_API_VERSION, KIND, namespace, name)

    def patch_run_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict:
        """Merge-patch the run's status subresource.

        With ``resource_version`` the patch is conditional: the API server applies it to the
        stored object and refuses the result with 409 Conflict unless the stored object still
        has that version (the patch's ``metadata.resourceVersion`` is a precondition, as with
        controller-runtime's ``MergeFromWithOptimisticLock``). A merge patch replaces lists
        whole, so an unconditional patch of ``conditions`` computed from a stale read would
        drop what another writer set in between.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, _request_timeout=self.timeout
        )


def retryable(err: BaseException) -> bool:
    """API errors worth retrying: conflicts, throttling, server errors, timeouts, resets."""
    if isinstance(err, k8s.ApiException):
        return err.status in (0, 409, 429) or (err.status or 0) >= 500
    return isinstance(err, urllib3.exceptions.HTTPError | TimeoutError | ConnectionError)


@dataclass(frozen=True)
class Backoff:
    """Retry delays for kopf.TemporaryError: ``base * 2**retry`` seconds, at most ``cap``."""

    base: float = 1.0
    cap: float = 60.0
    conflict_delay: float = 30.0

    def delay(self, retry: int) -> float:
        return min(self.cap, self.base * 2 ** min(retry, 30))


# ------------------------------------------------------------------------------------------
# State shared by the handlers of one operator: run phases for the runs gauge.


@dataclass
class _Phases:
    by_run: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        with self.lock:
            if phase is None:
                self.by_run.pop((namespace, name), None)
            else:
                self.by_run[(namespace, name)] = phase
            metrics.set_run_phases((ns, ph) for (ns, _), ph in self.by_run.items())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(body: Mapping[str, Any]) -> tuple[str, str, str | None, Any]:
    meta = body.get("metadata") or {}
    return meta.get("namespace"), meta.get("name"), meta.get("uid"), meta.get("generation")


def _phase_event(run: Mapping[str, Any], old: str | None, new: str, message: str) -> None:
    if old == new:
        return
    kind = "Warning" if new in ("Failed", "Invalid") else "Normal"
    text = f"phase {old or 'None'} -> {new}" + (f": {message}" if message else "")
    kopf.event(dict(run), type=kind, reason=new, message=text[:1000])


def _count_transition(namespace: str, target: str, old: str | None, new: str) -> None:
    if old == new:
        return
    counter = {
        "Succeeded": metrics.JOBS_SUCCESSFUL,
        "Failed": metrics.JOBS_FAILED,
        "Restarting": metrics.JOBS_RESTARTED,
    }.get(new)
    if counter is not None:
        counter.labels(namespace, target).inc()


def _condition_reason(status: Mapping[str, Any], kind: str) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("reason")
    return None


def _diff_touches(diff: Iterable[Any], path: tuple[str, ...]) -> bool:
    for _op, field_path, _old, _new in diff or ():
        n = min(len(field_path), len(path))
        if tuple(field_path[:n]) == path[:n]:
            return True
    return False


# ------------------------------------------------------------------------------------------
# The handlers.


def build_registry(
    cluster: Cluster,
    backoff: Backoff | None = None,
    now: Callable[[], str] = _now,
    observe: Callable[[float], None] | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry with the MegDetRun handlers bound to ``cluster``.

    ``observe`` (optional) receives each reconcile's duration in seconds, as the histogram
    does; the benchmark uses it for exact percentiles.
    """
    backoff = backoff or Backoff()
    registry = kopf.OperatorRegistry()
    phases = _Phases()

    def api_call(what: str, call: Callable[[], Any], retry: int) -> Any:
        try:
            return call()
        except Exception as err:
            if retryable(err):
                metrics.RECONCILES.labels("error").inc()
                raise kopf.TemporaryError(f"{what}: {err}", delay=backoff.delay(retry)) from err
            raise

    def write_status(
        run: Mapping[str, Any],
        compute: Callable[[Mapping[str, Any], Mapping[str, Any], bool], dict[str, Any] | None],
        message: str,
        retry: int,
    ) -> Mapping[str, Any] | None:
        """Write the run's status without losing another writer's update; returns the old status.

        ``compute(old_status, run, refreshed)`` gives the status fields to write (None: nothing
        to write). The write is conditional on the run's resourceVersion; on 409 Conflict (the
        job mirror, kopf or another controller wrote in between) the run is read again and
        ``compute`` runs again on the fresh status with ``refreshed=True``, so the caller can
        re-read anything else it computed from. Returns the status the write was computed from,
        or None when nothing was written (nothing to write, or the run is gone).
        """
        namespace, name, uid, _gen = _meta(run)
        current: Mapping[str, Any] = run
        for attempt in range(STATUS_WRITE_ATTEMPTS):
            old_status = current.get("status") or {}
            status = compute(old_status, current, attempt > 0)
            if status is None:
                return None
            version = (current.get("metadata") or {}).get("resourceVersion")
            try:
                cluster.patch_run_status(namespace, name, status, version)
            except k8s.ApiException as err:
                if err.status != 409 or not version:
                    api_call("write status", _raiser(err), retry)
                    raise
                fresh = api_call("get run", lambda: cluster.get_run(namespace, name), retry)
                if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
                    return None  # deleted (or deleted and re-created) meanwhile
                current = fresh
                continue
            except Exception as err:
                api_call("write status", _raiser(err), retry)
                raise
            old = old_status.get("phase")
            new = status.get("phase") or old
            if new is not None:
                phases.set(namespace, name, new)
                _phase_event(current, old, new, message)
            return old_status
        metrics.RECONCILES.labels("error").inc()
        raise kopf.TemporaryError(
            f"write status: {STATUS_WRITE_ATTEMPTS} conflicts in a row", delay=backoff.delay(retry)
        )

    def reconcile(body: kopf.Body, reason: Any, diff: Any, old: Any, retry: int, **_: Any) -> None:
        started = time.perf_counter()
        old_spec = (old or {}).get("spec") if str(reason) == "update" else None
        try:
            _reconcile(dict(body), str(reason), diff, old_spec, retry)
        finally:
            elapsed = time.perf_counter() - started
            metrics.RECONCILE_DURATION.observe(elapsed)
            if observe is not None:
                observe(elapsed)

    def _reconcile(run: dict[str, Any], reason: str, diff: Any, old_spec: Any, retry: int) -> None:
        namespace, name, uid, generation = _meta(run)
        decision = plan_children(run, old_spec)
        if isinstance(decision, Invalid):
            problems = decision.messages
            # Becoming Invalid sends a Warning event (reason Invalid) that names the fields.
            write_status(
                run,
                lambda old, _run, _fresh: invalid_status(old, problems, now(), generation),
                "; ".join(problems),
                retry,
            )
            metrics.RECONCILES.labels("invalid").inc()
            return

        job: dict[str, Any] | None = None
        # Helpers (the TrainingRuntime) first, the job last: the job refers to them.
        for obj in (*decision.objects[1:], decision.job):
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            found = api_call(
                f"get {kind} {obj_name}",
                lambda o=obj: cluster.get(
                    o["apiVersion"], o["kind"], namespace, o["metadata"]["name"]
                ),
                retry,
            )
            if found is None:
                try:
                    found = _create(obj, retry)
                except KindNotServed as err:
                    not_created(run, "JobKindNotInstalled", err.message, generation, retry)
                    metrics.RECONCILES.labels("error").inc()
                    raise kopf.TemporaryError(err.message, delay=backoff.conflict_delay) from err
            if not owned_by(found, uid):
                not_created(
                    run, "JobNameConflict", conflict_message(kind, obj_name), generation, retry
                )
                metrics.RECONCILES.labels("conflict").inc()
                raise kopf.TemporaryError(
                    f"{kind} {obj_name} is not owned by this run", delay=backoff.conflict_delay
                )
            if obj is decision.job:
                job = found

        assert job is not None
        if reason == "update" and _diff_touches(diff, ("spec", "runPolicy", "suspend")):
            job = _sync_suspend(decision, job, retry)

        def status_with_job(old: Mapping[str, Any], _run: Any, refreshed: bool) -> dict[str, Any]:
            nonlocal job
            if refreshed:
                # Someone wrote the status since this reconcile read it; most likely the job
                # mirror, after a change of the job that this reconcile's copy predates.
                meta = decision.job["metadata"]
                job = (
                    api_call(
                        "get job",
                        lambda: cluster.get(
                            decision.job["apiVersion"],
                            decision.job["kind"],
                            namespace,
                            meta["name"],
                        ),
                        retry,
                    )
                    or job
                )
            assert job is not None
            return planned_status(
                old, decision, job if job.get("status") else None, now(), generation
            )

        job_name = decision.job["metadata"]["name"]
        write_status(run, status_with_job, f"{decision.job['kind']} {job_name}", retry)
        plan = decision.rendered.plan
        metrics.record_run_info(
            namespace, name, decision.target, plan.world_size, plan.global_batch, plan.lr
        )
        metrics.RECONCILES.labels("success").inc()

    def not_created(
        run: Mapping[str, Any], reason: str, message: str, generation: Any, retry: int
    ) -> None:
        """``Created=False`` with ``reason``; a Warning event once per episode, not per retry."""
        before = write_status(
            run,
            lambda old, _run, _fresh: not_created_status(old, reason, message, now(), generation),
            "",
            retry,
        )
        if before is not None and _condition_reason(before, "Created") != reason:
            kopf.warn(run, reason=reason, message=message)

    def _create(obj: Mapping[str, Any], retry: int) -> dict[str, Any]:
        namespace, obj_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            created = cluster.create(obj)
        except k8s.ApiException as err:
            if err.status == 404:  # the run's namespace exists, so the kind is what is missing
                raise KindNotServed(obj) from err
            if err.status != 409:
                api_call(f"create {obj['kind']} {obj_name}", _raiser(err), retry)
            # Someone (an earlier try whose answer was lost, or another object) holds the name.
            found = api_call(
                f"get {obj['kind']} {obj_name}",
                lambda: cluster.get(obj["apiVersion"], obj["kind"], namespace, obj_name),
                retry,
            )
            if found is None:
                raise kopf.TemporaryError(
                    f"{obj['kind']} {obj_name}: conflict", delay=backoff.delay(retry)
                ) from err
            return found
        except Exception as err:
            api_call(f"create {obj['kind']} {obj_name}", _raiser(err), retry)
            raise
        if obj["kind"] in JOB_KINDS:
            metrics.JOBS_CREATED.labels(namespace, JOB_KINDS[obj["kind"]]).inc()
        return created

    def _sync_suspend(decision: Planned, job: dict[str, Any], retry: int) -> dict[str, Any]:
        wanted = suspend_of(decision.job)
        if suspend_of(job) == wanted:
            return job
        meta = job["metadata"]
        return api_call(
            f"suspend {job['kind']} {meta['name']}",
            lambda: cluster.patch(
                job["apiVersion"],
                job["kind"],
                meta["namespace"],
                meta["name"],
                suspend_patch(job["kind"], wanted),
            ),
            retry,
        )

    for register in (kopf.on.create, kopf.on.resume, kopf.on.update):
        register(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")(reconcile)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="cleanup")
    def cleanup(body: kopf.Body, retry: int, **_: Any) -> None:
        """Delete what the run owns (the API server's GC would too; this also counts them)."""
        namespace, name, uid, _gen = _meta(body)
        for (api_version, kind), _plural in OWNED_KINDS.items():
            items = api_call(
                f"list {kind}", lambda a=api_version, k=kind: cluster.list(a, k, namespace), retry
            )
            for item in items:
                if not owned_by(item, uid):
                    continue
                item_name = item["metadata"]["name"]
                api_call(
                    f"delete {kind} {item_name}",
                    lambda a=api_version, k=kind, n=item_name: cluster.delete(a, k, namespace, n),
                    retry,
                )
                if kind in JOB_KINDS:
                    metrics.JOBS_DELETED.labels(namespace, JOB_KINDS[kind]).inc()
        metrics.forget_run(namespace, name)
        phases.set(namespace, name, None)

    def job_event(body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
        """Mirror an owned job's status into its MegDetRun's status."""
        if type == "DELETED" or not body.get("status"):
            return  # deleted, or just created: the run's reconcile wrote its first status
        job = dict(body)
        ref = run_owner(job)
        namespace = job["metadata"].get("namespace")
        run = api_call("get run", lambda: cluster.get_run(namespace, ref["name"]), retry)
        if run is None or (run.get("metadata") or {}).get("uid") != ref.get("uid"):
            return
        state = job_state(job)

        def mirrored(old: Mapping[str, Any], current: Mapping[str, Any], _: bool) -> dict | None:
            meta = current.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                return None
            if old.get("phase") in (None, "Invalid"):
                return None  # the run's own reconcile writes its first status
            patch = next_status(old, state, now(), meta.get("generation"))
            if all(old.get(k) == v for k, v in patch.items()):
                return None
            return patch

        before = write_status(run, mirrored, state.message, retry)
        if before is None:
            return
        _count_transition(namespace, JOB_KINDS[job["kind"]], before.get("phase"), state.phase)
        if state.phase in TERMINAL_PHASES:
            logger.info("run %s/%s %s", namespace, ref["name"], state.phase)

    def _owned_by_run(body: kopf.Body, **_: Any) -> bool:
        return run_owner(body) is not None

    for (api_version, kind), plural in OWNED_KINDS.items():
        if kind in JOB_KINDS:
            group, version = api_version.split("/", 1)
            kopf.on.event(
                group, version, plural, registry=registry, when=_owned_by_run, id=f"mirror-{kind}"
            )(job_event)
    return registry


def _raiser(err: BaseException) -> Callable[[], Any]:
    def call() -> Any:
        raise err

    return call


def configure(
    settings: kopf.OperatorSettings,
    *,
    peering: str | None,
    fast: bool = False,
    workers: int | None = None,
) -> None:
    """Operator settings: bookkeeping in annotations, our finalizer, peering, timings.

    ``fast`` shortens kopf's batching and posting delays (tests and the benchmark).
    """
    # kopf's default "smart" storage also writes status.kopf, which the CRD's structural schema
    # would prune; annotations keep status to the fields the CRD declares.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="megdet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="megdet.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    # Scanning watches CRDs and namespaces; the controller serves fixed resources cluster-wide,
    # so it needs neither (and neither do its RBAC rules).
    settings.scanning.disabled = True
    # Events: ours (one per phase change, kopf.event) always post; of kopf's own log lines only
    # warnings and errors become Events ("Handler succeeded" on every reconcile is noise and
    # an API call per run).
    settings.posting.level = logging.WARNING
    if workers is not None:
        # Sync handlers run in kopf's thread pool; more threads than cores only adds GIL
        # contention to the CPU-bound part (validate + render), see docs/benchmarks.md.
        settings.execution.max_workers = workers
    if peering:
        settings.peering.name = peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = True
    else:
        settings.peering.standalone = True
    if fast:
        settings.queueing.idle_timeout = 1.0
        settings.queueing.exit_timeout = 1.0
        settings.queueing.error_delays = (0.1, 0.2, 0.5, 1.0)
        settings.posting.idle_timeout = 0.2
        settings.watching.reconnect_backoff = 0.05
        settings.peering.lifetime = 3
        settings.networking.error_backoffs = (0.05, 0.1, 0.2)
