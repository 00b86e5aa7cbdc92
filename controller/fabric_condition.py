"""The MegDetRun's ``FabricDegraded`` condition, from the fabric in the trainer's reports: set by
the job mirror for ``target: trainjob`` (:func:`with_fabric`), by the progress hub for ``target:
pytorchjob`` (:func:`condition_writer`). What it says: docs/operations.md, "The fabric".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from megdet.controller.conditions import conditions_in, set_condition
from megdet.fabric_report import CONDITION, FabricReport, condition, from_metrics

__all__ = ["condition_writer", "trainjob_fabric", "with_fabric"]

logger = logging.getLogger(__name__)

#: Reads of the run and conditional writes a fabric change may take before it waits.
ATTEMPTS = 3


def trainjob_fabric(job: Mapping[str, Any]) -> FabricReport | None:
    """The fabric in a TrainJob's ``status.trainerStatus.metrics``; None without one."""
    status = job.get("status")
    trainer = status.get("trainerStatus") if isinstance(status, Mapping) else None
    return from_metrics(trainer.get("metrics")) if isinstance(trainer, Mapping) else None


def with_fabric(
    conditions: Sequence[Mapping[str, Any]],
    report: FabricReport | None,
    now: str,
    generation: Any,
) -> list[dict[str, Any]]:
    """``conditions`` with ``FabricDegraded`` as ``report`` says (unchanged without one)."""
    verdict = None if report is None else condition(report)
    if verdict is None:
        return [dict(c) for c in conditions]
    status, reason, message = verdict
    return set_condition(conditions, CONDITION, status, reason, message, now, generation)


#: (namespace, name) -> the run, or None.
GetRun = Callable[[str, str], Mapping[str, Any] | None]
#: (namespace, name, status patch, resourceVersion) -> the API server's answer.
PatchStatus = Callable[[str, str, Mapping[str, Any], str | None], Any]


def condition_writer(
    get_run: GetRun, patch_status: PatchStatus, now: Callable[[], str]
) -> Callable[[str, str, FabricReport], bool]:
    """``write(namespace, name, report)``: set the run's condition over the version read (409:
    read again); True when it holds it now, False when the run is gone or kept changing. Raises
    what the API server raises otherwise (the hub logs it and tries again later)."""

    def write(namespace: str, name: str, report: FabricReport) -> bool:
        for _attempt in range(ATTEMPTS):
            run = get_run(namespace, name)
            if run is None:
                return False
            meta = run.get("metadata") or {}
            old = conditions_in(run.get("status"))
            new = with_fabric(old, report, now(), meta.get("generation"))
            if new == [dict(c) for c in old]:
                return True
            try:
                patch_status(namespace, name, {"conditions": new}, meta.get("resourceVersion"))
                return True
            except Exception as err:
                code = getattr(err, "status", None)
                if code == 404:
                    return False
                if code != 409:
                    raise
        logger.info("progress: %s/%s changed %d times while its fabric was written", namespace,
                    name, ATTEMPTS)  # fmt: skip
        return False

    return write
