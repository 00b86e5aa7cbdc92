"""The controller's progress endpoint (controller/progress_server.py) with a fake issuer: the auth
matrix over real HTTPS, the payload checks, rate-limited and conditional status writes counted
with an injected clock (two replicas' hubs on one run: each report lands once, never an older
over a newer), and the milestone events' budget. No API server: tests/e2e/test_progress.py has
the real one."""

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
from megdet.controller.progress_binding import run_ref
from megdet.controller.progress_ca import ServingCert, service_hosts
from megdet.controller.progress_events import Milestones, milestones_of
from megdet.controller.progress_hub import ProgressHub, UnknownRun
from megdet.controller.progress_server import MAX_BODY, ProgressServer
from megdet.controller.run_record import RunRecords
from megdet.controller.tokenauth import TokenBucket

NS = "vision"


class Conflict(Exception):
    status = 409


class FakeAPI:
    """The runs as the API server keeps them: a status patch merges into the stored status
    (a merge patch) and moves the resourceVersion on; one that names an older version is a
    409. ``views``: what each replica's watch shows, None for the stored run (up to date)."""

    def __init__(self, runs: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.runs = runs
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.reads = 0
        #: Errors the next patches raise, in order.
        self.fail: list[Exception] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.runs.get((namespace, name))

    def view(self, namespace: str, name: str) -> Any:
        return run_ref(json.loads(json.dumps(self.runs.get((namespace, name)))))

    def read(self, namespace: str, name: str) -> Any:
        self.reads += 1
        return self.view(namespace, name)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any],
                     version: str | None = None) -> None:  # fmt: skip
        if self.fail:
            raise self.fail.pop(0)
        run = self.runs[(namespace, name)]
        meta = run["metadata"]
        if version is not None and version != meta.get("resourceVersion"):
            raise Conflict(f"{name}: version {version} is not {meta.get('resourceVersion')}")
        patch = json.loads(json.dumps(status))
        self.patches.append((namespace, name, patch))
        stored = run.setdefault("status", {})
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(stored.get(key), dict):
                stored[key] = {k: v for k, v in {**stored[key], **value}.items() if v is not None}
            else:
                stored[key] = value
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)

    def hub(self, view: Any = None, **options: Any) -> ProgressHub:
        """A replica's hub: its watch's ``view`` of the runs (default: up to date)."""
        return ProgressHub(view or self.view, self.read, self.patch_status, **options)


def run_obj(name: str, target: str = "pytorchjob", progress: dict | None = None) -> dict:
    status = {"progress": progress} if progress else {}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"target": target},
        "status": status,
    }


