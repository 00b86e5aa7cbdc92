"""What this process keeps of each run, in one record per run, forgotten in one place.

The handlers of one operator share one :class:`RunRecords` (the status writer makes it, the
reconciler and the diff base read it): a :class:`RunRecord` per run, keyed by (namespace,
name), that holds every value the controller keeps of a run between its events. The run's
watch says when it is deleted, and :meth:`RunRecords.forget` drops the whole record, so a
value added to a run's record needs no forget of its own. A record whose fields are all None
is dropped as well: a run the controller keeps nothing of costs no entry.

The stores that keep their own structures (each with its own forget, called by
:meth:`megdet.controller.reconciler.Reconciler.forget`; docs/architecture.md, "The
controller") are the kept renders, the run's metric series and the progress hub;
the per-run status locks, the job cache and kopf's index of the runs let go by themselves (a
lock when no handler holds it, a job or a run when its watch drops it).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megdet.controller.progress_events import Milestones

__all__ = ["RunKey", "RunRecord", "RunRecords"]

#: A run: (namespace, name).
RunKey = tuple[str, str]


@dataclass
class RunRecord:
    """What the controller keeps of one run (None: nothing)."""

    #: Its ``status.phase`` as last written (the runs-by-phase gauge).
    phase: str | None = None
    #: What its watch saw of its milestones (controller/progress_events.py).
    milestones: Milestones | None = None
    #: The message of its ``PodsStarted=False`` as last written: only a stuck run's started
    #: pods reach the pod handler.
    stuck: str | None = None
    #: kopf's diff base the reconcile's last status write carried, until kopf stores it
    #: (controller/diffbase.py).
    written_base: str | None = None
    #: The view of the API server's answer to this process's last status write of the run,
    #: until its watch delivers that version (status_writer.RunViews).
    written_view: dict[str, Any] | None = None

    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in dataclasses.fields(self))


class RunRecords:
    """The :class:`RunRecord` of each run; thread-safe (handlers run in kopf's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[RunKey, RunRecord] = {}

    def get(self, key: RunKey, field: str) -> Any:
        """The run's ``field`` (None when nothing is kept)."""
        with self._lock:
            record = self._records.get(key)
            return None if record is None else getattr(record, field)

    def set(self, key: RunKey, **values: Any) -> None:
        """Set fields of the run's record (None clears one)."""
        with self._lock:
            record = self._records.get(key) or RunRecord()
            for field, value in values.items():
                getattr(record, field)  # a field that does not exist is an AttributeError
                setattr(record, field, value)
            if record.empty():
                self._records.pop(key, None)
            else:
                self._records[key] = record

    def update(self, key: RunKey, field: str, change: Callable[[Any], Any]) -> Any:
        """Set the run's ``field`` to ``change(its value)`` in one step; the new value."""
        with self._lock:
            record = self._records.get(key) or RunRecord()
            value = change(getattr(record, field))
            setattr(record, field, value)
            if record.empty():
                self._records.pop(key, None)
            else:
                self._records[key] = record
            return value

    def take(self, key: RunKey, field: str) -> Any:
        """The run's ``field``, cleared."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return None
            value = getattr(record, field)
            setattr(record, field, None)
            if record.empty():
                del self._records[key]
            return value

    def values_of(self, field: str) -> dict[RunKey, Any]:
        """Each run's ``field``, for the runs that have one."""
        with self._lock:
            return {
                key: value
                for key, record in self._records.items()
                if (value := getattr(record, field)) is not None
            }

    def forget(self, key: RunKey) -> None:
        """Drop all that is kept of the run (its watch says it was deleted)."""
        with self._lock:
            self._records.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._records

    def __iter__(self) -> Iterator[RunKey]:
        with self._lock:
            return iter(list(self._records))

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)
