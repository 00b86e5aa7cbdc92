"""How a run's pods are named, for the queries that find a run's GPUs by pod name.

dcgm-exporter labels a GPU's series with the pod that holds it. A run's pods are named after
the run: PyTorchJob ``<run>-master-0`` / ``<run>-worker-N``; TrainJob (JobSet)
``<run>-node-<job>-<index>-<suffix>`` (docs/monitoring.md, "Dashboards").
"""

from __future__ import annotations

__all__ = ["POD_SUFFIX"]

#: What follows the run's name in its pods' names (the recording rules strip it to find the run).
POD_SUFFIX = "((master|worker)-[0-9]+|node-[0-9]+-[0-9]+-[a-z0-9]+)"
