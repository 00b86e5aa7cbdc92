"""The controller's API layer: the calls it makes, and how it sorts their failures.

- :class:`Cluster` reads and writes objects with the official ``kubernetes`` client
  (``CustomObjectsApi``), as kopf's own examples do from sync handlers; reads answer ``None``
  for 404. With a :class:`JobCache` it answers "no such job" and "the job just created" from
  the controller's own watch of the jobs instead of asking the API server (:class:`JobCache`
  says why that is safe).
- :func:`retryable` and :class:`Backoff`: which failures kopf retries, and after how long.
- A refused create: :class:`KindNotServed` (404: the cluster lacks the kind),
  :class:`RefusalHeals` (a refusal that heals by itself or by an admin, not by the run's
  spec: a ResourceQuota without room, an admission check that looks up an object it does not
  see yet, the controller's own RBAC; :func:`heal_reason`) and :class:`JobRefused` (any other
  4xx outside :data:`NOT_REFUSALS`: only a spec edit fixes it), with the server's own words
  (:func:`refusal_message`).
"""

from __future__ import annotations

import collections
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3.exceptions
from kubernetes import client as k8s

from megdet.controller.api import (
    GROUP,
    KIND,
    KIND_BY_TARGET,
    OWNED_KINDS,
    PLURAL,
    RUN_API_VERSION,
    TARGET_BY_KIND,
    VERSION,
)

__all__ = [
    "KIND_PROVIDERS",
    "NOT_REFUSALS",
    "Backoff",
    "Cluster",
    "JobCache",
    "JobRefused",
    "KindNotServed",
    "RefusalHeals",
    "classify_refusal",
    "heal_reason",
    "refusal_message",
    "retryable",
]

#: HTTP statuses of a refused create that are not the job's fault, so are retried (401: the
#: controller's credentials; 404: the kind is not served; 408: a timeout; 409: the name is
#: taken; 429: throttling). Any other 4xx is the server refusing this job: retried if it heals
#: (:func:`heal_reason`: quota, an admission check's cache, RBAC), else final until the spec
#: changes (schema, an admission webhook's verdict): see :class:`JobRefused`.
NOT_REFUSALS = frozenset({401, 404, 408, 409, 429})

#: A refusal that heals (HTTP 403 only: what admission and authorization answer), by what its
#: Status message says -> the hint the run's condition gives. The quota admission plugin's
#: "exceeded quota: <name>, requested: ..." and "status unknown for quota" (a quota whose usage
#: the controller-manager has not computed yet; kubernetes plugin/pkg/admission/resourcequota);
#: an admission webhook or plugin that looks up an object and does not find it, as Trainer's
#: TrainJob webhook does for the TrainingRuntime the controller created a moment before
#: (``TrainingRuntime "r" not found: specified trainingRuntime must be created before the
#: TrainJob is created``: its informer cache has not seen it yet), or a namespace default an
#: admin has not created yet; RBAC's "cannot create resource" (the operator's ClusterRole).
HEALING_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"exceeded quota|status unknown for quota", re.IGNORECASE),
        "the namespace's ResourceQuota has no room for it now; created once other objects "
        "free it or the quota is raised",
    ),
    (
        re.compile(r"\bnot found\b|must be created before", re.IGNORECASE),
        "an admission check looks up an object it does not see yet (an object the controller "
        "has just created, which a webhook's cache sees a moment later, or a namespace default "
        "an admin has yet to create); created once it is visible",
    ),
    (
        re.compile(r"cannot create resource", re.IGNORECASE),
        "the controller's ServiceAccount may not create it (the operator chart's ClusterRole); "
        "created once an admin grants it",
    ),
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
        target = TARGET_BY_KIND.get(kind, "trainjob")
        (other,) = (t for t in KIND_BY_TARGET if t != target)
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

    def __init__(
        self, obj: Mapping[str, Any], err: k8s.ApiException, generation: Any, verb: str = "create"
    ) -> None:
        self.code = err.status
        self.message = refusal_message(obj, err, generation, verb)
        super().__init__(self.message)


