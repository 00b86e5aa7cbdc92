"""RunViews and the status writer: a write reads its run from the run's watch (or this
process's last write of it), never from a stale view without the version as a precondition."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.kubeapi import Backoff
from megdet.controller.status_writer import RUNS_INDEX, RunViews, StatusWriter, run_view


def run(version: int, uid: str = "u1", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "uid": uid,
            "generation": 1,
            "resourceVersion": str(version),
            "labels": {"team": "vision"},
            "annotations": {"note": "x" * 100},
        },
        "spec": {"gpus": 8},
        "status": dict(status),
    }


class Views:
    """A RunViews with its index fed as kopf feeds it: the indexing function registered on a
    real registry, called with the index, its result stored as (namespace, name) -> values."""

    def __init__(self) -> None:
        self.views = RunViews()
        self.index: dict[Any, list[Any]] = {}
        registry = kopf.OperatorRegistry()
        self.views.register(registry)
        (handler,) = registry._indexing.get_all_handlers()
        self.indexer = handler.fn

    def deliver(self, body: dict[str, Any]) -> None:
        result = asyncio.run(self.indexer(body=body, **{RUNS_INDEX: self.index}))
        for key, value in result.items():
            self.index[key] = [value]


def test_a_view_keeps_identity_version_and_status_not_the_spec() -> None:
    view = run_view(run(7, phase="Running"))
    assert view["metadata"] == {
        "name": "r",
        "namespace": "ns",
        "uid": "u1",
        "generation": 1,
        "resourceVersion": "7",
    }
    assert view["status"] == {"phase": "Running"} and "spec" not in view


def test_nothing_is_answered_before_the_watch_is_seen() -> None:
    views = RunViews()
    views.note_written(run(3))  # nothing would drop it without the watch: not kept
    assert views.lookup("ns", "r", "u1") is None and len(views) == 0


def test_the_newer_of_the_watch_and_the_last_write_is_answered() -> None:
    v = Views()
    v.deliver(run(5, phase="Pending"))
    assert v.views.lookup("ns", "r", "u1")["status"] == {"phase": "Pending"}
    v.views.note_written(run(8, phase="Running"))
    assert v.views.lookup("ns", "r", "u1")["status"] == {"phase": "Running"}
    assert len(v.views) == 1
    # An event older than the write (the watch is behind): the write still answers.
    v.deliver(run(6, phase="Pending"))
    assert v.views.lookup("ns", "r", "u1")["metadata"]["resourceVersion"] == "8"
    # The watch delivers the write (or newer): the answer is dropped, the watch answers.
    v.deliver(run(9, phase="Running", restarts=1))
    assert len(v.views) == 0
    assert v.views.lookup("ns", "r", "u1")["status"] == {"phase": "Running", "restarts": 1}


def test_another_incarnation_or_a_version_that_is_no_number_asks_the_server() -> None:
    v = Views()
    v.deliver(run(5))
    assert v.views.lookup("ns", "r", "u2") is None  # the run was deleted and made again
    assert v.views.lookup("ns", "r", None) is not None  # a pod's event names no uid
    v.deliver(run(5) | {"metadata": {**run(5)["metadata"], "resourceVersion": "abc"}})
    assert v.views.lookup("ns", "r", "u1") is None
    assert v.views.lookup("ns", "other", "u1") is None


def test_a_run_its_complete_watch_lacks_is_gone() -> None:
    views = RunViews()
    assert not views.gone("ns", "r", "u1")  # no watch yet: ask the server
    v = Views()
    v.deliver(run(5))
    assert not v.views.gone("ns", "r", "u1") and not v.views.gone("ns", "r", None)
    assert v.views.gone("ns", "r", "u2")  # another incarnation: the job's run is gone
    assert v.views.gone("ns", "deleted", "u3") and v.views.gone("ns", "deleted", None)


def test_a_write_for_a_deleted_run_reads_nothing() -> None:
    cluster, v = Cluster(run(5)), Views()
    v.deliver(run(5))
    writer = writer_with(cluster, v)
    deleted = run(1, uid="gone-uid") | {"metadata": {"namespace": "ns", "name": "old"}}
    assert writer.write(deleted, lambda cur: {"phase": "Failed"}, 0) is None
    assert cluster.calls == []


def test_forget_drops_the_last_write() -> None:
    v = Views()
    v.deliver(run(1))
    v.views.note_written(run(2))
    v.views.records.forget(("ns", "r"))
    assert len(v.views) == 0


class Cluster:
    """The two calls a status write makes: the run's read and its status patch, with the
    API server's resourceVersion precondition."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored
        self.calls: list[tuple[str, Any]] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", None))
        return copy.deepcopy(self.stored)

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: Any = None
    ) -> dict[str, Any]:
        self.calls.append(("patch", resource_version))
        if self.stored is None:
            raise k8s.ApiException(status=404)
        current = self.stored["metadata"]["resourceVersion"]
        if resource_version is not None and resource_version != current:
            raise k8s.ApiException(status=409)
        self.stored["status"] = {**self.stored.get("status", {}), **status}
        self.stored["metadata"]["resourceVersion"] = str(int(current) + 1)
        return copy.deepcopy(self.stored)


