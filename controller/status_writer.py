"""Writing a MegDetRun's status from the handlers (:class:`StatusWriter`): one writer per run,
the events a change posts (:func:`events`), counters. How and why: docs/controller.md, "The
controller in detail" (one writer per run's status; the run read from its watch).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.api import GROUP, PLURAL, TARGET_BY_KIND, VERSION
from megdet.controller.conditions import condition_of
from megdet.controller.diffbase import FIELD as HANDLED_FIELD
from megdet.controller.diffbase import StatusDiffBase
from megdet.controller.job_cache import version_of
from megdet.controller.job_state import TERMINAL_PHASES
from megdet.controller.kubeapi import Backoff, Cluster, api_call, retry_later
from megdet.controller.lifecycle import stage_of
from megdet.controller.resize import events as resize_events
from megdet.controller.run_record import RunRecords
from megdet.controller.run_summary import with_summary
from megdet.controller.status import (
    CHILDREN_READY,
    FOREIGN_JOB,
    JOB_PRESENT,
    JOB_REFUSED,
    PODS_STARTED,
    POLICY_DENIED,
)

__all__ = [
    "WARNING_CONDITIONS",
    "Event",
    "RunLocks",
    "RunViews",
    "StatusWriter",
    "changed_fields",
    "events",
    "now_text",
    "progress_patch",
    "run_meta",
]

logger = logging.getLogger(__name__)

#: The counter of each phase a job enters that counts (once per phase change).
TRANSITIONS = {
    "Succeeded": metrics.JOBS_SUCCESSFUL,
    "Failed": metrics.JOBS_FAILED,
    "Restarting": metrics.JOBS_RESTARTED,
}
#: compute(the run as just read) -> the status it should hold (its own: leave it alone).
Compute = Callable[[Mapping[str, Any]], dict[str, Any]]
#: The kopf index of the runs as their watch delivers them (:class:`RunViews`).
RUNS_INDEX = "megdet_runs"
#: What a view keeps of a run's metadata: what a status write reads (whose run, which
#: version, being deleted) and what kopf's events name.
_VIEW_METADATA = ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp")


@dataclass(frozen=True)
class Event:
    """One event on the run: ``source`` is "phase" for a phase change (a job's transition,
    counted), else the type of the condition whose change it reports."""

    type: str
    reason: str
    message: str
    source: str


#: The conditions whose arrival is news (a Warning event), each with the status it warns in.
WARNING_CONDITIONS = {
    "Created": "False",
    CHILDREN_READY: "False",
    "Valid": "False",
    JOB_PRESENT: "False",
    FOREIGN_JOB: "True",
    PODS_STARTED: "False",
}
#: The condition that says why a run is in a phase (the phase's own for the mirrored ones).
_CAUSE = {"Invalid": "Valid", "Pending": "Created"}


def _episode(cond: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells one episode of a condition from the next: its status and reason; for a
    refusal also the generation (each refused spec is news), for a foreign job its message
    (each foreign object, by its uid, is news); for pods that cannot start only the status (the
    kubelet alternates ``ErrImagePull`` and ``ImagePullBackOff``: one Warning per episode)."""
    if cond.get("type") == FOREIGN_JOB:
        return cond.get("status"), cond.get("message")
    if cond.get("type") == PODS_STARTED:
        return (cond.get("status"),)
    if cond.get("reason") == JOB_REFUSED:
        return cond.get("status"), cond.get("reason"), cond.get("observedGeneration")
    return cond.get("status"), cond.get("reason")


