"""Training progress through Kubeflow Trainer v2.3.0's own status server, on the real control
plane (its TrainJobStatus feature gate on; see docs/trainer-v2.md, Progress).

A MegDetRun with `target: trainjob`: Trainer's TrainJobStatus plugin gives the trainer's pods
the status URL, the CA and a projected ServiceAccount token with the TrainJob's audience; a
report built with ``megdet.progress.to_request`` and a token minted by the TokenRequest API for
one of the job's pods is POSTed to Trainer's server, which checks the token against the API
server's OIDC keys and applies it to ``TrainJob.status.trainerStatus``; the MegDet controller
mirrors that into ``MegDetRun.status.progress``. Tokens of another audience or namespace get
403, a report the API server's validation refuses gets 422. kwok completes a Job's pods at
once, so the run may be Succeeded by the time the report is sent: neither Trainer's server nor
the mirror look at the phase."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.parse
from typing import Any

import pytest
from e2e_helpers import (
    apply_objects,
    eventually,
    get_json,
    get_or_none,
    mdr,
    namespace,
    pods_of,
    run_namespace,
)

from cluster.control_plane import Cluster
from cluster.operators import TRAINER_NAMESPACE
from megdet.progress import ENV_CA_CERT, ENV_TOKEN, ENV_URL, Progress, to_request, to_status

NS = "progress-e2e"
OTHER_NS = "progress-e2e-other"
RUN = "coco-8"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Trainer v2.3.0 pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go.
MOUNT = "/var/run/secrets/kubeflow/trainer"
VOLUME = "kubeflow-trainer-token"
#: cmd/trainer-controller-manager (pkg/apis/config/v1alpha1/defaults.go): the Service name
#: the plugin puts in the URL.
SERVICE = "kubeflow-trainer-controller-manager"


def audience(ns: str, name: str) -> str:
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status"


def status_path(ns: str, name: str) -> str:
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status"


@pytest.fixture(scope="module")
def trainer_v2(kube):
    """JobSet and Trainer v2 on the session's cluster; the time they came up, 0 if they ran."""
    return time.monotonic() if kube.start_trainer_v2() else 0.0


@pytest.fixture(scope="module")
def ns(kube, trainer_v2, controller):
    if controller.started_at < trainer_v2:
        controller.restart()  # kopf lists the kinds to watch once
    name = run_namespace(kube, NS, gpus=8)
    apply_objects(
        kube,
        mdr(
            RUN,
            name,
            {
                "gpus": 8,
                "target": "trainjob",
                "dataset": {"claimName": "coco"},
                "output": {"claimName": "megdet-output"},
                "runName": RUN,
            },
        ),
    )
    return name


