"""The MegDetRun handlers: reconcile a run, mirror its job, forget a deleted run.

:class:`Reconciler` holds what the handlers of one operator share (the API layer, the
cluster's policy, the backoff, the status writer with its phase gauge, the TrainJob mirror's
milestones); its methods are the kopf handlers, which
:func:`megdet.controller.operator.build_registry` registers. What a run owns is decided by the
pure :func:`~megdet.controller.planning.plan_children`; what its status says, by
:mod:`megdet.controller.status`.

Handlers are sync methods: kopf runs them in its thread pool, so the blocking client and the
in-process Helm render never stall kopf's event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s

from megdet.controller import metrics, resize
from megdet.controller.api import GROUP, KIND, TARGET_BY_KIND, VERSION
from megdet.controller.job_state import trainjob_progress
from megdet.controller.kubeapi import (
    Backoff,
    Cluster,
    JobRefused,
    KindNotServed,
    RefusalHeals,
    api_call,
    classify_refusal,
    retry_later,
)
from megdet.controller.planning import (
    Invalid,
    OutputClaim,
    Planned,
    controlled_by,
    digest_of,
    expected_job_name,
    is_runs_job,
    merge_patch,
    output_claim,
    output_holder,
    output_in_use_message,
    plan_children,
    run_owner,
    suspend_of,
    suspend_patch,
    with_digest,
)
from megdet.controller.pod_problems import (
    PODS_STARTED_CONDITION,
    pod_of_runs_job,
    pod_start_problem,
    run_of_pod,
    started,
)
from megdet.controller.policy import Policy
from megdet.controller.policy import check as check_policy
from megdet.controller.progress_hub import Milestones
from megdet.controller.recheck import SUSPEND_DIFF, rechecks_policy
from megdet.controller.render import forget_run as forget_render
from megdet.controller.status import (
    CHILD_REFUSED,
    POLICY_DENIED,
    RETRYING,
    Created,
    Decision,
    Foreign,
    JobGone,
    NotCreated,
    Observed,
    PodStart,
    Refused,
    SpecInvalid,
    condition_of,
    conflict_message,
    desired_status,
    finished,
    had_job,
    refused_at,
)
from megdet.controller.status_writer import StatusWriter, diff_touches, now_text, run_meta

__all__ = ["OUTPUTS_INDEX", "Reconciler"]

logger = logging.getLogger(__name__)

#: The kopf index of MegDetRuns by output folder (also the handlers' keyword argument).
OUTPUTS_INDEX = "megdet_outputs"

#: The run's objects (other than its job) that follow its spec after they are created: merge-
#: patched when the render changes, deleted when the spec no longer renders them (the spec
#: field that renders each). A TrainingRuntime is not: Trainer reads it when it makes the
#: TrainJob's JobSet, so a change could not reach a running job anyway.
SYNCED_CHILDREN = {("networking.k8s.io/v1", "NetworkPolicy"): ("spec", "networkPolicy")}


@dataclass(frozen=True)
class Trouble:
    """Why one of the run's objects is not as its spec says: the condition's reason and
    message, and the delay of the next try (None: final until the spec changes)."""

    reason: str
    message: str
    delay: float | None
    kind: str = ""
    name: str = ""


def trouble_of(
    err: KindNotServed | JobRefused | RefusalHeals, backoff: Backoff, retry: int
) -> Trouble:
    """A refused create (or update) as a :class:`Trouble`."""
    if isinstance(err, KindNotServed):
        return Trouble("JobKindNotInstalled", err.message, backoff.conflict_delay)
    if isinstance(err, RefusalHeals):
        return Trouble(RETRYING, err.message, backoff.delay(retry))
    return Trouble(CHILD_REFUSED, err.message, None)


def _meta_part(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata the controller renders for an object (labels, annotations)."""
    return {key: dict(meta.get(key) or {}) for key in ("labels", "annotations")}


