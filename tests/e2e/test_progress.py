"""Progress reporting on the real control plane (target pytorchjob): tokens minted with the
TokenRequest API for the run's audience and bound to the run's (kwok) pod, POSTed to the
controller's HTTPS endpoint, verified by the controller with the cluster's own issuer keys
(its OIDC discovery document and JWKS, read under the chart's RBAC); the run's
status.progress, `kubectl get mdr` columns and Events; a forged report; a controller restart
(the CA stays). Two replicas, failover and a re-created run: tests/e2e/test_e2e_progress_ha.py."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any

import pytest
from e2e_helpers import apply_objects, eventually, get_json, get_or_none, mdr, namespace, pods_of

from megdet import progress as protocol

NS = "progress-e2e"
RUNS = ("prog-a", "prog-b")


@pytest.fixture(scope="module")
def ns(kube, controller):
    name = namespace(kube, NS)
    for run in RUNS:
        apply_objects(kube, mdr(run, name, {"gpus": 8}))
    return name


def run_pod(kube, ns: str, run: str) -> dict[str, Any]:
    pods = eventually(
        lambda: pods_of(kube, ns, f"training.kubeflow.org/job-name={run}"),
        timeout=120,
        message=f"the pod of {run}",
    )
    return pods[0]


def ca_of(kube, ns: str, run: str) -> str:
    cm = eventually(
        lambda: get_or_none(kube, "configmap", "megdet-progress-ca", "-n", ns),
        timeout=60,
        message=f"{run}'s CA ConfigMap",
    )
    return cm["data"]["ca.crt"]


def token_for(kube, ns: str, run: str, pod: str) -> str:
    """A token as the kubelet gives ``pod`` for ``run``'s audience (the run's uid in it)."""
    uid = get_json(kube, "mdr", run, "-n", ns)["metadata"]["uid"]
    return kube.kubectl(
        "create", "token", "default", "-n", ns,
        f"--audience={protocol.run_audience(ns, run, uid)}",
        "--bound-object-kind=Pod", f"--bound-object-name={pod}",
    ).stdout.strip()  # fmt: skip


def post(controller, ca: str, ns: str, run: str, token: str, body: dict) -> tuple[int, Any]:
    context = ssl.create_default_context(cadata=ca)  # verifies the certificate and 127.0.0.1
    conn = http.client.HTTPSConnection("127.0.0.1", controller.progress_port, context=context,
                                       timeout=20)  # fmt: skip
    conn.request(
        "POST",
        protocol.run_status_path(ns, run),
        json.dumps(body),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def body(iteration: int, **extra: Any) -> dict:
    p = protocol.Progress(
        iteration=iteration,
        max_iter=1000,
        images_per_second=42.5,
        eta_seconds=3600,
        updated_time=protocol.format_time(__import__("time").time()),
        **extra,
    )
    return protocol.to_request(p)


def progress_of(kube, ns: str, run: str) -> dict:
    return (get_json(kube, "mdr", run, "-n", ns).get("status") or {}).get("progress") or {}


def test_reports_reach_status_columns_and_events_forgeries_do_not(kube, ns, controller) -> None:
    pod_a = run_pod(kube, ns, "prog-a")
    pod_b = run_pod(kube, ns, "prog-b")
    # The run chart gave the pod the env, the audience-bound token volume and the CA.
    spec = pod_a["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "megdet-progress"]
    sources = volume["projected"]["sources"]
    uid_a = get_json(kube, "mdr", "prog-a", "-n", ns)["metadata"]["uid"]
    audience = sources[0]["serviceAccountToken"]["audience"]
    assert audience == protocol.run_audience(ns, "prog-a", uid_a)
    assert sources[1]["configMap"]["name"] == "megdet-progress-ca"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env[protocol.ENV_URL].endswith(protocol.run_status_path(ns, "prog-a"))
    assert spec.get("automountServiceAccountToken") is False

    ca = ca_of(kube, ns, "prog-a")
    cm = get_json(kube, "configmap", "megdet-progress-ca", "-n", ns)
    assert "ownerReferences" not in cm["metadata"]  # shared by the namespace's runs
    token_a = token_for(kube, ns, "prog-a", pod_a["metadata"]["name"])
    token_b = token_for(kube, ns, "prog-b", pod_b["metadata"]["name"])
    # B's pod, but a token minted for A's audience: the pod is not A's.
    token_b_for_a = token_for(kube, ns, "prog-a", pod_b["metadata"]["name"])

    first = body(120, ap=31.25, ap50=52.5, eval_iteration=100, checkpoint_iteration=100,
                 checkpoint_time="2026-01-01T00:00:00Z")  # fmt: skip
    code, echoed = post(controller, ca, ns, "prog-a", token_a, first)
    assert (code, echoed) == (200, first)
    written = eventually(
        lambda: (p := progress_of(kube, ns, "prog-a")).get("iteration") == 120 and p,
        timeout=30,
        message="status.progress of prog-a",
    )
    assert written["percent"] == 12 and written["ap"] == 31.25 and written["etaTime"]

    # Forged: another run's token, and this run's audience from another run's pod.
    assert post(controller, ca, ns, "prog-a", token_b, body(999))[0] == 403
    assert post(controller, ca, ns, "prog-a", token_b_for_a, body(999))[0] == 403
    assert post(controller, ca, ns, "prog-a", "forged", body(999))[0] == 403
    assert post(controller, ca, ns, "nope", token_a, body(1))[0] == 403  # wrong audience
    assert post(controller, ca, ns, "prog-b", token_b, body(7))[0] == 200
    eventually(lambda: progress_of(kube, ns, "prog-b").get("iteration") == 7, timeout=30,
               message="prog-b's own report")  # fmt: skip
    assert progress_of(kube, ns, "prog-a")["iteration"] == 120  # untouched by the forgeries

    # One Evaluated event for the evaluation.
    events = eventually(
        lambda: [
            e
            for e in get_json(kube, "events", "-n", ns)["items"]
            if e["involvedObject"]["name"] == "prog-a" and e["reason"] == "Evaluated"
        ],
        timeout=30,
        message="the Evaluated event",
    )
    assert "AP 31.25" in events[0]["message"] and "iteration 100" in events[0]["message"]

    # kubectl get mdr: Progress, ETA and AP on the default line; the rest with -o wide.
    table = kube.kubectl("get", "mdr", "prog-a", "-n", ns).stdout
    print(table)
    header, row = table.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=False))
    assert cells["PROGRESS"] == "12" and cells["AP"] == "31.25"
    assert cells["ETA"] == written["etaTime"]
    wide = kube.kubectl("get", "mdr", "prog-a", "-n", ns, "-o", "wide").stdout
    print(wide)
    header, row = wide.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=False))
    assert cells["ITERATION"] == "120" and cells["AP50"] == "52.5"
    assert cells["REPORTED"].endswith(("s", "m"))  # a `date` column: the age of a past time

    # Restart: the progress stays, the CA is the same (kept in the operator's Secret, which
    # the restarted controller reads), and the next report continues from it.
    controller.restart()
    assert progress_of(kube, ns, "prog-a")["iteration"] == 120
    assert ca_of(kube, ns, "prog-a") == ca
    code, _ = post(controller, ca, ns, "prog-a", token_a, body(240))
    assert code == 200
    after = eventually(
        lambda: (p := progress_of(kube, ns, "prog-a")).get("iteration") == 240 and p,
        timeout=30,
        message="the report after the restart",
    )
    assert after["percent"] == 24
    assert after["ap"] == 31.25  # the evaluation reported before the restart is kept
