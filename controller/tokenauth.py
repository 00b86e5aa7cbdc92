"""Bearer tokens and the cache of what the API server said about them.

Both of the controller's HTTPS servers check a request's bearer token with a ``TokenReview``
(``/metrics``: :mod:`megdet.controller.metrics_auth`; the progress endpoint:
:mod:`megdet.controller.progress_auth`). :class:`VerdictCache` keeps their verdicts for a short
time, by the token's SHA-256 (never the token itself), for a bounded number of tokens, so a
client that repeats its request every few seconds costs an API call a minute, not one a
request.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

__all__ = ["VerdictCache", "bearer_token"]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


class VerdictCache:
    """Verdicts by (SHA-256 of the token, *scope*), each until its own expiry; the least
    recently used goes first once ``max_entries`` are held. Thread-safe."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(token: str, *scope: Hashable) -> tuple[Hashable, ...]:
        """The cache key of ``token`` for ``scope`` (what was asked: a verb and path, a run)."""
        return (hashlib.sha256(token.encode()).hexdigest(), *scope)

    def get(self, key: tuple[Hashable, ...], now: float) -> Any | None:
        """The verdict kept for ``key`` if it has not expired at ``now``, else None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            if hit[0] > now:
                self._entries.move_to_end(key)
                return hit[1]
            del self._entries[key]
            return None

    def put(self, key: tuple[Hashable, ...], verdict: Any, expires: float) -> None:
        """Keep ``verdict`` for ``key`` until ``expires`` (on the cache's clock)."""
        with self._lock:
            self._entries[key] = (expires, verdict)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __iter__(self) -> Iterator[tuple[Hashable, ...]]:
        """The keys held now (a copy: safe while others write)."""
        with self._lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        """Tokens held now (expired ones included until looked up or evicted)."""
        with self._lock:
            return len(self._entries)