class RefusalHeals(Exception):
    """The API server refused to create an object for a reason that heals without a spec edit
    (:func:`heal_reason`): retried with backoff, the run Pending with ``Retrying`` meanwhile."""

    def __init__(
        self, obj: Mapping[str, Any], err: k8s.ApiException, hint: str, verb: str = "create"
    ) -> None:
        self.code = err.status
        meta = obj.get("metadata") or {}
        reason, server = _server_words(err)
        self.message = (
            f"the API server refused to {verb} {obj.get('kind')} {meta.get('name')} for now "
            f"(HTTP {err.status} {reason}): {server}. Not final: {hint}. Retried with backoff"
        )
        super().__init__(self.message)


def classify_refusal(
    obj: Mapping[str, Any], err: k8s.ApiException, generation: Any, verb: str = "create"
) -> JobRefused | RefusalHeals | None:
    """A 4xx answer to writing ``obj`` outside :data:`NOT_REFUSALS` as the refusal it is: one
    that heals (:func:`heal_reason`) or a final one; None for anything else (retried as an
    API error, or sorted by the caller: 404, 409)."""
    status = err.status or 0
    if not 400 <= status < 500 or status in NOT_REFUSALS:
        return None
    hint = heal_reason(err)
    if hint is not None:
        return RefusalHeals(obj, err, hint, verb)
    return JobRefused(obj, err, generation, verb)


def heal_reason(err: k8s.ApiException) -> str | None:
    """The hint of a refusal that heals without a spec edit (:data:`HEALING_REFUSALS`); None
    for one that only a spec edit fixes (schema, a webhook's or policy's verdict on the spec)."""
    if err.status != 403:
        return None
    _reason, server = _server_words(err)
    for pattern, hint in HEALING_REFUSALS:
        if pattern.search(server):
            return hint
    return None


def _server_words(err: k8s.ApiException) -> tuple[str, str]:
    """(the Status reason, its message and ``details.causes``), bounded."""
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
    return str(reason), server


def refusal_message(
    obj: Mapping[str, Any], err: k8s.ApiException, generation: Any, verb: str = "create"
) -> str:
    """The server's own words (its Status ``message`` and ``details.causes``) and the fix."""
    reason, server = _server_words(err)
    meta = obj.get("metadata") or {}
    return (
        f"the API server refused to {verb} {obj.get('kind')} {meta.get('name')} "
        f"(HTTP {err.status} {reason}): {server}. Not retried until the MegDetRun's spec "
        f"changes (metadata.generation {generation}): fix what the server names (the run's "
        "spec, or the namespace's ResourceQuota or admission policy) and edit the spec, or "
        "delete and re-create the run"
    )


#: A job's fields the handlers read (:func:`slim_job`): who owns it, its uid and version, its
#: labels and annotations, its suspend flag (api.SUSPEND_PATH) and its status.
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "labels",
    "annotations",
)

#: kopf index id of the run-owned jobs of a kind (``megdet_jobs_pytorchjob``).
JOB_INDEX_PREFIX = "megdet_jobs_"


def slim_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """What :class:`JobCache` keeps of a job it created until the watch delivers it: the fields
    the handlers read (metadata that says whose it is, the suspend flag, the status); the pod
    templates and the rest of the spec stay out (a PyTorchJob's spec is most of its size)."""
    from megdet.controller.api import SUSPEND_PATH

    meta = body.get("metadata") or {}
    kind = body.get("kind")
    out: dict[str, Any] = {
        "apiVersion": body.get("apiVersion"),
        "kind": kind,
        "metadata": {k: copy.deepcopy(meta[k]) for k in _KEPT_METADATA if k in meta},
    }
    path = SUSPEND_PATH.get(str(kind))
    if path is not None:
        value: Any = body
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is not None:
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
    if "status" in body:
        out["status"] = copy.deepcopy(body["status"])
    return out