def events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """The events the change from ``old`` to ``new`` posts: a Warning for each condition of
    :data:`WARNING_CONDITIONS` that enters its warning status or a new episode of it (``Valid``
    only for :data:`POLICY_DENIED`: an invalid spec is said by its phase), and one event per
    phase change (Warning for Failed and Invalid, else Normal) unless a Warning already says
    why (its reason is that of the phase's cause: a refused job, a deleted one, a denied
    spec, a job not created). None when nothing changed."""
    out: list[Event] = []
    for kind, warns in WARNING_CONDITIONS.items():
        cond = condition_of(new, kind)
        if cond is None or cond.get("status") != warns:
            continue
        if kind == "Valid" and cond.get("reason") != POLICY_DENIED:
            continue
        before = condition_of(old, kind)
        if before is not None and _episode(before) == _episode(cond):
            continue
        reason = FOREIGN_JOB if kind == FOREIGN_JOB else str(cond.get("reason"))
        out.append(Event("Warning", reason, str(cond.get("message") or "")[:1000], kind))
    was, phase = old.get("phase"), new.get("phase")
    if phase is not None and phase != was:
        cause = condition_of(new, _CAUSE.get(phase, phase)) or {}
        if cause.get("reason") not in {e.reason for e in out}:
            message = str(cause.get("message") or "")
            text = f"phase {was or 'None'} -> {phase}" + (f": {message}" if message else "")
            kind = "Warning" if phase in ("Failed", "Invalid") else "Normal"
            out.insert(0, Event(kind, phase, text[:1000], "phase"))

    out += [Event("Normal", r, m[:1000], "resize") for r, m in resize_events(old, new)]
    return out


def announce(
    run: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any], target: str
) -> None:
    """Count and post the events of the change from ``old`` to ``new`` on ``run``. Each is
    counted before its Event is queued: kopf posts Events from a task of its own, so whoever
    sees the Event reads the counter already moved."""
    namespace, name, _, _ = run_meta(run)
    for event in events(old, new):
        if event.source == "phase":  # a job that succeeded, failed or restarted
            counter = TRANSITIONS.get(event.reason)
            if counter is not None:
                counter.labels(namespace, target).inc()
        elif event.source == JOB_PRESENT:
            metrics.JOBS_DELETED.labels(namespace, target).inc()
        kopf.event(dict(run), type=event.type, reason=event.reason, message=event.message)
        if event.type == "Warning":
            logger.warning("run %s/%s: %s", namespace, name, event.message)
        if event.source == "phase" and event.reason in TERMINAL_PHASES:
            logger.info("run %s/%s %s", namespace, name, event.reason)


def now_text() -> str:
    """The time now as the API server writes it (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_meta(body: Mapping[str, Any]) -> tuple[str, str, str | None, Any]:
    """(namespace, name, uid, generation) of an object."""
    meta = body.get("metadata") or {}
    return meta.get("namespace"), meta.get("name"), meta.get("uid"), meta.get("generation")


def progress_patch(old: Any, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``status.progress`` that turns ``old`` into ``new`` (a field ``new``
    lacks is set to null, which removes it); None when they are equal: nothing to write."""
    before = old if isinstance(old, Mapping) else {}
    if dict(before) == dict(new) and (isinstance(old, Mapping) or not new):
        return None
    return {**{key: None for key in before if key not in new}, **new}


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
    """Each run's phase (its record's ``phase``), for the runs-by-phase gauge."""

    records: RunRecords = field(default_factory=RunRecords)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        with self.lock:
            self.records.set((namespace, name), phase=phase)
            self.publish()

    def publish(self) -> None:
        """Set the gauge from the records (after a run's record was forgotten, too)."""
        by_run = self.records.values_of("phase")
        metrics.set_run_phases((ns, ph) for (ns, _), ph in by_run.items())


def diff_touches(diff: Iterable[Any], path: tuple[str, ...]) -> bool:
    """Whether a kopf diff changes ``path`` or anything above or below it."""
    return any(tuple(at[: len(path)]) == path[: len(at)] for _op, at, _old, _new in diff or ())


