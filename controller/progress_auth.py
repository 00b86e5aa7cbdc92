"""Who may report a run's progress: the run's own pods, by their projected token, verified here
with the cluster's issuer keys as Kubeflow Trainer's status server does (``pkg/statusserver/
auth.go``, v2.3.0). In detail: docs/controller.md, "Progress reporting in detail".
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt

from megdet import progress as protocol
from megdet.controller.progress_binding import PodBinding, RunRef
from megdet.controller.tokenauth import Verdict, bearer_token

__all__ = [
    "ALGORITHMS",
    "DISCOVERY_PATH",
    "JWKS_PATH",
    "IssuerKeys",
    "KeysUnavailable",
    "RunAuthenticator",
    "kubernetes_fetch",
]

logger = logging.getLogger(__name__)

#: The API server's OIDC discovery document (its ``issuer``), and its own JWKS.
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"
#: Signature algorithms accepted (the API server signs with an RSA or ECDSA key; never HMAC).
ALGORITHMS = ["RS256", "ES256", "ES384", "ES512"]
#: Seconds between two reads of the keys for an unknown key id, and after a failed read.
REFRESH_SECONDS = 30.0
RETRY_SECONDS = 5.0
#: Keys kept of one JWKS (the API server publishes one per signing key, a few at most).
MAX_KEYS = 32
#: Clock skew allowed on ``exp`` and ``nbf``.
LEEWAY_SECONDS = 30

#: A GET of a path on the API server -> the JSON document; raises on any failure.
FetchFn = Callable[[str], Mapping[str, Any]]


class KeysUnavailable(Exception):
    """The issuer's discovery document or keys could not be read (answered 500)."""


@dataclass(eq=False)
class IssuerKeys:
    """The cluster's service-account issuer and its keys by key id, read with ``fetch`` at the
    first token and for an unknown key id at most once every ``refresh`` (``retry``) seconds.
    Thread-safe."""

    fetch: FetchFn
    clock: Callable[[], float] = time.monotonic
    refresh: float = REFRESH_SECONDS
    retry: float = RETRY_SECONDS
    issuer: str = field(init=False, default="")
    keys: dict[str, jwt.PyJWK] = field(init=False, default_factory=dict)
    reads: int = field(init=False, default=0)
    _tried: float | None = field(init=False, default=None)
    _failed: bool = field(init=False, default=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def key(self, kid: str) -> tuple[str, jwt.PyJWK | None]:
        """(issuer, the key with id ``kid`` or None); :class:`KeysUnavailable` if never read."""
        with self._lock:
            wait = self.retry if self._failed else self.refresh
            if kid not in self.keys and (self._tried is None or self.clock() - self._tried >= wait):
                self._read()
            if not self.issuer:
                raise KeysUnavailable("the service-account issuer's keys could not be read")
            return self.issuer, self.keys.get(kid)

    def _read(self) -> None:
        self._tried = self.clock()
        self.reads += 1
        try:
            issuer = self.fetch(DISCOVERY_PATH).get("issuer")
            if not isinstance(issuer, str) or not issuer:
                raise ValueError(f"{DISCOVERY_PATH} names no issuer")
            found = jwt.PyJWKSet.from_dict(dict(self.fetch(JWKS_PATH)))
        except Exception as err:
            self._failed = True
            logger.error("progress: reading the service-account issuer's keys: %s: %s",
                         type(err).__name__, err)  # fmt: skip
            return
        self._failed = False
        self.issuer = issuer
        self.keys = {k.key_id: k for k in found.keys[:MAX_KEYS] if k.key_id}


@dataclass
class RunAuthenticator:
    """Token -> :class:`~megdet.controller.tokenauth.Verdict` (200, 401, 403 or 500) for one
    run's progress; ``runs``: (namespace, name) -> the served run or None."""

    keys: IssuerKeys
    runs: Callable[[str, str], RunRef | None]
    binding: PodBinding

    def check(
        self, authorization: str | None, namespace: str, name: str, source: str = ""
    ) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        run = self.runs(namespace, name)
        if run is None:
            return Verdict(403, f"no MegDetRun {namespace}/{name} with target pytorchjob")
        audience = protocol.run_audience(namespace, run.name, run.uid)
        try:
            claims = self._claims(token, audience)
        except KeysUnavailable as err:
            return Verdict(500, str(err))
        except jwt.PyJWTError as err:
            return Verdict(403, f"token not valid for audience {audience}: {err}")
        bound = claims.get("kubernetes.io")
        bound = bound if isinstance(bound, Mapping) else {}
        if bound.get("namespace") != namespace or not str(claims.get("sub")).startswith(
            f"system:serviceaccount:{namespace}:"
        ):
            return Verdict(403, f"the token is not a ServiceAccount's of {namespace}")
        pod = bound.get("pod") if isinstance(bound.get("pod"), Mapping) else {}
        pod_name, pod_uid = pod.get("name"), pod.get("uid")
        if not isinstance(pod_name, str) or not pod_name:
            return Verdict(403, "the token is not bound to a pod")
        try:
            refusal = self.binding.refusal(namespace, run, pod_name, str(pod_uid or ""))
        except Exception as err:  # the job's read: nothing kept, the next report asks again
            logger.error("progress: reading the job of %s/%s: %s: %s", namespace, name,
                         type(err).__name__, err)  # fmt: skip
            return Verdict(500, "the run's job could not be read")
        if refusal is not None:
            return Verdict(403, refusal)
        return Verdict(200, "the run's pod", pod_name)

    def _claims(self, token: str, audience: str) -> dict[str, Any]:
        kid = jwt.get_unverified_header(token).get("kid")
        issuer, key = self.keys.key(kid if isinstance(kid, str) else "")
        if key is None:
            raise jwt.InvalidKeyError("signed by no key of the cluster's issuer")
        return jwt.decode(
            token,
            key,
            algorithms=ALGORITHMS,
            audience=audience,
            issuer=issuer,
            leeway=LEEWAY_SECONDS,
            options={"require": ["exp", "nbf", "iss", "aud", "sub"]},
        )


def kubernetes_fetch(api_client: Any, timeout: float) -> FetchFn:
    """``fetch(path)``: a GET of a non-resource URL of the API server as the controller."""

    def fetch(path: str) -> Mapping[str, Any]:
        response = api_client.call_api(
            path, "GET", auth_settings=["BearerToken"], _preload_content=False,
            _return_http_data_only=True, _request_timeout=timeout,
        )  # fmt: skip
        body = json.loads(response.data)
        if not isinstance(body, Mapping):
            raise ValueError(f"{path}: not a JSON object")
        return body

    return fetch
