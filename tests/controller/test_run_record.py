"""controller/run_record.py: one record per run, forgotten in one place. Deleting a run leaves
nothing of it in any field of its record, whatever fields the record grows."""

from __future__ import annotations

import dataclasses

import pytest

from megdet.controller import metrics
from megdet.controller.diffbase import StatusDiffBase
from megdet.controller.kubeapi import Backoff
from megdet.controller.reconciler import Reconciler
from megdet.controller.run_record import RunRecord, RunRecords

KEY = ("ns-record", "gone")
OTHER = ("ns-record", "stays")
FIELDS = [f.name for f in dataclasses.fields(RunRecord)]


def running() -> float:
    return metrics.sample("megdet_controller_runs", {"namespace": "ns-record", "phase": "Running"})


def test_a_record_holds_what_is_set_and_goes_when_empty() -> None:
    records = RunRecords()
    records.set(KEY, phase="Running", stuck="ImagePullBackOff")
    assert records.get(KEY, "phase") == "Running" and KEY in records
    assert records.take(KEY, "stuck") == "ImagePullBackOff"
    assert records.get(KEY, "stuck") is None and records.get(OTHER, "phase") is None
    records.set(KEY, phase=None)
    assert len(records) == 0 and KEY not in records  # nothing kept: no entry
    with pytest.raises(AttributeError):
        records.set(KEY, no_such_field=1)


def test_deleting_a_run_leaves_nothing_in_any_field_of_its_record() -> None:
    reconciler = Reconciler(cluster=None, backoff=Backoff())  # type: ignore[arg-type]
    records = reconciler.records
    # Every store that moved into the record shares it.
    assert reconciler.writer.phases.records is records
    assert reconciler.diffbase.records is records
    for key in (KEY, OTHER):
        records.set(key, **{name: f"{name}-value" for name in FIELDS})
    reconciler.writer.phases.set(*KEY, "Running")
    reconciler.writer.phases.set(*OTHER, "Running")
    reconciler.diffbase.note_written(*KEY, "{}")
    assert running() == 2 and len(reconciler.diffbase) == 2

    reconciler.forget(*KEY)

    assert KEY not in records and list(records) == [OTHER]
    assert all(records.get(KEY, name) is None for name in FIELDS)
    assert all(records.get(OTHER, name) is not None for name in FIELDS)  # another run's stays
    assert running() == 1  # the gauge follows at once
    assert len(reconciler.diffbase) == 1


def test_the_diff_base_is_taken_from_the_record_once() -> None:
    records = RunRecords()
    base = StatusDiffBase(records)
    base.note_written(*KEY, "encoded")
    assert records.get(KEY, "written_base") == "encoded" and len(base) == 1
    records.forget(KEY)
    assert len(records) == 0 and len(base) == 0
