"""The controller's /metrics behind Kubernetes authentication and authorization (unit level).

The verdicts and their cache (TokenAuthorizer with a fake reviewer and a fake clock), the
TokenReview / SubjectAccessReview bodies the Kubernetes client sends (against a stub API
server on 127.0.0.1), the HTTPS server, and the flags. tests/e2e/test_e2e_metrics_auth.py does the
same against a real API server with real ServiceAccount tokens and the chart's RBAC.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from megdet.cli import build_parser, main
from megdet.controller import metrics
from megdet.controller.metrics import server_ssl_context
from megdet.controller.tls import self_signed
from megdet.controller.tokenauth import (
    AuthError,
    KubernetesReviewer,
    TokenAuthorizer,
    User,
    bearer_token,
)
from tests.json_http import JsonHandler

READER = User("system:serviceaccount:monitoring:prometheus", "uid-1", ("system:serviceaccounts",))
STRANGER = User("system:serviceaccount:vision:default", "uid-2", ("system:serviceaccounts",))


class FakeReviewer:
    """Tokens "reader" (granted) and "stranger" (valid, no grant); counts the API calls."""

    def __init__(self) -> None:
        self.token_reviews = 0
        self.access_reviews: list[tuple[str, str, str]] = []
        self.fail: str | None = None  # "authn" or "authz": that review raises AuthError

    def authenticate(self, token: str) -> User | None:
        self.token_reviews += 1
        if self.fail == "authn":
            raise AuthError("connection refused")
        return {"reader": READER, "stranger": STRANGER}.get(token)

    def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        self.access_reviews.append((user.username, verb, path))
        if self.fail == "authz":
            raise AuthError("HTTP 403 Forbidden")
        return user == READER, "" if user == READER else "no RBAC policy matched"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        (None, None),
        ("", None),
        ("Basic dXNlcjpwdw==", None),
        ("Bearer", None),
        ("Bearer a b", None),
    ],
)
def test_bearer_token_is_taken_from_the_authorization_header(header, token) -> None:
    assert bearer_token(header) == token


def test_verdicts_401_without_or_with_a_bad_token_403_without_the_grant_200_with_it() -> None:
    reviewer = FakeReviewer()
    auth = TokenAuthorizer(reviewer)
    assert auth.check(None).status == 401
    assert reviewer.token_reviews == 0  # no token: nothing to ask the API server
    assert auth.check("Bearer forged").status == 401
    denied = auth.check("Bearer stranger")
    assert denied.status == 403 and STRANGER.username in denied.reason
    allowed = auth.check("Bearer reader")
    assert allowed.allowed and allowed.user == READER.username
    # Only valid tokens reach the SubjectAccessReview, which asks for get on /metrics.
    assert reviewer.access_reviews == [
        (STRANGER.username, "get", "/metrics"),
        (READER.username, "get", "/metrics"),
    ]


def test_verdicts_are_cached_per_token_for_their_ttl() -> None:
    reviewer, clock = FakeReviewer(), Clock()
    auth = TokenAuthorizer(reviewer, allow_ttl=60, deny_ttl=10, clock=clock)
    for _ in range(4):  # a scrape every 15 s within a minute: one pair of reviews
        assert auth.check("Bearer reader").allowed
        clock.now += 14.9
    assert (reviewer.token_reviews, len(reviewer.access_reviews)) == (1, 1)
    clock.now += 0.5  # 60.1 s after the first review: asked again
    assert auth.check("Bearer reader").allowed
    assert (reviewer.token_reviews, len(reviewer.access_reviews)) == (2, 2)
    # Refusals are remembered for deny_ttl only: a new grant takes effect soon.
    assert auth.check("Bearer stranger").status == 403
    clock.now += 9
    assert auth.check("Bearer stranger").status == 403
    assert reviewer.token_reviews == 3
    clock.now += 2
    assert auth.check("Bearer stranger").status == 403
    assert reviewer.token_reviews == 4
    assert auth.check("Bearer forged").status == 401
    assert auth.check("Bearer forged").status == 401
    assert reviewer.token_reviews == 5


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    reviewer = FakeReviewer()
    auth = TokenAuthorizer(reviewer, max_entries=3)
    for token in ("reader", "stranger", "a", "reader", "b", "c"):
        auth.check(f"Bearer {token}")
    # Grants and refusals in pools of 3 each: the four refusals evicted only one another.
    assert auth._cache.sizes() == (1, 3) and auth.cached() == 4
    calls = reviewer.token_reviews
    auth.check("Bearer c")  # still cached
    assert reviewer.token_reviews == calls
    auth.check("Bearer stranger")  # evicted long ago
    assert reviewer.token_reviews == calls + 1


def test_the_cache_keeps_no_token_in_clear() -> None:
    auth = TokenAuthorizer(FakeReviewer())
    auth.check("Bearer reader")
    assert "reader" not in repr(auth) and all("reader" not in k[0] for k in auth._cache)


@pytest.mark.parametrize("failing", ["authn", "authz"])
def test_an_api_failure_is_500_and_asked_again_next_time(failing) -> None:
    reviewer = FakeReviewer()
    reviewer.fail = failing
    auth = TokenAuthorizer(reviewer)
    assert auth.check("Bearer reader").status == 500
    reviewer.fail = None
    assert auth.check("Bearer reader").allowed  # not cached: the API server is asked again


def test_bad_cache_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        TokenAuthorizer(FakeReviewer(), max_entries=0)
    with pytest.raises(ValueError, match="allow_ttl and deny_ttl must be >= 0"):
        TokenAuthorizer(FakeReviewer(), deny_ttl=-1)


# --- The Kubernetes client's reviews, against a stub API server ---------------------------


class StubApiServer:
    """Answers TokenReviews (token "reader" -> READER with extra) and SubjectAccessReviews
    (READER may get /metrics), recording each request body; ``status`` forces an error."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.status = 201
        stub = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                body = self.read_json()
                stub.bodies.append((self.path, body))
                if stub.status != 201:
                    self.send_response(stub.status)
                    self.end_headers()
                    return
                if self.path.endswith("/tokenreviews"):
                    ok = body["spec"]["token"] == "reader"
                    user = {
                        "username": READER.username,
                        "uid": READER.uid,
                        "groups": list(READER.groups),
                        "extra": {"scope": ["a", "b"]},
                    }
                    status = {"authenticated": ok, "user": user if ok else {}}
                else:
                    spec = body["spec"]
                    ok = spec["user"] == READER.username and spec["nonResourceAttributes"] == {
                        "path": "/metrics",
                        "verb": "get",
                    }
                    status = {"allowed": ok, "reason": "bound" if ok else "no"}
                self.reply_json(201, {**body, "status": status})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub_api():
    from kubernetes import client as k8s

    stub = StubApiServer()
    config = k8s.Configuration()
    config.host = stub.url
    yield stub, k8s.ApiClient(config)
    stub.close()


