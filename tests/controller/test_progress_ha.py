"""The progress endpoint with two controller replicas and with edited CA ConfigMaps, the real
operator against kmock.

- Two replicas (the operator chart's default) share one CA through a Secret and both serve,
  whatever kopf's peering says (as Kubeflow Trainer's status server runs on every replica): a
  report to either is written once, an older report never replaces a newer one, and the
  evaluation in it is announced once (by the replica kopf lets act, from the run's watch); when
  the acting replica stops, the other goes on serving with the same CA.
- A CA ConfigMap that a namespace editor changed or deleted is written back; nothing is
  written while it is right.

The real API server (RBAC, the EndpointSlice of the progress Service) is in
tests/e2e/test_e2e_progress_ha.py.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import pytest_asyncio
from kmock_helpers import (
    NAMESPACE,
    PEERING_NAME,
    PEERINGS,
    OperatorThread,
    events_for,
    eventually,
    peers,
    run_status,
    stop_operator,
)
from progress_fakes import FakeIssuer
from progress_kmock import (
    apost,
    cluster_peering,
    obj,
    run_with_pod,
    serve_issuer,
    start_progress_operator,
)

from megdet.controller.progress_ca import CA_CONFIG_MAP, CA_KEY


def requests_from(api: Any, op: OperatorThread) -> list[Any]:
    return [r for r in list(api) if r.headers.get("User-Agent") == op.user_agent]


def writes(requests: list[Any], fragment: str) -> list[Any]:
    return [r for r in requests if r.method in ("POST", "PATCH", "PUT") and fragment in r.url.path]


def progress_writes(api: Any, op: OperatorThread) -> list[Any]:
    return [r for r in writes(requests_from(api, op), "/megdetruns/r/status")
            if "progress" in ((r.data or {}).get("status") or {})]  # fmt: skip


@pytest_asyncio.fixture()
async def replicas(cluster: Any):
    """(issuer, the replica kopf lets act, the other): two operators serving the endpoint,
    joining one peering with priorities 200 and 100."""
    cluster_peering(cluster)
    issuer = FakeIssuer()
    serve_issuer(cluster, issuer)
    leader = await start_progress_operator(cluster, 200, PEERING_NAME)
    follower = await start_progress_operator(cluster, 100, PEERING_NAME)
    try:
        # Both in the peering object before any run: kopf lets the follower act until it sees
        # the leader's record (a CI run's follower once created a job).
        await eventually(
            lambda: peers(cluster, kmock_lib.resource(PEERINGS), None)
            >= {leader.identity, follower.identity},
            message="both replicas in the peering",
        )
        yield issuer, leader, follower
    finally:
        await stop_operator(follower)
        if leader.thread.is_alive():
            await stop_operator(leader)


async def test_both_replicas_serve_each_report_lands_once_and_stopping_one_keeps_the_ca(
    cluster, replicas
) -> None:
    issuer, leader, follower = replicas
    # One Secret, made by whichever came first; both serve the certificate in it.
    secrets = [k for k in cluster.objects if k[0] == kmock_lib.resource("v1/secrets")]
    assert len(secrets) == 1
    ca = leader.progress_service.cert.ca_pem
    assert follower.progress_service.cert.ca_pem == ca
    token = await run_with_pod(cluster, "r", issuer)  # the job: made by the acting replica
    await eventually(lambda: obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP))
    assert obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP)["data"][CA_KEY] == ca
    # The follower acts on nothing (kopf's peering) ...
    assert writes(requests_from(cluster, follower), "/pytorchjobs") == []
    # ... and serves reports all the same, from watches of its own.
    await eventually(lambda: follower.progress_service.runs.get(NAMESPACE, "r"),
                     message="the follower's view of the run")  # fmt: skip
    iteration = lambda: (run_status(cluster, "r").get("progress") or {}).get("iteration")  # noqa: E731
    assert (await apost(follower, token, "r", 10, "2026-01-01T00:00:10Z"))[0] == 200
    await eventually(lambda: iteration() == 10, message="the follower's write")
    assert (await apost(leader, token, "r", 30, "2026-01-01T00:00:30Z"))[0] == 200
    await eventually(lambda: iteration() == 30, message="the leader's write")
    # A late, older report to the follower: accepted (200) and never written over it.
    assert (await apost(follower, token, "r", 20, "2026-01-01T00:00:20Z"))[0] == 200
    held = lambda: follower.progress_service.hub.runs[NAMESPACE, "r"]  # noqa: E731
    await eventually(lambda: held().written == held().latest, message="the follower's flush")
    assert held().latest["iteration"] == 20
    assert iteration() == 30
    # Each report landed once: one progress write per replica.
    assert len(progress_writes(cluster, follower)) == 1
    assert len(progress_writes(cluster, leader)) == 1

    # The acting replica stops: the other serves on, with the CA the pods trust.
    await stop_operator(leader)
    assert follower.progress_service.cert.ca_pem == ca
    assert (await apost(follower, token, "r", 40, "2026-01-01T00:00:40Z"))[0] == 200
    await eventually(lambda: iteration() == 40, message="the follower's write")
    assert obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP)["data"][CA_KEY] == ca


async def test_an_evaluation_is_announced_once_whichever_replica_it_reached(
    cluster, replicas
) -> None:
    """Milestone events come from the run's watch on the replica kopf lets act, not from the
    endpoint: an evaluation reported to the replica that does not act is announced once."""
    issuer, leader, follower = replicas
    await run_with_pod(cluster, "r", issuer)
    await eventually(lambda: follower.progress_service.runs.get(NAMESPACE, "r"),
                     message="the follower's view of the run")  # fmt: skip
    evaluation = {"iteration": 100, "evalIteration": 100, "ap": 30.0, "ap50": 50.0,
                  "updatedTime": "2026-01-01T00:01:40Z"}  # fmt: skip
    follower.progress_service.hub.report(NAMESPACE, "r", evaluation)
    evaluated = lambda: [e for e in events_for(cluster, "r") if e.get("reason") == "Evaluated"]  # noqa: E731
    (event,) = await eventually(evaluated, message="the Evaluated event")
    assert "iteration 100: AP 30.00, AP50 50.00" in event["message"]
    # The follower posted nothing itself; the same progress again announces nothing.
    assert writes(requests_from(cluster, follower), "/events") == []
    leader.progress_service.hub.report(NAMESPACE, "r", {**evaluation, "iteration": 101})
    await eventually(lambda: (run_status(cluster, "r").get("progress") or {})
                     .get("iteration") == 101, message="the leader's write")  # fmt: skip
    assert len(evaluated()) == 1


async def test_an_edited_or_deleted_ca_config_map_is_written_back(cluster) -> None:
    op = await start_progress_operator(cluster)
    try:
        issuer = FakeIssuer()
        serve_issuer(cluster, issuer)
        await run_with_pod(cluster, "r", issuer)
        ca = op.progress_service.cert.ca_pem
        config = lambda: obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP)  # noqa: E731
        await eventually(lambda: (config() or {}).get("data", {}).get(CA_KEY) == ca)
        keeper = op.progress_service.keeper

        # A namespace editor puts another CA in: written back.
        resp = await cluster.patch(
            f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CA_CONFIG_MAP}",
            json={"data": {CA_KEY: "-----BEGIN CERTIFICATE-----\nforged\n"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status == 200
        await eventually(lambda: config()["data"][CA_KEY] == ca, message="the CA written back")
        # ... or deletes it: made again.
        resp = await cluster.delete(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CA_CONFIG_MAP}")
        assert resp.status == 200
        await eventually(lambda: (config() or {}).get("data", {}).get(CA_KEY) == ca,
                         message="the ConfigMap made again")  # fmt: skip
        await eventually(lambda: keeper.restored == 2, message="two writes back")
        restored = keeper.restored

        # A change that leaves the CA as it is: heard, and nothing written.
        before = len(writes(requests_from(cluster, op), "/configmaps"))
        heard = keeper.events
        resp = await cluster.patch(
            f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CA_CONFIG_MAP}",
            json={"metadata": {"labels": {"team": "vision"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status == 200
        await eventually(lambda: keeper.events > heard, message="the keeper to hear the edit")
        assert len(writes(requests_from(cluster, op), "/configmaps")) == before
        assert keeper.restored == restored
    finally:
        await stop_operator(op)
