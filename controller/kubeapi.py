"""The controller's API calls (:class:`Cluster`), how their failures are retried
(:func:`api_call`) and what a refused create is (:func:`classify_refusal`). docs/architecture.md,
"The controller" (I/O seam); the refusals: docs/controller.md, "The controller in detail".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
import urllib3.exceptions
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.api import (
    GROUP,
    KIND,
    KIND_BY_TARGET,
    OWNED_KINDS,
    PLURAL,
    RUN_API_VERSION,
    TARGET_BY_KIND,
    VERSION,
)
from megdet.controller.job_cache import JobCache

__all__ = [
    "KIND_PROVIDERS",
    "NOT_REFUSALS",
    "Backoff",
    "Cluster",
    "JobRefused",
    "KindNotServed",
    "Refusal",
    "RefusalHeals",
    "api_call",
    "classify_refusal",
    "heal_reason",
    "refusal_message",
    "retry_later",
    "retryable",
]

#: HTTP statuses of a refused create that are not the job's fault, so are retried (401: the
#: controller's credentials; 404: the kind is not served; 408: a timeout; 409: the name is
#: taken; 429: throttling). Any other 4xx is the server refusing this job.
NOT_REFUSALS = frozenset({401, 404, 408, 409, 429})

#: A refusal that heals (HTTP 403 only), by what its Status message says -> the hint the run's
#: condition gives. Whose messages these are: docs/controller.md, "The controller in detail".
HEALING_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"exceeded quota|status unknown for quota", re.IGNORECASE),
        "the namespace's ResourceQuota has no room for it now; created once other objects "
        "free it or the quota is raised",
    ),
    (
        re.compile(r"\bnot found\b|must be created before", re.IGNORECASE),
        "an admission check looks up an object it does not see yet (an object the controller "
        "has just created, which a webhook's cache sees a moment later, or a namespace default "
        "an admin has yet to create); created once it is visible",
    ),
    (
        re.compile(r"cannot create resource", re.IGNORECASE),
        "the controller's ServiceAccount may not create it (the operator chart's ClusterRole); "
        "created once an admin grants it",
    ),
)

#: Who serves each kind the controller creates (for the message when a cluster lacks it).
KIND_PROVIDERS = {
    "PyTorchJob": "the Kubeflow training operator (kubeflow.org/v1)",
    "TrainJob": "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1)",
    "TrainingRuntime": "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1)",
}


class Refusal(Exception):
    """The API server refused to create (or update) an object; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KindNotServed(Refusal):
    """The API server answered 404 to creating an object: its kind is not installed."""

    def __init__(self, obj: Mapping[str, Any]) -> None:
        kind = obj["kind"]
        target = TARGET_BY_KIND.get(kind, "trainjob")
        (other,) = (t for t in KIND_BY_TARGET if t != target)
        super().__init__(
            f"{obj['apiVersion']} {kind} is not served by this cluster (creating it answered "
            f"404): install {KIND_PROVIDERS.get(kind, 'its operator')} or set "
            f"spec.target: {other} (spec.target is {target}); the controller watches the job "
            "kinds present when it starts, so restart it after installing"
        )


#: Longest server message kept in a condition (the API server's own limit is 32 KiB).
MAX_SERVER_MESSAGE = 2000


class JobRefused(Refusal):
    """A refusal that retrying does not fix: final until the run's spec changes."""


class RefusalHeals(Refusal):
    """A refusal that heals without a spec edit (:func:`heal_reason`): retried with backoff, the
    run Pending with ``Retrying`` meanwhile."""


def classify_refusal(
    obj: Mapping[str, Any], err: k8s.ApiException, generation: Any, verb: str = "create"
) -> JobRefused | RefusalHeals | None:
    """A 4xx answer to writing ``obj`` outside :data:`NOT_REFUSALS` as the refusal it is: one
    that heals (:func:`heal_reason`) or a final one; None for anything else (retried as an
    API error, or sorted by the caller: 404, 409)."""
    status = err.status or 0
    if not 400 <= status < 500 or status in NOT_REFUSALS:
        return None
    hint = heal_reason(err)
    message = refusal_message(obj, err, generation, verb, hint)
    return JobRefused(message) if hint is None else RefusalHeals(message)


def heal_reason(err: k8s.ApiException) -> str | None:
    """The hint of a refusal that heals without a spec edit (:data:`HEALING_REFUSALS`); None
    for one that only a spec edit fixes (schema, a webhook's or policy's verdict on the spec)."""
    if err.status != 403:
        return None
    _reason, server = _server_words(err)
    for pattern, hint in HEALING_REFUSALS:
        if pattern.search(server):
            return hint
    return None


def _server_words(err: k8s.ApiException) -> tuple[str, str]:
    """(the Status reason, its message and ``details.causes``), bounded."""
    body: Any = None
    try:
        body = json.loads(err.body) if isinstance(err.body, str | bytes) else err.body
    except ValueError:
        body = None
    if not isinstance(body, Mapping):
        body = {"message": str(err.body or "")}
    reason = body.get("reason") or err.reason or "Refused"
    text = str(body.get("message") or err.reason or "no message")
    details = body.get("details") if isinstance(body.get("details"), Mapping) else {}
    causes = details.get("causes") if isinstance(details.get("causes"), list) else []
    said = [
        f"{c.get('field')}: {c.get('message') or c.get('reason') or ''}".strip()
        if c.get("field")
        else str(c.get("message") or c.get("reason") or "")
        for c in causes
        if isinstance(c, Mapping)
    ]
    said = [s for s in said if s and s not in text]
    server = text + (f" (causes: {'; '.join(said)})" if said else "")
    if len(server) > MAX_SERVER_MESSAGE:
        server = server[: MAX_SERVER_MESSAGE - 3] + "..."
    return str(reason), server


