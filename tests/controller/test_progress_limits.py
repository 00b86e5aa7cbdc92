"""The progress endpoint cannot be used to take the controller down:
names bounded to what Kubernetes allows, nothing remembered for a request without a token or
with a forged one, the issuer's keys read at most once a period however many made-up key ids
come, every set bounded, report values checked against their ranges, a refused status write
dropped. (/metrics keeps its TokenReview cache and per-source limiter: their bounds are
tested here too.)

The token check is the real one over a fake issuer and namespace
(tests/controller/progress_fakes.py): tests/controller/test_progress_binding.py has the
decision, tests/e2e/test_progress.py the real API server."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Mapping
from typing import Any

import jwt
import pytest
from progress_fakes import Clock, FakeIssuer, FakeNamespace
from test_progress_endpoint import FakeAPI

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.progress_auth import REFRESH_SECONDS, RunAuthenticator
from megdet.controller.progress_hub import (
    MAX_INT64,
    RANGES,
    HubFull,
    InvalidProgress,
    UnknownRun,
    out_of_range,
)
from megdet.controller.progress_server import MAX_LOGGED, ProgressServer, run_of_path
from megdet.controller.tokenauth import MAX_TOKEN_LENGTH, SourceLimiter, Verdict, VerdictCache

NS = "vision"


class Authenticator(RunAuthenticator):
    """The real check over a fake issuer and namespace; a token named in ``good`` stands for the
    pod token of its run (minted by the issuer)."""

    def __init__(self, good: Mapping[str, str], clock: Clock) -> None:
        self.issuer = FakeIssuer()
        namespace = FakeNamespace()
        super().__init__(self.issuer.keys(clock), namespace.run, namespace.binding(clock))
        self.minted = {label: self.issuer.mint(label, run) for label, run in good.items()}

    def check(self, authorization: str | None, *args: Any, **kwargs: Any) -> Verdict:
        scheme, _, label = (authorization or "").partition(" ")
        if label in self.minted:
            authorization = f"{scheme} {self.minted[label]}"
        return super().check(authorization, *args, **kwargs)


def run_obj(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            **meta,
        },
        "spec": {"target": "pytorchjob"},
        "status": {},
    }


def body(iteration: int = 10, **metrics_: str) -> bytes:
    p = protocol.Progress(iteration=iteration, max_iter=1000, updated_time="2026-01-01T00:00:00Z")
    req = protocol.to_request(p)
    for name, value in metrics_.items():
        req["trainerStatus"]["metrics"].append({"name": name, "value": value})
    return json.dumps(req).encode()


def make(clock: Clock, good: Mapping[str, str] | None = None):
    api = FakeAPI({(NS, "r1"): run_obj("r1"), (NS, "r2"): run_obj("r2")})
    hub = api.hub(interval=30, clock=clock)
    auth = Authenticator(good or {}, clock)
    # Not started: handle() is called directly (the HTTP plumbing: test_http_limits.py).
    server = ProgressServer(("127.0.0.1", 0), hub, auth, None, clock=clock)
    return server, hub, auth, api


def post(server: ProgressServer, path: str, token: str | None, data: bytes = b"", source: str = ""):
    authorization = None if token is None else f"Bearer {token}"
    return server.handle(path, authorization, str(len(data)), io.BytesIO(data), source)


def random_name(rng: random.Random, length: int) -> str:
    """``length`` random lower-case hex digits (a valid DNS-1123 label up to 63)."""
    return format(rng.getrandbits(4 * length), "x").zfill(length)[:length]


def test_paths_are_bounded_to_kubernetes_names() -> None:
    prefix = "/apis/megdet.io/v1alpha1/namespaces/"
    ok_ns, ok_name = "n" * 63, ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    assert len(ok_name) == 253
    assert run_of_path(protocol.run_status_path(ok_ns, ok_name)) == (ok_ns, ok_name)
    assert run_of_path(protocol.run_status_path("vision", "r1")) == ("vision", "r1")
    for ns, name in [
        ("n" * 64, "r1"),  # a namespace is a DNS-1123 label: at most 63
        ("vision", ok_name + "c"),  # a name a DNS-1123 subdomain: at most 253
        ("vision", "r" * 30_000),
        ("Vision", "r1"),
        ("vision", "a..b"),
        ("vision", "-a"),
        ("vision", "a."),
        ("-vision", "r1"),
    ]:
        assert run_of_path(protocol.run_status_path(ns, name)) is None, (ns, name[:80])
    assert run_of_path(prefix + "vision/megdetruns/r1/status/x") is None


def test_a_flood_without_tokens_remembers_nothing() -> None:
    """20,000 POSTs with long random names and no, malformed or oversized tokens: every
    structure of the endpoint stays empty, and the issuer's keys are never read."""
    clock = Clock()
    server, hub, auth, _api = make(clock)
    rng = random.Random(22)
    tokens = [None, "", "Basic dXNlcjpwYXNz", "Bearer", "Bearer a b", "Bearer \x00x",
              "Bearer " + "t" * (MAX_TOKEN_LENGTH + 1)]  # fmt: skip
    before = metrics.sample("megdet_controller_progress_reports_total", {"result": "not_found"})
    for i in range(20_000):
        name = random_name(rng, 30_000 if i % 2 else rng.randint(1, 60))
        path = protocol.run_status_path(NS if i % 3 else random_name(rng, 100), name)
        authorization = tokens[i % len(tokens)]
        code, _ = server.handle(path, authorization, "2", io.BytesIO(b"{}"))
        assert code in (401, 404)
    assert server.logged == {}
    assert auth.issuer.fetches == []
    assert hub.runs == {}
    after = metrics.sample("megdet_controller_progress_reports_total", {"result": "not_found"})
    assert after - before > 0  # invalid paths are counted, not remembered


