"""kmock helpers for the progress endpoint: an operator that serves it, the cluster's issuer
discovery and keys served as the API server serves them, a run whose job has a pod, a report
POSTed over HTTPS."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock as kmock_lib
from kmock_helpers import (
    NAMESPACE,
    PEERING_NAME,
    PEERINGS,
    PYTORCHJOBS,
    RUNS,
    OperatorThread,
    apply,
    eventually,
    get,
    run_body,
    run_status,
)
from progress_fakes import FakeIssuer

from megdet import progress as protocol
from megdet.controller.pod_problems import PART_OF
from tests.json_http import post_json

OPS = "ops"
SECRET = f"{OPS}/megdet-operator-progress-ca"


def obj(api: Any, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    for (res, ns, n), stored in list(api.objects.items()):
        if res == kmock_lib.resource(resource) and ns == namespace and n == name:
            return None if stored.deleted else dict(stored.raw)
    return None


def cluster_peering(api: Any) -> None:
    """The ClusterKopfPeering the replicas join (the operator chart renders it)."""
    api.objects[PEERINGS, None, PEERING_NAME] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING_NAME},
    }


async def start_progress_operator(
    api: Any, priority: int | None = None, peering: str | None = None, **kwargs: Any
) -> OperatorThread:
    """An operator serving the progress endpoint (its CA in the Secret ``SECRET``), joining
    ``peering`` with ``priority`` if given."""
    options: dict[str, Any] = {"peering": peering, "priority": priority or 0} if peering else {}
    op = OperatorThread(str(api.url), progress=SECRET, **options, **kwargs)
    op.thread.start()
    await eventually(
        lambda: op.ready_flag.is_set() and op.progress_service is not None,
        message=f"{op.identity} to start",
    )
    return op


def serve_issuer(api: Any, issuer: FakeIssuer) -> None:
    """Serve ``issuer``'s discovery document and JWKS at the API server's paths."""

    async def react(request: Any) -> Any:
        if request.method != "GET":
            raise NotImplementedError
        try:
            return issuer.fetch(request.url.path)
        except OSError:
            raise NotImplementedError from None

    api << react


def post(
    op: OperatorThread, token: str, run: str, iteration: int, at: str = "2026-01-01T00:00:00Z"
) -> tuple[int, str]:
    """POST a report to ``op``'s endpoint, verifying its certificate with its published CA;
    ``at``: its ``lastUpdatedTime``."""
    service = op.progress_service
    report = protocol.Progress(iteration=iteration, max_iter=100, updated_time=at)
    path = protocol.run_status_path(NAMESPACE, run)
    body = protocol.to_request(report)
    status, data = post_json(service.port, service.cert.ca_pem, path, token, body, timeout=10)
    return status, data.decode()


async def apost(
    op: OperatorThread, token: str, run: str, iteration: int, *at: str
) -> tuple[int, str]:
    return await asyncio.to_thread(post, op, token, run, iteration, *at)


async def run_with_pod(api: Any, name: str, issuer: FakeIssuer) -> str:
    """A pytorchjob run, its job (made by the active replica), and a pod of that job as the
    training operator makes it; returns a token bound to that pod for the run's audience."""
    await apply(api, run_body(name))
    job = await eventually(lambda: get(api, PYTORCHJOBS, name), message=f"{name}'s job")
    await eventually(lambda: run_status(api, name).get("jobUID"), message=f"{name}'s jobUID")
    pod_name = f"{name}-master-0"  # gpus 8: the job has one master, no worker
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": NAMESPACE,
            "uid": f"pod-uid-{name}",
            "labels": {PART_OF[0]: PART_OF[1]},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
    }
    await apply(api, pod)  # through the API: the controller's pods watch sees it
    uid = obj(api, "v1/pods", NAMESPACE, pod_name)["metadata"]["uid"]
    run_uid = get(api, RUNS, name)["metadata"]["uid"]
    return issuer.mint(f"token-{name}", name, NAMESPACE, pod_name, uid=run_uid, bound_uid=uid)
