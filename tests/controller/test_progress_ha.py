"""The progress endpoint with two controller replicas and with edited CA ConfigMaps, the real
operator against kmock.

- Two replicas (the operator chart's default) share one CA through a Secret, only the active
  one (kopf's peering) answers and writes ``status.progress`` and labels its pod for the
  progress Service; the other answers 503 and writes nothing; after a failover the new
  active replica serves with the same CA.
- A CA ConfigMap that a namespace editor changed or deleted is written back by the active
  replica; nothing is written while it is right.

The real API server (TokenReview, RBAC, the EndpointSlice of the progress Service) is in
tests/e2e/test_progress_ha.py.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
from kmock_helpers import (
    NAMESPACE,
    PEERING_NAME,
    PEERINGS,
    OperatorThread,
    eventually,
    run_status,
    stop_operator,
)
from progress_fakes import FakeIssuer
from progress_kmock import (
    OPS,
    apost,
    obj,
    run_with_pod,
    serve_issuer,
    start_progress_operator,
)

from megdet.controller.progress_ca import CA_CONFIG_MAP, CA_KEY
from megdet.controller.progress_leader import ACTIVE_LABEL


def requests_from(api: Any, op: OperatorThread) -> list[Any]:
    return [r for r in list(api) if r.headers.get("User-Agent") == op.user_agent]


def writes(requests: list[Any], fragment: str) -> list[Any]:
    return [r for r in requests if r.method in ("POST", "PATCH", "PUT") and fragment in r.url.path]


async def test_two_replicas_share_the_ca_only_the_active_one_serves_and_failover_keeps_it(
    cluster,
) -> None:
    cluster.objects[PEERINGS, None, PEERING_NAME] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING_NAME},
    }
    issuer = FakeIssuer()
    serve_issuer(cluster, issuer)
    leader = await start_progress_operator(cluster, 200, PEERING_NAME)
    follower = await start_progress_operator(cluster, 100, PEERING_NAME)
    try:
        # One Secret, made by whichever came first; both serve the certificate in it.
        secrets = [k for k in cluster.objects if k[0] == kmock_lib.resource("v1/secrets")]
        assert len(secrets) == 1
        ca = leader.progress_service.cert.ca_pem
        assert follower.progress_service.cert.ca_pem == ca
        await eventually(
            lambda: leader.leadership.active() and not follower.leadership.active(),
            message="the higher priority to be the active replica",
        )
        token = await run_with_pod(cluster, "r", issuer)
        await eventually(lambda: obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP))
        assert obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP)["data"][CA_KEY] == ca

        assert (await apost(leader, token, "r", 10))[0] == 200
        code, body = await apost(follower, token, "r", 20)
        assert code == 503 and "standby" in body
        await eventually(
            lambda: (run_status(cluster, "r").get("progress") or {}).get("iteration") == 10,
            message="the active replica's status.progress write",
        )
        # Only the active replica's pod carries the label the progress Service selects.
        label = lambda op: ((obj(cluster, "v1/pods", OPS, op.identity) or {}).get(  # noqa: E731
            "metadata", {}).get("labels") or {}).get(ACTIVE_LABEL)  # fmt: skip
        await eventually(lambda: label(leader) == "active", message="the leader's label")
        assert label(follower) is None
        # The standby replica wrote no progress, no CA ConfigMap, no run status at all.
        standby = requests_from(cluster, follower)
        assert writes(standby, "/megdetruns/") == [] and writes(standby, "/configmaps") == []

        # Failover: the active replica stops (kopf takes it out of the peering object).
        await stop_operator(leader)
        await eventually(follower.leadership.active, message="the follower to take over")
        await eventually(lambda: label(follower) == "active", message="the follower's label")
        assert label(leader) is None  # the stopped replica took its label off
        assert follower.progress_service.cert.ca_pem == ca  # the CA the pods trust is the same
        code, _ = await apost(follower, token, "r", 30)
        assert code == 200
        await eventually(
            lambda: (run_status(cluster, "r").get("progress") or {}).get("iteration") == 30,
            message="the new active replica's write",
        )
        assert obj(cluster, "v1/configmaps", NAMESPACE, CA_CONFIG_MAP)["data"][CA_KEY] == ca
    finally:
        await stop_operator(follower)
        if leader.thread.is_alive():
            await stop_operator(leader)


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
