"""A status.progress write the real API server refuses (422, the CRD's schema) is dropped and
counted by the progress hub, never retried. The hub's own range checks keep
such values out (tests/controller/test_progress_limits.py); here one is put past them, as a bug
would, to see what the server answers and what the hub does with the answer. Only the CRDs are
needed (the operator chart), not the controller; but the session's controller may be running
and reconcile the run meanwhile, writing its status, so the test's writes carry no
resourceVersion: with one, the hub's attempts could all conflict with the controller's writes
(409, tried again after an interval: tests/controller/test_progress_endpoint.py), as they
did in one CI run."""

from __future__ import annotations

from typing import Any

from e2e_helpers import apply_objects, get_json, mdr, namespace

from megdet.controller import metrics
from megdet.controller.kubeapi import Cluster
from megdet.controller.progress_binding import run_ref
from megdet.controller.progress_hub import ProgressHub

NS = "progress-refused"


def _writes(result: str) -> float:
    return metrics.sample("megdet_controller_progress_writes_total", {"result": result})


def test_a_refused_status_write_is_dropped_counted_and_not_retried(kube, operator_chart) -> None:
    from kubernetes import config

    ns = namespace(kube, NS)
    apply_objects(kube, mdr("refused", ns, {"gpus": 8}))
    cluster = Cluster(config.new_client_from_config(str(kube.kubeconfig)), timeout=10)
    answers: list[Any] = []

    def patch(namespace_: str, name: str, status: Any, version: str | None) -> Any:
        try:  # no precondition: the controller may write the run's status meanwhile (above)
            answers.append(cluster.patch_run_status(namespace_, name, status, None))
        except Exception as err:
            answers.append(getattr(err, "status", err))
            raise
        return answers[-1]

    now = [0.0]

    def later() -> float:  # every look at the clock is an interval later: each flush may write
        now[0] += 31
        return now[0]

    def read(namespace_: str, name: str) -> Any:  # the view: the run as the server has it now
        return run_ref(cluster.get_run(namespace_, name))

    hub = ProgressHub(read, read, patch, interval=30, clock=later)
    hub.report(ns, "refused", {"iteration": 5, "percent": 1})
    assert hub.flush() == 1  # the server takes a valid one
    written, refused = _writes("written"), _writes("refused")

    hub.runs[(ns, "refused")].latest = {"iteration": 6, "percent": 101}  # the CRD says 0..100
    assert hub.flush() == 0
    assert answers[-1] == 422
    assert _writes("refused") - refused == 1
    for _ in range(3):  # never sent again
        assert hub.flush() == 0
    assert len(answers) == 2
    progress = get_json(kube, "mdr", "refused", "-n", ns)["status"]["progress"]
    assert progress["iteration"] == 5 and progress["percent"] == 1

    hub.report(ns, "refused", {"iteration": 7})  # the next good report is written
    assert hub.flush() == 1 and _writes("written") - written == 1
    progress = get_json(kube, "mdr", "refused", "-n", ns)["status"]["progress"]
    assert progress["iteration"] == 7 and progress["percent"] == 1
