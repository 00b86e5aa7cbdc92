"""The controller benchmark's anchor (bench/reconcile/report.py): the training operator's requests
from client-go's counters, and the controller's CPU and requests per run beside its per job.
The real measurement needs a control plane and is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.controller_cluster import client_requests
from bench.reconcile.report import anchor

METRICS = """\
# HELP rest_client_requests_total Number of HTTP requests, by status code, method, and host.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 40
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 12
rest_client_requests_total{code="200",host="other:6443",method="GET"} 2
rest_client_requests_total{code="409",host="127.0.0.1:6443",method="PUT"} 1
workqueue_adds_total{name="pytorchjob"} 99
"""


def test_client_requests_sums_by_method_and_code() -> None:
    assert client_requests(METRICS) == {"GET 200": 42.0, "POST 201": 12.0, "PUT 409": 1.0}
    assert client_requests("") == {}


def test_anchor_is_the_controller_per_run_over_the_operator_per_job() -> None:
    result = {"runs": 8, "controller_cpu_per_run_ms": 40.0, "api_requests_per_run": {"total": 6}}
    after = {"GET 200": 50.0, "POST 201": 30.0}
    before = {"GET 200": 10.0, "POST 201": 0.0}
    beside = anchor(result, {"PyTorchJob": 6, "TrainJob": 2}, after, before, 0.06, 3.0, {})
    assert beside["pytorchjobs"] == 6
    assert beside["operator_cpu_per_job_ms"] == pytest.approx(10.0)
    assert beside["cpu_ratio_controller_over_operator"] == pytest.approx(4.0)
    assert beside["operator_requests_per_job"] == pytest.approx(70 / 6)
    assert beside["requests_ratio"] == pytest.approx(6 / (70 / 6))
    assert beside["operator_requests_by_method_code"] == {"GET 200": 40.0, "POST 201": 30.0}


class _Kube:
    def __init__(self, text: str) -> None:
        self.text = text

    def kubectl(self, *args, **kwargs):
        import types

        return types.SimpleNamespace(stdout=self.text)


def test_the_anchor_waits_for_every_pod_the_pytorchjobs_ask_for(monkeypatch) -> None:
    # A wait for quiet alone stopped while the rate-limited training operator had made 431 of
    # 2,750 pods: the anchor's span now ends only once all of them exist.
    import json
    import types

    from bench import controller_cluster as cc

    jobs = {"items": [
        {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}}},
        {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 7}}}},
        {"spec": {"pytorchReplicaSpecs": {"Master": {}}}},  # replicas defaults to 1
    ]}  # fmt: skip
    bench = types.SimpleNamespace(kube=_Kube(json.dumps(jobs)))
    assert cc.BenchCluster.expected_pods(bench) == 10
    made = iter([{"Pending": 3}, {"Pending": 9}, {"Pending": 9, "Running": 1}])
    bench.count_pods = lambda: next(made)
    monkeypatch.setattr(cc.time, "sleep", lambda s: None)
    assert cc.BenchCluster.wait_for_pods(bench, 10, timeout=60) >= 0
    with pytest.raises(StopIteration):
        bench.count_pods()  # it polled until the tenth pod was there, not before
    bench.count_pods = lambda: {"Pending": 3}
    with pytest.raises(RuntimeError, match="3 of 10 pods made"):
        cc.BenchCluster.wait_for_pods(bench, 10, timeout=0)
