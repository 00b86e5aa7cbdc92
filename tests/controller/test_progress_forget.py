"""The progress hub forgets a run when it is deleted, on kmock with the real
operator: nothing the hub holds for a run outlives it, and a run re-created under the same
name starts clean (its own uid, no old progress, its milestones from the start)."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock_helpers
from kmock_helpers import (
    NAMESPACE,
    RUNS,
    apply,
    collect_garbage,
    delete,
    eventually,
    get,
    reconciled,
    run_body,
    start_operator,
    stop_operator,
)
from kubernetes import client as k8s

from megdet.controller.kubeapi import Cluster
from megdet.controller.operator import build_registry
from megdet.controller.progress_hub import ProgressHub, register_forget


def _client(url: str) -> k8s.ApiClient:
    config = k8s.Configuration()
    config.host = url
    return k8s.ApiClient(config)


async def test_the_hub_forgets_deleted_runs_and_a_recreated_run_starts_clean(
    cluster, monkeypatch
) -> None:
    cl = Cluster(_client(str(cluster.url)), timeout=2.0)
    events: list[tuple[str, str, str]] = []
    hub = ProgressHub(
        cl.get_run,
        lambda ns, name, status: cl.patch_run_status(ns, name, status),
        lambda ns, name, uid, reason, message: events.append((name, uid, reason)),
        interval=0.01,
    )

    def registry_with_forget(handlers: Any, progress: Any = None) -> Any:
        registry = build_registry(handlers, progress)
        register_forget(registry, hub)  # as controller/operator.py wires it
        return registry

    monkeypatch.setattr(kmock_helpers, "build_registry", registry_with_forget)
    op = await start_operator(str(cluster.url))
    try:
        names = [f"r{i}" for i in range(12)]
        for name in names:
            await apply(cluster, run_body(name))
        await reconciled(cluster, *names)
        evaluation = {"iteration": 100, "evalIteration": 100, "ap": 30.0, "ap50": 50.0}
        for name in names:  # the hub's blocking client runs off the loop kmock serves from
            await asyncio.to_thread(hub.report, NAMESPACE, name, evaluation)
        await asyncio.to_thread(hub.flush)
        assert set(hub.runs) == {(NAMESPACE, n) for n in names}
        assert sorted(n for n, _, reason in events if reason == "Evaluated") == sorted(names)
        old_uid = hub.runs[(NAMESPACE, "r0")].uid

        for name in names:
            await delete(cluster, RUNS, name)
        await eventually(
            lambda: all(get(cluster, RUNS, n) is None for n in names), message="runs gone"
        )
        await eventually(lambda: not hub.runs, message="the hub to forget every deleted run")
        # Their jobs go by garbage collection (kmock's stand-in here), as on a cluster, before
        # the name is used again.
        assert len(await collect_garbage(cluster)) == len(names)

        # The same name again: a new run, its own uid; the same evaluation is news to it.
        await apply(cluster, run_body("r0"))
        await reconciled(cluster, "r0")
        await asyncio.to_thread(hub.report, NAMESPACE, "r0", evaluation)
        run = hub.runs[(NAMESPACE, "r0")]
        assert run.uid == get(cluster, RUNS, "r0")["metadata"]["uid"] != old_uid
        assert run.written == {} and run.milestones.eval_iteration == 100
        await asyncio.to_thread(hub.flush)
        assert [(n, u) for n, u, reason in events if n == "r0" and reason == "Evaluated"] == [
            ("r0", old_uid),
            ("r0", run.uid),
        ]
    finally:
        await stop_operator(op)
