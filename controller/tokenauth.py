"""Bearer tokens on ``/metrics`` (a cached TokenReview and SubjectAccessReview), and the bounded
caches and rate limits the controller's HTTPS servers share: docs/monitoring.md, "Metrics
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
    "BoundedLRU",
    "KubernetesReviewer",
    "Reviewer",
    "SourceLimiter",
    "TokenAuthorizer",
    "TokenBucket",
    "User",
    "Verdict",
    "VerdictCache",
    "bearer_token",
]

logger = logging.getLogger(__name__)

#: Longest bearer token looked at (a ServiceAccount JWT is 1-2 KB); longer is malformed.
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
    """An HTTP status (200, 401, 403, 429 or 500), why, and whom the token speaks for."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


class BoundedLRU(OrderedDict):
    """An OrderedDict of at most ``most`` keys: :meth:`put` drops the least recently used."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most

    def put(self, key: Hashable, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.most:
            self.popitem(last=False)

    def fresh(self, key: Hashable, now: float) -> Any | None:
        """The value put as ``(expires, value)`` for ``key`` while ``expires`` is after ``now``."""
        hit = self.get(key)
        if hit is not None and hit[0] > now:
            self.move_to_end(key)
            return hit[1]
        self.pop(key, None)
        return None


@dataclass
class TokenBucket:
    """``capacity`` tokens, refilled at ``per_hour`` an hour; :meth:`take` spends one."""

    capacity: float
    per_hour: float
    tokens: float
    at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_hour / 3600)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class VerdictCache:
    """Verdicts by (SHA-256 of the token, *scope*) until their expiry, in two LRU pools: grants
    (``max_entries``) and refusals (``max_denied``). Thread-safe."""

    def __init__(self, max_entries: int, max_denied: int | None = None) -> None:
        max_denied = max_entries if max_denied is None else max_denied
        for label, value in (("max_entries", max_entries), ("max_denied", max_denied)):
            if value < 1:
                raise ValueError(f"{label} must be >= 1, got {value}")
        self._pools = {True: BoundedLRU(max_entries), False: BoundedLRU(max_denied)}
        self._lock = threading.Lock()

    @staticmethod
    def key(token: str, *scope: Hashable) -> tuple[Hashable, ...]:
        """The cache key of ``token`` for ``scope`` (what was asked: a verb and path, a run)."""
        return (hashlib.sha256(token.encode()).hexdigest(), *scope)

    def get(self, key: tuple[Hashable, ...], now: float) -> Any | None:
        """The verdict kept for ``key`` if it has not expired at ``now``, else None."""
        with self._lock:
            hit = self._pools[True].fresh(key, now)
            return hit if hit is not None else self._pools[False].fresh(key, now)

    def put(
        self, key: tuple[Hashable, ...], verdict: Any, expires: float, *, allowed: bool
    ) -> None:
        """Keep ``verdict`` for ``key`` until ``expires``, in the pool of ``allowed``."""
        with self._lock:
            self._pools[not allowed].pop(key, None)
            self._pools[allowed].put(key, (expires, verdict))

    def sizes(self) -> tuple[int, int]:
        """(grants, refusals) held now, expired ones included until looked up or evicted."""
        with self._lock:
            return len(self._pools[True]), len(self._pools[False])

    def __iter__(self) -> Iterator[tuple[Hashable, ...]]:
        """The keys held now (a copy: safe while others write)."""
        with self._lock:
            return iter([*self._pools[True], *self._pools[False]])

    def __len__(self) -> int:
        return sum(self.sizes())


class SourceLimiter:
    """A :class:`TokenBucket` per source address (``burst``, ``rate`` a second), at most
    ``max_sources`` kept. Thread-safe."""

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
        self.clock = clock
        self._buckets = BoundedLRU(max_sources)
        self._lock = threading.Lock()

    def take(self, source: str) -> bool:
        """Spend one token of ``source``'s bucket; False (and nothing spent) when empty."""
        with self._lock:
            bucket = self._buckets.get(source) or TokenBucket(
                self.burst, self.rate * 3600, self.burst
            )
            self._buckets.put(source, bucket)
            return bucket.take(self.clock())

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
    """Token -> cached :class:`Verdict` for ``verb path`` on ``/metrics``, ``reviewer`` asked
    on a miss while the source has reviews left (grants kept ``allow_ttl`` s, refusals
    ``deny_ttl`` s, ``max_entries`` each)."""

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
        self._cache = VerdictCache(self.max_entries)
        self.limiter = SourceLimiter(self.reviews_per_second, self.review_burst, clock=self.clock)

    def check(
        self,
        authorization: str | None,
        verb: str = "get",
        path: str = "/metrics",
        source: str = "",
    ) -> Verdict:
        """The verdict for this ``Authorization`` header value from the address ``source``."""
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
    """The :class:`Reviewer` of a pod: TokenReview and SubjectAccessReview, by the client."""

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
