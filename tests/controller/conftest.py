"""Fixtures for the controller tests; the helpers live in kmock_helpers (a unique module name,
so that other components' conftest modules cannot shadow it)."""

from kmock_helpers import cluster, operator

__all__ = ["cluster", "operator"]
