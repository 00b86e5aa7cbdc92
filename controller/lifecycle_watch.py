"""The handlers that keep a run's lifecycle conditions (:mod:`megdet.controller.lifecycle`).

Two sources change them: the pods of the run's job (the scheduler's and the kubelet's
writes) and the run's own status (the trainer's reports in ``status.progress``, the phase
the job mirror writes). A kopf index, ``megdet_pods``, keeps every trainer pod's
:func:`~megdet.controller.lifecycle.pod_summary` by run from the pods' watch (the API server
selects the run chart's label); an event of a pod or of a run computes the run's lifecycle
from the run's view and that index, under the run's lock (:class:`StatusWriter`), and
writes only what differs: nothing at all when nothing does, so the run's own event after a
write ends there. Level-triggered: a missed event is made good by the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from megdet.controller.api import GROUP, KIND, PLURAL, VERSION
from megdet.controller.lifecycle import lifecycle_status, pod_summary
from megdet.controller.pod_problems import PART_OF, run_of_pod
from megdet.controller.status_writer import StatusWriter

__all__ = ["PODS_INDEX", "LifecycleWatch"]

#: The kopf index of the trainer pods' summaries by (namespace, run).
PODS_INDEX = "megdet_pods"


class LifecycleWatch:
    """The lifecycle handlers of one operator, writing through its :class:`StatusWriter`."""

    def __init__(self, writer: StatusWriter) -> None:
        self.writer = writer

    def register(self, registry: kopf.OperatorRegistry) -> None:
        labels = {PART_OF[0]: PART_OF[1]}
        kopf.index("v1", "pods", registry=registry, labels=labels, id=PODS_INDEX)(self.index_pod)
        kopf.on.event("v1", "pods", registry=registry, labels=labels, id="pods-lifecycle")(
            self.pod_event
        )
        kopf.on.event(
            GROUP, VERSION, PLURAL, registry=registry, when=self.would_change, id="run-lifecycle"
        )(self.run_event)

    @staticmethod
    async def index_pod(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        key = run_of_pod(body)
        return {} if key is None else {key: pod_summary(body)}

    def would_change(self, body: kopf.Body, **kw: Any) -> bool:
        """Whether the run's event, as delivered, changes its lifecycle (in kopf's loop, pure):
        most run events are the controller's own writes, which change nothing more."""
        status = body.get("status") or {}
        if not status.get("jobUID") or (body.get("metadata") or {}).get("deletionTimestamp"):
            return False
        meta = body.get("metadata") or {}
        pods = _pods(kw.get(PODS_INDEX), meta.get("namespace"), meta.get("name"))
        if pods is None:
            return True  # the index changed while read: let the handler look
        new = lifecycle_status(body, pods, None, self.writer.now())
        return any(new.get(key) != status.get(key) for key in ("conditions", "startup"))

    def pod_event(self, body: kopf.Body, retry: int, **kw: Any) -> None:
        key = run_of_pod(body)
        if key is not None:
            self._write(*key, None, retry, kw.get(PODS_INDEX))

    def run_event(self, body: kopf.Body, type: str | None, retry: int, **kw: Any) -> None:
        if type == "DELETED":
            return
        meta = body.get("metadata") or {}
        self._write(meta.get("namespace"), meta.get("name"), meta.get("uid"), retry,
                    kw.get(PODS_INDEX))  # fmt: skip

    def _write(self, namespace: str, name: str, uid: str | None, retry: int, index: Any) -> None:
        def compute(run: Mapping[str, Any]) -> dict[str, Any]:
            pods = _pods(index, namespace, name)
            if pods is None:  # changed while read (kopf's loop writes it): the next event
                return dict(run.get("status") or {})
            return lifecycle_status(run, pods, None, self.writer.now())

        ref = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
        }
        self.writer.write(ref, compute, retry)


def _pods(index: Any, namespace: str, name: str) -> list[Any] | None:
    """The run's pod summaries in kopf's index ([] without the index; None if it changed
    while read)."""
    try:
        return list(index.get((namespace, name)) or []) if index is not None else []
    except RuntimeError:
        return None
