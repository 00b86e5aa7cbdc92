"""The real node started and the images imported into it ahead of the first test that needs
them: a thread from the session's start, while the e2e modules before the real-pod ones (run
on the kwok nodes, the real node's taint keeping their pods off it) have the API server.

The import of the 3.3 GB training image into the node's containerd took about 100 s of the
cluster's worker in `make test` (docs/cluster.md), most of it disk: in the thread it overlaps
those modules instead of adding to them. ``real_node`` and ``train_image`` (conftest.py) wait
for their step here and raise its error, so a node that cannot start or an image that cannot
be loaded fails the same tests, with the same message, as when they did the work themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The session fixtures whose work the thread does ahead, in its order.
STEPS = ("real_node", "train_image")


def wanted(items: Iterable[Any], folder: Path) -> tuple[str, ...]:
    """The steps of :data:`STEPS` that a test of ``items`` under ``folder`` needs (a fixture
    in its closure); none for a session that runs no real-pod test."""
    needed = {
        name
        for item in items
        if folder in Path(item.path).parents
        for name in STEPS
        if name in item.fixturenames
    }
    if "train_image" in needed:
        needed.add("real_node")  # the images go into the node
    return tuple(s for s in STEPS if s in needed)


class Ahead:
    """Runs ``steps`` (name -> callable, in order) in one thread; :meth:`result` waits for one
    and returns its value or raises its error. A step after a failed one does not run: its
    result raises the failed step's error."""

    def __init__(self, steps: dict[str, Callable[[], Any]]) -> None:
        self._steps = dict(steps)
        self._done = {name: threading.Event() for name in self._steps}
        self._results: dict[str, Any] = {}
        self._errors: dict[str, BaseException] = {}
        self._thread = threading.Thread(target=self._run, name="e2e-node-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failed: BaseException | None = None
        for name, step in self._steps.items():
            try:
                if failed is not None:
                    raise failed
                self._results[name] = step()
            except BaseException as err:  # handed to the fixture that waits for it
                failed = err
                self._errors[name] = err
            finally:
                self._done[name].set()

    def __contains__(self, name: str) -> bool:
        return name in self._steps

    def result(self, name: str) -> Any:
        self._done[name].wait()
        if name in self._errors:
            raise self._errors[name]
        return self._results[name]

    def join(self) -> None:
        """Wait until every step is done (before the cluster they use goes down)."""
        self._thread.join()
