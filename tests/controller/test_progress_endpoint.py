"""The controller's progress endpoint (controller/progress_server.py) with a fake issuer: the auth
matrix over real HTTPS, the payload checks, rate-limited status writes counted with an injected
clock, and the per-run event budget. No API server: tests/e2e/test_progress.py has the real one."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Mapping
from typing import Any

import pytest
from progress_fakes import Clock, FakeIssuer, FakeNamespace

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.planning import plan_children
from megdet.controller.progress_ca import ServingCert, service_hosts
from megdet.controller.progress_hub import ProgressHub, TokenBucket, UnknownRun
from megdet.controller.progress_server import MAX_BODY, ProgressServer

NS = "vision"


class FakeAPI:
    def __init__(self, runs: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.runs = runs
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str]] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.runs.get((namespace, name))

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.patches.append((namespace, name, json.loads(json.dumps(status))))

    def post_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        self.events.append((name, reason, message))


def run_obj(name: str, target: str = "pytorchjob", progress: dict | None = None) -> dict:
    status = {"progress": progress} if progress else {}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"target": target},
        "status": status,
    }


def report(iteration: int, *, ap: float | None = None, ev: int | None = None, ck: int | None = None,
           max_iter: int = 1000, eta: int | None = 600) -> dict[str, Any]:  # fmt: skip
    p = protocol.Progress(
        iteration=iteration,
        max_iter=max_iter,
        eta_seconds=eta,
        ap=ap,
        ap50=None if ap is None else ap + 20,
        eval_iteration=ev,
        checkpoint_iteration=ck,
        updated_time="2026-01-01T00:00:00Z",
    )
    return protocol.to_request(p)


@pytest.fixture(scope="module")
def cert() -> ServingCert:
    return ServingCert.generate(service_hosts("https://op-metrics.ops.svc:8443"))


@pytest.fixture()
def endpoint(cert):
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1"), (NS, "r2"): run_obj("r2"),
                   (NS, "tj"): run_obj("tj", "trainjob")})  # fmt: skip
    review = FakeIssuer()
    auth = FakeNamespace().authenticator(review)
    hub = ProgressHub(api.get_run, api.patch_status, api.post_event, interval=30, clock=clock)
    server = ProgressServer(("127.0.0.1", 0), hub, auth, cert.context, clock=clock)
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cadata=cert.ca_pem)

    def post(run: str, body: Any, token: str | None, raw: bytes | None = None,
             host: str = "localhost") -> tuple[int, Any]:  # fmt: skip
        conn = http.client.HTTPSConnection(
            host, server.server_address[1], context=client_ctx, timeout=10
        )
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("POST", protocol.run_status_path(NS, run), data, headers)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return resp.status, json.loads(payload) if payload else None

    yield post, review, api, hub, clock, auth
    server.shutdown()
    server.server_close()


def _count(result: str) -> float:
    return metrics.sample("megdet_controller_progress_reports_total", {"result": result})


def test_auth_matrix(endpoint) -> None:
    post, review, api, hub, _clock, _auth = endpoint
    body = report(10)
    own = review.mint("tok-r1", "r1")
    other = review.mint("tok-r2", "r2")
    elsewhere = "trainer.kubeflow.org/v1alpha1/whatever"
    forged_audience = review.mint("tok-wrong-aud", "r1", audience=elsewhere)
    no_pod = review.mint("tok-no-pod", "r1", pod="")
    stray_pod = review.mint("tok-stray", "r1", pod="stray")
    gone_pod = review.mint("tok-gone", "r1", pod="deleted-pod")
    before = {r: _count(r) for r in ("unauthenticated", "forbidden", "accepted")}

    assert post("r1", body, None)[0] == 401
    assert post("r1", body, "not-a-token")[0] == 403
    assert post("r1", body, forged_audience)[0] == 403
    assert post("r1", body, other)[0] == 403  # another run's (valid) token
    # A token for r1's audience of another namespace's ServiceAccount (and pod) is refused on
    # its kubernetes.io claims.
    other_ns = review.mint("tok-other-ns", "r1", sa_namespace="elsewhere")
    assert post("r1", body, other_ns)[0] == 403
    assert post("r1", body, no_pod)[0] == 403  # not bound to a pod
    # Pods not named as the training operator names r1's: refused without reading a pod.
    assert post("r1", body, stray_pod)[0] == 403
    assert post("r1", body, gone_pod)[0] == 403
    assert hub.runs == {}  # nothing of a refused report was kept
    status, echoed = post("r1", body, own)
    assert status == 200 and echoed == body
    assert post("r2", report(5), other)[0] == 200
    assert _count("unauthenticated") - before["unauthenticated"] == 1
    assert _count("forbidden") - before["forbidden"] == 7
    assert _count("accepted") - before["accepted"] == 2
    hub.flush()
    assert {(ns, name) for ns, name, _ in api.patches} == {(NS, "r1"), (NS, "r2")}
    (r1_patch,) = [p for _, name, p in api.patches if name == "r1"]
    assert set(r1_patch) == {"progress"}  # only the progress key of the status
    assert r1_patch["progress"]["iteration"] == 10 and r1_patch["progress"]["percent"] == 1


def test_reports_read_the_issuers_keys_once(endpoint) -> None:
    """No API call per report: the discovery document and JWKS are read at the first token."""
    post, review, _api, _hub, _clock, _auth = endpoint
    for i in range(5):
        assert post("r1", report(i), review.mint(f"tok-{i}", "r1"))[0] == 200
    assert review.fetches == ["/.well-known/openid-configuration", "/openid/v1/jwks"]


def test_unknown_run_404_trainjob_run_404_bad_payload_422(endpoint) -> None:
    post, review, _api, hub, _clock, _auth = endpoint
    ghost = review.mint("tok-ghost", "ghost", pod="r1-worker-0")
    assert post("ghost", report(1), ghost)[0] == 403  # r1's pod: refused before the run lookup
    # The pod's name is checked first, without reading it: r1's pod is not ghost's.
    auth_ok = FakeNamespace().authenticator(review)
    assert auth_ok.check(f"Bearer {ghost}", NS, "ghost").status == 403
    ghost3 = review.mint("tok-ghost3", "ghost", pod="ghost-master-0")
    assert auth_ok.check(f"Bearer {ghost3}", NS, "ghost").status == 200
    with pytest.raises(UnknownRun):
        hub.report(NS, "ghost", {"iteration": 1})
    with pytest.raises(UnknownRun, match="trainjob"):
        hub.report(NS, "tj", {"iteration": 1})

    token = review.mint("tok-422", "r1")
    assert post("r1", None, token, raw=b"{not json")[0] == 422
    assert post("r1", {"trainerStatus": "nope"}, token)[0] == 422
    code, body = post("r1", {"trainerStatus": {"progressPercentage": 900}}, token)
    assert code == 422 and "progressPercentage" in body["message"]
    assert post("r1", None, token, raw=b"x" * (MAX_BODY + 1))[0] == 413
    assert (NS, "r1") not in hub.runs


def test_a_reports_fabric_reaches_the_hub(endpoint) -> None:
    from megdet.fabric_report import FabricReport, to_metrics

    post, review, _api, hub, _clock, _auth = endpoint
    fabric = FabricReport("Socket", "IB", 2, 2, "NET/IB : No device found.")
    body = report(3)
    body["trainerStatus"]["metrics"] += to_metrics(fabric)
    assert post("r2", body, review.mint("tok-fabric", "r2"))[0] == 200
    assert hub.runs[(NS, "r2")].fabric == fabric
    assert "fabric" not in hub.runs[(NS, "r2")].latest  # not a status.progress field


def test_status_writes_are_rate_limited_and_only_when_changed() -> None:
    """1,000 runs reporting every 5 s for 10 simulated minutes, interval 30 s: at most one
    write per run per interval, i.e. 1000/30 writes a second (docs/operations.md)."""
    clock = Clock()
    runs = {(NS, f"r{i}"): run_obj(f"r{i}") for i in range(1000)}
    api = FakeAPI(runs)
    hub = ProgressHub(api.get_run, api.patch_status, api.post_event, interval=30, clock=clock)
    seconds, period = 600, 5
    for t in range(0, seconds, period):
        clock.now = 1000.0 + t
        for i in range(1000):
            progress, _ = protocol.to_status(report(t)["trainerStatus"])
            hub.report(NS, f"r{i}", progress)
        hub.flush()
    writes = len(api.patches)
    # ceil(600 / 30) = 20 writes per run: the first at once, then one per 30 s.
    assert writes == 1000 * 20
    assert writes / seconds == pytest.approx(1000 / 30, rel=0.05)
    # The last report (t=595) came inside the interval of the write at t=570: it is held, not
    # lost, and written once when the interval is over. Then nothing changed: nothing written,
    # however long one waits.
    clock.now += 3600
    assert hub.flush() == 1000
    assert {patch["progress"]["iteration"] for _ns, _name, patch in api.patches[-1000:]} == {595}
    assert hub.flush() == 0


def test_a_new_stage_is_written_at_once_inside_the_interval() -> None:
    """An evaluation lasts seconds: its stage (what the run's Evaluating condition reads) is
    written at the next flush, not held for the rest of the interval; iterations are."""
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1")})
    hub = ProgressHub(api.get_run, api.patch_status, api.post_event, interval=30, clock=clock)
    hub.report(NS, "r1", {"iteration": 10, "stage": "training"})
    assert hub.flush() == 1
    clock.now += 1
    hub.report(NS, "r1", {"iteration": 11, "stage": "training"})
    assert hub.flush() == 0  # held: the same stage inside the interval
    hub.report(NS, "r1", {"iteration": 12, "stage": "evaluating"})
    assert hub.flush() == 1
    assert api.patches[-1][2]["progress"]["stage"] == "evaluating"


def test_status_write_drops_keys_the_report_no_longer_has() -> None:
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1", progress={"iteration": 5, "etaSeconds": 9})})
    hub = ProgressHub(api.get_run, api.patch_status, api.post_event, interval=30, clock=clock)
    hub.report(NS, "r1", {"iteration": 6})
    hub.flush()
    ((_ns, _name, patch),) = api.patches
    # Progress is merged over what was written before, so a report without the ETA keeps it.
    assert patch["progress"]["iteration"] == 6 and patch["progress"]["etaSeconds"] == 9


def test_a_restarted_controller_continues_from_the_written_progress() -> None:
    clock = Clock()
    written = {"iteration": 500, "evalIteration": 400, "ap": 30.0, "checkpointIteration": 400}
    api = FakeAPI({(NS, "r1"): run_obj("r1", progress=written)})
    hub = ProgressHub(api.get_run, api.patch_status, api.post_event, interval=30, clock=clock)
    # The same evaluation reported again after the restart: no second Evaluated event.
    hub.report(NS, "r1", {**written, "iteration": 510})
    hub.flush()
    assert api.events == []
    assert api.patches[-1][2]["progress"]["iteration"] == 510


def test_events_one_per_evaluation_every_kth_checkpoint_and_bounded_per_hour() -> None:
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1")})
    hub = ProgressHub(
        api.get_run, api.patch_status, api.post_event, interval=30, checkpoint_every=2,
        clock=clock,
    )  # fmt: skip
    p = {"iteration": 100, "evalIteration": 100, "ap": 31.234, "ap50": 52.5}
    hub.report(NS, "r1", p)
    hub.report(NS, "r1", p)  # the same evaluation again
    hub.flush()
    assert api.events == [("r1", "Evaluated", "evaluated at iteration 100: AP 31.23, AP50 52.50")]
    for ck in (100, 200, 200, 300, 400):
        hub.report(NS, "r1", {"checkpointIteration": ck})
    hub.flush()
    assert [e[1:] for e in api.events[1:]] == [
        ("Checkpointed", "checkpoint at iteration 200"),
        ("Checkpointed", "checkpoint at iteration 400"),
    ]
    # The bucket (3 at once) is spent: a burst of evaluations posts nothing more ...
    for ev in range(200, 2000, 100):
        hub.report(NS, "r1", {"evalIteration": ev, "ap": 1.0})
    hub.flush()
    assert len(api.events) == 3
    # ... and over a long run, at most EVENTS_PER_HOUR an hour (+ the burst).
    for minute in range(1, 601):  # 10 hours, an evaluation every minute
        clock.now += 60
        hub.report(NS, "r1", {"evalIteration": 10_000 + minute, "ap": 1.0})
    hub.flush()
    assert len(api.events) - 3 <= 6 * 10 + 1


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(capacity=2, per_hour=6, tokens=2)
    assert [bucket.take(0), bucket.take(0), bucket.take(0)] == [True, True, False]
    assert bucket.take(599) is False and bucket.take(601) is True


def test_the_controller_injects_progress_values_into_the_render() -> None:
    """With --progress-url the run's pods get the env, token and CA; without, nothing."""
    body = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r1", "namespace": NS, "uid": "u1"},
        "spec": {},
    }
    plain = plan_children(body)
    assert "KUBEFLOW_TRAINER_SERVER_URL" not in json.dumps(plain.job)
    planned = plan_children(body, progress_url="https://op.ops.svc:8443")
    assert not hasattr(planned, "problems"), planned
    pod = planned.job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["KUBEFLOW_TRAINER_SERVER_URL"] == "https://op.ops.svc:8443" + (
        protocol.run_status_path(NS, "r1")
    )
    (volume,) = [v for v in pod["volumes"] if v["name"] == "megdet-progress"]
    assert volume["projected"]["sources"][1]["configMap"]["name"] == "megdet-progress-ca"
    assert env["MEGDET_RUN_NAME"] == "r1"  # the run env still comes last


async def test_the_operator_gives_each_run_its_progress_url(cluster) -> None:
    """--progress-url reaches the render as the Reconciler's setting (no module global): the
    job the operator creates carries the endpoint's URL for its run."""
    from kmock_helpers import (
        NAMESPACE,
        PYTORCHJOBS,
        apply,
        eventually,
        get,
        run_body,
        start_operator,
        stop_operator,
    )

    op = await start_operator(str(cluster.url), progress_url="https://op.ops.svc:8443")
    try:
        await apply(cluster, run_body("r1"))
        job = await eventually(lambda: get(cluster, PYTORCHJOBS, "r1"), message="the job")
    finally:
        await stop_operator(op)
    url = "https://op.ops.svc:8443" + protocol.run_status_path(NAMESPACE, "r1")
    assert url in json.dumps(job)


def test_serving_cert_verifies_for_the_service_names(cert) -> None:
    hosts = service_hosts("https://op-metrics.ops.svc:8443")
    assert hosts[:2] == ["op-metrics.ops.svc", "op-metrics"]
    assert "BEGIN CERTIFICATE" in cert.ca_pem