def report(iteration: int, *, ap: float | None = None, ev: int | None = None, ck: int | None = None,
           max_iter: int = 1000, eta: int | None = 600,
           at: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:  # fmt: skip
    p = protocol.Progress(
        iteration=iteration,
        max_iter=max_iter,
        eta_seconds=eta,
        ap=ap,
        ap50=None if ap is None else ap + 20,
        eval_iteration=ev,
        checkpoint_iteration=ck,
        updated_time=at,
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
    hub = api.hub(interval=30, clock=clock)
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
    with pytest.raises(UnknownRun):
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
    hub = api.hub(interval=30, clock=clock)
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
    hub = api.hub(interval=30, clock=clock)
    hub.report(NS, "r1", {"iteration": 10, "stage": "training"})
    assert hub.flush() == 1
    clock.now += 1
    hub.report(NS, "r1", {"iteration": 11, "stage": "training"})
    assert hub.flush() == 0  # held: the same stage inside the interval
    hub.report(NS, "r1", {"iteration": 12, "stage": "evaluating"})
    assert hub.flush() == 1
    assert api.patches[-1][2]["progress"]["stage"] == "evaluating"


def test_a_report_without_a_key_keeps_the_runs() -> None:
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1", progress={"iteration": 5, "etaSeconds": 9})})
    hub = api.hub(interval=30, clock=clock)
    hub.report(NS, "r1", {"iteration": 6})
    hub.flush()
    assert [patch for _ns, _name, patch in api.patches] == [{"progress": {"iteration": 6}}]
    # A merge patch of status.progress: a report without the ETA keeps the run's.
    assert api.runs[(NS, "r1")]["status"]["progress"] == {"iteration": 6, "etaSeconds": 9}


def _progress(iteration: int, at: str) -> dict[str, Any]:
    return protocol.to_status(report(iteration, at=at)["trainerStatus"])[0]


T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"


def test_two_replicas_each_report_lands_once_and_never_an_older_over_a_newer() -> None:
    """The Service spreads a run's reports over the replicas: each hub writes what it got,
    once, and a report older than what the run holds (another replica wrote a newer one) is
    not written at all."""
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1")})
    a, b = api.hub(interval=30, clock=clock), api.hub(interval=30, clock=clock)
    a.report(NS, "r1", _progress(10, T0))
    assert a.flush() == 1 and b.flush() == 0  # a report to either lands once
    b.report(NS, "r1", _progress(30, T2))
    a.report(NS, "r1", _progress(20, T1))  # older than b's, and a's flush comes later
    assert b.flush() == 1
    clock.now += 31
    assert a.flush() == 0
    assert api.runs[(NS, "r1")]["status"]["progress"]["iteration"] == 30
    assert len(api.patches) == 2
    assert a.flush() == 0 and b.flush() == 0  # nothing held is written again
    # Within one replica, a report that arrives after a newer one is not kept either.
    a.report(NS, "r1", _progress(40, "2026-01-01T00:00:40Z"))
    a.report(NS, "r1", _progress(35, "2026-01-01T00:00:35Z"))
    clock.now += 31
    assert a.flush() == 1
    assert api.runs[(NS, "r1")]["status"]["progress"]["iteration"] == 40


def test_a_stale_view_costs_a_409_and_a_read_and_loses_nothing() -> None:
    """A replica's watch may not have seen the other replica's write yet: its write names the
    version it compared with, the API server refuses it (409), the run is read and compared
    again, and the newer report it holds stays."""
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1")})
    stale = api.view(NS, "r1")  # a's watch, frozen before b's write
    a = api.hub(lambda ns, name: stale, interval=30, clock=clock)
    b = api.hub(interval=30, clock=clock)
    b.report(NS, "r1", _progress(30, T2))
    b.flush()
    a.report(NS, "r1", _progress(20, T1))
    assert a.flush() == 0 and api.reads == 1  # 409, read, the run holds a newer report
    assert api.runs[(NS, "r1")]["status"]["progress"]["iteration"] == 30
    a.report(NS, "r1", _progress(40, "2026-01-01T00:00:40Z"))
    clock.now += 31
    assert a.flush() == 1 and api.reads == 2  # 409, read, newer than the run's: written
    assert api.runs[(NS, "r1")]["status"]["progress"]["iteration"] == 40


def test_milestones_one_per_evaluation_every_kth_checkpoint_and_bounded_per_hour() -> None:
    """What the run's watch posts as the status.progress it sees changes (progress_events.py)."""
    seen, now, events = Milestones(checkpoint_every=2), [0.0], []

    def see(progress: dict[str, Any]) -> None:
        events.extend(seen.note(progress, now[0]))

    p = {"iteration": 100, "evalIteration": 100, "ap": 31.234, "ap50": 52.5}
    see(p)
    see(p)  # the same evaluation again
    assert events == [("Evaluated", "evaluated at iteration 100: AP 31.23, AP50 52.50")]
    for ck in (100, 200, 200, 300, 400):
        see({"checkpointIteration": ck})
    assert events[1:] == [
        ("Checkpointed", "checkpoint at iteration 200"),
        ("Checkpointed", "checkpoint at iteration 400"),
    ]
    # The bucket (3 at once) is spent: a burst of evaluations posts nothing more ...
    for ev in range(200, 2000, 100):
        see({"evalIteration": ev, "ap": 1.0})
    assert len(events) == 3
    # ... and over a long run, at most EVENTS_PER_HOUR an hour (+ the burst).
    for minute in range(1, 601):  # 10 hours, an evaluation every minute
        now[0] += 60
        see({"evalIteration": 10_000 + minute, "ap": 1.0})
    assert len(events) - 3 <= 6 * 10 + 1
    # A new look (a restart, a failover) starts from the progress the run holds: none again.
    held = {"evalIteration": 400, "ap": 30.0, "checkpointIteration": 400}
    assert Milestones.from_written(held, 2).note(held, 0.0) == []


def test_the_watch_announces_each_milestone_once_and_a_run_created_again_anew() -> None:
    """progress_events.milestones_of on the run's watch events: the first look starts from the
    progress the run holds; a new evaluation is announced once; a run created again under the
    same name (another uid) starts anew even while the old run's record is still kept."""
    records = RunRecords()

    def run(uid: str, progress: dict[str, Any]) -> dict[str, Any]:
        meta = {"namespace": NS, "name": "r1", "uid": uid}
        return {"metadata": meta, "status": {"progress": progress}}

    held = {"iteration": 100, "evalIteration": 100, "ap": 30.0}
    assert milestones_of(records, run("u1", held), 5, 0.0) == []  # a restart: none again
    later = {"iteration": 200, "evalIteration": 200, "ap": 31.0}
    assert [e[0] for e in milestones_of(records, run("u1", later), 5, 1.0)] == ["Evaluated"]
    assert milestones_of(records, run("u1", later), 5, 2.0) == []
    # Deleted and created again: the old record is not dropped yet (its DELETED comes later).
    assert milestones_of(records, run("u2", {}), 5, 3.0) == []
    assert [e[0] for e in milestones_of(records, run("u2", held), 5, 4.0)] == ["Evaluated"]


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
