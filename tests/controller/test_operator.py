"""Two controller replicas with kopf peering: only the higher-priority one acts.

kopf pauses an operator while a live peer with a higher priority is registered in the same
peering object (kopf 1.45 ``_core/engines/peering.py``). The chart gives each replica a random
priority at start-up (``megdet controller --priority random``), so one leads; these tests give
fixed ones. kmock stands in for the API server (none runs here).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import kmock as kmock_lib
import pytest
import yaml
from kmock_helpers import (
    NAMESPACE,
    NETWORKPOLICIES,
    NS_PEERINGS,
    PEERING_NAME,
    PEERINGS,
    PYTORCHJOBS,
    RUNS,
    TRAINJOBS,
    apply,
    collect_garbage,
    condition,
    delete,
    edit,
    eventually,
    get,
    objects,
    patch,
    peers,
    reconciled,
    requests_to,
    run_body,
    run_status,
    settle,
    start_operator,
    stop_operator,
)
from progress_fakes import FakeIssuer
from progress_kmock import (
    apost,
    cluster_peering,
    run_with_pod,
    serve_issuer,
    start_progress_operator,
)

from megdet.controller.progress_ca import CA_CONFIG_MAP, CA_KEY

#: Serving all namespaces, kopf peers through a ClusterKopfPeering; serving some namespaces,
#: through a KopfPeering in each (kopf makes peering namespaced whenever the operator is).
MODES = {
    "all-namespaces": ([], kmock_lib.resource(PEERINGS), None, "ClusterKopfPeering"),
    "watch-namespaces": ([NAMESPACE], kmock_lib.resource(NS_PEERINGS), NAMESPACE, "KopfPeering"),
}


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


# ------------------------------------------------------------------------------------------
# Cross-check: every API call the controller makes is allowed by the operator chart's
# ClusterRole, and every rule of it is used (kmock records the calls; no API server runs here).


CHART = Path(__file__).resolve().parents[2] / "charts" / "megdet-operator"
#: Needed although no call shows it: setting blockOwnerDeletion on an owner reference requires
#: update on the owner's finalizers under the OwnerReferencesPermissionEnforcement admission
#: plugin, which kmock does not run.
NOT_CALLED = {("megdet.io", "megdetruns/finalizers", "update")}
#: kopf's record of a retried reconcile on the run (its progress storage, prefix megdet.io).
RETRY_ANNOTATION = "megdet.io/reconcile"
_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


#: A permission: (namespace or None for any namespace and cluster scope, group, resource, verb).
Permission = tuple[str | None, str, str, str]


def granted(values: dict[str, Any]) -> set[Permission]:
    """What the operator chart's ClusterRole and Roles grant, rendered with ``values``."""
    with helm_python.Chart.load(str(CHART)) as chart:
        files = chart.render(
            values=values, name="megdet-operator", namespace="ops", is_install=True
        )
    roles = [
        doc
        for path, text in files.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
        and doc.get("kind") in ("ClusterRole", "Role")
        # The run rules: the ClusterRole or Roles named after the release, and the progress
        # endpoint's (the issuer's discovery URLs; the shared CA Secret and its pod label in the
        # release namespace). The metrics server's TokenReview/SubjectAccessReview role, the
        # user-facing megdet-edit/-view and the scrapers' reader role are checked in
        # tests/operator_chart/test_operator_chart_roles.py and against a real API server in
        # tests/e2e/test_e2e_metrics_auth.py.
        and doc["metadata"]["name"] in ("megdet-operator", "megdet-operator-progress")
    ]
    return {
        (role["metadata"].get("namespace") if role["kind"] == "Role" else None, group, res, verb)
        for role in roles
        for rule in role["rules"]
        for group, res in [
            *((g, r) for g in rule.get("apiGroups", []) for r in rule.get("resources", [])),
            *((NON_RESOURCE, url) for url in rule.get("nonResourceURLs", [])),
        ]
        for verb in rule["verbs"]
    }


#: The "group" of a non-resource URL's permission (namespace None, the URL as the resource).
NON_RESOURCE = "nonResourceURL"
#: The non-resource URLs the controller reads (the progress endpoint's issuer keys).
NON_RESOURCE_URLS = ("/.well-known/openid-configuration", "/openid/v1/jwks")


def permission(request: Any) -> Permission | None:
    """(namespace, apiGroup, resource[/subresource], verb) of a request; None for discovery."""
    if request.url.path in NON_RESOURCE_URLS:
        return None, NON_RESOURCE, request.url.path, request.method.lower()
    found = _PATH.match(request.url.path)
    if found is None or (found["core"] is None and found["group"] is None):
        return None
    group = "" if found["core"] else found["group"]
    resource = found["plural"] + (f"/{found['sub']}" if found["sub"] else "")
    method = request.method
    if method == "GET":
        verb = (
            "watch"
            if request.params.get("watch") == "true"
            else ("get" if found["name"] else "list")
        )
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return found["ns"], group, resource, verb


