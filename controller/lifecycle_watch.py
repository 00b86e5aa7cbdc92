"""The handlers that keep a run's lifecycle conditions (:mod:`megdet.controller.lifecycle`)
from kopf's indexes of the trainer pods and Kueue's Workloads, and the startup histogram
(:func:`observe_startup`). How: docs/controller.md, "Where a run is: the lifecycle conditions".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import kopf

from megdet.controller.api import GROUP, KIND, PLURAL, VERSION
from megdet.controller.lifecycle import STARTUP_PARTS, lifecycle_status, pod_summary
from megdet.controller.metrics import STARTUP
from megdet.controller.pod_problems import PART_OF, run_of_pod
from megdet.controller.run_summary import summary_stale
from megdet.controller.status_writer import StatusWriter

__all__ = [
    "KUEUE",
    "PART_LABELS",
    "PODS_INDEX",
    "WORKLOADS_INDEX",
    "LifecycleWatch",
    "observe_startup",
    "run_ref",
]

#: The kopf index of the trainer pods' summaries by (namespace, run).
PODS_INDEX = "megdet_pods"
#: The kopf index of Kueue's Workloads by (namespace, the job that owns it).
WORKLOADS_INDEX = "megdet_workloads"
#: Kueue's Workloads (kopf takes the version the API server prefers).
KUEUE = ("kueue.x-k8s.io", "workloads")
#: The job kinds whose Workloads count (a MegDetRun's jobs).
JOB_KINDS = ("PyTorchJob", "TrainJob")
#: ``status.startup`` field -> the ``part`` label of its observations (``admissionWaitSeconds``
#: -> ``admission_wait``: the unit is in the metric's name).
PART_LABELS = {
    field: re.sub(r"(?<!^)([A-Z])", r"_\1", field.removesuffix("Seconds")).lower()
    for field in STARTUP_PARTS
}


def run_ref(namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    """A run as events name it (for the writer's read and kopf's events), not yet read."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
    }


