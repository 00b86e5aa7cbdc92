"""The progress endpoint's token check (controller/progress_auth.py): the pod's projected token
verified here with the cluster's issuer keys, as Kubeflow Trainer's status server does
(pkg/statusserver/auth.go): signature, expiry, not-before, issuer, the run's audience, the
namespace, the pod. A fake issuer (tests/controller/progress_fakes.py); the real API server's
tokens and keys: tests/e2e/test_progress.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from progress_fakes import NS, Clock, FakeIssuer, FakeNamespace, public_jwk

from megdet.controller.progress_auth import LEEWAY_SECONDS, RETRY_SECONDS, IssuerKeys


def hmac_signed(claims: dict, secret: bytes) -> str:
    """An HS256 token built by hand (PyJWT rightly refuses to sign with a public key)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = part(json.dumps({"alg": "HS256", "kid": "k1", "typ": "JWT"}).encode())
    signed = f"{head}.{part(json.dumps(claims).encode())}"
    return f"{signed}.{part(hmac.new(secret, signed.encode(), hashlib.sha256).digest())}"


@pytest.fixture()
def world():
    issuer, clock = FakeIssuer(), Clock()
    return issuer, FakeNamespace().authenticator(issuer, clock), clock


def verdict(auth, token: str, run: str = "r1") -> tuple[int, str]:
    found = auth.check(f"Bearer {token}", NS, run)
    return found.status, found.reason


def test_the_runs_pod_token_is_allowed(world) -> None:
    issuer, auth, _clock = world
    assert verdict(auth, issuer.mint("t", "r1")) == (200, "the run's pod")


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"expires_in": -LEEWAY_SECONDS - 5}, "expired"),
        ({"not_before": LEEWAY_SECONDS + 60}, "not yet valid"),
        ({"issuer": "https://another-cluster.example"}, "issuer"),
        ({"audience": "https://example.com/another"}, "audience"),
        ({"uid": "uid-of-a-deleted-r1"}, "audience"),  # the run created again: a new uid
    ],
    ids=["expired", "not-before", "issuer", "audience", "old-run"],
)
def test_claims_outside_what_the_run_allows_are_refused(world, options, why: str) -> None:
    issuer, auth, _clock = world
    status, reason = verdict(auth, issuer.mint("t", "r1", **options))
    assert status == 403 and why in reason.lower()


def test_a_token_signed_by_another_key_or_algorithm_is_refused(world) -> None:
    issuer, auth, _clock = world
    good = issuer.mint("t", "r1")
    # Same claims and key id, signed by a key the cluster never published.
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = jwt.decode(good, options={"verify_signature": False})
    forged = jwt.encode(claims, stranger, algorithm="RS256", headers={"kid": "k1"})
    assert verdict(auth, forged)[0] == 403
    # HMAC keyed with the published public key (the classic confusion), and "none".
    public = jwt.algorithms.RSAAlgorithm.to_jwk(issuer.signing["k1"].public_key()).encode()
    assert verdict(auth, hmac_signed(claims, public))[0] == 403
    unsigned = jwt.encode(claims, None, algorithm="none", headers={"kid": "k1"})
    assert verdict(auth, unsigned)[0] == 403
    # The signature of another token pasted on.
    other = issuer.mint("o", "r2")
    assert verdict(auth, good.rsplit(".", 1)[0] + "." + other.rsplit(".", 1)[1])[0] == 403
    assert verdict(auth, good)[0] == 200


def test_the_tokens_namespace_and_pod_claims_must_be_the_runs(world) -> None:
    issuer, auth, _clock = world
    status, reason = verdict(auth, issuer.mint("t", "r1", sa_namespace="elsewhere"))
    assert status == 403 and "not a ServiceAccount's of vision" in reason
    status, reason = verdict(auth, issuer.mint("t", "r1", pod=""))
    assert status == 403 and reason == "the token is not bound to a pod"
    status, reason = verdict(auth, issuer.mint("t", "r1", pod="r2-worker-0"))
    assert status == 403 and "not named as a pod of job r1" in reason


def test_keys_that_cannot_be_read_answer_500_and_are_tried_again(world) -> None:
    issuer, auth, clock = world
    issuer.fail = True
    token = issuer.mint("t", "r1")
    assert verdict(auth, token)[0] == 500
    assert verdict(auth, token)[0] == 500 and len(issuer.fetches) == 1  # not again at once
    issuer.fail = False
    clock.now += RETRY_SECONDS
    assert verdict(auth, token)[0] == 200


def test_issuer_keys_are_bounded_to_what_the_discovery_names() -> None:
    """The JWKS is read from the API server's own path, not the jwks_uri's host; keys without
    an id are left out; an ECDSA key (the API server may sign with one) is kept too."""
    issuer = FakeIssuer()
    issuer.rotate("k2")
    keys = IssuerKeys(issuer.fetch)
    found_issuer, key = keys.key("k2")
    assert found_issuer == "https://kubernetes.default.svc.cluster.local"
    assert key is not None and key.algorithm_name == "ES256"
    assert issuer.fetches == ["/.well-known/openid-configuration", "/openid/v1/jwks"]
    nameless = {k: v for k, v in public_jwk(issuer.signing["k1"], "x").items() if k != "kid"}
    keys = IssuerKeys(lambda path: {"issuer": "i", "jwks_uri": "https://h/j"}
                      if path.startswith("/.well") else {"keys": [nameless]})  # fmt: skip
    assert keys.key("x") == ("i", None) and keys.keys == {}
