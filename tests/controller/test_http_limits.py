"""Both of the controller's servers (the progress endpoint and /metrics) cap their connections
and give each request one deadline for all of it: a client that holds
connections open, or sends a byte now and then, cannot hold the server's threads.

Real sockets on 127.0.0.1; the limits are made small so that each test is quick. No timing is
asserted: each test waits (with a generous deadline) for the server to act."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from megdet.controller import metrics
from megdet.controller.http_limits import ConnectionGate, Limits
from megdet.controller.progress_ca import ServingCert, service_hosts
from megdet.controller.progress_hub import ProgressHub
from megdet.controller.progress_server import ProgressServer

LIMITS = Limits(max_connections=4, per_source=3, request_timeout=1.0, write_timeout=2.0)
WAIT = 20.0  # seconds a test waits for the server to act before it fails


def _refused(server: str, reason: str) -> float:
    return metrics.sample(
        "megdet_controller_http_refused_total", {"server": server, "reason": reason}
    )


class _NoAuth:
    def check(self, authorization: Any, namespace: str, name: str, source: str = "") -> Any:
        from megdet.controller.tokenauth import Verdict

        return Verdict(401, "no bearer token")


@pytest.fixture(scope="module")
def cert() -> ServingCert:
    return ServingCert.generate(service_hosts("https://op.ops.svc:8443"))


@pytest.fixture()
def progress_server(cert) -> Iterator[ProgressServer]:
    hub = ProgressHub(lambda ns, n: None, lambda ns, n: None, lambda *a: None)
    server = ProgressServer(("127.0.0.1", 0), hub, _NoAuth(), cert.context, limits=LIMITS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture()
def metrics_server() -> Iterator[metrics.MetricsServer]:
    served = metrics.serve(0, "127.0.0.1", limits=LIMITS)  # plain HTTP: a 503 can be said
    yield served
    served.close()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT, source_address=(source, 0))
    return sock


def _wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (b'' if nothing)."""
    sock.settimeout(WAIT)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _https_post(port: int, cert: ServingCert) -> int:
    ctx = ssl.create_default_context(cadata=cert.ca_pem)
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=WAIT)
    try:
        conn.request("POST", "/apis/megdet.io/v1alpha1/namespaces/v/megdetruns/r/status", b"{}")
        return conn.getresponse().status
    finally:
        conn.close()


def test_at_the_cap_the_oldest_unfinished_connection_makes_room(progress_server, cert) -> None:
    """Four idle connections fill the cap: a real report still gets in, in the place of the
    oldest idle one, which is closed; the others are kept."""
    port = progress_server.server_address[1]
    evicted = _refused("progress", "evicted")
    held = [_connect(port, f"127.0.0.{i}") for i in (21, 22, 23, 24)]
    _wait(lambda: progress_server.gate.active == 4, "4 connections served")
    assert _https_post(port, cert) == 401  # served (no token): the cap did not refuse it
    assert _closed_by_server(held[0]) == b""  # the oldest idle one made room
    assert _refused("progress", "evicted") - evicted >= 1
    assert progress_server.gate.active <= 4
    for sock in held:
        sock.close()
    _wait(lambda: progress_server.gate.active == 0, "the connections to be let go")


def test_per_source_cap(progress_server) -> None:
    port = progress_server.server_address[1]
    busy = _refused("progress", "busy")
    held = [_connect(port, "127.0.0.5") for _ in range(3)]
    _wait(lambda: progress_server.gate.active == 3, "3 connections served")
    fourth = _connect(port, "127.0.0.5")
    assert _closed_by_server(fourth) == b""
    assert _refused("progress", "busy") - busy == 1
    other = _connect(port, "127.0.0.6")  # another address still gets the last place
    _wait(lambda: progress_server.gate.active == 4, "the other address served")
    for sock in [*held, fourth, other]:
        sock.close()


def test_a_dripping_client_is_cut_at_the_request_deadline(progress_server, cert) -> None:
    """A byte every 50 ms keeps a per-read timeout from ever firing; the whole-request deadline
    (1 s here) cuts it, during the TLS handshake or after it, in the headers."""
    port = progress_server.server_address[1]
    deadline = _refused("progress", "deadline")
    ctx = ssl.create_default_context(cadata=cert.ca_pem)
    raw = _connect(port)
    tls = ctx.wrap_socket(raw, server_hostname="localhost")
    tls.sendall(b"POST /apis/megdet.io/v1alpha1/namespaces/v/megdetruns/r/status HTTP/1.1\r\n")
    sent = 0
    stop = time.monotonic() + WAIT
    with pytest.raises(OSError):  # the server closes: a write fails (reset or EOF)
        while time.monotonic() < stop:
            tls.sendall(b"X-Slow: " + b"a" * 1 + b"\r\n")
            sent += 1
            time.sleep(0.05)
            tls.settimeout(0.001)
            try:
                if tls.recv(1) == b"":
                    raise ConnectionResetError("closed")
            except (TimeoutError, ssl.SSLWantReadError):
                pass
            finally:
                tls.settimeout(WAIT)
    tls.close()
    assert sent < WAIT / 0.05  # cut before the client gave up
    _wait(lambda: _refused("progress", "deadline") - deadline >= 1, "the deadline to be counted")
    _wait(lambda: progress_server.gate.active == 0, "its place to be free")


