"""Refusals that heal are not final: a ResourceQuota without room, an admission webhook whose
cache has not seen the TrainingRuntime the controller has just created (Trainer's TrainJob
webhook), the controller's own RBAC. The run stays Pending with Created=False reason Retrying
(one Warning event), the create is retried with backoff, and the job is created once the
refusal heals. What only a spec edit fixes stays final
(tests/controller/test_operator_lifecycle.py).

kmock emulates the API server (none runs here): the refusals are injected before kmock stores
anything, as the API server refuses before storing.
"""

from __future__ import annotations

from typing import Any

import kmock as kmock_lib
import pytest
from kmock_helpers import (
    PYTORCHJOBS,
    RUNTIMES,
    TRAINJOBS,
    apply,
    condition,
    eventually,
    get,
    is_create,
    phase,
    reconciled,
    requests_to,
    run_body,
)
from test_operator_lifecycle import warnings

from megdet.controller import metrics

QUOTA = (
    "pytorchjobs",
    {"gpus": 8},
    'pytorchjobs.kubeflow.org "r" is forbidden: exceeded quota: jobs, requested: '
    "count/pytorchjobs.kubeflow.org=1, used: count/pytorchjobs.kubeflow.org=4, limited: "
    "count/pytorchjobs.kubeflow.org=4",
    "ResourceQuota",
)
#: Trainer v2.3.0's TrainJob webhook, as it answered on a loaded machine (issue 22, item 10).
RUNTIME_NOT_SEEN = (
    "trainjobs",
    {"gpus": 8, "target": "trainjob"},
    'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
    'spec.runtimeRef: Invalid value: {"name":"r"}: TrainingRuntime "r" not found: specified '
    "trainingRuntime must be created before the TrainJob is created",
    "does not see yet",
)
RBAC = (
    "pytorchjobs",
    {"gpus": 8},
    'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:ops:megdet-operator" '
    'cannot create resource "pytorchjobs" in API group "kubeflow.org" in the namespace "vision"',
    "ClusterRole",
)


def refuse_creates(api: Any, plural: str, message: str, times: int) -> list[Any]:
    """Answer the first ``times`` creates of ``plural`` with 403 Forbidden, unstored."""
    refused: list[Any] = []

    def hook(request: Any) -> None:
        if is_create(plural)(request) and len(refused) < times:
            refused.append(request)
            raise kmock_lib.KubernetesError(status=403, reason="Forbidden", message=message)

    api.before_write.append(hook)
    return refused


@pytest.mark.parametrize(
    "answer", [QUOTA, RUNTIME_NOT_SEEN, RBAC], ids=["quota", "webhook", "rbac"]
)
async def test_a_refusal_that_heals_is_retried_until_the_job_is_created(
    cluster, operator, answer
) -> None:
    plural, spec, message, hint = answer
    refused = refuse_creates(cluster, plural, message, times=2)
    refusals = metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
    await apply(cluster, run_body("r", spec))
    created = await eventually(
        lambda: (c := condition(cluster, "r", "Created")) and c["reason"] == "Retrying" and c,
        message="Created=False reason Retrying",
    )
    assert created["status"] == "False"
    assert message in created["message"] and "HTTP 403 Forbidden" in created["message"]
    assert "Not final" in created["message"] and hint in created["message"]
    assert phase(cluster, "r") == "Pending" and condition(cluster, "r", "Failed") is None

    # Retried with backoff, and created once the refusal heals (the third try).
    await eventually(
        lambda: (condition(cluster, "r", "Created") or {}).get("status") == "True",
        timeout=20,
        message="the job created",
    )
    await reconciled(cluster, "r")
    assert len(refused) == 2 and len(requests_to(cluster, "POST", f"/{plural}")) == 3
    job_kind = TRAINJOBS if plural == "trainjobs" else PYTORCHJOBS
    assert get(cluster, job_kind, "r") is not None
    if plural == "trainjobs":
        # The runtime the TrainJob refers to went first, once.
        assert get(cluster, RUNTIMES, "r") is not None
        assert len(requests_to(cluster, "POST", "/trainingruntimes")) == 1
    assert phase(cluster, "r") == "Pending" and condition(cluster, "r", "Failed") is None
    assert len(warnings(cluster, "r", "Retrying")) == 1  # per episode, not per retry
    assert not warnings(cluster, "r", "JobRefused") and not warnings(cluster, "r", "Failed")
    after = metrics.sample("megdet_controller_reconciles_total", {"result": "refused"})
    assert after == refusals  # never counted as a final refusal
