"""Bearer tokens on the controller's ``/metrics``: a cached check, a ``TokenReview`` behind it.

:class:`TokenAuthorizer` does in process what controller-runtime's
``filters.WithAuthenticationAndAuthorization`` does: a ``TokenReview`` of the request's token,
then a ``SubjectAccessReview`` for ``get /metrics``; verdicts (:class:`Verdict`: 200, 401, 403,
429, 500) kept by the token's SHA-256 in two bounded pools (:class:`VerdictCache`), reviews per
source address bounded (:class:`SourceLimiter`). The progress endpoint shares
:func:`bearer_token` and :class:`Verdict`. In detail: docs/monitoring.md, "Metrics
authentication".
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

__all__ = [
    "MAX_TOKEN_LENGTH",
    "AuthError",
    "KubernetesReviewer",
    "Reviewer",
    "SourceLimiter",
    "TokenAuthorizer",
    "User",
    "Verdict",
    "VerdictCache",
    "bearer_token",
]

logger = logging.getLogger(__name__)

#: Longest bearer token looked at: a ServiceAccount JWT is 1-2 KB; a longer one is refused
#: as malformed without asking the API server.
MAX_TOKEN_LENGTH = 16 * 1024


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    if any(c.isspace() for c in token) or not token.isascii() or not token.isprintable():
        return None
    return token


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: an HTTP status (200, 401, 403, 429 or 500), why, and whom
    the token speaks for (``/metrics``: its user; the progress endpoint: the pod it is bound
    to)."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class _Pool:
    """One LRU pool of verdicts, each until its own expiry."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple[Hashable, ...], tuple[float, Any]] = OrderedDict()

    def get(self, key: tuple[Hashable, ...], now: float) -> Any | None:
        hit = self.entries.get(key)
        if hit is None:
            return None
        if hit[0] > now:
            self.entries.move_to_end(key)
            return hit[1]
        del self.entries[key]
        return None

    def put(self, key: tuple[Hashable, ...], verdict: Any, expires: float) -> None:
        self.entries[key] = (expires, verdict)
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


class VerdictCache:
    """Verdicts by (SHA-256 of the token, *scope*), each until its own expiry, in two pools:
    grants (``max_entries``) and refusals (``max_denied``, default the same). The least
    recently used of a pool goes first once it is full, so a flood of bad tokens evicts only
    other refusals, never a grant. Thread-safe."""

    def __init__(
        self,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
        max_denied: int | None = None,
    ) -> None:
        max_denied = max_entries if max_denied is None else max_denied
        for label, value in (("max_entries", max_entries), ("max_denied", max_denied)):
            if value < 1:
                raise ValueError(f"{label} must be >= 1, got {value}")
        self.max_entries = max_entries
        self.max_denied = max_denied
        self.clock = clock
        self._allowed = _Pool(max_entries)
        self._denied = _Pool(max_denied)
        self._lock = threading.Lock()

    @staticmethod
    def key(token: str, *scope: Hashable) -> tuple[Hashable, ...]:
        """The cache key of ``token`` for ``scope`` (what was asked: a verb and path, a run)."""
        return (hashlib.sha256(token.encode()).hexdigest(), *scope)

    def get(self, key: tuple[Hashable, ...], now: float) -> Any | None:
        """The verdict kept for ``key`` if it has not expired at ``now``, else None."""
        with self._lock:
            hit = self._allowed.get(key, now)
            return hit if hit is not None else self._denied.get(key, now)

    def put(
        self, key: tuple[Hashable, ...], verdict: Any, expires: float, *, allowed: bool
    ) -> None:
        """Keep ``verdict`` for ``key`` until ``expires`` (on the cache's clock), in the grants'
        pool when ``allowed``, else in the refusals'."""
        with self._lock:
            (self._denied if allowed else self._allowed).entries.pop(key, None)
            (self._allowed if allowed else self._denied).put(key, verdict, expires)

    def sizes(self) -> tuple[int, int]:
        """(grants, refusals) held now, expired ones included until looked up or evicted."""
        with self._lock:
            return len(self._allowed.entries), len(self._denied.entries)

    def __iter__(self) -> Iterator[tuple[Hashable, ...]]:
        """The keys held now (a copy: safe while others write)."""
        with self._lock:
            return iter([*self._allowed.entries, *self._denied.entries])

    def __len__(self) -> int:
        """Tokens held now (expired ones included until looked up or evicted)."""
        return sum(self.sizes())


