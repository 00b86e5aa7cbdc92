"""The MegDetRuns the controller benchmarks apply: their specs, names and namespaces.

Shared by ``bench/controller_reconcile.py`` (kmock and the measurement) and
``bench/controller_cluster.py`` (the real API server's side), so neither imports the other.
"""

from __future__ import annotations

import copy
from typing import Any

from megdet.controller.api import KIND, RUN_API_VERSION

#: The shapes the runs cycle through: 8 GPUs; 16 with InfiniBand; 64 with gang scheduling; 16 as
#: a TrainJob (which also creates a TrainingRuntime).
SPECS: list[dict[str, Any]] = [
    {"gpus": 8},
    {
        "gpus": 16,
        "nccl": {
            "ib": {"enabled": True, "rdmaResourceName": "rdma/rdma_shared_device_a", "hca": "mlx5"}
        },
    },
    {"gpus": 64, "gang": {"enabled": True}},
    {"gpus": 16, "target": "trainjob"},
]


def served_spec(index: int) -> dict[str, Any]:
    """The index-th spec as the API server hands it to the controller: with the CRD's defaults
    applied (kmock does no defaulting; the controller's validation reuses its render of exactly
    this spec, so an undefaulted spec would cost a second render that a cluster never causes).
    In cluster mode the server's own defaults are compared with this (``specs_as_kmock``).
    """
    from megdet.api.validation import default_spec

    return default_spec(SPECS[index % len(SPECS)])


def namespace_of(index: int, namespaces: int) -> str:
    return "vision" if namespaces <= 1 else f"vision-{index % namespaces}"


def run_name(index: int, runs: int) -> str:
    return f"bench-{index:0{max(3, len(str(runs - 1)))}d}"


def cluster_body(index: int, runs: int, namespaces: int) -> dict[str, Any]:
    """The index-th run as a user applies it: the spec as written, the server defaults it."""
    return {
        "apiVersion": RUN_API_VERSION,
        "kind": KIND,
        "metadata": {"name": run_name(index, runs), "namespace": namespace_of(index, namespaces)},
        "spec": copy.deepcopy(SPECS[index % len(SPECS)]),
    }
