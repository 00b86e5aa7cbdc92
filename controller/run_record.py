"""What this process keeps of each run: one :class:`RunRecord` per run, dropped whole when the
run's watch says it was deleted. Which stores keep their own: docs/architecture.md, "The
controller".
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

    def _edit(self, key: RunKey, edit: Callable[[RunRecord], Any]) -> Any:
        """``edit(the run's record)`` under the lock; a record left empty is dropped."""
        with self._lock:
            record = self._records.get(key) or RunRecord()
            result = edit(record)
            if record.empty():
                self._records.pop(key, None)
            else:
                self._records[key] = record
            return result

    def set(self, key: RunKey, **values: Any) -> None:
        """Set fields of the run's record (None clears one)."""
        self._edit(key, lambda record: [_set(record, f, v) for f, v in values.items()])

    def update(self, key: RunKey, field: str, change: Callable[[Any], Any]) -> Any:
        """Set the run's ``field`` to ``change(its value)`` in one step; the new value."""
        return self._edit(key, lambda record: _set(record, field, change(getattr(record, field))))

    def take(self, key: RunKey, field: str) -> Any:
        """The run's ``field``, cleared."""
        return self._edit(key, lambda record: _set(record, field, None, getattr(record, field)))

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


def _set(record: RunRecord, field: str, value: Any, answer: Any = ...) -> Any:
    """Set ``record.field`` (a field that does not exist is an AttributeError); ``answer``, or
    the value set."""
    getattr(record, field)
    setattr(record, field, value)
    return value if answer is ... else answer
