"""What a run's status mirrors from its job and pods, event by event (:class:`RunMirror`), and
the status write every handler makes (:meth:`RunMirror.write`, the reconcile's as well). Where
it sits: docs/architecture.md, "The controller"; what it writes: docs/controller.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from megdet.controller import metrics, resize
from megdet.controller.api import TARGET_BY_KIND
from megdet.controller.children import Children
from megdet.controller.job_state import trainjob_progress
from megdet.controller.kubeapi import api_call
from megdet.controller.lifecycle_watch import PODS_INDEX, run_ref
from megdet.controller.planning import expected_job_name, is_runs_job, run_owner
from megdet.controller.pod_problems import (
    PODS_STARTED_CONDITION,
    pod_of_runs_job,
    pod_start_problem,
    run_of_pod,
    started,
)
from megdet.controller.status import (
    Decision,
    Foreign,
    JobGone,
    Observed,
    PodStart,
    condition_of,
    desired_status,
)
from megdet.controller.status_writer import StatusWriter, run_meta

__all__ = ["Decide", "RunMirror"]

logger = logging.getLogger(__name__)

#: What a run's status write decides from the run as read under its lock: (the decision, the
#: job it is about, the job to read now instead) or None (nothing to say: no write).
Decide = Callable[[Mapping[str, Any]], "tuple[Decision, Any, Any] | None"]


class RunMirror:
    """The job and pod event handlers of one operator, and the status write they share with
    the reconcile. ``recreate(run, retry)``: reconcile a run whose resized job is gone (the
    reconciler's, so that the next job is made as every job is)."""

    def __init__(
        self,
        writer: StatusWriter,
        children: Children,
        now: Callable[[], str],
        recreate: Callable[[dict[str, Any], int], None],
    ) -> None:
        self.writer = writer
        self.children = children
        self.cluster = children.cluster
        self.backoff = children.backoff
        self.now = now
        self.recreate = recreate
        self.records = writer.records

    def write(
        self,
        run: Mapping[str, Any],
        decide: Decide,
        retry: int,
        kind: str = "",
        handled: str | None = None,
        generation: Any = None,
    ) -> tuple[Mapping[str, Any], dict[str, Any], Any] | None:
        """A status write with the run read once, under its lock (:meth:`StatusWriter.write`):
        ``decide(run)`` gives (decision, job, job to read now) or None (nothing to say: no
        write); the status is :func:`desired_status` of the decision for that job (at the
        run's ``generation``, when the reconcile wrote it). Returns (old status, new status,
        the job), None if the run is gone. ``handled``: this write ends the reconcile."""
        found: list[Any] = [None]

        def compute(current: Mapping[str, Any]) -> dict[str, Any]:
            chosen = decide(current)
            if chosen is None:
                return dict(current.get("status") or {})
            decision, job, read = chosen
            found[0] = self.children.get(read, retry) if read is not None else job
            return desired_status(current, found[0], decision, self.now(), generation)

        written = self.writer.write(run, compute, retry, kind, handled)
        if written is None:
            return None
        # Keep the run's record's ``stuck`` while its status says ``PodsStarted=False``.
        pods = condition_of(written[1], PODS_STARTED_CONDITION) or {}
        stuck = str(pods.get("message") or "") if pods.get("status") == "False" else None
        self.records.set(run_meta(run)[:2], stuck=stuck)
        return (*written, found[0])

    def job_event(self, body: kopf.Body, type: str | None, retry: int, **kw: Any) -> None:
        """Mirror the run's job into the run's status; record a job that was deleted."""
        job = dict(body)
        ref = run_owner(job)
        if ref is None:
            return
        if type != "DELETED" and not job.get("status"):
            return  # just created: the run's reconcile wrote its first status
        name = job["metadata"].get("name")

        deleting = stopped = False

        def decide(run: Mapping[str, Any]) -> tuple[Decision, Any, Any] | None:
            nonlocal deleting, stopped
            if (run.get("metadata") or {}).get("deletionTimestamp"):
                deleting = True  # its status stays as it is (desired_status)
                return None
            if type == "DELETED" and resize.is_stopped_job(run.get("status"), job):
                stopped = True  # the job a resize stopped, and its pods, are gone
                return None
            if name != expected_job_name(run):
                return None  # controlled by the run, but not the job it made (not ours)
            if not is_runs_job(job, ref.get("uid"), run.get("status")):
                # Under the job's name, naming the run as controller, but not the job the
                # controller created (status.jobUID): someone else's. Said on the run.
                return Foreign(type != "DELETED"), job, None
            if type == "DELETED":  # its last state counts first (a job deleted as it finished)
                return JobGone(job["kind"], name), job, None
            # Level-triggered: the job as it is now, read under the run's lock.
            return Observed(), None, job

        namespace = job["metadata"].get("namespace")
        run = run_ref(namespace, ref["name"], ref.get("uid"))
        written = self.write(run, decide, retry, job["kind"])
        if stopped:
            self._finish_resize(namespace, ref["name"], ref.get("uid"), kw.get(PODS_INDEX))
            return
        if type == "DELETED" and (written is None or deleting):
            # Deleted with its run (the garbage collector's work, or a foreground deletion's):
            # no status to say it on, but it counts as deleted all the same.
            metrics.JOBS_DELETED.labels(namespace, TARGET_BY_KIND[job["kind"]]).inc()
        if written is not None and job["kind"] == "TrainJob" and type != "DELETED":
            self._log_progress_problems(run, *written)

    def _log_progress_problems(
        self, run: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any], job: Any
    ) -> None:
        """Log, once per change, what a TrainJob's mirrored ``trainerStatus`` held that the
        run's ``status.progress`` could not keep."""
        progress = new.get("progress")
        if isinstance(progress, Mapping) and progress != old.get("progress"):
            problems = trainjob_progress(job)[1] if isinstance(job, Mapping) else []
            if problems:
                key = run_meta(run)[:2]
                logger.warning("run %s/%s: TrainJob trainerStatus: %s", *key, "; ".join(problems))

    def _finish_resize(self, namespace: str, name: str, uid: str | None, pods: Any) -> None:
        """Create the job of a resize whose stopped job is gone (controller/resize.py), once
        kopf's index of the trainer pods (``pods``) holds none of the run."""

        def pods_left() -> bool:
            try:
                return pods is not None and bool(list(pods.get((namespace, name)) or []))
            except RuntimeError:  # the index changed while read
                return True

        resize.finish(
            lambda: api_call(
                "get run", lambda: self.cluster.get_run(namespace, name), self.backoff, 0
            ),
            self.recreate,
            uid,
            pods_left=pods_left,
        )

    # -- the pods of the run's job: why they cannot start ----------------------------------

    def pod_matters(self, body: kopf.Body, **_: Any) -> bool:
        """The pods' watch filter (in kopf's event loop, so cheap): a pod with a container that
        cannot start, or a started one of a run said to have such a pod."""
        key = run_of_pod(body)
        if key is None:
            return False
        return pod_start_problem([body]) is not None or (
            self.records.get(key, "stuck") is not None and started(body)
        )

    def pod_event(self, body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
        """``PodsStarted`` on the pod's run: False with the kubelet's reason while the pod
        cannot start, True once it runs. Only a pod of the run's job counts."""
        if type == "DELETED":
            return
        pod = dict(body)
        key = run_of_pod(pod)
        if key is None:
            return
        problem = pod_start_problem([pod])
        stuck = self.records.get(key, "stuck")
        if problem is not None and stuck == problem[1]:
            return  # said already (the kubelet rewrites a waiting pod's status often)
        if problem is None and stuck is None:
            return
        decision = PodStart(problem, str(pod["metadata"].get("name")))

        def decide(run: Mapping[str, Any]) -> tuple[Decision, Any, Any] | None:
            if not pod_of_runs_job(pod, run):
                return None  # not the run's job's pod: labels are anyone's to write
            return decision, None, None

        self.write(run_ref(*key, None), decide, retry)