def test_a_client_that_never_handshakes_is_cut_at_the_deadline(progress_server) -> None:
    port = progress_server.server_address[1]
    deadline = _refused("progress", "deadline")
    sock = _connect(port)
    sock.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
    assert _closed_by_server(sock) == b""
    sock.close()
    _wait(lambda: _refused("progress", "deadline") - deadline >= 1, "the deadline to be counted")


def test_metrics_server_caps_connections_with_a_503_and_cuts_a_slow_request(
    metrics_server,
) -> None:
    port = metrics_server.port
    busy, deadline = _refused("metrics", "busy"), _refused("metrics", "deadline")
    held = [_connect(port, "127.0.0.11") for _ in range(3)]  # the address's cap
    _wait(lambda: metrics_server._httpd.gate.active == 3, "3 connections served")
    over = _connect(port, "127.0.0.11")
    over.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = _closed_by_server(over)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
    assert _refused("metrics", "busy") - busy == 1
    # The held connections send nothing: each is cut at the deadline and its place freed.
    for sock in held:
        assert _closed_by_server(sock) == b""  # closed without an answer
        sock.close()
    _wait(lambda: _refused("metrics", "deadline") - deadline >= 3, "the 3 deadlines")
    _wait(lambda: metrics_server._httpd.gate.active == 0, "the places to be free")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and b"megdet_controller_http_refused_total" in resp.read()
    conn.close()


def test_a_request_over_its_byte_budget_is_cut() -> None:
    """A request of 100 header lines of 60 KiB (what http.server itself allows: 6 MB held)
    gets no further than the budget."""
    limits = Limits(max_request_bytes=16 * 1024, request_timeout=5.0)
    served = metrics.serve(0, "127.0.0.1", limits=limits)
    try:
        sock = _connect(served.port)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sent = 0
        with pytest.raises(OSError):
            for _ in range(100):
                sock.sendall(b"X-Big: " + b"a" * 60_000 + b"\r\n")
                sent += 1
        assert sent < 100
        sock.close()
    finally:
        served.close()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        Limits(max_connections=0)
    with pytest.raises(ValueError, match="request_timeout"):
        Limits(request_timeout=float("inf"))
    gate = ConnectionGate(Limits(max_connections=2, per_source=1))
    a, b, c, d = (object() for _ in range(4))
    assert gate.enter("a", a) == (True, None)
    assert gate.enter("a", b) == (False, None)  # the source's cap
    assert gate.enter("b", b) == (True, None)
    # Full: the oldest whose request has not arrived makes room (a), unless all have.
    gate.settle(b)
    assert gate.enter("c", c) == (True, a)
    gate.settle(c)
    assert gate.enter("d", d) == (False, None)  # every place is answering a request
    gate.leave(a)  # the evicted one's thread ends: nothing more to free
    assert gate.active == 2
    gate.settle(c, settled=False)  # a kept-alive connection reads its next request
    assert gate.enter("d", d) == (True, c)
    gate.leave(b)
    gate.leave(d)
    assert gate.active == 0 and gate.sources() == 0


def test_a_source_evicting_its_own_connection_keeps_its_whole_cap() -> None:
    """The evicted place is the newcomer's own source's: counted once, so once its connections
    leave, the source may hold its full cap again (a count kept apart from the places drifted
    one too high here and cost the source a place for good)."""
    gate = ConnectionGate(Limits(max_connections=2, per_source=3))
    first, second, third = (object() for _ in range(3))
    assert gate.enter("a", first) == (True, None)
    assert gate.enter("a", second) == (True, None)
    assert gate.enter("a", third) == (True, first)
    gate.leave(second)
    gate.leave(third)
    assert gate.active == 0 and gate.sources() == 0
    # Its third connection again evicts the oldest, not refused as if it held three.
    assert [gate.enter("a", object())[0] for _ in range(3)] == [True, True, True]


def test_metrics_token_reviews_are_rate_limited_per_source() -> None:
    from megdet.controller.tokenauth import TokenAuthorizer

    class Reviewer:
        calls = 0

        def authenticate(self, token: str) -> None:
            Reviewer.calls += 1
            return None  # not a valid token

        def authorize(self, user: Any, verb: str, path: str) -> tuple[bool, str]:
            raise AssertionError("no user to authorize")

    now = [0.0]
    auth = TokenAuthorizer(Reviewer(), clock=lambda: now[0], review_burst=2)
    codes = [auth.check(f"Bearer t{i}", source="10.0.0.1").status for i in range(4)]
    assert codes == [401, 401, 429, 429] and Reviewer.calls == 2
    assert auth.check("Bearer t9", source="10.0.0.2").status == 401  # another address
    assert auth.check("Bearer t0", source="10.0.0.1").status == 401  # cached: no review
    now[0] += 1.0
    assert auth.check("Bearer t5", source="10.0.0.1").status == 401 and Reviewer.calls == 4


def test_the_controller_flags_set_both_servers_limits() -> None:
    import argparse

    from megdet.controller.daemon import build_parser_args

    parser = argparse.ArgumentParser()
    build_parser_args(parser)
    args = parser.parse_args([])
    assert (args.max_connections, args.request_timeout) == (128, 10.0)
    assert Limits().max_connections == 128 and Limits().request_timeout == 10.0
    args = parser.parse_args(["--max-connections", "16", "--request-timeout", "2.5"])
    assert (args.max_connections, args.request_timeout) == (16, 2.5)
    for bad in (["--max-connections", "0"], ["--request-timeout", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