def test_a_flood_of_random_tokens_stays_bounded_and_keeps_the_grants() -> None:
    """Random well-formed tokens for valid names from many addresses: all refused (403) without
    an API call (none decodes as a JWT), nothing kept per token, the log set bounded, and the
    run's own pod still reports."""
    clock = Clock()
    server, hub, auth, _api = make(clock, {"good": "r1"})
    assert post(server, protocol.run_status_path(NS, "r1"), "good", body(), "10.0.0.1")[0] == 200
    reads = len(auth.issuer.fetches)
    rng = random.Random(7)
    codes: dict[int, int] = {}
    for i in range(20_000):
        clock.now += 0.001
        name = ".".join(random_name(rng, rng.randint(1, 63)) for _ in range(rng.randint(1, 4)))
        token = random_name(rng, 40)
        code, _ = post(server, protocol.run_status_path(NS, name), token, b"{}", f"10.1.{i % 50}.1")
        codes[code] = codes.get(code, 0) + 1
    assert set(codes) == {403}
    assert len(auth.issuer.fetches) == reads == 2
    assert len(server.logged) <= MAX_LOGGED
    assert set(hub.runs) == {(NS, "r1")}
    assert post(server, protocol.run_status_path(NS, "r1"), "good", body(11), "10.0.0.1")[0] == 200


def test_made_up_key_ids_read_the_keys_at_most_once_a_period() -> None:
    """Signed-looking tokens naming key ids the issuer never had: each costs a look in the
    keys held; the keys are read again at most once every REFRESH_SECONDS (a key rotated in is
    found then), so a flood cannot turn into a flood of reads of the API server."""
    clock = Clock()
    server, _hub, auth, _api = make(clock, {"good": "r1"})
    path = protocol.run_status_path(NS, "r1")
    assert post(server, path, "good", body(), "10.0.0.1")[0] == 200
    forged = [jwt.encode({"sub": "x"}, "k" * 32, algorithm="HS256", headers={"kid": f"kid-{i}"})
              for i in range(1000)]  # fmt: skip
    for i, token in enumerate(forged):
        clock.now += 0.01  # 10 s in all
        assert post(server, path, token, b"{}", f"10.2.{i % 50}.1")[0] == 403
    assert len(auth.issuer.fetches) == 2  # read once, at the good token
    clock.now += REFRESH_SECONDS
    for token in forged[:100]:
        assert post(server, path, token, b"{}", "10.2.0.1")[0] == 403
    assert len(auth.issuer.fetches) == 4  # once more for the whole next period
    # A rotated-in key: found at the next read.
    auth.issuer.rotate("k2")
    rotated = auth.issuer.mint("rot", "r1", kid="k2")
    assert post(server, path, rotated, body(12), "10.0.0.1")[0] == 403  # within the period
    clock.now += REFRESH_SECONDS
    assert post(server, path, rotated, body(12), "10.0.0.1")[0] == 200


