"""The run-owned jobs as the controller's own watch delivered them: :class:`JobCache`, which
:class:`megdet.controller.kubeapi.Cluster` answers job reads from, and :func:`version_of`,
by which the watch caches keep the newer of two copies.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from megdet.controller.api import GROUP, OWNED_KINDS, PLURAL, SUSPEND_PATH, TARGET_BY_KIND, VERSION

__all__ = ["JOB_INDEX_PREFIX", "JobCache", "slim_job", "version_of"]


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
    index per job kind), or as this process last wrote or read them until the watch delivers
    that version; job reads are answered from it. What it answers and why: docs/controller.md,
    "The jobs are read from the controller's watch".
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

        ids = {}
        for (api_version, kind), plural in OWNED_KINDS.items():
            if kind not in TARGET_BY_KIND:
                continue
            group, version = api_version.split("/", 1)
            ids[kind] = JOB_INDEX_PREFIX + kind.lower()
            kopf.index(group, version, plural, registry=registry, id=ids[kind], when=when)(
                self._indexer(kind, ids[kind])
            )

        # Indexes nothing: a run's event shows this the job indices before any job exists.
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
            # This process's answer is dropped once the index holds the job (_sweep), not
            # here: kopf stores what this returns after it returns.
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
        """Drop the answers older than ``ttl``, and the answer for ``key`` (every answer when
        None) once kopf's index holds that version of its job or a newer one. Under the lock."""
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
