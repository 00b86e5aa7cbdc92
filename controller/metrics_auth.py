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
generated at start, as controller-runtime's secure metrics serving does
(:mod:`megdet.controller.tls`).
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from megdet.controller.tls import context_from_dir, context_from_pem, self_signed
from megdet.controller.tokenauth import SourceLimiter, VerdictCache, bearer_token

__all__ = [
    "AuthError",
    "KubernetesReviewer",
    "Reviewer",
    "TokenAuthorizer",
    "User",
    "Verdict",
    "server_ssl_context",
]

log = logging.getLogger(__name__)


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
    """The answer to one request: an HTTP status (200, 401, 403, 429 or 500) and why."""

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
    #: Reviews one source address may cause (cache misses): a burst, then a rate a second.
    reviews_per_second: float = 1.0
    review_burst: int = 10
    _cache: VerdictCache = field(init=False, repr=False)
    limiter: SourceLimiter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Grants and refusals in separate pools: a flood of bad tokens never evicts a grant.
        self._cache = VerdictCache(self.max_entries, self.clock)
        self.limiter = SourceLimiter(self.reviews_per_second, self.review_burst, clock=self.clock)
        if self.allow_ttl < 0 or self.deny_ttl < 0:
            raise ValueError("allow_ttl and deny_ttl must be >= 0")

    def check(
        self,
        authorization: str | None,
        verb: str = "get",
        path: str = "/metrics",
        source: str = "",
    ) -> Verdict:
        """The verdict for a request with this ``Authorization`` header value, from the
        address ``source`` (429 when it caused too many reviews lately)."""
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        key = VerdictCache.key(token, verb, path)
        now = self.clock()
        hit = self._cache.get(key, now)
        if hit is not None:
            return hit
        if not self.limiter.take(source):
            return Verdict(429, "too many token reviews from this address")
        verdict = self._review(token, verb, path)
        if verdict.status in (200, 401, 403):  # an API failure is asked again next time
            ttl = self.allow_ttl if verdict.allowed else self.deny_ttl
            self._cache.put(key, verdict, now + ttl, allowed=verdict.allowed)
        return verdict

    def cached(self) -> int:
        """Tokens in the cache now (expired ones included until looked up or evicted)."""
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


def server_ssl_context(cert_dir: str | Path | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context: ``cert_dir``'s ``tls.crt``/``tls.key``, or a self-signed pair.

    Raises ValueError naming the missing or unreadable file when ``cert_dir`` is given.
    """
    if cert_dir is not None:
        return context_from_dir(cert_dir)
    return context_from_pem(*self_signed(socket.gethostname()))