def version_of(obj: Mapping[str, Any] | None) -> int | None:
    """An object's resourceVersion as a number (etcd's revision), None if it is not one: the
    watch caches (JobCache, status_writer.RunViews) keep the newer of two copies by it."""
    text = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


class JobCache:
    """The run-owned jobs as the controller's own watch of them last delivered them (a kopf
    index per job kind, fed by the same watch as the job mirror: kopf fills it from its first
    list before any handler runs, and drops a job when the watch says it is deleted or no run
    controls it any more), so that job reads are not sent to the API server, as a
    controller-runtime client reads from its informer cache:

    - a job the watch has delivered: the index's copy (:func:`slim_job`: what the handlers
      read). It may be behind the API server by what the watch has not delivered yet; the
      status is level-triggered, and each change of the job is a watch event whose mirror
      reads the job again (the index is updated before the handlers of an event run);
    - "does the run's job exist?" when the watch has never seen it: no. A stale "no" (a job
      the watch has not delivered yet, or one no run controls: those are not indexed) makes
      the create answer 409, and the next read of that name asks the API server
      (:meth:`refresh`);
    - a job this process has just written (created or patched: the API server's answer), or
      read from the API server (a create answered 409: the job of an earlier try whose answer
      was lost): that answer, until the watch delivers that version of the job or a newer one
      (by resourceVersion: etcd's revision), so a reconcile never reads back an older state
      than its own write (a suspend it has just set). The answer is dropped when the index
      holds the delivered version, not when the indexing function is called: kopf stores the
      index entry after that call returns, and a read in between was answered "no such job",
      which left the run without a status (its reconcile saw no job to report, and the job's
      mirror leaves a job's first status to the reconcile). A job whose write the watch has not
      delivered after ``ttl`` seconds is read from the API server.

    A kind is answered from the cache only once its index has been seen (kopf hands every
    index to each indexing call); until then, and for every other kind, reads go to the API
    server. Nothing of a job outlives it: kopf drops a deleted job from its index.
    """

    def __init__(self, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        #: kind -> kopf's index for it (Mapping (namespace, name) -> Store of slim jobs).
        self._indices: dict[str, Mapping[Any, Any]] = {}
        #: (kind, namespace, name) -> (expiry, this process's answer, slimmed), oldest first.
        self._created: collections.OrderedDict[tuple[str, str, str], tuple[float, dict]] = (
            collections.OrderedDict()
        )
        #: names whose next read asks the API server (a create answered 409).
        self._refresh: set[tuple[str, str, str]] = set()
        #: reads answered here (from the watch, a write's answer, or "no such job") / sent to
        #: the server
        self.hits = 0
        self.misses = 0

    def register(self, registry: Any, when: Callable[..., bool] | None = None) -> None:
        """A kopf index per job kind on ``registry`` (``when``: which jobs; the mirror's
        filter, jobs a run controls)."""
        import kopf

        from megdet.controller.api import TARGET_BY_KIND

        ids = {}
        for (api_version, kind), plural in OWNED_KINDS.items():
            if kind not in TARGET_BY_KIND:
                continue
            group, version = api_version.split("/", 1)
            ids[kind] = JOB_INDEX_PREFIX + kind.lower()
            kopf.index(group, version, plural, registry=registry, id=ids[kind], when=when)(
                self._indexer(kind, ids[kind])
            )

        # kopf hands every index to every indexing call: a run's own event (indexed before its
        # handlers run) shows this the job indices before the first job exists, so the first
        # runs of a burst are answered too. It indexes nothing.
        async def see_job_indices(**kwargs: Any) -> dict[Any, Any]:
            if len(self._indices) < len(ids):
                with self._lock:
                    for kind, index_id in ids.items():
                        if kind not in self._indices and index_id in kwargs:
                            self._indices[kind] = kwargs[index_id]
            return {}

        kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=JOB_INDEX_PREFIX + "seen")(
            see_job_indices
        )

    def _indexer(self, kind: str, index_id: str) -> Callable[..., Any]:
        async def index(body: Mapping[str, Any], **kwargs: Any) -> dict[Any, Any]:
            # Async: kopf calls it on its event loop, no hop to its handler threads.
            # This process's answer for this job is dropped once the index holds it (_sweep),
            # not here: kopf stores what this returns after it returns.
            meta = body.get("metadata") or {}
            with self._lock:
                if kind not in self._indices and index_id in kwargs:
                    self._indices[kind] = kwargs[index_id]
            return {(meta.get("namespace"), meta.get("name")): slim_job(body)}

        index.__name__ = index.__qualname__ = f"index_{kind.lower()}"
        return index

    def __len__(self) -> int:
        """Jobs held: in the indices, written but not yet delivered by the watch, and names
        whose next read goes to the API server."""
        with self._lock:
            self._sweep()
            return (
                sum(len(i) for i in self._indices.values())
                + len(self._created)
                + len(self._refresh)
            )

    def serves(self, kind: str) -> bool:
        with self._lock:
            return kind in self._indices

    def lookup(self, kind: str, namespace: str, name: str) -> tuple[bool, dict | None]:
        """(answered, the job or None); ``answered`` False: ask the API server."""
        key = (kind, namespace, name)
        with self._lock:
            index = self._indices.get(kind)
            if index is None or key in self._refresh:
                self._refresh.discard(key)
                self.misses += 1
                return False, None
            self._sweep(key)
            created = self._created.get(key)
            if created is None and key in self._refresh:  # written, not delivered within ttl
                self._refresh.discard(key)
                self.misses += 1
                return False, None
        try:
            store = index.get((namespace, name))
            seen = list(store) if store else []
        except RuntimeError:  # changed while read (kopf's loop writes it): ask the server
            self.misses += 1
            return False, None
        found = [*seen, created[1]] if created is not None else seen
        if not found:
            self.hits += 1
            return True, None
        if any(version_of(j) is None for j in found):
            self.misses += 1
            return False, None
        self.hits += 1
        return True, copy.deepcopy(max(found, key=lambda j: version_of(j) or 0))

    def created(self, obj: Mapping[str, Any]) -> None:
        """This process created or patched ``obj``, or read it from the API server (its
        answer): answered from it until the watch delivers that version (or a newer one)."""
        kind, meta = str(obj.get("kind")), obj.get("metadata") or {}
        key = (kind, meta.get("namespace"), meta.get("name"))
        slim = slim_job(obj)
        with self._lock:
            if kind not in self._indices:
                return
            if self._delivered(key, slim):  # type: ignore[arg-type]
                return  # the watch delivered it before the answer came
            self._created.pop(key, None)  # type: ignore[arg-type]
            self._created[key] = (self._clock() + self.ttl, slim)  # type: ignore[index]
            self._refresh.discard(key)  # type: ignore[arg-type]
            self._sweep(key)  # type: ignore[arg-type]

    def refresh(self, kind: str, namespace: str, name: str) -> None:
        """The next read of this job asks the API server (a create of it answered 409: the
        cache's "no such job" was stale, or the name holds a job no run controls)."""
        with self._lock:
            if kind in self._indices:
                self._refresh.add((kind, namespace, name))
                self._created.pop((kind, namespace, name), None)

    def _sweep(self, key: tuple[str, str, str] | None = None) -> None:
        """Drop the answers older than ``ttl`` (their next read asks the API server unless
        the index holds the job by then), and the answer for ``key`` (every answer when None)
        once kopf's index holds that version of its job or a newer one (delivered). Under the
        lock; a lookup checks its own key only, so a read stays O(1) in a burst."""
        now = self._clock()
        while self._created:  # oldest first: one ttl for all, so ordered by expiry
            first, (expiry, _obj) = next(iter(self._created.items()))
            if expiry > now:
                break
            del self._created[first]
            if not self._delivered(first, _obj):
                self._refresh.add(first)
        for k in list(self._created) if key is None else [key]:
            entry = self._created.get(k)
            if entry is not None and self._delivered(k, entry[1]):
                del self._created[k]

    def _delivered(self, key: tuple[str, str, str], obj: Mapping[str, Any]) -> bool:
        """Whether kopf's index holds ``obj``'s job (its uid) at its version or newer."""
        kind, namespace, name = key
        uid, version = obj["metadata"].get("uid"), version_of(obj)
        try:
            store = self._indices[kind].get((namespace, name))
            seen = list(store) if store else []
        except RuntimeError:  # changed while read (kopf's loop writes it): look again later
            return False
        return any(
            (j.get("metadata") or {}).get("uid") == uid
            and (version is None or (version_of(j) or 0) >= version)
            for j in seen
        )