@pytest.fixture(scope="module")
def trainer_container(kube, ns) -> dict[str, Any]:
    """The trainer container of the JobSet Trainer made for the run's TrainJob."""
    jobset = eventually(
        lambda: get_or_none(kube, "jobset", RUN, "-n", ns), timeout=90, message="the JobSet"
    )
    (replicated,) = jobset["spec"]["replicatedJobs"]
    pod_spec = replicated["template"]["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    return {"pod": pod_spec, "container": container}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_trainer_injects_its_status_url_ca_and_token(kube, ns, trainer_container) -> None:
    """The TrainJobStatus plugin ran (the gate is on): env, mount and projected volume in the
    trainer's pods, and the CA ConfigMap it copies from its webhook Secret."""
    env = env_of(trainer_container["container"])
    port = kube.ports["trainer-status"]
    assert env[ENV_URL] == (
        f"https://{SERVICE}.{TRAINER_NAMESPACE}.svc:{port}{status_path(ns, RUN)}"
    ), env
    assert env[ENV_CA_CERT] == f"{MOUNT}/ca.crt" and env[ENV_TOKEN] == f"{MOUNT}/token", env
    mounts = {m["name"]: m for m in trainer_container["container"]["volumeMounts"]}
    assert mounts[VOLUME]["mountPath"] == MOUNT and mounts[VOLUME]["readOnly"] is True
    volumes_ = {v["name"]: v for v in trainer_container["pod"]["volumes"]}
    sources = volumes_[VOLUME]["projected"]["sources"]
    token = next(s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s)
    assert token == {"audience": audience(ns, RUN), "expirationSeconds": 3600, "path": "token"}
    config_map = next(s["configMap"] for s in sources if "configMap" in s)
    assert config_map["name"] == f"{RUN}-tls-config"
    assert config_map["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # The ConfigMap holds the CA of the certificate the status server serves.
    data = get_json(kube, "configmap", f"{RUN}-tls-config", "-n", ns)["data"]
    assert data["ca.crt"] == (Cluster.webhook_pki() / "ca.crt").read_text()
    # And the pods were admitted with it under `restricted` Pod Security.
    pods = eventually(
        lambda: pods_of(kube, ns, f"{JOBSET_LABEL}={RUN}"), timeout=90, message="the pods"
    )
    for pod in pods:
        assert any(v["name"] == VOLUME for v in pod["spec"]["volumes"]), pod["spec"]["volumes"]


# -- the status server ---------------------------------------------------------------------------


def post(kube, ns: str, url: str, token: str | None, body: Any) -> tuple[int, dict]:
    """POST to the injected URL as a pod would: TLS checked against the ConfigMap's CA and the
    URL's host name; the connection goes to 127.0.0.1 (no cluster DNS on the host)."""
    parts = urllib.parse.urlsplit(url)
    ca = get_json(kube, "configmap", f"{RUN}-tls-config", "-n", ns)["data"]["ca.crt"]
    ctx = ssl.create_default_context(cadata=ca)
    raw = socket.create_connection(("127.0.0.1", parts.port), timeout=10)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.sock = ctx.wrap_socket(raw, server_hostname=parts.hostname)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", parts.path, body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, json.loads(payload or b"{}")


def mint(kube, ns: str, aud: str, pod: dict[str, Any] | None = None) -> str:
    """A ServiceAccount token from the TokenRequest API, bound to ``pod`` (its own account)."""
    account = (pod or {}).get("spec", {}).get("serviceAccountName") or "default"
    args = ["create", "token", account, "-n", ns, f"--audience={aud}", "--duration=10m"]
    if pod is not None:
        args += ["--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}"]
    return kube.kubectl(*args).stdout.strip()


def claims(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


REPORT = Progress(
    iteration=1200,
    max_iter=4800,
    images_seen=19200,
    planned_images=76800,
    images_per_second=41.5,
    eta_seconds=3600,
    ap=37.25,
    ap50=58.5,
    eval_iteration=1000,
    checkpoint_iteration=1000,
    checkpoint_time="2026-12-01T09:50:00Z",
    updated_time="2026-12-01T10:00:00Z",
)


@pytest.fixture(scope="module")
def reported(kube, ns, trainer_container) -> dict[str, Any]:
    """One report, POSTed with a token bound to a pod of the job; Trainer's answer."""
    url = env_of(trainer_container["container"])[ENV_URL]
    pod = eventually(
        lambda: pods_of(kube, ns, f"{JOBSET_LABEL}={RUN}"), timeout=90, message="the pods"
    )[0]
    token = mint(kube, ns, audience(ns, RUN), pod)
    assert claims(token)["kubernetes.io"]["pod"]["name"] == pod["metadata"]["name"]
    code, answer = post(kube, ns, url, token, to_request(REPORT))
    return {"url": url, "code": code, "answer": answer, "pod": pod}


def test_a_pod_token_report_lands_in_the_trainjob_status(kube, ns, reported) -> None:
    assert reported["code"] == 200, reported["answer"]
    sent = to_request(REPORT)
    assert reported["answer"] == sent  # Trainer answers with what it applied
    job = get_json(kube, "trainjob", RUN, "-n", ns)
    stored = job["status"]["trainerStatus"]
    assert stored == sent["trainerStatus"], stored
    assert stored["progressPercentage"] == 25 and stored["estimatedRemainingSeconds"] == 3600
    # v2.3.0's printer columns are State and Age only; progress shows with custom columns.
    header = kube.kubectl("get", "trainjob", RUN, "-n", ns).stdout.splitlines()[0].split()
    assert header == ["NAME", "STATE", "AGE"]
    columns = (
        "NAME:.metadata.name,PROGRESS:.status.trainerStatus.progressPercentage,"
        "ETA:.status.trainerStatus.estimatedRemainingSeconds"
    )
    out = kube.kubectl("get", "trainjob", RUN, "-n", ns, "-o", f"custom-columns={columns}")
    assert out.stdout.splitlines()[1].split() == [RUN, "25", "3600"]


def test_the_run_mirrors_the_trainjob_progress(kube, ns, reported) -> None:
    assert reported["code"] == 200, reported["answer"]
    expected, problems = to_status(to_request(REPORT)["trainerStatus"])
    assert problems == []
    progress = eventually(
        lambda: (get_json(kube, "mdr", RUN, "-n", ns).get("status") or {}).get("progress")
        == expected
        and expected,
        timeout=60,
        message="MegDetRun status.progress mirrored from the TrainJob",
    )
    assert progress["percent"] == 25 and progress["etaTime"] == "2026-12-01T11:00:00Z"
    assert progress["ap"] == 37.25 and progress["checkpointIteration"] == 1000
    # And `kubectl get mdr` shows it (the CRD's Progress, ETA and AP columns).
    header, row = kube.kubectl("get", "mdr", RUN, "-n", ns).stdout.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert (cells["PROGRESS"], cells["ETA"], cells["AP"]) == ("25", progress["etaTime"], "37.25")


def test_tokens_for_another_audience_or_namespace_get_403(kube, ns, reported) -> None:
    url, pod = reported["url"], reported["pod"]
    body = to_request(REPORT)
    refused = {
        "no token": None,
        "not a token": "abc.def.ghi",
        "another TrainJob's audience": mint(kube, ns, audience(ns, "other"), pod),
        "the MegDet controller's audience": mint(
            kube, ns, f"megdet.io/v1alpha1/namespaces/{ns}/megdetruns/{RUN}/status", pod
        ),
        "the API server's audience": kube.kubectl(
            "create", "token", "default", "-n", ns, "--duration=10m"
        ).stdout.strip(),
    }
    # A token with the right audience from a pod-less account of another namespace.
    namespace(kube, OTHER_NS)
    refused["another namespace"] = mint(kube, OTHER_NS, audience(ns, RUN))
    for what, token in refused.items():
        code, answer = post(kube, ns, url, token, body)
        assert (code, answer.get("reason")) == (403, "Forbidden"), (what, answer)
    # The same audience from an account of the TrainJob's namespace is what Trainer allows
    # (it checks signature, expiry, audience and namespace; not which pod).
    assert post(kube, ns, url, mint(kube, ns, audience(ns, RUN)), body)[0] == 200


def test_a_report_out_of_bounds_gets_422(kube, ns, reported) -> None:
    token = mint(kube, ns, audience(ns, RUN), reported["pod"])
    bad = to_request(REPORT)
    bad["trainerStatus"]["progressPercentage"] = 250
    code, answer = post(kube, ns, reported["url"], token, bad)
    assert code == 422 and answer["reason"] == "Invalid", answer
    assert "progressPercentage" in answer["message"], answer
    code, answer = post(kube, ns, reported["url"], token, "not an object")
    assert code == 422, answer
    # Nothing of either reached the TrainJob.
    stored = get_json(kube, "trainjob", RUN, "-n", ns)["status"]["trainerStatus"]
    assert stored["progressPercentage"] == 25, stored
