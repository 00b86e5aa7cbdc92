"""Fixtures for the controller tests; the helpers live in kmock_helpers (a unique module name,
so that other components' conftest modules cannot shadow it). The chart tests' helpers
(tests/chart/chart_helpers) are importable here too: the render tests compare with them."""

import sys
from pathlib import Path

from kmock_helpers import cluster, operator

__all__ = ["cluster", "operator"]

_CHART_TESTS = str(Path(__file__).resolve().parents[1] / "chart")
if _CHART_TESTS not in sys.path:
    sys.path.insert(0, _CHART_TESTS)
