"""When a run whose job exists is checked against the policy again: which kopf diffs of a
run count as a spec change (a suspend alone does not). Pure; read by
:mod:`megdet.controller.reconciler`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megdet.controller.conditions import condition_of
from megdet.controller.status import POLICY_DENIED

__all__ = ["SUSPEND_DIFF", "rechecks_policy"]


#: The kopf diff path of a run's suspend flag.
SUSPEND_DIFF = ("spec", "runPolicy", "suspend")


def rechecks_policy(seen: Mapping[str, Any], reason: str, diff: Any) -> bool:
    """Whether a run whose job exists is checked against the policy again: on a spec change
    other than suspend alone (its owner may always suspend and resume it; labels and
    annotations are no spec change), and while the run is denied (until a spec inside the
    policy, or a looser policy, clears it)."""
    if (condition_of(seen, "Valid") or {}).get("reason") == POLICY_DENIED:
        return True
    if reason != "update":
        return False
    return any(
        tuple(path)[:1] == ("spec",) and not _suspend_alone(tuple(path), old, new)
        for _op, path, old, new in diff or ()
    )


def _suspend_alone(path: tuple[str, ...], old: Any, new: Any) -> bool:
    """Whether one kopf diff item changes the suspend flag and nothing else (an item above
    it, such as adding ``spec.runPolicy``, carries the values below its path)."""
    if path[: len(SUSPEND_DIFF)] == SUSPEND_DIFF:
        return True
    if SUSPEND_DIFF[: len(path)] != path:
        return False
    rest = SUSPEND_DIFF[len(path) :]

    def without_suspend(value: Any, keys: tuple[str, ...]) -> Any:
        if not isinstance(value, Mapping):
            return value
        if len(keys) == 1:
            return {k: v for k, v in value.items() if k != keys[0]}
        return {**value, keys[0]: without_suspend(value.get(keys[0]), keys[1:])}

    return without_suspend(old or {}, rest) == without_suspend(new or {}, rest)
