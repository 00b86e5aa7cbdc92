"""The progress endpoint's own watches, which every replica keeps (kopf pauses a replica's):
docs/controller.md, "Progress reporting in detail".
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

__all__ = ["ListWatch", "labelled", "named", "watch_each"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ListWatch:
    """A list, then a watch from its resourceVersion, again after any error, in a daemon thread.

    ``list_fn(**kwargs)``: a ``kubernetes`` client list method; ``on_list(objects)`` gets every
    (re)list, ``on_event(type, object)`` every event, as plain dicts, only what ``keep`` accepts
    (checked here too: ``selectors`` are the API server's ``field_selector``/``label_selector``).
    """

    list_fn: Callable[..., Any]
    on_list: Callable[[list[dict[str, Any]]], None]
    on_event: Callable[[str, dict[str, Any]], None]
    _: KW_ONLY
    keep: Callable[[Any], bool] = lambda obj: isinstance(obj, Mapping)
    selectors: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    watch_seconds: int = 300
    retry_seconds: float = 2.0
    what: str = ""
    stop_event: threading.Event = field(init=False, default_factory=threading.Event)
    _response: Any = field(init=False, default=None)

    def start(self) -> ListWatch:
        threading.Thread(target=self._run, name=f"megdet-watch-{self.what}", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            began = time.monotonic()
            try:
                listed = self.list_fn(
                    **self.selectors, _request_timeout=self.timeout, _preload_content=False
                )
                body = json.loads(listed.data)
                self.on_list([i for i in body.get("items") or [] if self.keep(i)])
                self._stream((body.get("metadata") or {}).get("resourceVersion"))
            except Exception as err:  # a watch ends; it is started again
                if self.stop_event.is_set():
                    return
                logger.warning("watch of %s: %s: %s", self.what, type(err).__name__, err)
            # A watch the server ended at once (or an error): not a tight loop of lists.
            if time.monotonic() - began < self.retry_seconds:
                self.stop_event.wait(self.retry_seconds)

    def _stream(self, version: str | None) -> None:
        """One watch from ``version``: every event to ``on_event`` until the server ends it
        (``timeout_seconds``), an ERROR event (410 Gone: list again) or :meth:`stop`."""
        response = self.list_fn(
            **self.selectors,
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
                    if self.keep(obj):
                        self.on_event(kind, obj)
        finally:
            response.release_conn()


class WatchEnded(Exception):
    """The server ended a watch with an ERROR event (e.g. 410 Gone): list again."""


def named(name: str) -> Callable[[Any], bool]:
    """``keep`` for the objects called ``name``."""
    return lambda obj: isinstance(obj, Mapping) and (obj.get("metadata") or {}).get("name") == name


def labelled(key: str, value: str) -> Callable[[Any], bool]:
    """``keep`` for the objects labelled ``key=value``."""

    def keep(obj: Any) -> bool:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        return isinstance(meta, Mapping) and (meta.get("labels") or {}).get(key) == value

    return keep


def watch_each(
    namespaces: list[str],
    all_namespaces: Callable[..., Any],
    namespaced: Callable[..., Any],
    on_list: Callable[[list[dict[str, Any]], str | None], None],
    on_event: Callable[[str, dict[str, Any]], None],
    **options: Any,
) -> list[ListWatch]:
    """A started :class:`ListWatch` in each of ``namespaces`` (none: all); ``on_list(items,
    namespace)``."""
    watches = []
    for ns in namespaces or [None]:
        list_fn = all_namespaces if ns is None else functools.partial(namespaced, ns)
        watches.append(
            ListWatch(list_fn, functools.partial(on_list, namespace=ns), on_event, **options)
        )
    return [w.start() for w in watches]
