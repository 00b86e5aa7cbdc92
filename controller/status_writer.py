"""Writing a MegDetRun's status from the handlers: one writer per run, events, counters.

:class:`StatusWriter` is the one place a handler writes a run's status
(:meth:`StatusWriter.write`). A run's writes are serialized by a lock per run: the run's
reconcile and its job's mirror never interleave, and each computes the status from the run
(and the job) read inside the lock, so what it writes is level-triggered: the current state,
written only where it differs from what the run holds. That makes the lost update of two
writers impossible by construction, so a write needs no resourceVersion precondition and no
retry loop (the controller runs active-passive: kopf's peering keeps a second replica idle).
``status.progress`` has its own writer (the progress endpoint, or the TrainJob mirror), a
field no other writer touches. The outcomes that go with a Warning event and a counter
(invalid for the cluster's policy, not created, refused, the job gone) live here too; what
each status holds is decided by the pure builders of :mod:`megdet.controller.status`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from megdet.controller import metrics
from megdet.controller.api import TARGET_BY_KIND
from megdet.controller.job_state import TERMINAL_PHASES, JobState
from megdet.controller.kubeapi import Backoff, Cluster, retryable
from megdet.controller.status import (
    CHILDREN_READY,
    FOREIGN_JOB,
    JOB_DELETED,
    JOB_REFUSED,
    condition_of,
    conflict_message,
    finished,
    foreign_job_status,
    invalid_status,
    job_deleted_status,
    next_status,
    not_created_status,
    refused_status,
)

__all__ = ["POLICY_DENIED", "RunLocks", "StatusWriter", "changed_fields", "now_text", "run_meta"]

logger = logging.getLogger(__name__)

#: The Valid condition's reason (and the event's) for a run outside the cluster's policy.
POLICY_DENIED = "PolicyDenied"

#: compute(old status, the run as just read) -> the status fields it should hold (None: leave
#: the status alone).
Compute = Callable[[Mapping[str, Any], Mapping[str, Any]], "dict[str, Any] | None"]


def now_text() -> str:
    """The time now as the API server writes it (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_meta(body: Mapping[str, Any]) -> tuple[str, str, str | None, Any]:
    """(namespace, name, uid, generation) of an object."""
    meta = body.get("metadata") or {}
    return meta.get("namespace"), meta.get("name"), meta.get("uid"), meta.get("generation")


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``new`` whose value differs from ``old``'s: the merge patch to write."""
    return {key: value for key, value in new.items() if old.get(key) != value}


class RunLocks:
    """A lock per run, held while one of its handlers reads, computes and writes its status."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, list[int]]] = {}

    @contextlib.contextmanager
    def hold(self, key: tuple[str, str]) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._guard:
                users[0] -= 1
                if users[0] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


@dataclass
class Phases:
    """Each run's phase, for the runs-by-phase gauge."""

    by_run: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        with self.lock:
            if phase is None:
                self.by_run.pop((namespace, name), None)
            else:
                self.by_run[(namespace, name)] = phase
            metrics.set_run_phases((ns, ph) for (ns, _), ph in self.by_run.items())


def post_phase_event(run: Mapping[str, Any], old: str | None, new: str, message: str) -> None:
    """One event per phase change: Warning for Failed and Invalid, else Normal."""
    if old == new:
        return
    kind = "Warning" if new in ("Failed", "Invalid") else "Normal"
    text = f"phase {old or 'None'} -> {new}" + (f": {message}" if message else "")
    kopf.event(dict(run), type=kind, reason=new, message=text[:1000])


def count_transition(namespace: str, target: str, old: str | None, new: str) -> None:
    """Count a job that succeeded, failed or restarted (once per phase change)."""
    if old == new:
        return
    counter = {
        "Succeeded": metrics.JOBS_SUCCESSFUL,
        "Failed": metrics.JOBS_FAILED,
        "Restarting": metrics.JOBS_RESTARTED,
    }.get(new)
    if counter is not None:
        counter.labels(namespace, target).inc()


def condition_reason(status: Mapping[str, Any], kind: str) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("reason")
    return None


def diff_touches(diff: Iterable[Any], path: tuple[str, ...]) -> bool:
    """Whether a kopf diff changes ``path`` or anything above or below it."""
    for _op, field_path, _old, _new in diff or ():
        n = min(len(field_path), len(path))
        if tuple(field_path[:n]) == path[:n]:
            return True
    return False


def raiser(err: BaseException) -> Callable[[], Any]:
    """A call that raises ``err`` (to sort an error already caught through :meth:`api_call`)."""

    def call() -> Any:
        raise err

    return call


class StatusWriter:
    """Status writes, events and counters for the handlers of one operator."""

    def __init__(
        self, cluster: Cluster, backoff: Backoff, now: Callable[[], str] = now_text
    ) -> None:
        self.cluster = cluster
        self.backoff = backoff
        self.now = now
        self.phases = Phases()
        self.locks = RunLocks()

    def api_call(self, what: str, call: Callable[[], Any], retry: int) -> Any:
        """``call()``; a retryable failure becomes kopf.TemporaryError (counted as an error)."""
        try:
            return call()
        except Exception as err:
            if retryable(err):
                metrics.RECONCILES.labels("error").inc()
                raise kopf.TemporaryError(
                    f"{what}: {err}", delay=self.backoff.delay(retry)
                ) from err
            raise

    def write(
        self,
        run: Mapping[str, Any],
        compute: Compute,
        message: str,
        retry: int,
        phase_event: bool = True,
    ) -> Mapping[str, Any] | None:
        """Bring the run's status to what ``compute`` says; returns the status it replaced.

        Under the run's lock: read the run, ``compute(old_status, run)`` the fields it should
        hold (None: leave it alone), write those that differ (nothing, if none do). Returns the
        status ``compute`` saw, or None when it returned None or the run is gone (or is
        another incarnation: a different uid). ``phase_event=False``: the caller posts its own
        event for a phase change.
        """
        namespace, name, uid, _gen = run_meta(run)
        with self.locks.hold((namespace, name)):
            current = self.api_call("get run", lambda: self.cluster.get_run(namespace, name), retry)
            if current is None or (current.get("metadata") or {}).get("uid") != uid:
                return None  # deleted (or deleted and re-created) meanwhile
            old_status = current.get("status") or {}
            status = compute(old_status, current)
            if status is None:
                return None
            patch = changed_fields(old_status, status)
            if patch:
                self.api_call(
                    "write status",
                    lambda: self.cluster.patch_run_status(namespace, name, patch),
                    retry,
                )
        old = old_status.get("phase")
        new = status.get("phase") or old
        if new is not None:
            self.phases.set(namespace, name, new)
            if phase_event:
                post_phase_event(current, old, new, message)
        return old_status

    def policy_denied(
        self, run: Mapping[str, Any], problems: list[str], generation: Any, retry: int
    ) -> None:
        """Outside the cluster's policy: phase Invalid, ``Valid=False`` (reason
        ``PolicyDenied``), one Warning event; retried when the spec or the policy changes."""

        def denied(old: Mapping[str, Any], _run: Any) -> dict[str, Any]:
            return invalid_status(old, problems, self.now(), generation, reason=POLICY_DENIED)

        before = self.write(run, denied, "", retry, phase_event=False)
        metrics.RECONCILES.labels("denied").inc()
        if before is not None and condition_reason(before, "Valid") != POLICY_DENIED:
            message = "; ".join(problems)
            kopf.warn(run, reason=POLICY_DENIED, message=message[:1000])
            logger.warning("run %s/%s: %s", *run_meta(run)[:2], message)

    def conflict(
        self, run: Mapping[str, Any], kind: str, name: str, generation: Any, retry: int
    ) -> None:
        """An object of the name the run needs is not the run's: never overwritten, retried."""
        self.not_created(run, "JobNameConflict", conflict_message(kind, name), generation, retry)
        metrics.RECONCILES.labels("conflict").inc()
        raise kopf.TemporaryError(
            f"{kind} {name} is not owned by this run", delay=self.backoff.conflict_delay
        )

    def not_created(
        self, run: Mapping[str, Any], reason: str, message: str, generation: Any, retry: int
    ) -> None:
        """``Created=False`` with ``reason``; a Warning event once per episode, not per retry."""
        before = self.write(
            run,
            lambda old, _run: not_created_status(old, reason, message, self.now(), generation),
            "",
            retry,
            phase_event=False,
        )
        if before is not None and condition_reason(before, "Created") != reason:
            kopf.warn(run, reason=reason, message=message[:1000])

    def refused(self, run: Mapping[str, Any], message: str, generation: Any, retry: int) -> None:
        """The API server refused the job: phase Failed, ``Created=False`` (reason
        ``JobRefused``), one Warning event, counted; no retry until the spec changes."""
        before = self.write(
            run,
            lambda old, _run: refused_status(old, message, self.now(), generation),
            message,
            retry,
            phase_event=False,
        )
        metrics.RECONCILES.labels("refused").inc()
        if before is not None:
            kopf.warn(run, reason=JOB_REFUSED, message=message[:1000])
            logger.warning("run %s/%s: %s", *run_meta(run)[:2], message)

    def children_event(
        self,
        run: Mapping[str, Any],
        before: Mapping[str, Any] | None,
        children: list[tuple[str, str]],
    ) -> None:
        """One Warning event when the run's other objects turn not ready (``ChildrenReady``
        False, or False for another reason); ``before``: the status the write replaced."""
        if before is None or not children:
            return
        reasons = {reason for reason, _ in children}
        reason = reasons.pop() if len(reasons) == 1 else "ChildrenNotReady"
        old = condition_of(before, CHILDREN_READY)
        if old is not None and old.get("status") == "False" and old.get("reason") == reason:
            return
        message = "; ".join(text for _, text in children)
        kopf.warn(run, reason=reason, message=message[:1000])
        logger.warning("run %s/%s: %s", *run_meta(run)[:2], message)

    def foreign_job(
        self, run: Mapping[str, Any], job: Mapping[str, Any], present: bool, retry: int
    ) -> None:
        """A job under the run's job name that names the run as controller but is not the one
        the controller created (``status.jobUID``): ``ForeignJob=True`` and one Warning event;
        ``present=False`` (it was deleted): ``ForeignJob=False``."""
        _namespace, _name, _uid, generation = run_meta(run)
        meta = job.get("metadata") or {}
        kind, name, uid = job.get("kind"), meta.get("name"), meta.get("uid")
        said: dict[str, str] = {}

        def compute(old: Mapping[str, Any], _current: Any) -> dict[str, Any] | None:
            patch = foreign_job_status(
                old, str(kind), str(name), uid, present, self.now(), generation
            )
            if patch is not None:
                said["message"] = next(
                    c["message"] for c in patch["conditions"] if c["type"] == FOREIGN_JOB
                )
            return patch

        before = self.write(run, compute, "", retry, phase_event=False)
        if before is not None and present and "message" in said:
            kopf.warn(run, reason=FOREIGN_JOB, message=said["message"][:1000])
            logger.warning("run %s/%s: %s", *run_meta(run)[:2], said["message"])

    def job_gone(
        self,
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
        namespace, name, _uid, generation = run_meta(run)
        said: dict[str, Any] = {}

        def compute(old: Mapping[str, Any], current: Mapping[str, Any]) -> dict | None:
            said.clear()
            if (current.get("metadata") or {}).get("deletionTimestamp"):
                return None  # the run is being deleted: its cleanup deleted the job
            patch: dict[str, Any] = {}
            if final is not None and final.phase in TERMINAL_PHASES and not finished(old):
                patch = next_status(old, final, self.now(), generation)
                said["final"] = (old.get("phase"), final)
            gone = job_deleted_status({**old, **patch}, kind, job_name, self.now(), generation)
            if gone is not None:
                said["message"] = next(
                    c["message"] for c in gone["conditions"] if c["type"] == "JobPresent"
                )
            patch.update(gone or {})
            return patch or None

        before = self.write(run, compute, "", retry, phase_event=False)
        if before is None:
            return
        target = TARGET_BY_KIND.get(kind, kind.lower())
        if "final" in said:
            old_phase, state = said["final"]
            post_phase_event(run, old_phase, state.phase, state.message)
            count_transition(namespace, target, old_phase, state.phase)
        if "message" in said:
            metrics.JOBS_DELETED.labels(namespace, target).inc()
            kopf.warn(run, reason=JOB_DELETED, message=said["message"][:1000])
            logger.warning("run %s/%s: %s", namespace, name, said["message"])
