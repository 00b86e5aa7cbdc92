"""Operator chart tests; the helpers live in operator_chart_helpers (a unique module name)."""
