"""The run's other objects (its NetworkPolicy, its TrainingRuntime) once its job exists: a
refusal of one of them is its own condition (ChildrenReady), never the job's; the job stays
recorded as created, so the run keeps its output folder and never gets a second job; the
NetworkPolicy follows the spec (updated, deleted).

kmock emulates the API server (none runs here; it validates nothing, so the refusals are
injected at the exact request); see kmock_helpers.py.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
from kmock_helpers import (
    NETWORKPOLICIES,
    PYTORCHJOBS,
    RUNS,
    cond,
    condition,
    delete,
    eventually,
    get,
    job_condition,
    objects,
    patch,
    phase,
    reconciled,
    requests_to,
    run_body,
)
from kmock_helpers import (
    apply as apply_run,
)
from kmock_helpers import (
    run_status as status,
)
from test_operator_lifecycle import warnings

EGRESS = [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443}]}]
INVALID = (
    'NetworkPolicy.networking.k8s.io "r" is invalid: '
    'spec.egress[2].to[0].ipBlock.cidr: Invalid value: "10.20.0.0/33": must be a valid CIDR'
)


def refuse(api: Any, method: str, plural: str, name: str, times: int = 1) -> list[Any]:
    """Answer the first ``times`` ``method`` requests on ``plural/name`` (a POST: on the
    collection, for that name) with 422 before kmock stores anything, as the API server
    refuses an invalid object."""
    refused: list[Any] = []

    def hook(request: Any) -> None:
        if len(refused) >= times or request.method != method:
            return
        path = request.url.path
        ours = (
            path.endswith(f"/{plural}")
            and (request.data or {}).get("metadata", {}).get("name") == name
            if method == "POST"
            else path.endswith(f"/{plural}/{name}")
        )
        if ours:
            refused.append(request)
            raise kmock_lib.KubernetesError(status=422, reason="Invalid", message=INVALID)

    api.before_write.append(hook)
    return refused


async def edit(api: Any, name: str, generation: int, spec: dict[str, Any]) -> None:
    """A spec edit, with the generation the API server would give it (kmock does not)."""
    await patch(api, RUNS, name, {"metadata": {"generation": generation}, "spec": spec})


async def test_a_refused_network_policy_leaves_the_running_job_recorded(cluster, operator) -> None:
    shared = {"gpus": 8, "runName": "coco-shared"}
    await apply_run(cluster, run_body("r", shared))
    await eventually(lambda: phase(cluster, "r") == "Pending", message="Pending")
    await job_condition(cluster, "r", cond("Created"), cond("Running"))
    await eventually(lambda: phase(cluster, "r") == "Running", message="Running")

    # The author adds a NetworkPolicy the API server refuses (422), while the job runs.
    refused = refuse(cluster, "POST", "networkpolicies", "r")
    policy = {"enabled": True, "restrictEgress": True, "extraEgress": EGRESS}
    await edit(cluster, "r", 2, {"networkPolicy": policy})
    ready = await eventually(
        lambda: condition(cluster, "r", "ChildrenReady"), message="ChildrenReady"
    )
    await reconciled(cluster, "r")
    assert refused
    assert ready["status"] == "False" and ready["reason"] == "ChildRefused", ready
    assert "NetworkPolicy r" in ready["message"] and "must be a valid CIDR" in ready["message"]
    # The job is still the run's: Created=True, the phase its own, nothing Failed.
    assert condition(cluster, "r", "Created")["status"] == "True"
    assert phase(cluster, "r") == "Running" and condition(cluster, "r", "Failed") is None
    await eventually(lambda: warnings(cluster, "r", "ChildRefused"), message="Warning event")

    # So the output folder stays the run's: another run on it waits.
    await apply_run(cluster, run_body("other", shared))
    waiting = await eventually(lambda: condition(cluster, "other", "Created"), message="waits")
    assert waiting["status"] == "False" and waiting["reason"] == "OutputInUse"
    assert get(cluster, PYTORCHJOBS, "other") is None
    await delete(cluster, RUNS, "other")

    # The fix creates the NetworkPolicy; ChildrenReady turns True.
    await edit(cluster, "r", 3, {"networkPolicy": {**policy, "extraEgress": []}})
    await eventually(lambda: get(cluster, NETWORKPOLICIES, "r"), message="the NetworkPolicy")
    await eventually(
        lambda: (condition(cluster, "r", "ChildrenReady") or {}).get("status") == "True",
        message="ChildrenReady=True",
    )

    # The job ends and the training operator's TTL deletes it: a spec edit makes no second job.
    await job_condition(cluster, "r", cond("Created"), cond("Succeeded"))
    await eventually(lambda: phase(cluster, "r") == "Succeeded", message="Succeeded")
    await delete(cluster, PYTORCHJOBS, "r")
    await eventually(lambda: condition(cluster, "r", "JobPresent"), message="JobPresent")
    await edit(cluster, "r", 4, {"imagesPerGpu": 2})
    await reconciled(cluster, "r")
    assert objects(cluster, PYTORCHJOBS) == {}
    assert len(requests_to(cluster, "POST", "/pytorchjobs")) == 1
    assert phase(cluster, "r") == "Succeeded"
    assert len(warnings(cluster, "r", "ChildRefused")) == 1


async def test_the_network_policy_is_updated_and_deleted_with_the_spec(cluster, operator) -> None:
    await apply_run(cluster, run_body("r", {"gpus": 8, "networkPolicy": {"enabled": True}}))
    created = await eventually(lambda: get(cluster, NETWORKPOLICIES, "r"), message="policy")
    assert created["spec"]["policyTypes"] == ["Ingress"] and "egress" not in created["spec"]
    await eventually(lambda: status(cluster, "r").get("jobUID"), message="the job recorded")

    policy = {"enabled": True, "restrictEgress": True, "extraEgress": EGRESS}
    await edit(cluster, "r", 2, {"networkPolicy": policy})
    updated = await eventually(
        lambda: (p := get(cluster, NETWORKPOLICIES, "r")) and "egress" in p["spec"] and p,
        message="the NetworkPolicy updated",
    )
    await reconciled(cluster, "r")
    assert updated["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert EGRESS[0] in updated["spec"]["egress"]
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]  # the same object
    patches = len(requests_to(cluster, "PATCH", "/networkpolicies/r"))
    assert patches == 1

    # Egress open again: the egress rules go (a merge patch removes them, not just adds).
    await edit(cluster, "r", 3, {"networkPolicy": {"restrictEgress": False, "extraEgress": []}})
    await eventually(
        lambda: "egress" not in get(cluster, NETWORKPOLICIES, "r")["spec"],
        message="the egress rules removed",
    )
    assert get(cluster, NETWORKPOLICIES, "r")["spec"]["policyTypes"] == ["Ingress"]

    # A reconcile that changes nothing of it writes nothing to it.
    await edit(cluster, "r", 4, {"imagesPerGpu": 2})
    await reconciled(cluster, "r")
    assert len(requests_to(cluster, "PATCH", "/networkpolicies/r")) == patches + 1

    # networkPolicy.enabled: false deletes it (only this incarnation: a uid precondition).
    await edit(cluster, "r", 5, {"networkPolicy": {"enabled": False}})
    await eventually(
        lambda: get(cluster, NETWORKPOLICIES, "r") is None, message="the NetworkPolicy deleted"
    )
    await reconciled(cluster, "r")
    assert list(objects(cluster, PYTORCHJOBS)) == ["r"]  # the job is untouched
    assert condition(cluster, "r", "ChildrenReady") is None


async def test_a_run_without_a_network_policy_never_looks_for_one(cluster, operator) -> None:
    """Only an edit of spec.networkPolicy (or a resume) looks for a policy to delete: a run's
    create and its other edits cost no NetworkPolicy request."""
    await apply_run(cluster, run_body("plain"))
    await eventually(lambda: status(cluster, "plain").get("jobUID"), message="the job recorded")
    await edit(cluster, "plain", 2, {"imagesPerGpu": 2})
    await reconciled(cluster, "plain")
    assert requests_to(cluster, "GET", "/networkpolicies/plain") == []
    await edit(cluster, "plain", 3, {"networkPolicy": {"metricsFrom": []}})
    await eventually(
        lambda: requests_to(cluster, "GET", "/networkpolicies/plain"), message="one look"
    )
    await reconciled(cluster, "plain")
    assert objects(cluster, NETWORKPOLICIES) == {}
