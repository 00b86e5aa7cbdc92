"""The CA keeper stops keeping its ConfigMap in a namespace that is gone or being deleted, as
kube-controller-manager's root CA publisher does (no retried create there), and keeps it again
once a run is published there."""

from __future__ import annotations

import json

from megdet.controller.progress_ca import CA_KEY, CAKeeper, namespace_gone


class Refused(Exception):
    """What the Kubernetes client raises: an HTTP status and the Status body."""

    def __init__(self, status: int, details: dict) -> None:
        super().__init__(status)
        self.status = status
        self.body = json.dumps({"kind": "Status", "code": status, "details": details})


TERMINATING = Refused(
    403,
    {"name": "megdet-progress-ca", "kind": "configmaps",
     "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
)  # fmt: skip
NO_NAMESPACE = Refused(404, {"name": "gone", "kind": "namespaces"})
RBAC = Refused(403, {"name": "megdet-progress-ca", "kind": "configmaps"})
NO_CONFIG_MAP = Refused(404, {"name": "megdet-progress-ca", "kind": "configmaps"})


def test_only_a_missing_or_terminating_namespace_counts_as_gone() -> None:
    assert namespace_gone(TERMINATING) and namespace_gone(NO_NAMESPACE)
    assert not namespace_gone(RBAC) and not namespace_gone(NO_CONFIG_MAP)
    assert not namespace_gone(ValueError("no body"))


def keeper(errors: list[Exception]) -> tuple[CAKeeper, list[str]]:
    writes: list[str] = []

    def write(namespace, found):
        writes.append(namespace)
        if errors:
            raise errors.pop(0)

    keep = CAKeeper("CA", write)
    keep.publish("runs")
    keep.on_list([], None)
    return keep, writes


def test_a_terminating_namespace_is_not_written_again_until_a_run_is_published_there() -> None:
    keep, writes = keeper([TERMINATING])
    assert writes == ["runs"]
    keep.resync()
    keep.on_event("DELETED", {"metadata": {"namespace": "runs", "name": "megdet-progress-ca"}})
    assert writes == ["runs"], "a namespace being deleted was written to again"
    keep.publish("runs")
    keep.resync()
    assert writes == ["runs", "runs"] and "runs" in keep.kept


def test_any_other_refusal_is_tried_again() -> None:
    keep, writes = keeper([RBAC, NO_CONFIG_MAP])
    keep.resync()
    keep.resync()
    assert writes == ["runs", "runs", "runs"]
    assert keep.seen["runs"]["data"][CA_KEY] == "CA"