class Reconciler:
    """The handlers of one operator and the state they share.

    ``observe`` (optional) receives each reconcile's duration in seconds, as the histogram
    does; the benchmark uses it for exact percentiles. ``policy``: the cluster's MegDet policy
    (default: the operator chart's secure defaults), checked before a run's job is created.
    ``checkpoint_events``: the TrainJob mirror posts a ``Checkpointed`` event every this many
    checkpoints (``--progress-checkpoint-events``). ``progress_url``: the progress endpoint's
    base URL given to every run (``--progress-url``; "" = none, see
    :func:`~megdet.controller.planning.with_progress`).
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
        #: kopf's diff base storage (configure() gives it to kopf's settings).
        self.diffbase = self.writer.diffbase
        #: what this process keeps of each run: its phase, the TrainJob mirror's milestones,
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
        if job is not None and not ours:
            self._conflict(run, kind, job_name, retry)
        if job is None:
            self._wait_for_output_folder(run, outputs, retry)
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
                    self._sync_suspend(decision, job, retry)  # suspend always goes through
                return
        if job is not None and resize.is_stopped_job(seen, job):
            resize.restop(self.backoff, self.cluster, job, retry)
            return  # its DELETED event creates the next job
        gpus = None if job is None else resize.wanted(run, decision, job)
        if job is not None and gpus is not None:
            # No diff base on this write: the delete after it may still be retried.
            resize.start(self.writer, self.cluster, run, job, gpus, retry)
            metrics.RECONCILES.labels("success").inc()
            return

        # A run's first reconcile (kopf has no base for it, no try before): its other objects
        # are most likely missing, so created without a read first (a taken name answers
        # 409, and is read then).
        fresh = job is None and reason == "create" and retry == 0
        job, troubles = self._create_missing(
            run, decision, job, finished(seen), retry, fresh, resync=replacing
        )
        if job is None:
            return  # the API server refused the job
        if reason == "update" and not finished(seen) and diff_touches(diff, SUSPEND_DIFF):
            self._sync_suspend(decision, job, retry)
        if not finished(seen) and reason in ("resume", "update"):
            self._delete_unplanned(run, decision, None if reason == "resume" else diff, retry)
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
        """Bring the run's status to :func:`desired_status` of ``decision``, for ``job`` or,
        level-triggered, for the job ``read`` names as it is now (read under the run's lock:
        its mirror may have seen a newer state than this handler did). Returns (old status,
        new status, the job) as :meth:`StatusWriter.write` does, None if the run is gone.
        ``handled``: this write ends the reconcile (:meth:`StatusWriter.write`)."""
        generation = run_meta(run)[3]
        found: list[Any] = [job]

        def compute(current: Mapping[str, Any]) -> dict[str, Any]:
            if read is not None:
                found[0] = self._get(read, retry)
            return desired_status(current, found[0], decision, self.now(), generation)

        written = self.writer.write(
            run, compute, retry, kind or (read or job or {}).get("kind", ""), handled
        )
        if written is None:
            return None
        self._note_stuck(run, written[1])
        return (*written, found[0])

    def _note_stuck(self, run: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Keep a run's record's ``stuck`` while its status says ``PodsStarted=False``."""
        pods = condition_of(status, PODS_STARTED_CONDITION) or {}
        stuck = str(pods.get("message") or "") if pods.get("status") == "False" else None
        self.records.set(run_meta(run)[:2], stuck=stuck)

    def _not_created(self, run: Mapping[str, Any], reason: str, message: str, retry: int) -> None:
        """``Created=False`` (a Warning event once per episode, not per retry); kopf retries
        after the conflict delay."""
        self._write(run, NotCreated(reason, message), retry)
        metrics.RECONCILES.labels("conflict").inc()
        raise kopf.TemporaryError(message, delay=self.backoff.conflict_delay)

    def _conflict(self, run: Mapping[str, Any], kind: str, name: str, retry: int) -> None:
        """An object of the name the run needs is not the run's: never overwritten, retried."""
        self._not_created(run, "JobNameConflict", conflict_message(kind, name), retry)

    def _wait_for_output_folder(self, run: Mapping[str, Any], outputs: Any, retry: int) -> None:
        """Raise kopf.TemporaryError while another live run goes first at the output folder."""
        holder = output_holder(outputs, run)
        if holder is not None:
            self._not_created(run, "OutputInUse", output_in_use_message(run, holder), retry)

    def _allowed(self, run: Mapping[str, Any], retry: int, keep_phase: bool = False) -> bool:
        """Whether the cluster's policy allows the run; if not, its status says why (Valid=False,
        reason PolicyDenied, one Warning event; ``keep_phase``: its job exists)."""
        denied = [f"{p}: {m}" for p, m in check_policy(run.get("spec"), self.policy)]
        if denied:
            self._write(run, SpecInvalid(tuple(denied), POLICY_DENIED, keep_phase), retry)
            metrics.RECONCILES.labels("denied").inc()
        return not denied

    def _create_missing(
        self,
        run: Mapping[str, Any],
        decision: Planned,
        job: dict[str, Any] | None,
        done: bool,
        retry: int,
        fresh: bool = False,
        resync: bool = False,
    ) -> tuple[dict[str, Any] | None, list[Trouble]]:
        """Create what the run lacks and bring its other objects to the spec: those (the
        TrainingRuntime the TrainJob refers to, the NetworkPolicy) first, the job last; a
        finished run (``done``) creates nothing. Returns the job (None when the API server
        refused it) and the troubles of the other objects once the job exists.

        Before the job exists, a trouble with another object stops the job: it is not created
        without what it refers to or the isolation the spec asks for (the run's status says
        why, as for the job itself). Once the job exists, a trouble with another object is that
        object's (``ChildrenReady=False``): the job stays the run's, Created=True.
        ``fresh``: the run's first try (:meth:`_ensure_child`). ``resync``: a resize creates
        the job again, so every other object is brought to the new render first (a TrainJob's
        TrainingRuntime, which Trainer reads when it builds the JobSet).
        """
        _namespace, _name, uid, generation = run_meta(run)
        wanted = decision.job
        troubles: list[Trouble] = []
        for obj in [] if done else decision.objects[1:]:
            trouble = self._ensure_child(obj, uid, generation, retry, fresh, resync)
            if trouble is None:
                continue
            if job is None:
                self._stop_for(run, trouble, retry)
                return None, []
            troubles.append(trouble)
        if job is None:
            try:
                job = self._create(wanted, generation, retry)
            except (KindNotServed, JobRefused, RefusalHeals) as err:
                self._stop_for(run, trouble_of(err, self.backoff, retry), retry)
                return None, []
            if not controlled_by(job, uid):
                self._conflict(run, wanted["kind"], wanted["metadata"]["name"], retry)
        return job, troubles

    def _stop_for(self, run: Mapping[str, Any], trouble: Trouble, retry: int) -> None:
        """The run's job is not created because of ``trouble``: say so on the run, and raise
        kopf.TemporaryError when it is retried (a refusal that heals, a kind not installed,
        a name taken); a final refusal returns (the spec's next change retries)."""
        if trouble.delay is None:
            self._write(run, Refused(trouble.message), retry)
            metrics.RECONCILES.labels("refused").inc()
            return
        if trouble.reason == "JobNameConflict":
            self._conflict(run, trouble.kind, trouble.name, retry)
        self._write(run, NotCreated(trouble.reason, trouble.message), retry)
        metrics.RECONCILES.labels("error").inc()
        raise kopf.TemporaryError(trouble.message, delay=trouble.delay)

    def _ensure_child(
        self,
        obj: Mapping[str, Any],
        uid: str | None,
        generation: Any,
        retry: int,
        fresh: bool = False,
        resync: bool = False,
    ) -> Trouble | None:
        """One of the run's other objects as the spec says: created if missing, brought to
        the spec if it is of a kind that follows it (:data:`SYNCED_CHILDREN`); the trouble
        when the API server refuses, or the name holds an object the run does not control.
        ``fresh``: most likely missing, so created first and read only if the name is taken
        (one request instead of two); else read first."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        synced = resync or (obj["apiVersion"], kind) in SYNCED_CHILDREN
        wanted = with_digest(obj) if synced else obj
        try:
            # _create answers what holds the name when it is taken (409).
            found = self._create(wanted, generation, retry) if fresh else self._get(obj, retry)
            if found is None:
                self._create(wanted, generation, retry)
                return None
            if not controlled_by(found, uid):
                return Trouble(
                    "JobNameConflict",
                    conflict_message(kind, name),
                    self.backoff.conflict_delay,
                    kind,
                    name,
                )
            if wanted is not obj and digest_of(found) != digest_of(wanted):
                self._update(found, wanted, generation, retry)
        except (KindNotServed, JobRefused, RefusalHeals) as err:
            return trouble_of(err, self.backoff, retry)
        return None

    def _update(
        self, found: Mapping[str, Any], wanted: Mapping[str, Any], generation: Any, retry: int
    ) -> None:
        """Merge-patch ``found`` into ``wanted``'s labels, annotations and spec (fields that
        ``wanted`` lacks are removed), only over the version read."""
        meta = found["metadata"]
        body = merge_patch(
            {k: found.get(k) for k in ("spec",)} | {"metadata": _meta_part(meta)},
            {k: wanted.get(k) for k in ("spec",)} | {"metadata": _meta_part(wanted["metadata"])},
        )
        body.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
        try:
            self.cluster.patch(
                found["apiVersion"], found["kind"], meta["namespace"], meta["name"], body
            )
        except k8s.ApiException as err:
            refusal = classify_refusal(found, err, generation, verb="update")
            if refusal is not None:
                raise refusal from err
            retry_later(f"update {found['kind']} {meta['name']}", err, self.backoff, retry)
            raise
        except Exception as err:
            retry_later(f"update {found['kind']} {meta['name']}", err, self.backoff, retry)
            raise

    def _delete_unplanned(
        self, run: Mapping[str, Any], decision: Planned, diff: Any, retry: int
    ) -> None:
        """Delete the run's objects of a kind that follows the spec (:data:`SYNCED_CHILDREN`)
        which its spec no longer renders (``networkPolicy.enabled: false``): by the run's name
        (the chart's name for them), only if the run controls it, only that incarnation.
        Looked for only where ``diff`` (an update's) touches the field that renders them, or
        on a resume (``diff`` None: an edit made while the controller was away)."""
        namespace, name, uid, _generation = run_meta(run)
        planned = {(o["apiVersion"], o["kind"]) for o in decision.objects}
        for (api_version, kind), path in SYNCED_CHILDREN.items():
            if (api_version, kind) in planned or (
                diff is not None and not diff_touches(diff, path)
            ):
                continue
            found = api_call(
                f"get {kind} {name}",
                lambda a=api_version, k=kind: self.cluster.get(a, k, namespace, name),
                self.backoff,
                retry,
            )
            if found is None or not controlled_by(found, uid):
                continue
            found_uid = (found.get("metadata") or {}).get("uid")
            api_call(
                f"delete {kind} {name}",
                lambda a=api_version, k=kind, u=found_uid: self.cluster.delete(
                    a, k, namespace, name, u
                ),
                self.backoff,
                retry,
            )

    def _get(self, obj: Mapping[str, Any], retry: int) -> dict[str, Any] | None:
        meta = obj["metadata"]
        return api_call(
            f"get {obj['kind']} {meta['name']}",
            lambda: self.cluster.get(
                obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]
            ),
            self.backoff,
            retry,
        )

    def _create(self, obj: Mapping[str, Any], generation: Any, retry: int) -> dict[str, Any]:
        namespace, obj_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            created = self.cluster.create(obj)
        except k8s.ApiException as err:
            if err.status == 404:  # the run's namespace exists, so the kind is what is missing
                raise KindNotServed(obj) from err
            refusal = classify_refusal(obj, err, generation)
            if refusal is not None:
                raise refusal from err
            if err.status != 409:
                retry_later(f"create {obj['kind']} {obj_name}", err, self.backoff, retry)
            # Someone (an earlier try whose answer was lost, or another object) holds the name.
            found = self._get(obj, retry)
            if found is None:
                raise kopf.TemporaryError(
                    f"{obj['kind']} {obj_name}: conflict", delay=self.backoff.delay(retry)
                ) from err
            return found
        except Exception as err:
            retry_later(f"create {obj['kind']} {obj_name}", err, self.backoff, retry)
            raise
        if obj["kind"] in TARGET_BY_KIND:
            metrics.JOBS_CREATED.labels(namespace, TARGET_BY_KIND[obj["kind"]]).inc()
        return created

    def _sync_suspend(self, decision: Planned, job: dict[str, Any], retry: int) -> dict[str, Any]:
        wanted = suspend_of(decision.job)
        if suspend_of(job) == wanted:
            return job
        meta = job["metadata"]
        return api_call(
            f"suspend {job['kind']} {meta['name']}",
            lambda: self.cluster.patch(
                job["apiVersion"],
                job["kind"],
                meta["namespace"],
                meta["name"],
                suspend_patch(job["kind"], wanted),
            ),
            self.backoff,
            retry,
        )

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
        event): its record (controller/run_record.py), metric series and kept render.
        What the run owns (its job, TrainingRuntime, NetworkPolicy) the cluster's
        garbage collector deletes through their controller owner references: the controller
        deletes none of it and keeps no finalizer on the run (docs/controller.md, "Delete")."""
        metrics.forget_run(namespace, name)
        forget_render(namespace, name)  # its kept render (controller/render.py)
        self.records.forget((namespace, name))
        self.writer.phases.publish()

    # -- the job mirror: events of the run's job ---------------------------------------------

    def job_event(self, body: kopf.Body, type: str | None, retry: int, **_: Any) -> None:
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
            # Level-triggered: the job as it is now (the job reads' watch cache), read under the
            # run's lock; the event only says that it changed.
            return Observed(), None, job

        namespace = job["metadata"].get("namespace")
        run = self._run_ref(namespace, ref["name"], ref.get("uid"))
        written = self._mirror(run, decide, retry, job["kind"])
        if stopped:
            self._finish_resize(namespace, ref["name"], ref.get("uid"))
            return
        if type == "DELETED" and (written is None or deleting):
            # Deleted with its run (the garbage collector's work, or a foreground deletion's):
            # no status to say it on, but it counts as deleted all the same.
            metrics.JOBS_DELETED.labels(namespace, TARGET_BY_KIND[job["kind"]]).inc()
        if written is not None and job["kind"] == "TrainJob" and type != "DELETED":
            self._progress_events(run, *written)

    def _finish_resize(self, namespace: str, name: str, uid: str | None) -> None:
        """Create the job of a resize whose stopped job is gone (controller/resize.py)."""
        resize.finish(
            lambda: api_call(
                "get run", lambda: self.cluster.get_run(namespace, name), self.backoff, 0
            ),
            lambda run, retry: self._reconcile(run, "resize", None, retry, None),
            uid,
        )

    def _run_ref(self, namespace: str, name: str, uid: str | None) -> dict[str, Any]:
        """A run as events name it (for the writer's read and kopf's events), not yet read."""
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
        }

    def _mirror(
        self,
        run: Mapping[str, Any],
        decide: Callable[[Mapping[str, Any]], tuple[Decision, Any, Any] | None],
        retry: int,
        kind: str = "",
    ) -> tuple[Mapping[str, Any], dict[str, Any], Any] | None:
        """A status from an event of the run's job or pod, with the run read once, under its
        lock (:meth:`StatusWriter.write`): ``decide(run)`` gives (decision, job, job to read
        now) or None (nothing to say: no write). Returns what :meth:`_write` does."""
        found: list[Any] = [None]

        def compute(current: Mapping[str, Any]) -> dict[str, Any]:
            chosen = decide(current)
            if chosen is None:
                return dict(current.get("status") or {})
            decision, job, read = chosen
            found[0] = self._get(read, retry) if read is not None else job
            return desired_status(current, found[0], decision, self.now())

        written = self.writer.write(run, compute, retry, kind)
        if written is None:
            return None
        self._note_stuck(run, written[1])
        return (*written, found[0])

    def _progress_events(
        self, run: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any], job: Any
    ) -> None:
        """A TrainJob's mirrored progress (what the trainer reported to Trainer's status
        server), once per change: its problems logged, its milestone events posted as the
        pytorchjob endpoint posts them (controller/progress_hub.py)."""
        progress = new.get("progress")
        if not isinstance(progress, Mapping) or progress == old.get("progress"):
            return
        key = run_meta(run)[:2]
        problems = trainjob_progress(job)[1] if isinstance(job, Mapping) else []
        if problems:
            logger.warning("run %s/%s: TrainJob trainerStatus: %s", *key, "; ".join(problems))
        milestones = self.records.get(key, "milestones")
        if milestones is None:
            written = old.get("progress") if isinstance(old.get("progress"), Mapping) else {}
            milestones = Milestones.from_written(written, self.checkpoint_events)
            self.records.set(key, milestones=milestones)
        for reason, message in milestones.note(progress, time.monotonic()):
            kopf.event(dict(run), type="Normal", reason=reason, message=message[:1000])

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

        self._mirror(self._run_ref(*key, None), decide, retry)

    @staticmethod
    def owned_by_run(body: kopf.Body, **_: Any) -> bool:
        """The job watch's filter: objects a MegDetRun controls."""
        return run_owner(body) is not None

    @staticmethod
    def index_outputs(body: kopf.Body, **_: Any) -> dict[tuple[str, str, str], OutputClaim]:
        """The ``megdet_outputs`` index: runs by output folder."""
        return output_claim(body)
