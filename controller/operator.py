"""The MegDetRun operator: kopf handlers that validate a run, create its job and mirror it.

Three layers, so that most of it is tested without an API server:

- :func:`plan_children` (pure): a MegDetRun body -> :class:`Invalid` (field-named problems) or
  :class:`Planned` (every object the run chart renders, adopted: owner reference, namespace).
  It calls :func:`~megdet.controller.validation.validate_run` and
  :func:`~megdet.controller.render.render_run`; nothing here builds a job.
- :class:`Cluster` (the I/O seam): reads and writes objects with the official ``kubernetes``
  client (``CustomObjectsApi``), as kopf's own examples do from sync handlers.
- :func:`build_registry`: the kopf handlers, thin, wiring the two together, and one kopf
  index (``megdet_outputs``: runs by output folder) so a reconcile knows which other runs
  write where without listing the namespace.

Handlers are sync functions: kopf runs them in its thread pool, so the blocking client and the
in-process Helm render never stall kopf's event loop. kopf keeps its own bookkeeping in
annotations (see :func:`configure`), so ``status`` holds only the fields the CRD declares.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
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
from megdet.controller.progress import CA_CONFIG_MAP, Milestones
from megdet.controller.render import RenderedRun, default_renderer, render_run
from megdet.controller.status import (
    ACTIVE_PHASES,
    JOB_DELETED,
    JOB_REFUSED,
    TERMINAL_PHASES,
    JobState,
    finished,
    had_job,
    invalid_status,
    job_deleted_status,
    job_state,
    next_status,
    progress_patch,
    refused_at,
    refused_status,
    set_condition,
    trainjob_progress,
)
from megdet.controller.validation import validate_run, validate_update
from megdet.policy import Policy
from megdet.policy import check as check_policy

__all__ = [
    "GROUP",
    "JOB_KINDS",
    "OWNED_KINDS",
    "PLURAL",
    "RUN_ENV",
    "VERSION",
    "Backoff",
    "Cluster",
    "Invalid",
    "OutputClaim",
    "Planned",
    "build_registry",
    "configure",
    "controlled_by",
    "output_location",
    "owned_by",
    "plan_children",
    "refusal_message",
    "with_run_env",
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
    # spec.networkPolicy.enabled: the run's pods reachable only from each other and monitoring.
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
}
#: The owned kinds that are the run's job (the rest are helpers such as the TrainingRuntime).
JOB_KINDS = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob"}
#: Conditional status writes tried before a reconcile gives up for now (kopf retries it).
STATUS_WRITE_ATTEMPTS = 5
#: Where each job kind keeps its suspend flag (PyTorchJob: runPolicy; TrainJob: spec).
SUSPEND_PATH = {"PyTorchJob": ("spec", "runPolicy", "suspend"), "TrainJob": ("spec", "suspend")}
#: Env the controller gives every container of a run, through the chart's ``extraEnv`` (after
#: the user's entries, so these win: the kubelet keeps the last of equal names).
RUN_ENV = ("MEGDET_RUN_UID", "MEGDET_RUN_NAME")
#: The base URL of the controller's progress endpoint (``--progress-url``; controller/progress.py),
#: given to every run as the chart value ``progress`` (owned by the controller, not a spec
#: field); "" = progress reporting off. Set once at start by ``megdet controller``.
PROGRESS_URL = ""
#: A ``Checkpointed`` event every this many checkpoints (``--progress-checkpoint-events``).
CHECKPOINT_EVENTS = 5
#: HTTP statuses of a refused create that are not the job's fault, so are retried (401: the
#: controller's credentials; 404: the kind is not served; 408: a timeout; 409: the name is
#: taken; 429: throttling). Any other 4xx is the server refusing this job (schema, admission
#: webhook, ResourceQuota): see :class:`JobRefused`.
NOT_REFUSALS = frozenset({401, 404, 408, 409, 429})
#: The Valid condition's reason (and the event's) for a run outside the cluster's policy.
POLICY_DENIED = "PolicyDenied"


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


def plan_children(
    run: Mapping[str, Any], old_spec: Any = None, unsafe_weights: bool = False
) -> Invalid | Planned:
    """Validate a MegDetRun and render what it owns. Never raises for any run body.

    ``old_spec`` (on an update) adds the transition rules: fields fixed at creation.
    ``unsafe_weights``: the cluster policy's ``unsafeWeights``, the chart's
    ``allowUnsafeWeights`` (not a MegDetRun field: the operator decides).
    """
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        missing = "metadata.name" if not isinstance(name, str) or not name else "metadata.namespace"
        return Invalid((Problem(missing, "a MegDetRun needs a name and a namespace"),))
    spec = run.get("spec")
    if spec is None:
        spec = {}
    # The run's own env goes in before validation, so that validation's render is the one
    # render_run reuses (the renderer keeps recent renders by their values).
    spec = with_run_env(spec, name, meta.get("uid"))
    if old_spec is not None:
        old_spec = with_run_env(old_spec, name, meta.get("uid"))
    try:
        if old_spec is not None:
            problems = validate_update(old_spec, spec, name=name, namespace=namespace)
        else:
            problems = validate_run(spec, name=name, namespace=namespace)
        if problems:
            return Invalid(tuple(problems))
        values = with_progress(spec, name)
        if unsafe_weights and isinstance(values, Mapping):
            values = {**values, "allowUnsafeWeights": True}
        rendered = render_run(name, namespace, values)
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


def with_progress(spec: Any, name: str) -> Any:
    """``spec`` with the chart value ``progress`` when progress reporting is on (PROGRESS_URL).

    Added after validation (``progress`` is not a MegDetRun field: strict validation refuses
    it, as the API server does), so only the job's render sees it. The chart adds the run's
    path to the URL; the controller publishes the CA ConfigMap (controller/progress.py).
    """
    if not PROGRESS_URL or not isinstance(spec, Mapping):
        return spec
    return {**spec, "progress": {"url": PROGRESS_URL, "caConfigMap": CA_CONFIG_MAP}}


def with_run_env(spec: Any, name: str, uid: Any) -> Any:
    """``spec`` with ``MEGDET_RUN_UID`` and ``MEGDET_RUN_NAME`` appended to ``extraEnv``.

    The chart appends ``extraEnv`` to every container's env. A spec that is not an object, or
    whose ``extraEnv`` is not a list, is returned unchanged for validation to name.
    """
    if not isinstance(spec, Mapping):
        return spec
    extra = spec.get("extraEnv")
    if extra is None:
        extra = []
    if not isinstance(extra, list | tuple):
        return spec
    env = [{"name": RUN_ENV[1], "value": name}]
    if isinstance(uid, str) and uid:
        env.insert(0, {"name": RUN_ENV[0], "value": uid})
    return {**spec, "extraEnv": [*extra, *env]}


def _refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``obj`` carries an owner reference (controller or not) to ``uid``."""
    return uid is not None and any(ref.get("uid") == uid for ref in _refs(obj))