def run_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What :class:`RunViews` keeps of a run: its identity and version, and its status (what
    :func:`~megdet.controller.status.desired_status` and the job and pod mirrors read); not
    its spec, labels or annotations."""
    meta = body.get("metadata") or {}
    view: dict[str, Any] = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in _VIEW_METADATA if k in meta},
    }
    if isinstance(body.get("status"), Mapping):
        view["status"] = copy.deepcopy(dict(body["status"]))
    return view


class RunViews:
    """Each run as this process last knew it, so that a status write reads no run from the API
    server: its watch's (the kopf index ``megdet_runs``) or this process's last write's, the
    newer. Why a stale view is safe: docs/controller.md, "The controller in detail"."""

    def __init__(self, records: RunRecords | None = None) -> None:
        self._lock = threading.Lock()
        self._index: Mapping[Any, Any] | None = None
        #: Each run's record (``written_view``): the view of this process's last status
        #: write's answer, until the watch delivers it (or a newer version).
        self.records = records if records is not None else RunRecords()

    def register(self, registry: Any) -> None:
        """The runs' index on ``registry`` (kopf's operator registry)."""

        async def index_run(body: Mapping[str, Any], **kwargs: Any) -> dict[Any, Any]:
            # Async: kopf calls it on its event loop (no hop to its handler threads).
            meta = body.get("metadata") or {}
            key = (meta.get("namespace"), meta.get("name"))
            view = run_view(body)
            with self._lock:
                if self._index is None:
                    self._index = kwargs.get(RUNS_INDEX)

            def delivered(written: dict[str, Any] | None) -> dict[str, Any] | None:
                if written is not None and (
                    _uid(written) != meta.get("uid")
                    or (version_of(view) or 0) >= (version_of(written) or 0)
                ):
                    return None  # delivered (or a newer version, or another run)
                return written

            self.records.update(key, "written_view", delivered)
            return {key: view}

        kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=RUNS_INDEX)(index_run)

    def _seen(self, key: tuple[str, str]) -> list[dict[str, Any]] | None:
        """The run's views in the watch's index; None before the index is seen."""
        with self._lock:
            index = self._index
        if index is None:
            return None
        try:
            store = index.get(key)
        except RuntimeError:  # changed while read (kopf's loop writes it): ask the server
            return None
        return list(store) if store else []

    def lookup(self, namespace: str, name: str, uid: str | None) -> dict[str, Any] | None:
        """The newest view of the run (of the incarnation ``uid``, if given), or None: ask the
        API server (no watch yet, a run the watch has not delivered, a version that is not a
        number)."""
        key = (namespace, name)
        written = self.records.get(key, "written_view")
        seen = self._seen(key) or []
        found = [v for v in [*seen, written] if v is not None and uid in (None, _uid(v))]
        if not found or any(version_of(v) is None for v in found):
            return None
        metrics.RUN_READS.labels("watch").inc()
        return max(found, key=lambda v: version_of(v) or 0)

    def gone(self, namespace: str, name: str, uid: str | None) -> bool:
        """Whether the run's watch says the run (the incarnation ``uid``, if given) does not
        exist: kopf's index, complete before any handler runs, holds no such run (a job mirror's
        write for a job the garbage collector deletes after its run)."""
        written = self.records.get((namespace, name), "written_view")
        if written is not None and uid in (None, _uid(written)):
            return False
        seen = self._seen((namespace, name))
        return seen is not None and not any(uid in (None, _uid(v)) for v in seen)

    def note_written(self, answer: Mapping[str, Any]) -> None:
        """The API server's answer to this process's status write of a run."""
        meta = answer.get("metadata") or {}
        with self._lock:
            watched = self._index is not None
        if watched:  # without the watch, nothing would drop it
            key = (meta.get("namespace"), meta.get("name"))
            self.records.set(key, written_view=run_view(answer))

    def __len__(self) -> int:
        """Runs whose last written answer is held (the index is kopf's, and drops a deleted
        run itself)."""
        return len(self.records.values_of("written_view"))


def _uid(view: Mapping[str, Any]) -> Any:
    return (view.get("metadata") or {}).get("uid")


class StatusWriter:
    """Status writes, events and counters for the handlers of one operator."""

    def __init__(
        self, cluster: Cluster, backoff: Backoff, now: Callable[[], str] = now_text
    ) -> None:
        self.cluster = cluster
        self.backoff = backoff
        self.now = now
        #: what this process keeps of each run, forgotten in one place (run_record.py)
        self.records = RunRecords()
        self.phases = Phases(self.records)
        self.locks = RunLocks()
        #: kopf's diff base in the run's status (controller/diffbase.py): a reconcile's last
        #: write carries it, so kopf makes no write of its own.
        self.diffbase = StatusDiffBase(self.records)
        #: the runs as this process last knew them: a write reads no run (register() puts
        #: their index on the operator's registry; until then every write reads the run).
        self.views = RunViews(self.records)

    def write(
        self,
        run: Mapping[str, Any],
        compute: Compute,
        retry: int,
        kind: str = "",
        handled: str | None = None,
    ) -> tuple[Mapping[str, Any], dict[str, Any]] | None:
        """Bring the run's status to what ``compute(run)`` says, under the run's lock, then post
        its events and count it; returns (the status it replaced, the new one), or None when the
        run is gone or is another incarnation (a run given without a uid is taken as found).
        ``kind``: the job's, for the target label of a run whose status has none yet.
        ``handled``: the write ends a reconcile and carries kopf's diff base for it. How:
        docs/controller.md, "The controller in detail" (one writer per run's status).
        """
        namespace, name, uid, _gen = run_meta(run)
        with self.locks.hold((namespace, name)):
            view = self.views.lookup(namespace, name, uid)
            if view is None and self.views.gone(namespace, name, uid):
                return None  # deleted: no read of it (its watch is complete and lacks it)
            while True:
                if view is not None:
                    current = view
                else:
                    metrics.RUN_READS.labels("server").inc()
                    current = api_call(
                        "get run",
                        lambda: self.cluster.get_run(namespace, name),
                        self.backoff,
                        retry,
                    )
                    if current is None or (uid is not None and _uid(current) != uid):
                        return None  # deleted (or deleted and re-created) meanwhile
                meta = current.get("metadata") or {}
                old = current.get("status") or {}
                new = with_summary(compute(current))  # a finished run's summary
                if handled is not None and not meta.get("deletionTimestamp"):
                    new[HANDLED_FIELD] = handled
                patch = changed_fields(old, new)
                if patch and new.get("phase") is not None:  # the Stage column follows
                    new["stage"] = stage_of(new)
                    patch = changed_fields(old, new)
                if not patch:
                    if handled is not None and old.get(HANDLED_FIELD) == handled:
                        # The run holds this base already (a write whose answer was lost):
                        # kopf has nothing to write either.
                        self.diffbase.note_written(namespace, name, handled)
                    break
                version = meta.get("resourceVersion") if view is not None else None
                try:
                    answer = self.cluster.patch_run_status(namespace, name, patch, version)
                except Exception as err:
                    code = err.status if isinstance(err, k8s.ApiException) else None
                    if view is not None and code == 409:
                        # Changed since the view: read it, and write once more.
                        metrics.RUN_READS.labels("stale").inc()
                        view = None
                        continue
                    if view is not None and code == 404:
                        return None  # deleted meanwhile
                    retry_later("write status", err, self.backoff, retry)
                    raise
                if isinstance(answer, Mapping):
                    self.views.note_written(answer)
                if handled is not None and HANDLED_FIELD in patch:
                    self.diffbase.note_written(namespace, name, handled)
                break
        if new.get("phase") is not None:
            self.phases.set(namespace, name, new["phase"])
        target = str(new.get("target") or TARGET_BY_KIND.get(kind, kind.lower()))
        announce(current, old, new, target)
        return old, new
