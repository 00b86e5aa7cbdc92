"""``megdet_controller_startup_seconds``: each part of ``status.startup``, observed once.

The lifecycle handlers (:mod:`~megdet.controller.lifecycle_watch`) call :func:`observe` with
the status a write replaced and the one it wrote. A part is observed when the written
``status.startup`` holds it and the replaced one did not for the same attempt: the status on
the API server is the record of what was observed, so a write that repeats a part (the next
iteration's report, a re-read after a conflict, a restarted controller) observes nothing, and a
new attempt (``status.startup.attempt``) observes its parts afresh.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from megdet.controller.lifecycle import STARTUP_PARTS
from megdet.controller.metrics import STARTUP

__all__ = ["PART_LABELS", "observe"]


def _label(field: str) -> str:
    """``admissionWaitSeconds`` -> ``admission_wait`` (the unit is in the metric's name)."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", field.removesuffix("Seconds")).lower()


#: ``status.startup`` field -> the ``part`` label of its observations.
PART_LABELS = {field: _label(field) for field in STARTUP_PARTS}


def observe(namespace: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Observe the parts ``new`` (a run's status as written) measures that ``old`` (the status
    it replaced) lacked for the same attempt; returns their labels."""
    after = new.get("startup")
    if not isinstance(after, Mapping):
        return []
    before = old.get("startup") if isinstance(old.get("startup"), Mapping) else {}
    if before.get("attempt") != after.get("attempt"):
        before = {}
    target = str(new.get("target") or "unknown")
    done = []
    for field, part in PART_LABELS.items():
        value = after.get(field)
        if field in before or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        STARTUP.labels(namespace, target, part).observe(value)
        done.append(part)
    return done
