"""Writing a MegDetRun's status from the handlers: one writer per run, events, counters.

:meth:`StatusWriter.write` is the one place a handler writes a run's status. A run's writes
are serialized by a lock per run: the run's reconcile and its job's mirror never interleave,
and each computes the status from the run (and the job) read inside the lock
(:func:`~megdet.controller.status.desired_status`), so what it writes is level-triggered:
the current state, written only where it differs from what the run holds, and nothing at all
when nothing does. That makes the lost update of two writers impossible by construction, so a
write needs no resourceVersion precondition and no retry loop (the controller runs
active-passive: kopf's peering keeps a second replica idle). ``status.progress`` has its own
writer (the progress endpoint, or the TrainJob mirror), a field no other writer touches. The
events and counters of a write follow from the old and the new status
(:func:`~megdet.controller.status.events`).
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
from megdet.controller.diffbase import FIELD as HANDLED_FIELD
from megdet.controller.diffbase import StatusDiffBase
from megdet.controller.job_state import TERMINAL_PHASES
from megdet.controller.kubeapi import Backoff, Cluster, retryable
from megdet.controller.status import JOB_PRESENT, events, progress_patch

__all__ = ["RunLocks", "StatusWriter", "changed_fields", "now_text", "run_meta"]

logger = logging.getLogger(__name__)

#: The counter of each phase a job enters that counts (once per phase change).
TRANSITIONS = {
    "Succeeded": metrics.JOBS_SUCCESSFUL,
    "Failed": metrics.JOBS_FAILED,
    "Restarting": metrics.JOBS_RESTARTED,
}
#: compute(the run as just read) -> the status it should hold (its own: leave it alone).
Compute = Callable[[Mapping[str, Any]], dict[str, Any]]


def now_text() -> str:
    """The time now as the API server writes it (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_meta(body: Mapping[str, Any]) -> tuple[str, str, str | None, Any]:
    """(namespace, name, uid, generation) of an object."""
    meta = body.get("metadata") or {}
    return meta.get("namespace"), meta.get("name"), meta.get("uid"), meta.get("generation")


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``new`` whose value differs from ``old``'s: the merge patch to write (an
    object, ``status.progress``, as its own merge patch: what ``new`` lacks is removed)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if old.get(key) == value:
            continue
        if isinstance(value, Mapping):
            value = progress_patch(old.get(key), value)
            if value is None:
                continue
        patch[key] = value
    return patch


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
        #: kopf's diff base in the run's status (controller/diffbase.py): a reconcile's last
        #: write carries it, so kopf makes no write of its own.
        self.diffbase = StatusDiffBase()

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
        retry: int,
        kind: str = "",
        handled: str | None = None,
    ) -> tuple[Mapping[str, Any], dict[str, Any]] | None:
        """Bring the run's status to what ``compute`` says; returns (the status it replaced,
        the new one), or None when the run is gone (or is another incarnation: a new uid; a run
        given without a uid, as a pod's labels name it, is taken as it is found).

        Under the run's lock: read the run, ``compute(run)`` the status it should hold, write
        the fields that differ (no request at all when none do), then post the events the
        change derives (:func:`~megdet.controller.status.events`) and count it: a job's
        transition, a deleted job (``kind``: the job's, for the target label of a run whose
        status has none yet).

        ``handled``: the write ends a reconcile of the run as it was given to it, and carries
        kopf's diff base for it (:meth:`StatusDiffBase.encoded`), so that kopf need not patch
        the run for it once the handler returns (not on a run being deleted, whose status
        stays as it is).
        """
        namespace, name, uid, _gen = run_meta(run)
        with self.locks.hold((namespace, name)):
            current = self.api_call("get run", lambda: self.cluster.get_run(namespace, name), retry)
            if current is None or (
                uid is not None and (current.get("metadata") or {}).get("uid") != uid
            ):
                return None  # deleted (or deleted and re-created) meanwhile
            old = current.get("status") or {}
            new = compute(current)
            deleting = (current.get("metadata") or {}).get("deletionTimestamp")
            if handled is not None and not deleting:
                new[HANDLED_FIELD] = handled
            patch = changed_fields(old, new)
            if patch:
                self.api_call(
                    "write status",
                    lambda: self.cluster.patch_run_status(namespace, name, patch),
                    retry,
                )
                if handled is not None and HANDLED_FIELD in patch:
                    self.diffbase.note_written(namespace, name, handled)
        if new.get("phase") is not None:
            self.phases.set(namespace, name, new["phase"])
        target = str(new.get("target") or TARGET_BY_KIND.get(kind, kind.lower()))
        for event in events(old, new):
            kopf.event(dict(current), type=event.type, reason=event.reason, message=event.message)
            if event.type == "Warning":
                logger.warning("run %s/%s: %s", namespace, name, event.message)
            if event.source == "phase":  # a job that succeeded, failed or restarted
                counter = TRANSITIONS.get(event.reason)
                if counter is not None:
                    counter.labels(namespace, target).inc()
                if event.reason in TERMINAL_PHASES:
                    logger.info("run %s/%s %s", namespace, name, event.reason)
            elif event.source == JOB_PRESENT:
                metrics.JOBS_DELETED.labels(namespace, target).inc()
        return old, new
