"""The MegDetRun handlers (:class:`Reconciler`, registered by
:func:`megdet.controller.operator.build_registry`): reconcile a run, mirror its job, forget a
deleted run. How they split with children.py and mirror.py: docs/architecture.md, "The
controller".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from megdet.controller import metrics, resize
from megdet.controller.children import Children, Trouble
from megdet.controller.conditions import condition_of
from megdet.controller.kubeapi import Backoff, Cluster, api_call
from megdet.controller.mirror import RunMirror
from megdet.controller.planning import (
    Invalid,
    OutputClaim,
    Planned,
    controlled_by,
    is_runs_job,
    output_claim,
    output_holder,
    output_in_use_message,
    plan_children,
    run_owner,
)
from megdet.controller.render import forget_run as forget_render
from megdet.controller.status import (
    POLICY_DENIED,
    Created,
    Decision,
    Foreign,
    JobGone,
    NotCreated,
    Refused,
    SpecInvalid,
    finished,
    had_job,
    refused_at,
)
from megdet.controller.status_writer import StatusWriter, diff_touches, now_text, run_meta
from megdet.policy import SUSPEND_FIELD, Policy
from megdet.policy import check as check_policy

__all__ = ["OUTPUTS_INDEX", "Reconciler"]


#: The kopf index of MegDetRuns by output folder (also the handlers' keyword argument).
OUTPUTS_INDEX = "megdet_outputs"
#: The kopf diff path of a run's suspend flag.
SUSPEND_DIFF = ("spec", *SUSPEND_FIELD)


class Reconciler:
    """The handlers of one operator and the state they share.

    ``observe`` (optional) receives each reconcile's duration in seconds, as the histogram
    does; the benchmark uses it for exact percentiles. ``policy``: the cluster's MegDet policy
    (default: the operator chart's secure defaults), checked before a run's job is created.
    ``checkpoint_events``: the run's watch posts a ``Checkpointed`` event every this many
    checkpoints (``--progress-checkpoint-events``; controller/progress_events.py).
    ``progress_url``: the progress endpoint's base URL given to every run (``--progress-url``;
    "" = none, see :func:`~megdet.controller.planning.with_progress`).
    """

    def __init__(
        self,
        cluster: Cluster,
        backoff: Backoff | None = None,
        now: Callable[[], str] = now_text,
        observe: Callable[[float], None] | None = None,
        policy: Policy | None = None,
        checkpoint_events: int = 5,
        progress_url: str = "",
    ) -> None:
        self.cluster = cluster
        self.backoff = backoff or Backoff()
        self.now = now
        self.observe = observe
        self.policy = policy if policy is not None else Policy()
        self.checkpoint_events = checkpoint_events
        self.progress_url = progress_url
        self.writer = StatusWriter(cluster, self.backoff, now)
        #: the API calls for the run's objects (controller/children.py).
        self.children = Children(cluster, self.backoff)
        #: the job and pod event handlers and every status write (controller/mirror.py).
        self.mirror = RunMirror(
            self.writer,
            self.children,
            now,
            lambda run, retry: self._reconcile(run, "resize", None, retry, None),
        )
        #: kopf's diff base storage (configure() gives it to kopf's settings).
        self.diffbase = self.writer.diffbase
        #: what this process keeps of each run: its phase, its milestones,
        #: its ``PodsStarted=False`` message, the diff base its last write carried.
        self.records = self.writer.records

    # -- reconcile: create, resume, update ---------------------------------------------------

    def reconcile(self, body: kopf.Body, reason: Any, diff: Any, retry: int, **kw: Any) -> None:
        started = time.perf_counter()
        try:
            # kopf's diff base once this reconcile ends: its last status write carries it.
            handled = self.diffbase.encoded(body)
            self._reconcile(dict(body), str(reason), diff, retry, kw.get(OUTPUTS_INDEX), handled)
        finally:
            elapsed = time.perf_counter() - started
            metrics.RECONCILE_DURATION.observe(elapsed)
            if self.observe is not None:
                self.observe(elapsed)

    def _reconcile(
        self,
        run: dict[str, Any],
        reason: str,
        diff: Any,
        retry: int,
        outputs: Any,
        handled: str | None = None,
    ) -> None:
        """``handled``: kopf's diff base for ``run``, written by the status write that ends
        the reconcile (the common ends: planned, invalid); elsewhere kopf writes it."""
        namespace, _name, uid, generation = run_meta(run)
        seen = run.get("status") if isinstance(run.get("status"), Mapping) else {}
        if generation is not None and refused_at(seen) == generation:
            # The API server refused this spec's job; retried when the spec changes.
            return
        decision = plan_children(
            run, unsafe_weights=self.policy.unsafeWeights, progress_url=self.progress_url
        )
        if isinstance(decision, Invalid):
            # Becoming Invalid sends a Warning event (reason Invalid) that names the fields.
            self._write(run, SpecInvalid(tuple(decision.messages)), retry, handled=handled)
            metrics.RECONCILES.labels("invalid").inc()
            return

        wanted = decision.job
        kind, job_name = wanted["kind"], wanted["metadata"]["name"]
        job = api_call(
            f"get {kind} {job_name}",
            lambda: self.cluster.get(wanted["apiVersion"], kind, namespace, job_name),
            self.backoff,
            retry,
        )
        ours = job is not None and is_runs_job(job, uid, seen)
        replacing = job is None and resize.pending(seen) is not None  # a resize's next job
        if not ours and (had_job(seen) or finished(seen)) and not replacing:
            # The run had its job and it is gone (deleted while this controller was away, or
            # its name now holds someone else's object): never a second job.
            self._write(run, JobGone(kind, job_name), retry, kind=kind)
            if job is not None and controlled_by(job, uid):
                self._write(run, Foreign(True), retry, job=job)
            metrics.RECONCILES.labels("success").inc()
            return
        if job is not None and not ours:  # never overwritten: retried
            trouble = self.children.conflict(kind, job_name)
            self._not_created(run, trouble.reason, trouble.message, retry)
        if job is None:
            holder = output_holder(outputs, run)
            if holder is not None:  # another live run goes first at the output folder
                self._not_created(run, "OutputInUse", output_in_use_message(run, holder), retry)
            # The cluster's policy, before anything is created for the run (a job that exists
            # was allowed when it was made: a stricter policy later does not stop it).
            if not finished(seen) and not self._allowed(run, retry):
                return
        elif not finished(seen) and rechecks_policy(seen, reason, diff):
            # A spec change (beyond suspend) of a run whose job exists: the policy as it is now
            # (if denied: Valid=False, the phase and the job left as they are, the change not
            # applied).
            if not self._allowed(run, retry, keep_phase=True):
                if reason == "update" and diff_touches(diff, SUSPEND_DIFF):
                    self.children.sync_suspend(decision, job, retry)  # suspend always goes through
                return
        if job is not None and resize.is_stopped_job(seen, job):
            resize.restop(self.backoff, self.cluster, job, retry)
            return  # its DELETED event creates the next job
        gpus = None if job is None else resize.wanted(run, decision, job)
        if job is not None and gpus is not None:
            # No diff base on this write: the delete after it may still be retried.
            resize.start(self.writer, run, job, gpus, retry)
            metrics.RECONCILES.labels("success").inc()
            return

        # A run's first reconcile (kopf has no base for it, no try before): its other objects
        # are most likely missing, so created without a read first (a taken name answers
        # 409, and is read then).
        fresh = job is None and reason == "create" and retry == 0
        job, troubles, stop = self.children.create_missing(
            run, decision, job, finished(seen), retry, fresh, resync=replacing
        )
        if stop is not None or job is None:
            if stop is not None:
                self._stop_for(run, stop, retry)
            return  # the job is not created: its status says why
        if reason == "update" and not finished(seen) and diff_touches(diff, SUSPEND_DIFF):
            self.children.sync_suspend(decision, job, retry)
        if not finished(seen) and reason in ("resume", "update"):
            self.children.delete_unplanned(
                run, decision, None if reason == "resume" else diff, retry
            )
        self._write_planned(run, decision, retry, troubles, handled)

    def _write(
        self,
        run: Mapping[str, Any],
        decision: Decision,
        retry: int,
        job: Mapping[str, Any] | None = None,
        read: Mapping[str, Any] | None = None,
        kind: str = "",
        handled: str | None = None,
    ) -> tuple[Mapping[str, Any], dict[str, Any], Any] | None:
        """Bring the run's status to ``decision``'s (:meth:`RunMirror.write`), for ``job`` or for
        the job ``read`` names as it is now, under the run's lock. ``handled``: this write ends
        the reconcile (:meth:`StatusWriter.write`)."""
        return self.mirror.write(
            run,
            lambda _current: (decision, job, read),
            retry,
            kind or (read or job or {}).get("kind", ""),
            handled,
            run_meta(run)[3],
        )

    def _not_created(self, run: Mapping[str, Any], reason: str, message: str, retry: int) -> None:
        """``Created=False`` (a Warning event once per episode, not per retry); kopf retries
        after the conflict delay."""
        self._write(run, NotCreated(reason, message), retry)
        metrics.RECONCILES.labels("conflict").inc()
        raise kopf.TemporaryError(message, delay=self.backoff.conflict_delay)

    def _allowed(self, run: Mapping[str, Any], retry: int, keep_phase: bool = False) -> bool:
        """Whether the cluster's policy allows the run; if not, its status says why (Valid=False,
        reason PolicyDenied, one Warning event; ``keep_phase``: its job exists)."""
        denied = [f"{p}: {m}" for p, m in check_policy(run.get("spec"), self.policy)]
        if denied:
            self._write(run, SpecInvalid(tuple(denied), POLICY_DENIED, keep_phase), retry)
            metrics.RECONCILES.labels("denied").inc()
        return not denied

    def _stop_for(self, run: Mapping[str, Any], trouble: Trouble, retry: int) -> None:
        """The run's job is not created because of ``trouble``: say so on the run, and raise
        kopf.TemporaryError when it is retried (a refusal that heals, a kind not installed,
        a name taken); a final refusal returns (the spec's next change retries)."""
        if trouble.delay is None:
            self._write(run, Refused(trouble.message), retry)
            metrics.RECONCILES.labels("refused").inc()
            return
        if trouble.reason == "JobNameConflict":
            self._not_created(run, trouble.reason, trouble.message, retry)
        self._write(run, NotCreated(trouble.reason, trouble.message), retry)
        metrics.RECONCILES.labels("error").inc()
        raise kopf.TemporaryError(trouble.message, delay=trouble.delay)

    def _write_planned(
        self,
        run: Mapping[str, Any],
        decision: Planned,
        retry: int,
        troubles: list[Trouble] | None = None,
        handled: str | None = None,
    ) -> None:
        namespace, name, _uid, _generation = run_meta(run)
        children = tuple((t.reason, t.message) for t in troubles or ())
        delays = [t.delay for t in troubles or () if t.delay is not None]
        # A write that ends the reconcile carries kopf's diff base; one before a retry does
        # not (kopf would otherwise take the run as handled and never retry it).
        ends = None if delays else handled
        self._write(run, Created(decision, children), retry, read=decision.job, handled=ends)
        plan = decision.rendered.plan
        metrics.record_run_info(
            namespace, name, decision.target, plan.world_size, plan.global_batch, plan.lr
        )
        if delays:
            # An object of the run that is retried (a refusal that heals, a name taken, a kind
            # not installed): the job is recorded, the rest is tried again.
            metrics.RECONCILES.labels("error").inc()
            retried = [t.message for t in troubles or () if t.delay is not None]
            raise kopf.TemporaryError("; ".join(retried), delay=min(delays))
        metrics.RECONCILES.labels("success").inc()

    # -- a deleted run: what this process holds for it --------------------------------------

    def forget(self, namespace: str, name: str) -> None:
        """Drop what this process holds for a run that was deleted (its watch's DELETED
        event): its record, metric series and kept render. What the run owns the garbage
        collector deletes (docs/controller.md, "Delete")."""
        metrics.forget_run(namespace, name)
        forget_render(namespace, name)  # its kept render (controller/render.py)
        self.records.forget((namespace, name))
        self.writer.phases.publish()

    # -- events of the run's job and pods: controller/mirror.py ------------------------------

    def job_event(self, body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
        """Mirror the run's job into the run's status (:meth:`RunMirror.job_event`)."""
        self.mirror.job_event(body, type, retry)

    def pod_matters(self, body: kopf.Body, **_: Any) -> bool:
        """The pods' watch filter (:meth:`RunMirror.pod_matters`)."""
        return self.mirror.pod_matters(body)

    def pod_event(self, body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
        """``PodsStarted`` on the pod's run (:meth:`RunMirror.pod_event`)."""
        self.mirror.pod_event(body, type, retry)

    @staticmethod
    def owned_by_run(body: kopf.Body, **_: Any) -> bool:
        """The job watch's filter: objects a MegDetRun controls."""
        return run_owner(body) is not None

    @staticmethod
    def index_outputs(body: kopf.Body, **_: Any) -> dict[tuple[str, str, str], OutputClaim]:
        """The ``megdet_outputs`` index: runs by output folder."""
        return output_claim(body)


def rechecks_policy(seen: Mapping[str, Any], reason: str, diff: Any) -> bool:
    """Whether a run whose job exists is checked against the policy again: on a spec change
    other than suspend alone (its owner may always suspend and resume it; labels and
    annotations are no spec change), and while the run is denied (until a spec inside the
    policy, or a looser policy, clears it)."""
    if (condition_of(seen, "Valid") or {}).get("reason") == POLICY_DENIED:
        return True
    if reason != "update":
        return False
    return any(
        tuple(path)[:1] == ("spec",) and not _suspend_alone(tuple(path), old, new)
        for _op, path, old, new in diff or ()
    )


def _suspend_alone(path: tuple[str, ...], old: Any, new: Any) -> bool:
    """Whether one kopf diff item changes the suspend flag and nothing else (an item above
    it, such as adding ``spec.runPolicy``, carries the values below its path)."""
    if path[: len(SUSPEND_DIFF)] == SUSPEND_DIFF:
        return True
    if SUSPEND_DIFF[: len(path)] != path:
        return False
    rest = SUSPEND_DIFF[len(path) :]

    def without_suspend(value: Any, keys: tuple[str, ...]) -> Any:
        if not isinstance(value, Mapping):
            return value
        if len(keys) == 1:
            return {k: v for k, v in value.items() if k != keys[0]}
        return {**value, keys[0]: without_suspend(value.get(keys[0]), keys[1:])}

    return without_suspend(old or {}, rest) == without_suspend(new or {}, rest)
