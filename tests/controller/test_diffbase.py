"""kopf's diff base in the run's status (controller/diffbase.py), against kopf's own use of it.

The operator tests (test_reconciler.py) show the effect on a served API; these pin the storage's
contract with kopf: the base the reconcile writes is the one kopf would store, kopf stores
nothing the reconcile already wrote, and what earlier controllers left is still read.
"""

from __future__ import annotations

import json
from typing import Any

import kopf

from megdet.controller.api import GROUP
from megdet.controller.diffbase import FIELD, LEGACY_KEY, ProgressAnnotations, StatusDiffBase


def _run(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {
            "name": "r",
            "namespace": "vision",
            "uid": "u1",
            "generation": 3,
            "resourceVersion": "17",
            "labels": {"team": "vision"},
            "annotations": {
                "note": "kept",
                f"{GROUP}/reconcile": '{"retries":1}',
                f"{GROUP}/kopf-managed": "yes",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
            },
        },
        "spec": {"gpus": 8, "suspend": False},
        "status": {"phase": "Pending"},
        **extra,
    }


def test_the_base_written_is_the_one_kopf_compares_with() -> None:
    """kopf takes progress_storage.clear(diffbase.build(body)) as the run's essence
    (kopf/_core/reactor/processing.py): the reconcile's encoded base is exactly that."""
    base = StatusDiffBase()
    body = kopf.Body(_run())
    kopfs = ProgressAnnotations().clear(essence=base.build(body=body))
    assert json.loads(base.encoded(_run())) == kopfs
    assert kopfs == {
        "spec": {"gpus": 8, "suspend": False},
        "metadata": {"labels": {"team": "vision"}, "annotations": {"note": "kept"}},
    }


def test_a_run_whose_only_annotations_are_ours_has_none_in_its_essence() -> None:
    run = _run()
    run["metadata"]["annotations"] = {f"{GROUP}/reconcile": "{}"}
    assert "annotations" not in StatusDiffBase().build(body=kopf.Body(run))["metadata"]


def test_fetch_reads_the_status_then_the_annotation_of_earlier_controllers() -> None:
    base = StatusDiffBase()
    assert base.fetch(body=kopf.Body(_run())) is None  # never handled: kopf's create
    legacy = _run()
    legacy["metadata"]["annotations"][f"{GROUP}/{LEGACY_KEY}"] = '{"spec":{"gpus":16}}\n'
    assert base.fetch(body=kopf.Body(legacy)) == {"spec": {"gpus": 16}}
    legacy["status"][FIELD] = '{"spec":{"gpus":8}}'
    assert base.fetch(body=kopf.Body(legacy)) == {"spec": {"gpus": 8}}  # the status wins


def test_a_base_that_is_not_json_is_taken_as_never_handled() -> None:
    """In the status or in the old annotation (which a run's editors can write): a base that
    does not parse to an object is no base, never an exception in kopf's processing."""
    for bad in ("{", "[1]", '"x"'):
        run = _run()
        run["status"][FIELD] = bad
        assert StatusDiffBase().fetch(body=kopf.Body(run)) is None
        legacy = _run()
        legacy["metadata"]["annotations"][f"{GROUP}/{LEGACY_KEY}"] = bad
        assert StatusDiffBase().fetch(body=kopf.Body(legacy)) is None


def test_kopf_writes_the_base_unless_the_reconcile_wrote_it() -> None:
    base = StatusDiffBase()
    run = _run()
    essence = ProgressAnnotations().clear(essence=base.build(body=kopf.Body(run)))

    patch = kopf.Patch()
    base.store(body=kopf.Body(run), patch=patch, essence=essence)
    assert dict(patch) == {"status": {FIELD: base.encoded(run)}}  # a handler that wrote none

    base.note_written("vision", "r", base.encoded(run))
    patch = kopf.Patch()
    base.store(body=kopf.Body(run), patch=patch, essence=essence)
    assert not patch and len(base) == 0  # written by the reconcile, and no longer kept

    # A base written for an older spec does not stand for the newer one kopf stores.
    base.note_written("vision", "r", base.encoded(run))
    newer = _run(spec={"gpus": 16})
    newer_essence = base.build(body=kopf.Body(newer))
    patch = kopf.Patch()
    base.store(body=kopf.Body(newer), patch=patch, essence=newer_essence)
    assert json.loads(patch["status"][FIELD])["spec"] == {"gpus": 16}


def test_a_forgotten_run_keeps_nothing() -> None:
    base = StatusDiffBase()
    base.note_written("vision", "r", "{}")
    base.records.forget(("vision", "r"))
    assert len(base) == 0


def test_progress_is_stored_without_kopfs_marker() -> None:
    """A handler's progress record, and nothing else: purging it once the handler is done
    leaves kopf an empty patch (no request)."""
    storage = ProgressAnnotations()
    body = kopf.Body({"metadata": {"name": "r", "namespace": "vision", "annotations": {}}})
    patch = kopf.Patch()
    storage.store(key=kopf.HandlerId("reconcile"), record={"retries": 1}, body=body, patch=patch)
    assert list(patch["metadata"]["annotations"]) == [f"{GROUP}/reconcile"]
    storage.purge(key=kopf.HandlerId("reconcile"), body=body, patch=patch)
    assert not patch