class Cluster:
    """The API calls the controller makes, through the official ``kubernetes`` client.

    Every method raises ``kubernetes.client.ApiException`` or a urllib3 error on failure,
    except that reads return ``None``/``[]`` for 404. :func:`retryable` sorts the errors.
    ``cache``: the :class:`JobCache` job reads are answered from where it can (True: a fresh
    one; False: none, every read asks the API server). It answers nothing until
    :meth:`JobCache.register` has put its indices on the operator's registry
    (:func:`megdet.controller.operator.build_registry` does, for the reconciler's cluster).
    """

    def __init__(
        self, api_client: k8s.ApiClient, timeout: float = 10.0, cache: JobCache | bool = True
    ) -> None:
        self.api = k8s.CustomObjectsApi(api_client)
        self.timeout = timeout
        self.cache: JobCache | None = (
            cache if isinstance(cache, JobCache) else JobCache() if cache else None
        )

    @staticmethod
    def _ref(api_version: str, kind: str) -> tuple[str, str, str]:
        group, version = api_version.split("/", 1)
        return group, version, OWNED_KINDS[(api_version, kind)] if kind != KIND else PLURAL

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        """The object, or None when it does not exist."""
        if self.cache is not None and kind in TARGET_BY_KIND:
            answered, cached = self.cache.lookup(kind, namespace, name)
            if answered:
                return cached
        group, version, plural = self._ref(api_version, kind)
        try:
            found = self.api.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self.timeout
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        if self.cache is not None and kind in TARGET_BY_KIND:
            # A job the watch has not delivered (this version of) yet, such as the job of an
            # earlier try whose create answered 409: answered from this read until it does.
            self.cache.created(found)
        return found

    def create(self, obj: Mapping[str, Any]) -> dict:
        group, version, plural = self._ref(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"]["namespace"]
        try:
            created = self.api.create_namespaced_custom_object(
                group, version, namespace, plural, dict(obj), _request_timeout=self.timeout
            )
        except k8s.ApiException as err:
            if err.status == 409 and self.cache is not None:
                self.cache.refresh(obj["kind"], namespace, obj["metadata"]["name"])
            raise
        if self.cache is not None:
            self.cache.created(created)
        return created

    def replace(self, obj: Mapping[str, Any]) -> dict:
        """PUT ``obj`` whole (with ``metadata.resourceVersion``: only over that version)."""
        group, version, plural = self._ref(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        return self.api.replace_namespaced_custom_object(
            group,
            version,
            meta["namespace"],
            plural,
            meta["name"],
            dict(obj),
            _request_timeout=self.timeout,
        )

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: Mapping) -> dict:
        group, version, plural = self._ref(api_version, kind)
        patched = self.api.patch_namespaced_custom_object(
            group, version, namespace, plural, name, dict(body), _request_timeout=self.timeout
        )
        if self.cache is not None and kind in TARGET_BY_KIND:
            self.cache.created(patched)  # a job's suspend: read back as written
        return patched

    def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> None:
        """Delete (background propagation, or ``propagation``); with ``uid``, only that
        incarnation of the name (the API server answers 409 if the name now holds another
        object)."""
        group, version, plural = self._ref(api_version, kind)
        options = k8s.V1DeleteOptions(
            propagation_policy=propagation,
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
