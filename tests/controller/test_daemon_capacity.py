"""`megdet controller`'s capacity knobs (docs/capacity.md): --workers reaches kopf's handler
thread pool, --worker-limit kopf's queueing (as controller/operator.py's IndexedWorkerLimit),
and the heap trimmer (controller/heap.py) runs for as long as the operator does."""

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


@pytest.mark.parametrize(
    ("value", "message"),
    [("-1", "--worker-limit: -1 must be >= 0"), ("ten", "--worker-limit: 'ten' is not a whole")],
)
def test_worker_limit_must_be_a_whole_number_of_at_least_zero(value, message, capsys) -> None:
    from megdet.controller.daemon import DEFAULT_WORKER_LIMIT

    with pytest.raises(SystemExit) as exit_info:
        main(["controller", "--worker-limit", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert build_parser().parse_args(["controller"]).worker_limit == DEFAULT_WORKER_LIMIT == 100


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
        settings = kwargs["settings"]
        seen["max_workers"] = settings.execution.max_workers
        seen["worker limit"] = getattr(settings.queueing.worker_limit, "limit", None)
        seen["idle timeout"] = settings.queueing.idle_timeout
        seen["handlers"] = {h.id for h in kwargs["registry"]._watching.get_all_handlers()}
        seen["trimmers while running"] = len(started)

    monkeypatch.setattr(heap, "HeapTrimmer", Trimmer)
    monkeypatch.setattr(k8s_config, "load_incluster_config", no_cluster)
    monkeypatch.setattr(k8s_config, "load_kube_config", lambda *a, **k: None)
    monkeypatch.setattr(metrics, "serve", lambda *a, **k: None)
    monkeypatch.setattr(kopf, "run", fake_run)
    argv = ["controller", "--standalone", "--no-metrics-secure", "--workers", "3"]
    assert daemon.run(build_parser().parse_args([*argv, "--worker-limit", "7"])) == 0
    assert "worker-limit" in seen.pop("handlers")  # what tells the limit kopf has indexed
    assert seen == {
        "max_workers": 3,
        "worker limit": 7,
        "idle timeout": 1.0,
        "trimmers while running": 1,
        "trimmer stopped": True,
    }
    seen.clear()
    started.clear()
    assert daemon.run(build_parser().parse_args([*argv, "--worker-limit", "0"])) == 0
    assert "worker-limit" not in seen["handlers"]
    assert seen["worker limit"] is None and seen["idle timeout"] == 1.0
