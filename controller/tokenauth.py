"""Bearer tokens and the cache of what the API server said about them.

Both of the controller's HTTPS servers check a request's bearer token with a ``TokenReview``
(``/metrics``: :mod:`megdet.controller.metrics_auth`; the progress endpoint:
:mod:`megdet.controller.progress_auth`). :class:`VerdictCache` keeps their verdicts for a short
time, by the token's SHA-256 (never the token itself), for a bounded number of tokens, so a
client that repeats its request every few seconds costs an API call a minute, not one a
request.
A flood of refusals cannot evict the grants (two pools), and :class:`SourceLimiter` bounds how
many TokenReviews one source address may cause.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

__all__ = ["MAX_TOKEN_LENGTH", "SourceLimiter", "VerdictCache", "bearer_token"]

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
