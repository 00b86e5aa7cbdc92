"""Who may report a run's progress: the run's own pods, by a token bound to the run.

The run must be one the controller serves (``target: pytorchjob``, known from its watch:
:class:`~megdet.controller.progress_binding.RunDirectory`; no read, no review otherwise). The
bearer token is a projected ServiceAccount token whose audience is the run's, its uid in it
(:func:`megdet.progress.run_audience`). A ``TokenReview`` with ``spec.audiences=[that
audience]`` must say authenticated, list the audience, name a ServiceAccount of the run's
namespace and carry the pod the token is bound to (``authentication.kubernetes.io/pod-name``
and ``pod-uid``), and that pod must be one of the run's job
(:class:`~megdet.controller.progress_binding.PodBinding`: named as the training operator names
them and controlled by the job this controller created). Anything else is 403 (401: no token
at all). Verdicts are cached per token (its SHA-256) and run uid for a short time, in a
bounded cache (:class:`~megdet.controller.tokenauth.VerdictCache`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet import progress as protocol
from megdet.controller.progress_binding import PodBinding, RunRef
from megdet.controller.tokenauth import SourceLimiter, VerdictCache, bearer_token

__all__ = [
    "POD_NAME_EXTRA",
    "POD_UID_EXTRA",
    "RunAuthenticator",
    "Verdict",
    "kubernetes_review",
]

logger = logging.getLogger(__name__)

#: TokenReview ``status.user.extra`` key naming the pod a bound token belongs to.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
#: ... and its uid (the API server checked that the pod with this name has this uid).
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True)
class Verdict:
    """200 (the run's own pod), 401 (no token), 403 (any other token), 429 (too many reviews
    from the client's address), 500 (could not ask)."""

    status: int
    reason: str
    pod: str = ""


#: (token, audiences) -> the TokenReview's ``status`` as a plain dict; raises on API errors.
TokenReviewFn = Callable[[str, list[str]], Mapping[str, Any]]
#: (namespace, name) -> the served run, or None (not a ``target: pytorchjob`` run known here).
RunLookupFn = Callable[[str, str], RunRef | None]


@dataclass
class RunAuthenticator:
    """Token -> :class:`Verdict` for one run, with a time- and size-bounded cache."""

    review: TokenReviewFn
    runs: RunLookupFn
    binding: PodBinding
    allow_ttl: float = 300.0
    deny_ttl: float = 10.0
    max_entries: int = 4096
    clock: Callable[[], float] = time.monotonic
    #: TokenReviews one source address may cause (cache misses): a burst, then a rate.
    reviews_per_second: float = 1.0
    review_burst: int = 10
    _cache: VerdictCache = field(init=False, repr=False)
    limiter: SourceLimiter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Grants and refusals in separate pools: bad tokens never evict a pod's grant.
        self._cache = VerdictCache(self.max_entries, self.clock)
        self.limiter = SourceLimiter(self.reviews_per_second, self.review_burst, clock=self.clock)

    def check(
        self, authorization: str | None, namespace: str, name: str, source: str = ""
    ) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        run = self.runs(namespace, name)
        if run is None:  # nothing asked, nothing cached
            return Verdict(403, f"no MegDetRun {namespace}/{name} with target pytorchjob")
        key = VerdictCache.key(token, namespace, name, run.uid)
        now = self.clock()
        hit = self._cache.get(key, now)
        if hit is not None:
            return hit
        if not self.limiter.take(source):  # nothing cached: the next try asks again
            return Verdict(429, f"too many token reviews from {source or 'this client'}")
        verdict = self._decide(token, namespace, run)
        if verdict.status in (200, 403):  # 500 (the API could not be asked) is asked again
            ttl = self.allow_ttl if verdict.status == 200 else self.deny_ttl
            self._cache.put(key, verdict, now + ttl, allowed=verdict.status == 200)
        return verdict

    def cached(self) -> int:
        return len(self._cache)

    def _decide(self, token: str, namespace: str, run: RunRef) -> Verdict:
        audience = protocol.run_audience(namespace, run.name, run.uid)
        try:
            status = self.review(token, [audience]) or {}
        except Exception as err:
            logger.error("progress: TokenReview failed: %s: %s", type(err).__name__, err)
            return Verdict(500, "the token could not be reviewed")
        if not status.get("authenticated"):
            return Verdict(403, f"token not valid for audience {audience}")
        if audience not in (status.get("audiences") or []):
            return Verdict(403, f"token audiences do not include {audience}")
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        if not username.startswith(f"system:serviceaccount:{namespace}:"):
            return Verdict(403, f"{username or 'the user'} is not a ServiceAccount of {namespace}")
        extra = user.get("extra") or {}
        pods, uids = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
        if not pods:
            return Verdict(403, "the token is not bound to a pod")
        pod = str(pods[0])
        try:
            refusal = self.binding.refusal(namespace, run, pod, str(uids[0]) if uids else "")
        except Exception as err:
            logger.error("progress: reading pod %s/%s: %s: %s", namespace, pod,
                         type(err).__name__, err)  # fmt: skip
            return Verdict(500, "the token's pod could not be read")
        if refusal is not None:
            return Verdict(403, refusal)
        return Verdict(200, "the run's pod", pod)


def kubernetes_review(api_client: Any, timeout: float) -> TokenReviewFn:
    from kubernetes import client as k8s

    authn = k8s.AuthenticationV1Api(api_client)

    def review(token: str, audiences: list[str]) -> Mapping[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        result = authn.create_token_review(body=body, _request_timeout=timeout)
        return api_client.sanitize_for_serialization(result.status) or {}

    return review