def controlled_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the MegDetRun with ``uid`` is ``obj``'s controller: the owner reference that
    :func:`kopf.adopt` writes (``controller: true``). Another object may name the run as a
    plain owner; that does not make it the run's."""
    return uid is not None and any(
        ref.get("uid") == uid and ref.get("controller") is True and ref.get("kind") == KIND
        for ref in _refs(obj)
    )


def run_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The MegDetRun controller reference of ``obj``, if it has one."""
    for ref in _refs(obj):
        if (
            ref.get("kind") == KIND
            and ref.get("apiVersion") == RUN_API_VERSION
            and ref.get("controller") is True
        ):
            return ref
    return None


def expected_job_name(run: Mapping[str, Any]) -> str | None:
    """The name of the run's job: ``status.jobName``, else the run's name (the chart names the
    job after the release, and the controller renders with the run's name as the release)."""
    status = run.get("status") if isinstance(run.get("status"), Mapping) else {}
    name = status.get("jobName") or (run.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else None


# ------------------------------------------------------------------------------------------
# Output folders: two live runs must not write one folder.


@functools.cache
def _default_output_claim() -> str:
    output = default_renderer().defaults.get("output")
    claim = output.get("claimName") if isinstance(output, Mapping) else None
    return claim if isinstance(claim, str) else ""


def output_location(run: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, PVC, folder) the run's pods write: ``spec.output.claimName`` (the chart's
    default when unset) mounted at /output, folder ``/output/<spec.runName or the run's name>``
    (the chart's ``--output``). None when the spec is too malformed to say (validation names it).
    """
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    spec = run.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(name, str) or not isinstance(namespace, str) or not isinstance(spec, Mapping):
        return None
    output = spec.get("output")
    if output is None:
        output = {}
    if not isinstance(output, Mapping):
        return None
    claim = output.get("claimName")
    if claim is None:
        claim = _default_output_claim()
    folder = spec.get("runName") or name
    if not isinstance(claim, str) or not claim or not isinstance(folder, str):
        return None
    return namespace, claim, folder


@dataclass(frozen=True)
class OutputClaim:
    """One run's entry in the ``megdet_outputs`` index (key: :func:`output_location`)."""

    name: str
    uid: str | None
    #: metadata.creationTimestamp ("" when unknown): the older of two waiting runs goes first.
    created: str
    #: The run has (had) its job: it goes first, whatever its age.
    has_job: bool
    #: The run may write the folder: not deleted, not finished, not Invalid without a job.
    live: bool
    phase: str | None


def output_claim(body: Mapping[str, Any]) -> dict[tuple[str, str, str], OutputClaim]:
    """The ``megdet_outputs`` index function: {output location: this run's claim}. Never raises
    (a body it cannot read indexes as nothing)."""
    try:
        key = output_location(body)
        if key is None:
            return {}
        meta = body.get("metadata") or {}
        status = body.get("status") if isinstance(body.get("status"), Mapping) else {}
        phase = status.get("phase")
        has_job = had_job(status)
        live = (
            not meta.get("deletionTimestamp")
            and phase not in TERMINAL_PHASES
            and not (phase == "Invalid" and not has_job)
        )
        claim = OutputClaim(
            name=str(meta.get("name")),
            uid=meta.get("uid"),
            created=str(meta.get("creationTimestamp") or ""),
            has_job=has_job,
            live=bool(live),
            phase=phase if isinstance(phase, str) else None,
        )
    except Exception as err:  # an index function that raises is retried by kopf on every event
        logger.warning(
            "cannot index the output folder of a MegDetRun: %s: %s", type(err).__name__, err
        )
        return {}
    return {key: claim}


def output_holder(index: Mapping[Any, Any] | None, run: Mapping[str, Any]) -> OutputClaim | None:
    """The other live run that goes before ``run`` at its output folder, if any.

    A run with a job goes first; between runs without one, the older (creationTimestamp, then
    name). So of two runs applied at once exactly one proceeds, and one that already trains is
    never blocked by a newer one.
    """
    key = output_location(run)
    if index is None or key is None:
        return None
    meta = run.get("metadata") or {}
    me = (str(meta.get("creationTimestamp") or ""), str(meta.get("name")))
    for _ in range(3):  # kopf updates the index on its loop while this thread reads it
        try:
            claims = list(index[key]) if key in index else []
            break
        except RuntimeError:
            continue
    else:
        return None
    before = [
        c
        for c in claims
        if c.live and c.uid != meta.get("uid") and (c.has_job or (c.created, c.name) < me)
    ]
    return min(before, key=lambda c: (not c.has_job, c.created, c.name), default=None)


def output_in_use_message(run: Mapping[str, Any], other: OutputClaim) -> str:
    _namespace, claim, folder = output_location(run) or ("", "", "")
    state = other.phase or "not started"
    return (
        f"the output folder /output/{folder} on PVC {claim} (spec.output.claimName, "
        f"spec.runName) is in use by MegDetRun {other.name} (phase {state}"
        f"{', job created' if other.has_job else ''}); two runs writing one folder overwrite "
        f"each other's checkpoints. This run's job is created once {other.name} has ended or "
        "is deleted (checked every 30 s); to run both, delete this run and re-create it with "
        "another spec.runName or spec.output.claimName"
    )


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
    """Status for a valid run whose objects could not be created: ``Created=False``.

    A run with no job is Pending; one that was Failed because its job was refused (the only
    way a run without a job gets a terminal phase) is Pending again while it waits.
    """
    conditions = set_condition(
        old.get("conditions") or [], "Created", False, reason, message, now, generation
    )
    phase = old.get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        phase = "Pending"
        for kind in ACTIVE_PHASES:
            if any(c.get("type") == kind and c.get("status") == "True" for c in conditions):
                conditions = set_condition(
                    conditions, kind, False, f"Not{kind}", "phase is Pending", now, generation
                )
    return {"phase": phase, "conditions": conditions, "observedGeneration": generation}


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


#: Longest server message kept in a condition (the API server's own limit is 32 KiB).
MAX_SERVER_MESSAGE = 2000


class JobRefused(Exception):
    """The API server refused to create an object for a reason that retrying does not fix."""

    def __init__(self, obj: Mapping[str, Any], err: k8s.ApiException, generation: Any) -> None:
        self.code = err.status
        self.message = refusal_message(obj, err, generation)
        super().__init__(self.message)


def refusal_message(obj: Mapping[str, Any], err: k8s.ApiException, generation: Any) -> str:
    """The server's own words (its Status ``message`` and ``details.causes``) and the fix."""
    body: Any = None
    try:
        body = json.loads(err.body) if isinstance(err.body, str | bytes) else err.body
    except ValueError:
        body = None
    if not isinstance(body, Mapping):
        body = {"message": str(err.body or "")}
    reason = body.get("reason") or err.reason or "Refused"
    text = str(body.get("message") or err.reason or "no message")
    details = body.get("details") if isinstance(body.get("details"), Mapping) else {}
    causes = details.get("causes") if isinstance(details.get("causes"), list) else []
    said = [
        f"{c.get('field')}: {c.get('message') or c.get('reason') or ''}".strip()
        if c.get("field")
        else str(c.get("message") or c.get("reason") or "")
        for c in causes
        if isinstance(c, Mapping)
    ]
    said = [s for s in said if s and s not in text]
    server = text + (f" (causes: {'; '.join(said)})" if said else "")
    if len(server) > MAX_SERVER_MESSAGE:
        server = server[: MAX_SERVER_MESSAGE - 3] + "..."
    meta = obj.get("metadata") or {}
    return (
        f"the API server refused to create {obj.get('kind')} {meta.get('name')} "
        f"(HTTP {err.status} {reason}): {server}. Not retried until the MegDetRun's spec "
        f"changes (metadata.generation {generation}): fix what the server names (the run's "
        "spec, or the namespace's ResourceQuota or admission policy) and edit the spec, or "
        "delete and re-create the run"
    )


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

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> None:
        """Delete (background propagation); with ``uid``, only that incarnation of the name
        (the API server answers 409 if the name now holds another object)."""
        group, version, plural = self._ref(api_version, kind)
        options = k8s.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=k8s.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.api.delete_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                body=options,
                _request_timeout=self.timeout,
            )
        except k8s.ApiException as err:
            if err.status != 404:
                raise

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
        return err.status in (0, 408, 409, 429) or (err.status or 0) >= 500
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
    policy: Policy | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry with the MegDetRun handlers bound to ``cluster``.

    ``observe`` (optional) receives each reconcile's duration in seconds, as the histogram
    does; the benchmark uses it for exact percentiles. ``policy``: the cluster's MegDet policy
    (default: the operator chart's secure defaults), checked before a run's job is created.
    """
    backoff = backoff or Backoff()
    policy = policy if policy is not None else Policy()
    registry = kopf.OperatorRegistry()
    phases = _Phases()
    #: (namespace, run) -> the TrainJob mirror's milestone events state.
    milestones: dict[tuple[str, str], Milestones] = {}

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
        phase_event: bool = True,
    ) -> Mapping[str, Any] | None:
        """Write the run's status without losing another writer's update; returns the old status.

        ``compute(old_status, run, refreshed)`` gives the status fields to write (None: nothing
        to write). The write is conditional on the run's resourceVersion; on 409 Conflict (the
        job mirror, kopf or another controller wrote in between) the run is read again and
        ``compute`` runs again on the fresh status with ``refreshed=True``, so the caller can
        re-read anything else it computed from. Returns the status the write was computed from,
        or None when nothing was written (nothing to write, or the run is gone).
        ``phase_event=False``: the caller posts its own event for a phase change.
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
                if phase_event:
                    _phase_event(current, old, new, message)
            return old_status
        metrics.RECONCILES.labels("error").inc()
        raise kopf.TemporaryError(
            f"write status: {STATUS_WRITE_ATTEMPTS} conflicts in a row", delay=backoff.delay(retry)
        )

    def reconcile(body: kopf.Body, reason: Any, diff: Any, old: Any, retry: int, **kw: Any) -> None:
        started = time.perf_counter()
        old_spec = (old or {}).get("spec") if str(reason) == "update" else None
        try:
            _reconcile(dict(body), str(reason), diff, old_spec, retry, kw.get(OUTPUTS_INDEX))
        finally:
            elapsed = time.perf_counter() - started
            metrics.RECONCILE_DURATION.observe(elapsed)
            if observe is not None:
                observe(elapsed)

    def _reconcile(
        run: dict[str, Any], reason: str, diff: Any, old_spec: Any, retry: int, outputs: Any
    ) -> None:
        namespace, name, uid, generation = _meta(run)
        seen = run.get("status") if isinstance(run.get("status"), Mapping) else {}
        if generation is not None and refused_at(seen) == generation:
            # The API server refused this spec's job; retried when the spec changes.
            return
        decision = plan_children(run, old_spec, unsafe_weights=policy.unsafeWeights)
        if isinstance(decision, Invalid):
            problems = decision.messages

            def invalid(old: Mapping[str, Any], _run: Any, _fresh: bool) -> dict[str, Any]:
                status = invalid_status(old, problems, now(), generation)
                if finished(old):
                    status["phase"] = old["phase"]  # a finished run's result stands
                return status

            # Becoming Invalid sends a Warning event (reason Invalid) that names the fields.
            write_status(run, invalid, "; ".join(problems), retry)
            metrics.RECONCILES.labels("invalid").inc()
            return

        wanted = decision.job
        kind, job_name = wanted["kind"], wanted["metadata"]["name"]
        job = api_call(
            f"get {kind} {job_name}",
            lambda: cluster.get(wanted["apiVersion"], kind, namespace, job_name),
            retry,
        )
        ours = job is not None and controlled_by(job, uid)
        if not ours and (had_job(seen) or finished(seen)):
            # The run had its job and it is gone (deleted while this controller was away, or
            # its name now holds someone else's object): never a second job.
            job_gone(run, kind, job_name, retry)
            metrics.RECONCILES.labels("success").inc()
            return
        if job is not None and not ours:
            conflict(run, kind, job_name, generation, retry)
        if job is None:
            holder = output_holder(outputs, run)
            if holder is not None:
                not_created(
                    run, "OutputInUse", output_in_use_message(run, holder), generation, retry
                )
                metrics.RECONCILES.labels("conflict").inc()
                raise kopf.TemporaryError(
                    f"output folder in use by MegDetRun {holder.name}",
                    delay=backoff.conflict_delay,
                )

        if job is None and not finished(seen):
            # The cluster's policy, before anything is created for the run (a job that exists
            # was allowed when it was made: a stricter policy later does not stop it).
            denied = [
                f"{path}: {message}" for path, message in check_policy(run.get("spec"), policy)
            ]
            if denied:
                policy_denied(run, denied, generation, retry)
                return

        # Helpers (the TrainingRuntime) first, the job last: the job refers to them. A finished
        # run creates nothing.
        creates = [] if finished(seen) else list(decision.objects[1:])
        if job is None:
            creates.append(wanted)
        for obj in creates:
            obj_kind, obj_name = obj["kind"], obj["metadata"]["name"]
            found = job if obj is wanted else None
            if obj is not wanted:
                found = api_call(
                    f"get {obj_kind} {obj_name}",
                    lambda o=obj: cluster.get(
                        o["apiVersion"], o["kind"], namespace, o["metadata"]["name"]
                    ),
                    retry,
                )
            if found is None:
                try:
                    found = _create(obj, generation, retry)
                except KindNotServed as err:
                    not_created(run, "JobKindNotInstalled", err.message, generation, retry)
                    metrics.RECONCILES.labels("error").inc()
                    raise kopf.TemporaryError(err.message, delay=backoff.conflict_delay) from err
                except JobRefused as err:
                    refused(run, err.message, generation, retry)
                    return
            if not controlled_by(found, uid):
                conflict(run, obj_kind, obj_name, generation, retry)
            if obj is wanted:
                job = found

        assert job is not None
        if (
            reason == "update"
            and not finished(seen)
            and _diff_touches(diff, ("spec", "runPolicy", "suspend"))
        ):
            job = _sync_suspend(decision, job, retry)

        def status_with_job(
            old: Mapping[str, Any], _run: Any, refreshed: bool
        ) -> dict[str, Any] | None:
            nonlocal job
            if refreshed:
                # Someone wrote the status since this reconcile read it; most likely the job
                # mirror, after a change of the job that this reconcile's copy predates.
                job = api_call(
                    "get job",
                    lambda: cluster.get(wanted["apiVersion"], kind, namespace, job_name),
                    retry,
                )
                if job is None or not controlled_by(job, uid):
                    return None  # deleted meanwhile: the job mirror records that
            assert job is not None
            return planned_status(
                old, decision, job if job.get("status") else None, now(), generation
            )

        write_status(run, status_with_job, f"{kind} {job_name}", retry)
        plan = decision.rendered.plan
        metrics.record_run_info(
            namespace, name, decision.target, plan.world_size, plan.global_batch, plan.lr
        )
        metrics.RECONCILES.labels("success").inc()

    def policy_denied(
        run: Mapping[str, Any], problems: list[str], generation: Any, retry: int
    ) -> None:
        """Outside the cluster's policy: phase Invalid, ``Valid=False`` (reason
        ``PolicyDenied``), one Warning event; retried when the spec or the policy changes."""

        def denied(old: Mapping[str, Any], _run: Any, _fresh: bool) -> dict[str, Any]:
            return invalid_status(old, problems, now(), generation, reason=POLICY_DENIED)

        before = write_status(run, denied, "", retry, phase_event=False)
        metrics.RECONCILES.labels("denied").inc()
        if before is not None and _condition_reason(before, "Valid") != POLICY_DENIED:
            message = "; ".join(problems)
            kopf.warn(run, reason=POLICY_DENIED, message=message[:1000])
            logger.warning("run %s/%s: %s", *_meta(run)[:2], message)

    def conflict(run: Mapping[str, Any], kind: str, name: str, generation: Any, retry: int) -> None:
        """An object of the name the run needs is not the run's: never overwritten, retried."""
        not_created(run, "JobNameConflict", conflict_message(kind, name), generation, retry)
        metrics.RECONCILES.labels("conflict").inc()
        raise kopf.TemporaryError(
            f"{kind} {name} is not owned by this run", delay=backoff.conflict_delay
        )

    def not_created(
        run: Mapping[str, Any], reason: str, message: str, generation: Any, retry: int
    ) -> None:
        """``Created=False`` with ``reason``; a Warning event once per episode, not per retry."""
        before = write_status(
            run,
            lambda old, _run, _fresh: not_created_status(old, reason, message, now(), generation),
            "",
            retry,
            phase_event=False,
        )
        if before is not None and _condition_reason(before, "Created") != reason:
            kopf.warn(run, reason=reason, message=message[:1000])

    def refused(run: Mapping[str, Any], message: str, generation: Any, retry: int) -> None:
        """The API server refused the job: phase Failed, ``Created=False`` (reason
        ``JobRefused``), one Warning event, counted; no retry until the spec changes."""
        before = write_status(
            run,
            lambda old, _run, _fresh: refused_status(old, message, now(), generation),
            message,
            retry,
            phase_event=False,
        )
        metrics.RECONCILES.labels("refused").inc()
        if before is not None:
            kopf.warn(run, reason=JOB_REFUSED, message=message[:1000])
            logger.warning("run %s/%s: %s", *_meta(run)[:2], message)

    def job_gone(
        run: Mapping[str, Any],
        kind: str,
        job_name: str,
        retry: int,
        final: JobState | None = None,
    ) -> None:
        """Record that the run's job is gone: ``JobPresent=False`` (reason ``JobDeleted``); a
        run that had not finished becomes Failed. One Warning event, counted as a deleted job.

        ``final`` is the job's last state (from the DELETED watch event): a job that finished
        and was deleted at once (TTL 0) still counts as Succeeded or Failed first.
        """
        namespace, name, _uid, generation = _meta(run)
        said: dict[str, Any] = {}

        def compute(old: Mapping[str, Any], current: Mapping[str, Any], _: bool) -> dict | None:
            said.clear()
            if (current.get("metadata") or {}).get("deletionTimestamp"):
                return None  # the run is being deleted: its cleanup deleted the job
            patch: dict[str, Any] = {}
            if final is not None and final.phase in TERMINAL_PHASES and not finished(old):
                patch = next_status(old, final, now(), generation)
                said["final"] = (old.get("phase"), final)
            gone = job_deleted_status({**old, **patch}, kind, job_name, now(), generation)
            if gone is not None:
                said["message"] = next(
                    c["message"] for c in gone["conditions"] if c["type"] == "JobPresent"
                )
            patch.update(gone or {})
            return patch or None

        before = write_status(run, compute, "", retry, phase_event=False)
        if before is None:
            return
        target = JOB_KINDS.get(kind, kind.lower())
        if "final" in said:
            old_phase, state = said["final"]
            _phase_event(run, old_phase, state.phase, state.message)
            _count_transition(namespace, target, old_phase, state.phase)
        if "message" in said:
            metrics.JOBS_DELETED.labels(namespace, target).inc()
            kopf.warn(run, reason=JOB_DELETED, message=said["message"][:1000])
            logger.warning("run %s/%s: %s", namespace, name, said["message"])

    def _create(obj: Mapping[str, Any], generation: Any, retry: int) -> dict[str, Any]:
        namespace, obj_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            created = cluster.create(obj)
        except k8s.ApiException as err:
            if err.status == 404:  # the run's namespace exists, so the kind is what is missing
                raise KindNotServed(obj) from err
            if 400 <= (err.status or 0) < 500 and err.status not in NOT_REFUSALS:
                raise JobRefused(obj, err, generation) from err
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

    # The runs by output folder, kept by kopf from its watch of MegDetRuns (filled before any
    # handler runs); a reconcile reads it instead of listing the namespace.
    kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=OUTPUTS_INDEX)(_index_outputs)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="cleanup")
    def cleanup(body: kopf.Body, retry: int, **_: Any) -> None:
        """Delete what the run owns (the API server's GC would too; this also counts them).

        By name, never by listing the namespace: the chart names the job and the
        TrainingRuntime after the run (``status.jobName``); each is read and deleted only if
        the run is its controller, and only that incarnation (a uid precondition).
        """
        namespace, name, uid, _gen = _meta(body)
        status = body.get("status") or {}
        names = sorted({n for n in (name, status.get("jobName")) if isinstance(n, str) and n})
        for (api_version, kind), _plural in OWNED_KINDS.items():
            if not _may_own(status.get("target"), kind):
                continue
            for item_name in names:
                item = api_call(
                    f"get {kind} {item_name}",
                    lambda a=api_version, k=kind, n=item_name: cluster.get(a, k, namespace, n),
                    retry,
                )
                if item is None or not controlled_by(item, uid):
                    continue
                item_uid = (item.get("metadata") or {}).get("uid")
                api_call(
                    f"delete {kind} {item_name}",
                    lambda a=api_version, k=kind, n=item_name, u=item_uid: cluster.delete(
                        a, k, namespace, n, u
                    ),
                    retry,
                )
                if kind in JOB_KINDS:
                    metrics.JOBS_DELETED.labels(namespace, JOB_KINDS[kind]).inc()
        metrics.forget_run(namespace, name)
        milestones.pop((namespace, name), None)
        phases.set(namespace, name, None)

    def job_event(body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
        """Mirror the run's job into the run's status; record a job that was deleted."""
        job = dict(body)
        ref = run_owner(job)
        if ref is None:
            return
        namespace = job["metadata"].get("namespace")
        if type != "DELETED" and not job.get("status"):
            return  # just created: the run's reconcile wrote its first status
        run = api_call("get run", lambda: cluster.get_run(namespace, ref["name"]), retry)
        if run is None or (run.get("metadata") or {}).get("uid") != ref.get("uid"):
            return
        if job["metadata"].get("name") != expected_job_name(run):
            return  # controlled by the run, but not the job it made (not ours to mirror)
        if type == "DELETED":
            final = job_state(job) if job.get("status") else None
            job_gone(run, job["kind"], job["metadata"]["name"], retry, final)
            return
        state = job_state(job)
        # target: trainjob: what the trainer reported to Trainer's status server, mirrored
        # into status.progress (only when it changed; None: nothing reported yet).
        progress, problems = trainjob_progress(job) if job["kind"] == "TrainJob" else (None, [])

        def mirrored(old: Mapping[str, Any], current: Mapping[str, Any], _: bool) -> dict | None:
            meta = current.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                return None
            if old.get("phase") in (None, "Invalid"):
                return None  # the run's own reconcile writes its first status
            patch = next_status(old, state, now(), meta.get("generation"))
            if all(old.get(k) == v for k, v in patch.items()):
                patch = {}
            changed = None if progress is None else progress_patch(old.get("progress"), progress)
            if changed is not None:
                patch["progress"] = changed
                if problems:
                    logger.warning(
                        "run %s/%s: TrainJob trainerStatus: %s",
                        namespace,
                        ref["name"],
                        "; ".join(problems),
                    )
            return patch or None

        before = write_status(run, mirrored, state.message, retry)
        if before is None:
            return
        if progress is not None:
            # Milestone events, as the pytorchjob endpoint posts them (controller/progress.py).
            key = (namespace, ref["name"])
            if key not in milestones:
                written = (
                    before.get("progress") if isinstance(before.get("progress"), Mapping) else {}
                )
                milestones[key] = Milestones.from_written(written, CHECKPOINT_EVENTS)
            for reason, message in milestones[key].note(progress, time.monotonic()):
                kopf.event(dict(run), type="Normal", reason=reason, message=message[:1000])
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


#: The kopf index of MegDetRuns by output folder (also the handlers' keyword argument).
OUTPUTS_INDEX = "megdet_outputs"


def _index_outputs(body: kopf.Body, **_: Any) -> dict[tuple[str, str, str], OutputClaim]:
    return output_claim(body)


def _may_own(target: Any, kind: str) -> bool:
    """Whether a run of ``target`` (status.target; unknown: any) can own objects of ``kind``."""
    if kind == "NetworkPolicy":
        return True
    if target == "pytorchjob":
        return kind == "PyTorchJob"
    if target == "trainjob":
        return kind in ("TrainJob", "TrainingRuntime")
    return True


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
