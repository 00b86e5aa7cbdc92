"""NCCL settings: the few defaults the launcher adds, and the NCCL env a pod runs with."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["NCCL_DEFAULTS", "NCCL_ENV_PREFIXES", "nccl_env", "with_nccl_defaults"]

#: Added only when the variable is unset: the chart's (or the user's) value always wins.
NCCL_DEFAULTS: dict[str, str] = {
    # Without it NCCL fails with a bare "unhandled system error"; WARN prints the cause
    # (e.g. an IB device that cannot be opened) and nothing while all is well.
    "NCCL_DEBUG": "WARN",
}
# Deliberately not set: TORCH_NCCL_ASYNC_ERROR_HANDLING. torch's default (3, SkipCleanUp)
# already ends the process when a collective times out, which is what a PyTorchJob restart
# needs, and torch intends to retire the variable. Interface and InfiniBand choices
# (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) depend on the cluster and belong to the chart.

#: Prefixes of the variables `megdet doctor` reports as "the NCCL env in effect".
NCCL_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def with_nccl_defaults(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` plus the defaults it lacks, and the defaults that were added."""
    added = {k: v for k, v in NCCL_DEFAULTS.items() if k not in env}
    return {**env, **added}, added


def nccl_env(env: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_* and TORCH_NCCL_* variables in ``env``, sorted by name."""
    return {k: env[k] for k in sorted(env) if k.startswith(NCCL_ENV_PREFIXES)}
