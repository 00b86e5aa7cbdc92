"""Which replica serves progress: the one kopf lets act (the active replica), and only it.

With ``replicaCount: 2`` (the operator chart's default) both replicas run, and kopf pauses the
one that sees a live peer of higher (or equal) priority in the peering object (kopf 1.45
``_core/engines/peering.py``, ``process_peering_event``: a peer is alive until ``lastseen +
lifetime``; ``touch`` with lifetime 0 on exit removes it). kopf keeps that decision to itself,
so :class:`PeeringLeadership` watches the same peering object(s) and applies the same rule:
this replica is active when no other live peer has a priority >= its own, in every peering
object it joins (one ClusterKopfPeering, or a KopfPeering per served namespace); before the
first look, it is not. Only the active replica accepts reports, writes ``status.progress`` and
keeps the CA ConfigMaps (controller/progress.py); :class:`PodLabel` puts
:data:`ACTIVE_LABEL` on its pod, which the operator chart's progress Service selects, so the
run's pods reach only it.

:class:`NamedWatch` is the one watch loop used here and for the CA ConfigMaps: a list, then a
watch from its resourceVersion, of the objects of one name (``fieldSelector=metadata.name=``:
RBAC may then limit list and watch to that name), again after any error.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ACTIVE_LABEL",
    "Always",
    "NamedWatch",
    "PeeringLeadership",
    "PodLabel",
    "peer_is_active",
]

logger = logging.getLogger(__name__)

#: The label the active replica's pod carries (the progress Service selects it).
ACTIVE_LABEL = "megdet.io/progress-endpoint"
ACTIVE_VALUE = "active"


class Always:
    """``--standalone``: the only replica is always the active one."""

    def active(self) -> bool:
        return True


def _parse(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def peer_is_active(
    status: Mapping[str, Any], identity: str, priority: int, now: datetime.datetime
) -> bool:
    """kopf's rule on one peering object's ``status`` (peer id -> ``{priority, lifetime,
    lastseen}``): active unless another live peer has a priority >= ``priority`` (kopf pauses
    both of two equal peers)."""
    for peer, info in status.items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        try:
            their_priority = int(info.get("priority", 0))
            lifetime = float(info.get("lifetime", 60))
        except (TypeError, ValueError):
            continue
        seen = _parse(info.get("lastseen")) or now
        if seen + datetime.timedelta(seconds=lifetime) <= now:
            continue  # dead: kopf ignores it (and cleans it up)
        if their_priority >= priority:
            return False
    return True


class NamedWatch:
    """List and watch the objects called ``name`` of one resource, in a daemon thread.

    ``list_fn(**kwargs)`` is a ``kubernetes`` client list method (namespace and resource bound
    already); ``on_list(objects)`` gets every (re)list, ``on_event(type, object)`` every watch
    event, both as plain dicts.
    """

    def __init__(
        self,
        api_client: Any,
        list_fn: Callable[..., Any],
        name: str,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        timeout: float = 10.0,
        watch_seconds: int = 300,
        retry_seconds: float = 2.0,
        what: str = "",
    ) -> None:
        self.api_client = api_client
        self.list_fn = list_fn
        self.name = name
        self.on_list = on_list
        self.on_event = on_event
        self.timeout = timeout
        self.watch_seconds = watch_seconds
        self.retry_seconds = retry_seconds
        self.what = what or name
        self.stop_event = threading.Event()
        self._response: Any = None
        self.thread = threading.Thread(target=self._run, name=f"megdet-watch-{name}", daemon=True)

    def start(self) -> NamedWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()

    def _run(self) -> None:
        selector = f"metadata.name={self.name}"
        while not self.stop_event.is_set():
            began = time.monotonic()
            try:
                listed = self.list_fn(
                    field_selector=selector, _request_timeout=self.timeout, _preload_content=False
                )
                body = json.loads(listed.data)
                items = [i for i in body.get("items") or [] if _named(i, self.name)]
                self.on_list(items)
                version = (body.get("metadata") or {}).get("resourceVersion")
                self._stream(selector, version)
            except Exception as err:  # a watch ends; it is started again
                if self.stop_event.is_set():
                    return
                logger.warning("watch of %s: %s: %s", self.what, type(err).__name__, err)
            # A watch the server ended at once (or an error): not a tight loop of lists.
            if time.monotonic() - began < self.retry_seconds:
                self.stop_event.wait(self.retry_seconds)

    def _stream(self, selector: str, version: str | None) -> None:
        """One watch from ``version``: every event to ``on_event`` until the server ends it
        (``timeout_seconds``), an ERROR event (410 Gone: list again) or :meth:`stop`."""
        response = self.list_fn(
            field_selector=selector,
            resource_version=version,
            timeout_seconds=self.watch_seconds,
            watch="true",  # the API server also takes the client's "True"; kmock only this
            allow_watch_bookmarks=False,
            _request_timeout=self.watch_seconds + self.timeout,
            _preload_content=False,
        )
        self._response = response
        buffered = b""
        try:
            for chunk in response.stream(amt=None, decode_content=True):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if self.stop_event.is_set():
                        return
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type")), event.get("object")
                    if kind == "ERROR":
                        raise WatchEnded(f"{(obj or {}).get('code')}: {(obj or {}).get('message')}")
                    if _named(obj, self.name):
                        self.on_event(kind, obj)
        finally:
            response.release_conn()


class WatchEnded(Exception):
    """The server ended a watch with an ERROR event (e.g. 410 Gone): list again."""


def _named(obj: Any, name: str) -> bool:
    return isinstance(obj, Mapping) and (obj.get("metadata") or {}).get("name") == name


class PeeringLeadership:
    """Whether this replica is kopf's active one, from the peering objects it joins
    (``namespaces``: None for the ClusterKopfPeering, else each served namespace's
    KopfPeering). :meth:`observe` takes a peering object (or None: gone)."""

    def __init__(
        self,
        identity: str,
        priority: int,
        namespaces: list[str | None],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.identity = identity
        self.priority = priority
        self.namespaces = list(namespaces) or [None]
        self.clock = clock
        self._status: dict[str | None, Mapping[str, Any] | None] = {}
        self._lock = threading.Lock()
        self.watches: list[NamedWatch] = []

    def observe(self, namespace: str | None, obj: Mapping[str, Any] | None) -> None:
        status = (obj or {}).get("status") if obj is not None else None
        with self._lock:
            self._status[namespace] = (
                status if isinstance(status, Mapping) else ({} if obj is not None else None)
            )

    def active(self) -> bool:
        now = self.clock()
        with self._lock:
            seen = [self._status.get(ns) for ns in self.namespaces]
        return all(
            status is not None and peer_is_active(status, self.identity, self.priority, now)
            for status in seen
        )

    def watch(self, api_client: Any, peering: str, timeout: float) -> PeeringLeadership:
        """Start a :class:`NamedWatch` of each peering object."""
        from kubernetes import client as k8s

        custom = k8s.CustomObjectsApi(api_client)
        for namespace in self.namespaces:
            if namespace is None:

                def list_fn(**kw: Any) -> Any:
                    return custom.list_cluster_custom_object(
                        "kopf.dev", "v1", "clusterkopfpeerings", **kw
                    )
            else:

                def list_fn(ns: str = namespace, **kw: Any) -> Any:
                    return custom.list_namespaced_custom_object(
                        "kopf.dev", "v1", ns, "kopfpeerings", **kw
                    )

            def on_list(items: list[dict[str, Any]], ns: str | None = namespace) -> None:
                self.observe(ns, items[0] if items else None)

            def on_event(kind: str, obj: dict[str, Any], ns: str | None = namespace) -> None:
                self.observe(ns, None if kind == "DELETED" else obj)

            self.watches.append(
                NamedWatch(
                    api_client, list_fn, peering, on_list, on_event, timeout=timeout,
                    what=f"peering {peering}" + (f" in {namespace}" if namespace else ""),
                ).start()
            )  # fmt: skip
        return self

    def stop(self) -> None:
        for w in self.watches:
            w.stop()


class PodLabel:
    """Keep :data:`ACTIVE_LABEL` on this replica's pod exactly while ``active()``: one patch
    per change (the first look removes a label a previous process in this pod left). The
    progress service's leadership thread calls :meth:`step`."""

    def __init__(
        self,
        patch_labels: Callable[[dict[str, str | None]], Any],
        active: Callable[[], bool],
    ) -> None:
        self.patch_labels = patch_labels
        self.active = active
        self.labelled: bool | None = None

    def step(self) -> None:
        want = self.active()
        if want == self.labelled:
            return
        try:
            self.patch_labels({ACTIVE_LABEL: ACTIVE_VALUE if want else None})
        except Exception as err:  # tried again next period
            logger.warning("progress: labelling this replica's pod: %s: %s",
                           type(err).__name__, err)  # fmt: skip
            return
        self.labelled = want
        logger.info("progress: this replica is %s", "active" if want else "on standby")


def kubernetes_pod_labeller(
    api_client: Any, namespace: str, pod: str, timeout: float
) -> Callable[[dict[str, str | None]], Any]:
    """A merge patch of this pod's labels (``null`` removes one)."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def patch(labels: dict[str, str | None]) -> Any:
        return core.patch_namespaced_pod(
            pod, namespace, {"metadata": {"labels": labels}}, _request_timeout=timeout
        )

    return patch