def test_refusals_never_evict_grants() -> None:
    clock = Clock()
    cache = VerdictCache(4, max_denied=8)
    for i in range(4):
        cache.put(VerdictCache.key(f"good-{i}", "r"), "ok", clock() + 300, allowed=True)
    for i in range(10_000):
        cache.put(VerdictCache.key(f"bad-{i}", "r"), "no", clock() + 10, allowed=False)
    assert cache.sizes() == (4, 8)
    assert all(cache.get(VerdictCache.key(f"good-{i}", "r"), clock()) == "ok" for i in range(4))
    # A token refused then granted (or the reverse) is kept once, in the pool of its verdict.
    key = VerdictCache.key("flip", "r")
    cache.put(key, "no", clock() + 10, allowed=False)
    cache.put(key, "ok", clock() + 300, allowed=True)
    assert cache.get(key, clock()) == "ok" and cache.sizes() == (4, 7)


def test_source_limiter_is_bounded_and_refills() -> None:
    clock = Clock()
    limiter = SourceLimiter(rate=1.0, burst=2, max_sources=100, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [True, True, False]
    for i in range(1000):
        limiter.take(f"s{i}")
    assert len(limiter) == 100
    clock.now += 1.0
    assert limiter.take("s999") is True


def test_out_of_range_values_are_refused_with_the_field_and_range() -> None:
    clock = Clock()
    server, hub, _auth, _api = make(clock, {"good": "r1"})
    path = protocol.run_status_path(NS, "r1")
    cases = {
        "iteration": ("9300000000000000000", f"0..{MAX_INT64}"),  # 19 digits, above int64
        "imagesSeen": ("9223372036854775808", f"0..{MAX_INT64}"),
        "ap": ("100.5", "0..100"),
        "ap50": ("-1", "0..100"),
        "imagesPerSecond": ("-3.5", ">= 0"),
    }
    for field, (value, allowed) in cases.items():
        data = json.loads(body())
        data["trainerStatus"]["metrics"] = [
            m for m in data["trainerStatus"]["metrics"] if m["name"] != field
        ] + [{"name": field, "value": value}]
        code, status = post(server, path, "good", json.dumps(data).encode())
        assert code == 422, field
        assert status["kind"] == "Status" and status["reason"] == "Invalid"
        assert field in status["message"] and allowed in status["message"], status["message"]
    assert hub.runs == {}  # nothing of a refused report was kept
    ok = post(server, path, "good", body(5, ap="0", ap50="100", imagesPerSecond="0"))
    assert ok[0] == 200
    assert out_of_range({"percent": 101, "ap": float("nan"), "etaSeconds": -1}) == [
        "etaSeconds: -1 is not an integer 0..9223372036854775807",
        "percent: 101 is not an integer 0..100",
        "ap: nan is not a finite number 0..100",
    ]
    with pytest.raises(InvalidProgress, match="iteration"):
        hub.report(NS, "r1", {"iteration": MAX_INT64 + 1})


def test_every_number_the_trainer_reports_has_a_range() -> None:
    """Each number field ``to_status`` makes (the final report's totals among them) is bounded
    by RANGES: the totals at most 2^31-1, the totals' rate >= 0."""
    numbers = {*protocol.INT_METRICS.values(), *protocol.NUMBER_METRICS.values()}
    assert numbers | {"percent", "etaSeconds"} <= set(RANGES)
    assert out_of_range({"attempts": 2**31, "stepsImagesPerSecond": -0.5}) == [
        f"attempts: {2**31} is not an integer 0..{protocol.MAX_INT32}",
        "stepsImagesPerSecond: -0.5 is not a finite number >= 0",
    ]
    assert out_of_range({"attempts": protocol.MAX_INT32, "stepsImagesPerSecond": 0.0}) == []


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _writes(result: str) -> float:
    return metrics.sample("megdet_controller_progress_writes_total", {"result": result})


def test_a_status_write_the_api_server_refuses_is_dropped_not_retried() -> None:
    clock = Clock()
    api = FakeAPI({(NS, "r1"): run_obj("r1")})
    hub = api.hub(interval=30, clock=clock)
    refused, errors = _writes("refused"), _writes("error")
    hub.report(NS, "r1", {"iteration": 5})
    hub.runs[(NS, "r1")].latest = {"iteration": 5, "percent": 101}  # past the checks, as a bug
    api.fail.append(ApiError(422))
    assert hub.flush() == 0
    assert _writes("refused") - refused == 1
    for _ in range(5):  # however long one waits, the refused value is not written again
        clock.now += 31
        assert hub.flush() == 0
    assert api.patches == [] and _writes("refused") - refused == 1
    # A new report is written (from what was written before, not the refused value).
    hub.report(NS, "r1", {"iteration": 6})
    assert hub.flush() == 1 and api.patches[-1][2] == {"progress": {"iteration": 6}}
    assert api.runs[(NS, "r1")]["status"]["progress"] == {"iteration": 6}
    # Any other failure is tried again, after an interval.
    hub.report(NS, "r1", {"iteration": 7})
    api.fail.append(ApiError(500))
    clock.now += 31
    assert hub.flush() == 0 and _writes("error") - errors == 1
    assert hub.flush() == 0  # not in a tight loop
    clock.now += 31
    assert hub.flush() == 1 and api.patches[-1][2]["progress"]["iteration"] == 7


def test_the_hub_holds_at_most_max_runs_and_forgets_idle_runs() -> None:
    clock = Clock()
    api = FakeAPI({(NS, f"r{i}"): run_obj(f"r{i}") for i in range(10)})
    hub = api.hub(clock=clock, max_runs=3, idle_forget=600)
    for i in range(3):
        hub.report(NS, f"r{i}", {"iteration": i})
    with pytest.raises(HubFull):
        hub.report(NS, "r3", {"iteration": 1})
    hub.report(NS, "r0", {"iteration": 9})  # a held run still reports
    assert len(hub.runs) == 3
    hub.flush()
    clock.now += 601
    hub.report(NS, "r0", {"iteration": 10})
    hub.flush()  # r1 and r2 were written and are idle: forgotten; r0 has a pending write
    assert set(hub.runs) == {(NS, "r0")}
    hub.report(NS, "r3", {"iteration": 1})
    assert set(hub.runs) == {(NS, "r0"), (NS, "r3")}


def test_a_run_being_deleted_or_unknown_is_refused_and_one_gone_at_its_write_is_forgotten():
    clock = Clock()
    api = FakeAPI({(NS, "gone"): run_obj("gone", deletionTimestamp="2026-01-01T00:00:00Z"),
                   (NS, "r"): run_obj("r")})  # fmt: skip
    hub = api.hub(clock=clock)
    for name in ("gone", "never"):
        with pytest.raises(UnknownRun, match="not found"):
            hub.report(NS, name, {"iteration": 1})
    assert hub.runs == {}
    gone = _writes("gone")
    hub.report(NS, "r", {"iteration": 1})
    del api.runs[(NS, "r")]  # deleted before the flush: its watch says so, nothing is written
    assert hub.flush() == 0 and hub.runs == {} and api.patches == []
    assert _writes("gone") - gone == 1
