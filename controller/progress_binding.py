"""Which pod's token may report a run's progress: a pod of the job this controller created.

A token that passes the ``TokenReview`` for the run's audience
(:func:`megdet.progress.run_audience`, the run's uid in it) says which pod it is bound to
(``authentication.kubernetes.io/pod-name`` and ``pod-uid``; the API server has checked that
this pod exists with that uid). The audience alone is no proof: any pod of the namespace may
ask the kubelet for a token of any audience. So the pod is read once (``get pods``, cached by
its uid) and must be

- named as the training operator names the job's pods (``<job>-master-0``,
  ``<job>-worker-<i>``, the index as the operator writes it: ``<job>-worker-01`` is no pod's
  name), within the job's replica counts (``<job>-worker-999`` of a job with
  4 workers is no pod of it), and
- controlled by the run's job: its controller owner reference is the PyTorchJob named
  ``status.jobName`` whose uid is ``status.jobUID``, the job this controller created (for a run
  from before ``jobUID``: the job of that name whose controller reference is the run's uid).

What a namespace user who may create pods can still do is in docs/operations.md ("Progress
reporting", who may report): a pod carrying a copied owner reference under one of the job's
pod names that no live pod holds, and anything run inside the job's own pods (``kubectl
exec``).

:class:`RunDirectory` is what the active replica knows of the runs from its watch (uid, job
name and uid), so that a report costs no read of the run.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.planning import controlled_by
from megdet.controller.tokenauth import VerdictCache

__all__ = ["JOB_API_VERSION", "PodBinding", "RunDirectory", "RunRef", "kubernetes_readers"]

#: The job kind whose pods report to this endpoint (target pytorchjob).
JOB_API_VERSION, JOB_KIND = "kubeflow.org/v1", "PyTorchJob"

#: What follows ``<job>-`` in the name of a job's pod: ``<replica type, lowercase>-<index>``, the
#: index in decimal without leading zeros (Go's strconv.Itoa; kubeflow/training-operator,
#: pkg/core/utils.go ``GenGeneralName``), so one spelling per pod; the master's index is 0.
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

    @property
    def job(self) -> str:
        """The job's name: ``status.jobName``, else the run's (the chart names it so)."""
        return self.job_name or self.name


class RunDirectory:
    """(namespace, name) -> :class:`RunRef` of every served ``target: pytorchjob`` run, kept
    from the runs' watch events (:meth:`note`). Thread-safe."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], RunRef] = {}
        self._lock = threading.Lock()

    def note(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
        namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
        if not all(isinstance(v, str) and v for v in (namespace, name, uid)):
            return
        spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
        status = body.get("status") if isinstance(body.get("status"), Mapping) else {}
        key = (namespace, name)
        with self._lock:
            if deleted or spec.get("target") == "trainjob":
                if (known := self._runs.get(key)) is not None and known.uid == uid:
                    del self._runs[key]
                return
            self._runs[key] = RunRef(
                name=name,
                uid=uid,
                job_name=_text(status.get("jobName")),
                job_uid=_text(status.get("jobUID")),
            )

    def get(self, namespace: str, name: str) -> RunRef | None:
        with self._lock:
            return self._runs.get((namespace, name))

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


@dataclass
class PodBinding:
    """Whether a token's pod is a pod of the run's job (see the module docstring)."""

    read_pod: ReadFn
    read_job: ReadFn
    ttl: float = 300.0
    max_entries: int = 4096
    clock: Callable[[], float] = time.monotonic
    reads: int = 0
    _pods: VerdictCache = field(init=False, repr=False)
    _jobs: VerdictCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pods = VerdictCache(self.max_entries, self.clock)
        self._jobs = VerdictCache(self.max_entries, self.clock)

    def refusal(self, namespace: str, run: RunRef, pod_name: str, pod_uid: str) -> str | None:
        """None when the pod ``namespace/pod_name`` with ``pod_uid`` is a pod of ``run``'s job,
        else why not. Raises what the reads raise (the caller answers 500 and caches nothing)."""
        job = run.job
        named = re.fullmatch(rf"{re.escape(job)}-{_REPLICA}", pod_name)
        if named is None:
            return f"pod {namespace}/{pod_name} is not named as a pod of job {job}"
        if not pod_uid:
            return "the token names no pod uid"
        found = self._job(namespace, job, run)
        if found is None:
            return f"MegDetRun {run.name} has no job {job} of its own"
        job_uid, replicas = found
        role, _, index_text = named[1].partition("-")
        index = int(index_text)
        if index >= replicas.get(role, 0):
            return (
                f"pod {namespace}/{pod_name} is not one of job {job}'s pods "
                f"({replicas.get(role, 0)} {role} replicas)"
            )
        owner = self._pod_owner(namespace, pod_name, pod_uid)
        if owner is None:
            return f"pod {namespace}/{pod_name} with uid {pod_uid} is not there"
        kind, api_version, name, uid = owner
        if (kind, api_version, name, uid) != (JOB_KIND, JOB_API_VERSION, job, job_uid):
            return (
                f"pod {namespace}/{pod_name} is not controlled by the run's {JOB_KIND} {job} "
                f"(uid {job_uid})"
            )
        return None

    def _pod_owner(self, namespace: str, name: str, uid: str) -> tuple[str, ...] | None:
        key = VerdictCache.key(uid, namespace, name)
        now = self.clock()
        hit = self._pods.get(key, now)
        if hit is not None:
            return hit
        self.reads += 1
        pod = self.read_pod(namespace, name)
        meta = (pod or {}).get("metadata") or {}
        if pod is None or meta.get("uid") != uid:
            return None  # not cached: the uid was checked by the TokenReview a moment ago
        ref = _controller_ref(pod) or {}
        owner = tuple(str(ref.get(k) or "") for k in ("kind", "apiVersion", "name", "uid"))
        self._pods.put(key, owner, now + self.ttl, allowed=True)
        return owner

    def _job(self, namespace: str, name: str, run: RunRef) -> tuple[str, dict[str, int]] | None:
        """(uid, replicas by role) of the run's job ``name``: the one whose uid is the run's
        ``status.jobUID``, or for a run with none the one the run controls; read once a while
        per run (the replica counts bound the pod names a report may come from)."""
        key = VerdictCache.key(run.uid, namespace, name, run.job_uid)
        now = self.clock()
        hit = self._jobs.get(key, now)
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
        self._jobs.put(key, (uid, replicas), now + self.ttl, allowed=True)
        return uid, replicas


def _count(value: Any) -> int:
    """A replica count as the training operator reads it (absent: 1)."""
    if value is None:
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def kubernetes_readers(api_client: Any, timeout: float) -> tuple[ReadFn, ReadFn]:
    """(read a pod, read a PyTorchJob) through the official client; None for 404."""
    from kubernetes import client as k8s

    from megdet.controller.kubeapi import Cluster

    core = k8s.CoreV1Api(api_client)
    cluster = Cluster(api_client, timeout=timeout)

    def read_pod(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            pod = core.read_namespaced_pod(name, namespace, _request_timeout=timeout)
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        return api_client.sanitize_for_serialization(pod)

    def read_job(namespace: str, name: str) -> Mapping[str, Any] | None:
        return cluster.get(JOB_API_VERSION, JOB_KIND, namespace, name)

    return read_pod, read_job