def observe_startup(namespace: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Observe in ``megdet_controller_startup_seconds`` the parts ``new`` (a run's status as
    written) measures that ``old`` (the status it replaced) lacked for the same attempt (the
    status is the record: a rewrite observes nothing); returns their labels."""
    after = new.get("startup")
    if not isinstance(after, Mapping):
        return []
    before = old.get("startup") if isinstance(old.get("startup"), Mapping) else {}
    if before.get("attempt") != after.get("attempt"):
        before = {}
    target = str(new.get("target") or "unknown")
    done = []
    for field, part in PART_LABELS.items():
        value = after.get(field)
        if field in before or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        STARTUP.labels(namespace, target, part).observe(value)
        done.append(part)
    return done


class LifecycleWatch:
    """The lifecycle handlers of one operator, writing through its :class:`StatusWriter`."""

    def __init__(self, writer: StatusWriter) -> None:
        self.writer = writer

    def register(self, registry: kopf.OperatorRegistry) -> None:
        labels = {PART_OF[0]: PART_OF[1]}
        kopf.index("v1", "pods", registry=registry, labels=labels, id=PODS_INDEX)(self.index_pod)
        kopf.on.event(
            "v1", "pods", registry=registry, labels=labels, when=self.pod_would_change,
            id="pods-lifecycle",
        )(self.pod_event)  # fmt: skip
        kopf.index(*KUEUE, registry=registry, id=WORKLOADS_INDEX)(self.index_workload)
        kopf.on.event(*KUEUE, registry=registry, id="workloads-lifecycle")(self.workload_event)
        kopf.on.event(
            GROUP, VERSION, PLURAL, registry=registry, when=self.would_change, id="run-lifecycle"
        )(self.run_event)

    @staticmethod
    async def index_pod(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        key = run_of_pod(body)
        return {} if key is None else {key: pod_summary(body)}

    @staticmethod
    async def index_workload(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        owner = _job_owner(body)
        if owner is None:
            return {}
        meta = body.get("metadata") or {}
        summary = {
            "metadata": {
                "creationTimestamp": meta.get("creationTimestamp"),
                "ownerReferences": [dict(owner)],
            },
            "status": {"conditions": list((body.get("status") or {}).get("conditions") or [])},
        }
        return {(meta.get("namespace"), owner["name"]): summary}

    def would_change(self, body: kopf.Body, **kw: Any) -> bool:
        """Whether the run's event, as delivered, changes its lifecycle (in kopf's loop)."""
        status = body.get("status") or {}
        meta = body.get("metadata") or {}
        if not status.get("jobUID") or meta.get("deletionTimestamp"):
            return False
        signals = _signals(kw, meta.get("namespace"), meta.get("name"), status)
        if signals is None:
            return True  # an index changed while read: let the handler look
        new = lifecycle_status(body, *signals, self.writer.now())
        changed = any(new.get(key) != status.get(key) for key in ("conditions", "startup"))
        return changed or summary_stale(status)  # a report after the end (run_summary.py)

    def pod_would_change(self, body: kopf.Body, **kw: Any) -> bool:
        """Whether a pod's event changes its run's lifecycle, judged on the run as this process
        last knew it (:class:`~megdet.controller.status_writer.RunViews`; no view: look)."""
        key = run_of_pod(body)
        if key is None:
            return False
        view = self.writer.views.lookup(*key, None)
        return view is None or self.would_change(view, **kw)

    def pod_event(self, body: kopf.Body, retry: int, **kw: Any) -> None:
        key = run_of_pod(body)
        if key is not None:
            self._write(*key, None, retry, kw)

    def workload_event(self, body: kopf.Body, retry: int, **kw: Any) -> None:
        owner = _job_owner(body)
        if owner is not None:  # the chart names the job after its run (release name)
            self._write((body.get("metadata") or {}).get("namespace"), owner["name"], None,
                        retry, kw)  # fmt: skip

    def run_event(self, body: kopf.Body, type: str | None, retry: int, **kw: Any) -> None:
        if type != "DELETED":
            meta = body.get("metadata") or {}
            self._write(meta.get("namespace"), meta.get("name"), meta.get("uid"), retry, kw)

    def _write(
        self, namespace: str, name: str, uid: str | None, retry: int, kw: Mapping[str, Any]
    ) -> None:
        def compute(run: Mapping[str, Any]) -> dict[str, Any]:
            status = run.get("status") if isinstance(run.get("status"), Mapping) else {}
            signals = _signals(kw, namespace, name, status)
            if signals is None:  # an index changed while read (kopf's loop): the next event
                return dict(status)
            return lifecycle_status(run, *signals, self.writer.now())

        written = self.writer.write(run_ref(namespace, name, uid), compute, retry)
        if written is not None:  # each part of status.startup once per attempt, as written
            observe_startup(namespace, *written)


def _job_owner(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Workload's controller owner reference when it is a job of a MegDetRun's kinds."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") in JOB_KINDS:
            return ref if isinstance(ref.get("name"), str) else None
    return None


def _signals(
    kw: Mapping[str, Any], namespace: str, name: str, status: Mapping[str, Any]
) -> tuple[list[Any], Mapping[str, Any] | None] | None:
    """The run's pod summaries and its job's Workload (``status.jobName``, owned by the job
    of uid ``status.jobUID``) from kopf's indexes; None if one changed while read."""
    pods_index, workloads = kw.get(PODS_INDEX), kw.get(WORKLOADS_INDEX)
    job, uid = status.get("jobName"), status.get("jobUID")
    try:
        pods = list(pods_index.get((namespace, name)) or []) if pods_index is not None else []
        found = list(workloads.get((namespace, job)) or []) if workloads is not None else []
    except RuntimeError:
        return None
    mine = [w for w in found if w["metadata"]["ownerReferences"][0].get("uid") == uid]
    return pods, (mine[-1] if mine and uid else None)