def allowed(call: Permission, grants: set[Permission]) -> bool:
    return call in grants or (None, *call[1:]) in grants


def is_discovery(request: Any) -> bool:
    # /api, /apis, /apis/<group>, /apis/<group>/<version>, /api/v1, /version: public discovery.
    # (/api/v1/configmaps is a list of all namespaces' ConfigMaps, not discovery.)
    parts = request.url.path.strip("/").split("/")
    depth = {"api": 2, "apis": 3, "version": 1}.get(parts[0], 0)
    return len(parts) <= depth and request.method == "GET"


@pytest.mark.parametrize(
    "namespaces", [[], [NAMESPACE]], ids=["all-namespaces", "watch-namespaces"]
)
async def test_every_controller_call_is_allowed_and_every_rule_is_used(cluster, namespaces) -> None:
    """Serving all namespaces, the ClusterRole allows every call. Serving only
    ``controller.watchNamespaces``, every call stays in a listed namespace, where a Role allows
    it, peering included (kopf peers through a KopfPeering in each namespace then)."""
    if namespaces:  # what the chart renders: a KopfPeering in each served namespace
        cluster.objects[NS_PEERINGS, NAMESPACE, PEERING_NAME] = {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": PEERING_NAME, "namespace": NAMESPACE},
        }
    else:
        cluster_peering(cluster)
    issuer = FakeIssuer()
    serve_issuer(cluster, issuer)
    op = await start_progress_operator(cluster, 1, PEERING_NAME, namespaces=namespaces)
    try:
        # Everything the controller does: create (both targets), refuse, mirror, suspend, delete;
        # serve a progress report (its pod read), write back an edited CA ConfigMap.
        token = await run_with_pod(cluster, "pj", issuer)
        assert (await apost(op, token, "pj", 10))[0] == 200
        await eventually(lambda: (get(cluster, RUNS, "pj").get("status") or {}).get("progress"))
        ca = op.progress_service.cert.ca_pem
        forged = {"data": {CA_KEY: "forged"}}
        await patch(cluster, "v1/configmaps", CA_CONFIG_MAP, forged)
        await eventually(
            lambda: get(cluster, "v1/configmaps", CA_CONFIG_MAP)["data"][CA_KEY] == ca,
            message="the CA ConfigMap written back",
        )
        await apply(cluster, run_body("tj", {"gpus": 8, "target": "trainjob"}))
        await apply(cluster, run_body("bad", {"gpus": 12, "gpusPerNode": 8}))
        await apply(cluster, run_body("np", {"gpus": 8, "networkPolicy": {"enabled": True}}))
        # A run whose job's name is taken: retried, which kopf records on the run (its progress
        # annotations: the controller's patch of the run itself).
        foreign = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "taken", "namespace": NAMESPACE},
            "spec": {"pytorchReplicaSpecs": {}},
        }
        await apply(cluster, foreign)
        await apply(cluster, run_body("taken"))
        await eventually(
            lambda: RETRY_ANNOTATION
            in (get(cluster, RUNS, "taken")["metadata"].get("annotations") or {}),
            message="the retry recorded on the run",
        )
        # The same for a TrainJob: jobs are read from the controller's watch of them, and
        # from the API server only where the watch cannot answer (here: a create answered 409).
        foreign_tj = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "taken-tj", "namespace": NAMESPACE},
            "spec": {"runtimeRef": {"name": "someone-elses"}},
        }
        await apply(cluster, foreign_tj)
        await apply(cluster, run_body("taken-tj", {"gpus": 8, "target": "trainjob"}))
        await eventually(
            lambda: (condition(cluster, "taken-tj", "Created") or {}).get("reason")
            == "JobNameConflict",
            message="the TrainJob's name taken",
        )
        await eventually(lambda: get(cluster, PYTORCHJOBS, "pj") and get(cluster, TRAINJOBS, "tj"))
        await eventually(lambda: get(cluster, NETWORKPOLICIES, "np"), message="NetworkPolicy")
        # The NetworkPolicy follows the spec (patched), and goes when the spec drops it.
        egress = {"networkPolicy": {"restrictEgress": True}}
        await edit(cluster, "np", 2, egress)
        await eventually(
            lambda: "egress" in get(cluster, NETWORKPOLICIES, "np")["spec"], message="patched"
        )
        await apply(cluster, run_body("np-off", {"gpus": 8, "networkPolicy": {"enabled": True}}))
        await eventually(lambda: get(cluster, NETWORKPOLICIES, "np-off"), message="np-off policy")
        off = {"networkPolicy": {"enabled": False}}
        await edit(cluster, "np-off", 2, off)
        await eventually(lambda: get(cluster, NETWORKPOLICIES, "np-off") is None, message="gone")
        running = [{"type": "Running", "status": "True", "reason": "Running", "message": ""}]
        await patch(cluster, PYTORCHJOBS, "pj", {"status": {"conditions": running}}, status=True)
        await eventually(
            lambda: (get(cluster, RUNS, "pj").get("status") or {}).get("phase") == "Running"
        )
        await patch(cluster, RUNS, "pj", {"spec": {"runPolicy": {"suspend": True}}})
        await eventually(lambda: get(cluster, PYTORCHJOBS, "pj")["spec"]["runPolicy"]["suspend"])
        await patch(cluster, RUNS, "tj", {"spec": {"runPolicy": {"suspend": True}}})
        await eventually(lambda: get(cluster, TRAINJOBS, "tj")["spec"]["suspend"])
        # Elastic runs resized: their jobs deleted and created again, a TrainingRuntime patched.
        elastic = {"gpus": 2, "gpusPerNode": 1, "elastic": {"minGpus": 1, "maxGpus": 2}}
        await apply(cluster, run_body("pe", elastic))
        await apply(cluster, run_body("te", {**elastic, "target": "trainjob"}))
        for name in ("pe", "te"):
            await eventually(lambda n=name: run_status(cluster, n).get("jobUID"))
            await patch(cluster, RUNS, name, {"spec": {"gpus": 1}})
        for name in ("pe", "te"):
            await eventually(
                lambda n=name: run_status(cluster, n).get("attempt") == 2,
                message=f"{name} resized",
            )
        await delete(cluster, RUNS, "pe")
        await delete(cluster, RUNS, "te")
        await delete(cluster, RUNS, "pj")
        await delete(cluster, RUNS, "tj")
        await delete(cluster, RUNS, "np")
        await eventually(
            lambda: all(get(cluster, RUNS, n) is None for n in ("pj", "tj", "np", "pe", "te"))
        )
        # The controller deletes nothing of a deleted run (its delete verb on jobs is for
        # resizes): the garbage collector does, which kmock runs here as a test helper.
        assert get(cluster, NETWORKPOLICIES, "np") is not None
        assert sorted(await collect_garbage(cluster)) == [
            "NetworkPolicy/np",
            "PyTorchJob/np",
            "PyTorchJob/pe",
            "PyTorchJob/pj",
            "TrainJob/te",
            "TrainJob/tj",
            "TrainingRuntime/te",
            "TrainingRuntime/tj",
        ]
        await settle()
    finally:
        await stop_operator(op)

    # The test's own client (kmock's) is not the controller; the operator's start (its shared
    # CA Secret) may come before the test's first request.
    calls = [r for r in list(cluster) if not r.headers.get("User-Agent", "").startswith("kmock/")]
    used = {p for r in calls if not is_discovery(r) for p in [permission(r)] if p is not None}
    grants = granted({"controller": {"watchNamespaces": namespaces}})
    assert {call for call in used if not allowed(call, grants)} == set(), "calls not allowed"
    # Every rule is used somewhere it applies.
    unused = {
        grant
        for grant in grants
        if grant[1:] not in NOT_CALLED
        and not any(call[1:] == grant[1:] and grant[0] in (None, call[0]) for call in used)
    }
    assert unused == set(), "rules no call needs"
    # It never lists a namespace of a run's objects, nor deletes a runtime, and deletes a job
    # only to resize its run.
    assert ("trainer.kubeflow.org", "trainingruntimes", "list") not in {c[1:] for c in used}
    jobs = ("networkpolicies", "pytorchjobs", "trainjobs")
    assert not {c for c in used if c[3] == "delete" and c[2] not in jobs}
    deleted = {
        tuple(r.url.path.rsplit("/", 2)[-2:])
        for r in calls
        if r.method == "DELETE" and r.url.path.rsplit("/", 2)[-2] in jobs[1:]
    }
    assert deleted == {("pytorchjobs", "pe"), ("trainjobs", "te")}
    if namespaces:
        # No cluster-wide grant but the progress endpoint's issuer discovery (non-resource
        # URLs); the release namespace ("ops") holds only its CA Secret.
        assert {grant[0] for grant in grants if grant[1] != NON_RESOURCE} == {NAMESPACE, "ops"}
        assert {grant[2] for grant in grants if grant[0] == "ops"} == {"secrets"}
        assert ("kopf.dev", "kopfpeerings", "patch") in {call[1:] for call in used}
