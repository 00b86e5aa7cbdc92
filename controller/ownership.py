"""Whose is an object: the MegDetRun controller reference, and the run's own job. Pure. Read by
planning (which re-exports it) and by status, which planning imports, so it imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megdet.controller.api import KIND, RUN_API_VERSION

__all__ = ["controlled_by", "is_runs_job", "run_owner"]


def _refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def controlled_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the MegDetRun with ``uid`` is ``obj``'s controller: the owner reference that
    :func:`kopf.adopt` writes (``controller: true``). Another object may name the run as a
    plain owner; that does not make it the run's."""
    return uid is not None and any(
        ref.get("uid") == uid and ref.get("controller") is True and ref.get("kind") == KIND
        for ref in _refs(obj)
    )


def is_runs_job(job: Mapping[str, Any], uid: str | None, status: Any) -> bool:
    """Whether ``job`` is the job the MegDetRun with ``uid`` has: controlled by it and, once
    the run's status records one, the very object the controller created (``status.jobUID``;
    a controller reference can be forged, the uid cannot). Before a uid is recorded, and while
    a resize replaces the recorded job, a job the run controls is taken as its own once.
    """
    if not controlled_by(job, uid):
        return False
    recorded = status.get("jobUID") if isinstance(status, Mapping) else None
    if not recorded or (job.get("metadata") or {}).get("uid") == recorded:
        return True
    # A resize stops the recorded job and creates the next: until the next one's uid is
    # recorded, a job the run controls is that one (controller/resize.py).
    resize = status.get("resize")
    return isinstance(resize, Mapping) and resize.get("jobUID") == recorded


def run_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The MegDetRun controller reference of ``obj``, if it has one."""
    for ref in _refs(obj):
        if (
            ref.get("kind") == KIND
            and ref.get("apiVersion") == RUN_API_VERSION
            and ref.get("controller") is True
        ):
            return ref
    return None
