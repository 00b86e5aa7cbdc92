"""A status change's counters move before its Events are queued (``status_writer.announce``).

kopf posts Events from a task of its own, so a reader that sees a run's ``Failed`` or
``JobDeleted`` Event and then reads the metrics must find the job counted: a CI run once read
``jobs_deleted`` one short when the count came after the Event.
"""

from __future__ import annotations

import kopf
import pytest

from megdet.controller import metrics
from megdet.controller.status_writer import announce

NS = "announce-test"
RUN = {"metadata": {"name": "r", "namespace": NS, "uid": "u-1"}}


def _condition(kind: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.fixture
def posted(monkeypatch) -> list[tuple[str, float, float]]:
    """Each Event queued: (reason, jobs_failed, jobs_deleted) as the counters read then."""
    seen: list[tuple[str, float, float]] = []

    def event(body, *, type, reason, message):
        labels = {"namespace": NS, "target": "pytorchjob"}
        failed = metrics.sample("megdet_controller_jobs_failed_total", labels)
        deleted = metrics.sample("megdet_controller_jobs_deleted_total", labels)
        seen.append((reason, failed, deleted))

    monkeypatch.setattr(kopf, "event", event)
    return seen


def _counts() -> tuple[float, float]:
    labels = {"namespace": NS, "target": "pytorchjob"}
    return (
        metrics.sample("megdet_controller_jobs_failed_total", labels),
        metrics.sample("megdet_controller_jobs_deleted_total", labels),
    )


def test_a_failed_job_is_counted_before_its_event(posted):
    failed, deleted = _counts()
    old = {"phase": "Running"}
    new = {"phase": "Failed", "conditions": [_condition("Failed", "True", "PyTorchJobFailed")]}
    announce(RUN, old, new, "pytorchjob")
    assert [(r, f) for r, f, _ in posted] == [("Failed", failed + 1)]
    assert _counts() == (failed + 1, deleted)
    announce(RUN, new, new, "pytorchjob")  # no change: no Event, no count
    assert len(posted) == 1 and _counts() == (failed + 1, deleted)


def test_a_deleted_job_is_counted_before_its_warning(posted):
    failed, deleted = _counts()
    gone = _condition("JobPresent", "False", "JobDeleted", "deleted by ttlSecondsAfterFinished")
    old = {"phase": "Succeeded"}
    new = {"phase": "Succeeded", "conditions": [gone]}
    announce(RUN, old, new, "pytorchjob")
    assert [(r, d) for r, _, d in posted] == [("JobDeleted", deleted + 1)]
    assert _counts() == (failed, deleted + 1)