def writer_with(cluster: Cluster, v: Views) -> StatusWriter:
    writer = StatusWriter(cluster, Backoff())  # type: ignore[arg-type]
    writer.views = v.views
    return writer


def reads(source: str) -> float:
    return metrics.sample("megdet_controller_run_reads_total", {"source": source})


# The writes below change fields that derive no event (a phase would post one through kopf).


def test_a_write_over_a_fresh_view_reads_nothing_and_carries_the_version() -> None:
    cluster, v = Cluster(run(5, phase="Pending")), Views()
    v.deliver(run(5, phase="Pending"))
    writer = writer_with(cluster, v)
    watch = reads("watch")
    old, new = writer.write(run(5), lambda cur: {**cur["status"], "restarts": 1}, 0)
    assert cluster.calls == [("patch", "5")]
    # stage: the Stage column's step, which every write keeps (controller/lifecycle.py)
    assert old == {"phase": "Pending"}
    assert new == {"phase": "Pending", "restarts": 1, "stage": "Pending"}
    assert reads("watch") == watch + 1
    # The next write reads this write's answer (the watch has not delivered it yet).
    writer.write(run(5), lambda cur: {**cur["status"], "jobName": "r"}, 0)
    assert cluster.calls[-1] == ("patch", "6")
    assert cluster.stored["status"] == {
        "phase": "Pending", "restarts": 1, "jobName": "r", "stage": "Pending",
    }  # fmt: skip


def test_a_stale_view_costs_a_conflict_and_a_read_never_a_lost_update() -> None:
    # Someone wrote the run after the view: a field the view lacks.
    cluster, v = Cluster(run(7, phase="Pending", note="kept")), Views()
    v.deliver(run(5, phase="Pending"))
    writer = writer_with(cluster, v)
    stale, server = reads("stale"), reads("server")
    old, _new = writer.write(run(5), lambda cur: {**cur["status"], "restarts": 1}, 0)
    assert cluster.calls == [("patch", "5"), ("get", None), ("patch", None)]
    assert old == {"phase": "Pending", "note": "kept"}  # the events derive from the read
    assert cluster.stored["status"] == {
        "phase": "Pending", "note": "kept", "restarts": 1, "stage": "Pending",
    }  # fmt: skip
    assert (reads("stale"), reads("server")) == (stale + 1, server + 1)


def test_a_view_that_needs_no_write_sends_nothing_and_a_gone_run_is_gone() -> None:
    cluster, v = Cluster(run(5, phase="Running")), Views()
    v.deliver(run(5, phase="Running"))
    writer = writer_with(cluster, v)
    assert writer.write(run(5), lambda cur: dict(cur["status"]), 0) is not None
    assert cluster.calls == []
    cluster.stored = None  # deleted after the view: the conditional write answers 404
    assert writer.write(run(5), lambda cur: {**cur["status"], "restarts": 2}, 0) is None


def test_without_a_view_the_run_is_read_and_written_as_before() -> None:
    cluster = Cluster(run(3, phase="Pending"))
    writer = StatusWriter(cluster, Backoff())  # type: ignore[arg-type]
    server = reads("server")
    writer.write(run(3), lambda cur: {**cur["status"], "restarts": 1}, 0)
    assert cluster.calls == [("get", None), ("patch", None)]
    assert reads("server") == server + 1


@pytest.mark.parametrize("status", [409, 500])
def test_a_failed_write_after_a_read_is_kopfs_to_retry(status: int) -> None:
    class Failing(Cluster):
        def patch_run_status(self, *a: Any, **k: Any) -> dict[str, Any]:
            self.calls.append(("patch", None))
            raise k8s.ApiException(status=status)

    writer = StatusWriter(Failing(run(3)), Backoff())  # type: ignore[arg-type]
    with pytest.raises(kopf.TemporaryError):
        writer.write(run(3), lambda cur: {"restarts": 1}, 0)