def refusal_message(
    obj: Mapping[str, Any],
    err: k8s.ApiException,
    generation: Any,
    verb: str = "create",
    hint: str | None = None,
) -> str:
    """The server's own words (its Status ``message`` and ``details.causes``) and the fix, or
    for a refusal that heals (``hint``) what it waits for."""
    reason, server = _server_words(err)
    meta = obj.get("metadata") or {}
    refused = f"the API server refused to {verb} {obj.get('kind')} {meta.get('name')}"
    if hint is not None:
        return (
            f"{refused} for now (HTTP {err.status} {reason}): {server}. Not final: {hint}. "
            "Retried with backoff"
        )
    return (
        f"{refused} (HTTP {err.status} {reason}): {server}. Not retried until the MegDetRun's spec "
        f"changes (metadata.generation {generation}): fix what the server names (the run's "
        "spec, or the namespace's ResourceQuota or admission policy) and edit the spec, or "
        "delete and re-create the run"
    )


class Cluster:
    """The API calls the controller makes, through the official ``kubernetes`` client.

    Every method raises ``kubernetes.client.ApiException`` or a urllib3 error on failure,
    except that reads return None for 404. ``cache``: the :class:`JobCache` that answers job
    reads once registered (True: a fresh one; False: none, every read asks the API server).
    """

    def __init__(
        self, api_client: k8s.ApiClient, timeout: float = 10.0, cache: JobCache | bool = True
    ) -> None:
        self.api = k8s.CustomObjectsApi(api_client)
        self.timeout = timeout
        self.cache: JobCache | None = (
            cache if isinstance(cache, JobCache) else JobCache() if cache else None
        )

    def _call(self, verb: str, api_version: str, kind: str, ns: str, *args: Any, **kw: Any) -> Any:
        """The client's ``<verb>_namespaced_custom_object`` for ``kind`` in namespace ``ns``."""
        group, version = api_version.split("/", 1)
        plural = OWNED_KINDS[(api_version, kind)] if kind != KIND else PLURAL
        call = getattr(self.api, f"{verb}_namespaced_custom_object")
        return call(group, version, ns, plural, *args, _request_timeout=self.timeout, **kw)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        """The object, or None when it does not exist."""
        if self.cache is not None and kind in TARGET_BY_KIND:
            answered, cached = self.cache.lookup(kind, namespace, name)
            if answered:
                return cached
        try:
            found = self._call("get", api_version, kind, namespace, name)
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        if self.cache is not None and kind in TARGET_BY_KIND:
            # A job the watch has not delivered (this version of) yet, such as the job of an
            # earlier try whose create answered 409: answered from this read until it does.
            self.cache.created(found)
        return found

    def create(self, obj: Mapping[str, Any]) -> dict:
        namespace = obj["metadata"]["namespace"]
        try:
            created = self._call("create", obj["apiVersion"], obj["kind"], namespace, dict(obj))
        except k8s.ApiException as err:
            if err.status == 409 and self.cache is not None:
                self.cache.refresh(obj["kind"], namespace, obj["metadata"]["name"])
            raise
        if self.cache is not None:
            self.cache.created(created)
        return created

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: Mapping) -> dict:
        patched = self._call("patch", api_version, kind, namespace, name, dict(body))
        if self.cache is not None and kind in TARGET_BY_KIND:
            self.cache.created(patched)  # a job's suspend: read back as written
        return patched

    def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> None:
        """Delete (background propagation, or ``propagation``); with ``uid``, only that
        incarnation of the name (the API server answers 409 if the name now holds another
        object)."""
        preconditions = k8s.V1Preconditions(uid=uid) if uid else None
        options = k8s.V1DeleteOptions(propagation_policy=propagation, preconditions=preconditions)
        try:
            self._call("delete", api_version, kind, namespace, name, body=options)
        except k8s.ApiException as err:
            if err.status != 404:
                raise

    def get_run(self, namespace: str, name: str) -> dict | None:
        return self.get(RUN_API_VERSION, KIND, namespace, name)

    def patch_run_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict:
        """Merge-patch the run's status subresource; with ``resource_version``, only over that
        version (409 otherwise: docs/controller.md, "The controller in detail")."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, _request_timeout=self.timeout
        )


def retryable(err: BaseException) -> bool:
    """API errors worth retrying: conflicts, throttling, server errors, timeouts, resets."""
    if isinstance(err, k8s.ApiException):
        return err.status in (0, 408, 409, 429) or (err.status or 0) >= 500
    return isinstance(err, urllib3.exceptions.HTTPError | TimeoutError | ConnectionError)


@dataclass(frozen=True)
class Backoff:
    """Retry delays for kopf.TemporaryError: ``base * 2**retry`` seconds, at most ``cap``."""

    base: float = 1.0
    cap: float = 60.0
    conflict_delay: float = 30.0

    def delay(self, retry: int) -> float:
        return min(self.cap, self.base * 2 ** min(retry, 30))


def api_call(what: str, call: Callable[[], Any], backoff: Backoff, retry: int) -> Any:
    """``call()``; a retryable failure becomes kopf.TemporaryError (:func:`retry_later`)."""
    try:
        return call()
    except Exception as err:
        retry_later(what, err, backoff, retry)
        raise


def retry_later(what: str, err: BaseException, backoff: Backoff, retry: int) -> None:
    """Raise kopf.TemporaryError for a retryable ``err`` (counted as a reconcile error), after
    the delay ``backoff`` gives try ``retry``; return for any other, for the caller to
    re-raise or sort."""
    if retryable(err):
        metrics.RECONCILES.labels("error").inc()
        raise kopf.TemporaryError(f"{what}: {err}", delay=backoff.delay(retry)) from err
