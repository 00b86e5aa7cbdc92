"""Two controller replicas with kopf peering: only the higher-priority one acts.

kopf pauses an operator while a live peer with a higher priority is registered in the same
peering object (kopf 1.45 ``_core/engines/peering.py``). The chart gives each replica a random
priority at start-up (``megdet controller --priority random``), so one leads; these tests give
fixed ones. kmock stands in for the API server (none runs here).
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import pytest
from kmock_helpers import (
    NAMESPACE,
    NS_PEERINGS,
    PEERING_NAME,
    PEERINGS,
    PYTORCHJOBS,
    RUNS,
    apply,
    eventually,
    get,
    objects,
    reconciled,
    requests_to,
    run_body,
    start_operator,
    stop_operator,
)

#: Serving all namespaces, kopf peers through a ClusterKopfPeering; serving some namespaces,
#: through a KopfPeering in each (kopf makes peering namespaced whenever the operator is).
MODES = {
    "all-namespaces": ([], kmock_lib.resource(PEERINGS), None, "ClusterKopfPeering"),
    "watch-namespaces": ([NAMESPACE], kmock_lib.resource(NS_PEERINGS), NAMESPACE, "KopfPeering"),
}


def peers(api: Any, resource: Any, namespace: str | None) -> set[str]:
    for (res, ns, name), obj in list(api.objects.items()):
        if res == resource and ns == namespace and name == PEERING_NAME and not obj.deleted:
            return set((obj.raw.get("status") or {}).keys())
    return set()


def agents(requests: list[Any]) -> set[str]:
    return {r.headers.get("User-Agent", "") for r in requests}


@pytest.mark.parametrize("mode", list(MODES))
async def test_two_replicas_only_the_leader_acts_and_the_other_takes_over(cluster, mode) -> None:
    namespaces, resource, namespace, kind = MODES[mode]
    meta = {"name": PEERING_NAME, **({"namespace": namespace} if namespace else {})}
    cluster.objects[resource, namespace, PEERING_NAME] = {
        "apiVersion": "kopf.dev/v1",
        "kind": kind,
        "metadata": meta,
    }
    url = str(cluster.url)
    leader = await start_operator(url, peering=PEERING_NAME, priority=200, namespaces=namespaces)
    follower = await start_operator(url, peering=PEERING_NAME, priority=100, namespaces=namespaces)
    try:
        await eventually(
            lambda: peers(cluster, resource, namespace) >= {leader.identity, follower.identity},
            message="peers",
        )
        for i in range(4):
            await apply(cluster, run_body(f"ha-{i}"))
        for i in range(4):
            await eventually(
                lambda i=i: ((get(cluster, RUNS, f"ha-{i}") or {}).get("status") or {}).get(
                    "jobName"
                )
            )
        await reconciled(cluster, *(f"ha-{i}" for i in range(4)))
        assert sorted(objects(cluster, PYTORCHJOBS)) == [f"ha-{i}" for i in range(4)]
        creates = requests_to(cluster, "POST", "/pytorchjobs")
        assert len(creates) == 4
        writes = [
            r
            for r in list(cluster)
            if r.method == "PATCH"
            and r.url.path.endswith("/status")
            and "/megdetruns/" in r.url.path
        ]
        assert agents(creates) == agents(writes) == {leader.user_agent}

        # The leader goes away (kopf removes it from the peering object on exit): the follower
        # resumes, re-checks the existing runs without creating anything, and serves new ones.
        await stop_operator(leader)
        await apply(cluster, run_body("after"))
        await eventually(
            lambda: get(cluster, PYTORCHJOBS, "after"), timeout=20, message="follower acts"
        )
        await reconciled(cluster, "after")
        creates = requests_to(cluster, "POST", "/pytorchjobs")
        assert len(creates) == 5
        assert agents(creates[4:]) == {follower.user_agent}
    finally:
        await stop_operator(follower)
        if leader.thread.is_alive():
            await stop_operator(leader)
