"""What a report is checked against: the runs' and their pods' watches (:class:`Directory`), and
whether a token's pod is a live pod of the run's job (:class:`PodBinding`): docs/controller.md,
"Progress reporting in detail".
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.planning import controlled_by
from megdet.controller.tokenauth import BoundedLRU

__all__ = [
    "JOB_API_VERSION",
    "Directory",
    "PodBinding",
    "PodRef",
    "RunRef",
    "pod_ref",
    "run_ref",
]

#: The job kind whose pods report to this endpoint (target pytorchjob).
JOB_API_VERSION, JOB_KIND = "kubeflow.org/v1", "PyTorchJob"

#: What follows ``<job>-`` in a job's pod name (kubeflow/training-operator, pkg/core/utils.go
#: ``GenGeneralName``: the index as strconv.Itoa writes it).
_REPLICA = "(master-0|worker-(?:0|[1-9][0-9]*))"

#: (namespace, name) -> the object, None when it does not exist; raises on API errors.
ReadFn = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class RunRef:
    """A ``target: pytorchjob`` run as the controller last saw it."""

    name: str
    uid: str
    job_name: str = ""
    job_uid: str = ""
    #: Its ``metadata.resourceVersion`` and ``status.progress`` (a progress write's base).
    version: str = ""
    progress: Mapping[str, Any] = field(default_factory=dict)
    deleting: bool = False

    @property
    def job(self) -> str:
        """The job's name: ``status.jobName``, else the run's (the chart names it so)."""
        return self.job_name or self.name


def run_ref(body: Mapping[str, Any] | None) -> RunRef | None:
    """The :class:`RunRef` of a run object; None for no object or a ``target: trainjob`` run."""
    if not isinstance(body, Mapping) or (identity := _identity(body)) is None:
        return None
    spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
    if spec.get("target") == "trainjob":
        return None
    meta, status = body["metadata"], body.get("status")
    status = status if isinstance(status, Mapping) else {}
    progress = status.get("progress")
    return RunRef(
        name=identity[1],
        uid=identity[2],
        job_name=_text(status.get("jobName")),
        job_uid=_text(status.get("jobUID")),
        version=_text(meta.get("resourceVersion")),
        progress=dict(progress) if isinstance(progress, Mapping) else {},
        deleting=bool(meta.get("deletionTimestamp")),
    )


class Directory:
    """(namespace, name) -> ``entry(body)`` of each watched object (None: not kept). Thread-safe."""

    def __init__(self, entry: Callable[[Mapping[str, Any]], Any]) -> None:
        self.entry = entry
        self._items: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def note(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        if (identity := _identity(body)) is None:
            return
        key = identity[:2]
        kept = None if deleted else self.entry(body)
        with self._lock:
            if kept is not None:
                self._items[key] = kept
            elif (known := self._items.get(key)) is not None and known.uid == identity[2]:
                del self._items[key]

    def relist(self, items: list[dict[str, Any]], namespace: str | None = None) -> None:
        """A full list of ``namespace`` (None: all): what it lacks is gone."""
        with self._lock:
            for key in [k for k in self._items if namespace is None or k[0] == namespace]:
                del self._items[key]
        for body in items:
            self.note(body)

    def get(self, namespace: str, name: str) -> Any:
        with self._lock:
            return self._items.get((namespace, name))

    def owner(self, namespace: str, name: str, uid: str) -> tuple[str, ...] | None:
        """The controller owner of the live pod ``namespace/name`` whose uid is ``uid``."""
        found = self.get(namespace, name)
        return found.owner if found is not None and found.uid == uid else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _identity(body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of a watched object, None when one of them is missing."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    found = (meta.get("namespace"), meta.get("name"), meta.get("uid"))
    return found if all(isinstance(v, str) and v for v in found) else None  # type: ignore[return-value]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class PodRef:
    uid: str
    #: Its controller owner reference: kind, apiVersion, name, uid.
    owner: tuple[str, ...]


def pod_ref(body: Mapping[str, Any]) -> PodRef:
    """The :class:`PodRef` of a pod object."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    refs = meta.get("ownerReferences")
    ref = next((r for r in (refs if isinstance(refs, list) else [])
                if isinstance(r, Mapping) and r.get("controller") is True), {})  # fmt: skip
    owner = tuple(str(ref.get(k) or "") for k in ("kind", "apiVersion", "name", "uid"))
    return PodRef(str(meta.get("uid")), owner)


@dataclass
class PodBinding:
    """Whether a token's pod is a live pod of the run's job: ``pods`` from the watch,
    ``read_job`` for the job's replica counts, kept ``ttl`` seconds per run (at most
    ``max_entries`` runs)."""

    read_job: ReadFn
    pods: Directory
    ttl: float = 300.0
    max_entries: int = 4096
    clock: Callable[[], float] = time.monotonic
    reads: int = 0
    _jobs: BoundedLRU = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._jobs = BoundedLRU(self.max_entries)

    def refusal(self, namespace: str, run: RunRef, pod_name: str, pod_uid: str) -> str | None:
        """None when the pod ``namespace/pod_name`` with ``pod_uid`` is a pod of ``run``'s job,
        else why not. Raises what the job's read raises."""
        job = run.job
        named = re.fullmatch(rf"{re.escape(job)}-{_REPLICA}", pod_name)
        if named is None:
            return f"pod {namespace}/{pod_name} is not named as a pod of job {job}"
        if not pod_uid:
            return "the token names no pod uid"
        owner = self.pods.owner(namespace, pod_name, pod_uid)
        if owner is None:
            return f"pod {namespace}/{pod_name} with uid {pod_uid} is not there"
        found = self._job(namespace, job, run)
        if found is None:
            return f"MegDetRun {run.name} has no job {job} of its own"
        job_uid, replicas = found
        role, _, index_text = named[1].partition("-")
        if int(index_text) >= replicas.get(role, 0):
            return (
                f"pod {namespace}/{pod_name} is not one of job {job}'s pods "
                f"({replicas.get(role, 0)} {role} replicas)"
            )
        if owner != (JOB_KIND, JOB_API_VERSION, job, job_uid):
            return (
                f"pod {namespace}/{pod_name} is not controlled by the run's {JOB_KIND} {job} "
                f"(uid {job_uid})"
            )
        return None

    def _job(self, namespace: str, name: str, run: RunRef) -> tuple[str, dict[str, int]] | None:
        """(uid, replicas by role) of the run's job ``name``, read once a ``ttl`` per run."""
        key = (namespace, name, run.uid, run.job_uid)
        now = self.clock()
        with self._lock:
            hit = self._jobs.fresh(key, now)
        if hit is not None:
            return hit
        self.reads += 1
        job = self.read_job(namespace, name)
        if job is None:
            return None
        uid = _text((job.get("metadata") or {}).get("uid"))
        if not uid or (uid != run.job_uid if run.job_uid else not controlled_by(job, run.uid)):
            return None
        specs = ((job.get("spec") or {}).get("pytorchReplicaSpecs")) or {}
        replicas = {
            role.lower(): _count((spec or {}).get("replicas"))
            for role, spec in specs.items()
            if isinstance(role, str) and isinstance(spec, Mapping)
        }
        with self._lock:
            self._jobs.put(key, (now + self.ttl, (uid, replicas)))
        return uid, replicas


def _count(value: Any) -> int:
    """A replica count as the training operator reads it (absent: 1)."""
    if value is None:
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
