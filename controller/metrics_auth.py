"""Kubernetes authentication and authorization for the controller's ``/metrics``.

What controller-runtime's ``filters.WithAuthenticationAndAuthorization`` and kube-rbac-proxy
do, in process: every request's bearer token is checked with a ``TokenReview``, then the
user it names with a ``SubjectAccessReview`` for the non-resource URL (``get /metrics``), so
the usual "metrics reader" ClusterRole (``nonResourceURLs: ["/metrics"], verbs: ["get"]``)
grants it. Verdicts: 200 (allowed), 401 (no, malformed or rejected token), 403 (a valid token
whose user lacks the grant), 500 (the API server could not be asked; never cached).

Verdicts are cached per token (by its SHA-256, never the token itself) for a short time and
a bounded number of tokens, so Prometheus scraping every 15 s costs two API calls a minute,
not two a scrape. Denials are cached for less time than grants, so a freshly bound reader
gets in within seconds.

Also the serving certificate: a mounted ``tls.crt``/``tls.key`` pair, or a self-signed one
generated at start (as controller-runtime's secure metrics serving does).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "CERT_NAME",
    "KEY_NAME",
    "AuthError",
    "KubernetesReviewer",
    "Reviewer",
    "TokenAuthorizer",
    "User",
    "Verdict",
    "bearer_token",
    "server_ssl_context",
]

log = logging.getLogger(__name__)

#: The file names in ``--metrics-cert-dir`` (a kubernetes.io/tls Secret's keys).
CERT_NAME = "tls.crt"
KEY_NAME = "tls.key"


class AuthError(Exception):
    """The API server could not be asked (network, timeout, the controller lacks RBAC)."""


@dataclass(frozen=True)
class User:
    """``TokenReview.status.user``: what a ``SubjectAccessReview`` is asked about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: an HTTP status (200, 401, 403 or 500) and why."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Reviewer(Protocol):
    """Who answers the two questions; the API server in a pod, a fake in unit tests."""

    def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server says it is not valid."""

    def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``, and the reason given."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


@dataclass
class TokenAuthorizer:
    """Token -> verdict for ``verb path``, with a small time- and size-bounded cache."""

    reviewer: Reviewer
    #: Seconds a grant (200) is reused for the same token.
    allow_ttl: float = 60.0
    #: Seconds a refusal (401, 403) is reused; short, so a new grant takes effect soon.
    deny_ttl: float = 10.0
    #: Tokens remembered at most; the least recently used goes first.
    max_entries: int = 1024
    clock: Callable[[], float] = time.monotonic
    _cache: OrderedDict[tuple[str, str, str], tuple[float, Verdict]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {self.max_entries}")
        if self.allow_ttl < 0 or self.deny_ttl < 0:
            raise ValueError("allow_ttl and deny_ttl must be >= 0")

    def check(
        self, authorization: str | None, verb: str = "get", path: str = "/metrics"
    ) -> Verdict:
        """The verdict for a request with this ``Authorization`` header value."""
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        key = (hashlib.sha256(token.encode()).hexdigest(), verb, path)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                if hit[0] > now:
                    self._cache.move_to_end(key)
                    return hit[1]
                del self._cache[key]
        verdict = self._review(token, verb, path)
        if verdict.status in (200, 401, 403):  # an API failure is asked again next time
            ttl = self.allow_ttl if verdict.allowed else self.deny_ttl
            with self._lock:
                self._cache[key] = (now + ttl, verdict)
                self._cache.move_to_end(key)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        return verdict

    def cached(self) -> int:
        """Tokens in the cache now (expired ones included until looked up or evicted)."""
        with self._lock:
            return len(self._cache)

    def _review(self, token: str, verb: str, path: str) -> Verdict:
        try:
            user = self.reviewer.authenticate(token)
        except AuthError as err:
            log.error("metrics: TokenReview failed: %s", err)
            return Verdict(500, "authentication failed")
        if user is None:
            return Verdict(401, "token not accepted by the API server")
        try:
            allowed, reason = self.reviewer.authorize(user, verb, path)
        except AuthError as err:
            log.error("metrics: SubjectAccessReview for %s failed: %s", user.username, err)
            return Verdict(500, f"authorization for user {user.username} failed", user.username)
        if not allowed:
            log.debug("metrics: %s may not %s %s: %s", user.username, verb, path, reason)
            return Verdict(403, f"user {user.username} may not {verb} {path}", user.username)
        return Verdict(200, "allowed", user.username)


class KubernetesReviewer:
    """TokenReview and SubjectAccessReview through the Kubernetes Python client.

    Needs ``create`` on ``authentication.k8s.io/tokenreviews`` and
    ``authorization.k8s.io/subjectaccessreviews`` (the operator chart's ``-metrics-auth``
    ClusterRole).
    """

    def __init__(self, api_client: Any, timeout: float = 10.0) -> None:
        from kubernetes import client as k8s

        self._authn = k8s.AuthenticationV1Api(api_client)
        self._authz = k8s.AuthorizationV1Api(api_client)
        self._timeout = timeout

    def authenticate(self, token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}  # fmt: skip
        review = self._call(self._authn.create_token_review, body)
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return None
        user = status.user
        extra = tuple(sorted((k, tuple(v or ())) for k, v in (user.extra or {}).items()))
        return User(user.username or "", user.uid or "", tuple(user.groups or ()), extra)

    def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec}  # fmt: skip
        review = self._call(self._authz.create_subject_access_review, body)
        status = review.status
        return bool(status and status.allowed), (status.reason or "") if status else ""

    def _call(self, method: Callable[..., Any], body: dict[str, Any]) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return method(body=body, _request_timeout=self._timeout)
        except ApiException as err:
            raise AuthError(f"HTTP {err.status} {err.reason}") from None
        except (OSError, ValueError) as err:  # urllib3's errors are OSErrors or ValueErrors
            raise AuthError(str(err) or type(err).__name__) from None
        except Exception as err:  # urllib3 MaxRetryError and friends
            raise AuthError(f"{type(err).__name__}: {err}") from None


def _self_signed(hostname: str) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a one-year self-signed certificate for ``hostname`` (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    server_key_usage = x509.KeyUsage(
        digital_signature=True, key_encipherment=False, content_commitment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{hostname}@{int(time.time())}")])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"),
                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]  # fmt: skip
    if hostname and hostname != "localhost":
        sans.insert(0, x509.DNSName(hostname))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(server_key_usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_ssl_context(cert_dir: str | Path | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context: ``cert_dir``'s ``tls.crt``/``tls.key``, or a self-signed pair.

    Raises ValueError naming the missing or unreadable file when ``cert_dir`` is given.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir is not None:
        cert, key = Path(cert_dir) / CERT_NAME, Path(cert_dir) / KEY_NAME
        for path in (cert, key):
            if not path.is_file():
                raise ValueError(f"{path} does not exist (needs {CERT_NAME} and {KEY_NAME})")
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as err:
            raise ValueError(f"cannot load {cert} / {key}: {err}") from None
        return context
    cert_pem, key_pem = _self_signed(socket.gethostname())
    # ssl loads key pairs from files only: write them where the pod may write (/tmp), load,
    # and remove them at once.
    with tempfile.TemporaryDirectory(prefix="megdet-metrics-") as tmp:
        cert_file, key_file = os.path.join(tmp, CERT_NAME), os.path.join(tmp, KEY_NAME)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key_pem)
        Path(cert_file).write_bytes(cert_pem)
        context.load_cert_chain(cert_file, key_file)
    return context
