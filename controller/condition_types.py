"""The list of every condition type a MegDetRun can carry, in one place.

It names the types of modules that import :mod:`megdet.controller.status` (the lifecycle's),
so it lives above them all; nothing in the controller imports it.
"""

from __future__ import annotations

from megdet.controller.job_state import ACTIVE_PHASES
from megdet.controller.lifecycle import CONDITIONS as LIFECYCLE_CONDITIONS
from megdet.controller.pod_problems import CONDITION as PODS_STARTED
from megdet.controller.status import CHILDREN_READY, FOREIGN_JOB, JOB_PRESENT
from megdet.fabric_report import CONDITION as FABRIC_DEGRADED

__all__ = ["CONDITION_TYPES"]

#: Every condition type a MegDetRun can carry: Valid (the spec passed validation), Created
#: (the controller created, or found, its job), one per mirrored phase, JobPresent (only
#: once the job has gone), FabricDegraded (from the trainer's reports:
#: controller/fabric_condition.py), Resizing (controller/resize.py) and the lifecycle's
#: (controller/lifecycle.py).
CONDITION_TYPES = (
    "Valid",
    "Created",
    *ACTIVE_PHASES,
    JOB_PRESENT,
    CHILDREN_READY,
    FOREIGN_JOB,
    PODS_STARTED,
    FABRIC_DEGRADED,
    "Resizing",
    *LIFECYCLE_CONDITIONS,
)