def test_kubernetes_reviewer_sends_token_review_then_subject_access_review(stub_api) -> None:
    stub, api = stub_api
    reviewer = KubernetesReviewer(api, timeout=5)
    user = reviewer.authenticate("reader")
    assert user == User(READER.username, READER.uid, READER.groups, (("scope", ("a", "b")),))
    assert reviewer.authenticate("forged") is None
    assert reviewer.authorize(user, "get", "/metrics") == (True, "bound")
    assert reviewer.authorize(STRANGER, "get", "/metrics") == (False, "no")
    paths = [path for path, _ in stub.bodies]
    assert paths == [
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
    ]
    assert stub.bodies[0][1]["spec"] == {"token": "reader"}
    # The SubjectAccessReview carries the whole user: groups, uid and extra decide RBAC too.
    assert stub.bodies[2][1]["spec"] == {
        "user": READER.username,
        "uid": READER.uid,
        "groups": list(READER.groups),
        "extra": {"scope": ["a", "b"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


def test_kubernetes_reviewer_turns_api_errors_into_500_verdicts(stub_api) -> None:
    stub, api = stub_api
    stub.status = 403  # e.g. the controller lacks create on tokenreviews
    reviewer = KubernetesReviewer(api, timeout=5)
    with pytest.raises(AuthError, match="HTTP 403"):
        reviewer.authenticate("reader")
    assert TokenAuthorizer(reviewer).check("Bearer reader").status == 500
    stub.close()  # the API server is gone
    with pytest.raises(AuthError):
        reviewer.authenticate("reader")


# --- The HTTPS server -------------------------------------------------------------------


def _fetch(url: str, token: str | None = None, cafile: Path | None = None) -> tuple[int, str]:
    if cafile is not None:
        context = ssl.create_default_context(cafile=str(cafile))
    else:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10, context=context
        ) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def secure_server():
    server = metrics.serve(
        0,
        "127.0.0.1",
        authorizer=TokenAuthorizer(FakeReviewer()),
        ssl_context=server_ssl_context(),
    )
    yield f"https://127.0.0.1:{server.port}"
    server.close()


def test_secure_server_answers_401_403_200(secure_server) -> None:
    code, body = _fetch(f"{secure_server}/metrics")
    assert code == 401 and "no bearer token" in body
    assert _fetch(f"{secure_server}/metrics", "forged")[0] == 401
    code, body = _fetch(f"{secure_server}/metrics", "stranger")
    assert code == 403 and "megdet_controller" not in body
    code, body = _fetch(f"{secure_server}/metrics", "reader")
    assert code == 200 and "megdet_controller_reconciles_total" in body
    assert _fetch(f"{secure_server}/other", "reader")[0] == 404


def test_secure_server_refuses_plain_http(secure_server) -> None:
    url = secure_server.replace("https:", "http:") + "/metrics"
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=10)
    # ... and keeps serving afterwards.
    assert _fetch(f"{secure_server}/metrics", "reader")[0] == 200


def test_mounted_certificate_is_served_and_verifies(tmp_path) -> None:
    cert, key = self_signed("megdet-operator-metrics.megdet-system.svc")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server = metrics.serve(
        0, "127.0.0.1", authorizer=TokenAuthorizer(FakeReviewer()),
        ssl_context=server_ssl_context(tmp_path),
    )  # fmt: skip
    try:
        # A client that trusts exactly that certificate (the ServiceMonitor's caSecret case).
        code, _ = _fetch(f"https://localhost:{server.port}/metrics", "reader", tmp_path / "tls.crt")
        assert code == 200
    finally:
        server.close()


def test_self_signed_certificates_are_fresh_and_serve_localhost() -> None:
    from cryptography import x509

    first, second = self_signed("pod-a")[0], self_signed("pod-a")[0]
    assert first != second
    cert = x509.load_pem_x509_certificate(first)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"pod-a", "localhost"}


def test_cert_dir_without_the_pair_names_the_missing_file(tmp_path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    with pytest.raises(ValueError, match=r"tls\.key does not exist"):
        server_ssl_context(tmp_path)
    (tmp_path / "tls.key").write_text("y")
    with pytest.raises(ValueError, match="cannot load"):
        server_ssl_context(tmp_path)


def test_plain_server_without_authorizer_serves_anyone() -> None:
    server = metrics.serve(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert "megdet_controller_runs" in response.read().decode()
    finally:
        server.close()


# --- Flags ----------------------------------------------------------------------------------


def test_secure_is_the_default_and_can_be_turned_off() -> None:
    assert build_parser().parse_args(["controller"]).metrics_secure is True
    args = build_parser().parse_args(["controller", "--no-metrics-secure"])
    assert args.metrics_secure is False and args.metrics_cert_dir is None


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--no-metrics-secure", "--metrics-cert-dir", "/x"],
            "--metrics-cert-dir needs --metrics-secure",
        ),
        (["--metrics-cert-dir", "/nonexistent"], "--metrics-cert-dir: /nonexistent/tls.crt"),
    ],
)
def test_bad_metrics_flags_exit_2_naming_the_flag(argv, message, kubeconfig, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", "--standalone", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