class SourceLimiter:
    """A token bucket per source address: at most ``burst`` at once, refilled at ``rate`` a
    second; what a cache miss costs (a TokenReview) is taken from the bucket of the address
    that asked. At most ``max_sources`` buckets are kept (the least recently used goes first:
    a forgotten source starts again with a full bucket). Thread-safe."""

    def __init__(
        self,
        rate: float = 1.0,
        burst: int = 10,
        max_sources: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not rate > 0 or burst < 1 or max_sources < 1:
            raise ValueError(
                f"rate must be > 0, burst and max_sources >= 1, got {rate}, {burst}, {max_sources}"
            )
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, source: str) -> bool:
        """Spend one token of ``source``'s bucket; False (and nothing spent) when empty."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(source, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            allowed = tokens >= 1
            self._buckets[source] = (tokens - 1 if allowed else tokens, now)
            self._buckets.move_to_end(source)
            while len(self._buckets) > self.max_sources:
                self._buckets.popitem(last=False)
            return allowed

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


class AuthError(Exception):
    """The API server could not be asked (network, timeout, the controller lacks RBAC)."""


def _call(method: Callable[..., Any], body: dict[str, Any], timeout: float) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return method(body=body, _request_timeout=timeout)
    except ApiException as err:
        raise AuthError(f"HTTP {err.status} {err.reason}") from None
    except (OSError, ValueError) as err:  # urllib3's errors are OSErrors or ValueErrors
        raise AuthError(str(err) or type(err).__name__) from None
    except Exception as err:  # urllib3 MaxRetryError and friends
        raise AuthError(f"{type(err).__name__}: {err}") from None


# -- /metrics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    """``TokenReview.status.user``: what a ``SubjectAccessReview`` is asked about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class Reviewer(Protocol):
    """Who answers the two questions; the API server in a pod, a fake in unit tests."""

    def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server says it is not valid."""

    def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``, and the reason given."""


@dataclass
class TokenAuthorizer:
    """Token -> verdict for ``verb path`` on ``/metrics``: ``reviewer`` is asked only for a
    token whose verdict is not kept, and only while the asking address has reviews left; the
    grants are kept ``allow_ttl`` seconds and the refusals ``deny_ttl``, in pools of
    ``max_entries`` each (Prometheus scraping every 15 s costs two API calls a minute, not two
    a scrape)."""

    reviewer: Reviewer
    _: KW_ONLY
    allow_ttl: float = 60.0
    deny_ttl: float = 10.0
    max_entries: int = 1024
    clock: Callable[[], float] = time.monotonic
    #: Reviews one source address may cause (cache misses): a burst, then a rate a second.
    reviews_per_second: float = 1.0
    review_burst: int = 10
    _cache: VerdictCache = field(init=False, repr=False)
    limiter: SourceLimiter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.allow_ttl < 0 or self.deny_ttl < 0:
            raise ValueError("allow_ttl and deny_ttl must be >= 0")
        self._cache = VerdictCache(self.max_entries, self.clock)
        self.limiter = SourceLimiter(self.reviews_per_second, self.review_burst, clock=self.clock)

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
        if not self.limiter.take(source):  # nothing kept: the next try asks again
            return Verdict(429, f"too many token reviews from {source or 'this client'}")
        verdict = self._review(token, verb, path)
        if verdict.status in (200, 401, 403):  # an API failure (500) is asked again next time
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
            logger.error("metrics: TokenReview failed: %s", err)
            return Verdict(500, "authentication failed")
        if user is None:
            return Verdict(401, "token not accepted by the API server")
        try:
            allowed, reason = self.reviewer.authorize(user, verb, path)
        except AuthError as err:
            logger.error("metrics: SubjectAccessReview for %s failed: %s", user.username, err)
            return Verdict(500, f"authorization for user {user.username} failed", user.username)
        if not allowed:
            logger.debug("metrics: %s may not %s %s: %s", user.username, verb, path, reason)
            return Verdict(403, f"user {user.username} may not {verb} {path}", user.username)
        return Verdict(200, "allowed", user.username)


class KubernetesReviewer:
    """TokenReview and SubjectAccessReview through the Kubernetes Python client: needs
    ``create`` on ``authentication.k8s.io/tokenreviews`` and
    ``authorization.k8s.io/subjectaccessreviews`` (the operator chart's ``-metrics-auth``
    ClusterRole)."""

    def __init__(self, api_client: Any, timeout: float = 10.0) -> None:
        from kubernetes import client as k8s

        self._api = api_client
        self._authn = k8s.AuthenticationV1Api(api_client)
        self._authz = k8s.AuthorizationV1Api(api_client)
        self._timeout = timeout

    def authenticate(self, token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}  # fmt: skip
        result = _call(self._authn.create_token_review, body, self._timeout)
        status = self._api.sanitize_for_serialization(result.status) or {}
        user = status.get("user")
        if not status.get("authenticated") or not isinstance(user, Mapping):
            return None
        extra = tuple(sorted((k, tuple(v or ())) for k, v in (user.get("extra") or {}).items()))
        groups = tuple(user.get("groups") or ())
        return User(user.get("username") or "", user.get("uid") or "", groups, extra)

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
        status = _call(self._authz.create_subject_access_review, body, self._timeout).status
        return bool(status and status.allowed), (status.reason or "") if status else ""
