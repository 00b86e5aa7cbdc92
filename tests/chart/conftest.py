"""Fixtures for the chart tests; the helpers live in chart_helpers (a unique module name, so
that other components' conftest modules cannot shadow it)."""

from chart_helpers import render

__all__ = ["render"]
