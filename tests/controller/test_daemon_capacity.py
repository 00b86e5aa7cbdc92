"""`megdet controller`'s capacity knobs (docs/capacity.md): --workers reaches kopf's handler
thread pool, and the heap trimmer (controller/heap.py) runs for as long as the operator does."""

from __future__ import annotations

from typing import Any

import pytest

from megdet.cli import build_parser, main


def test_workers_must_be_a_whole_number_of_at_least_one(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", "--workers", "0"])
    assert exit_info.value.code == 2
    assert "--workers: 0 must be >= 1" in capsys.readouterr().err
    assert build_parser().parse_args(["controller"]).workers is None  # kopf's default


def test_workers_and_the_heap_trimmer_reach_the_running_operator(monkeypatch) -> None:
    import kopf
    from kubernetes import config as k8s_config

    from megdet.controller import daemon, heap, metrics

    seen: dict[str, Any] = {}
    started: list[Any] = []

    class Trimmer(heap.HeapTrimmer):
        def start(self) -> heap.HeapTrimmer:
            started.append(self)
            return self

        def stop(self) -> None:
            seen["trimmer stopped"] = True

    def no_cluster() -> None:
        raise k8s_config.ConfigException("not in a pod")

    def fake_run(**kwargs: Any) -> None:
        seen["max_workers"] = kwargs["settings"].execution.max_workers
        seen["trimmers while running"] = len(started)

    monkeypatch.setattr(heap, "HeapTrimmer", Trimmer)
    monkeypatch.setattr(k8s_config, "load_incluster_config", no_cluster)
    monkeypatch.setattr(k8s_config, "load_kube_config", lambda *a, **k: None)
    monkeypatch.setattr(metrics, "serve", lambda *a, **k: None)
    monkeypatch.setattr(kopf, "run", fake_run)
    args = build_parser().parse_args(
        ["controller", "--standalone", "--no-metrics-secure", "--workers", "3"]
    )
    assert daemon.run(args) == 0
    assert seen == {"max_workers": 3, "trimmers while running": 1, "trimmer stopped": True}
