"""Fixtures for the monitoring tests."""

from __future__ import annotations

from typing import Any

import pytest
from monitoring_helpers import rule_groups


@pytest.fixture(scope="session")
def default_rule_groups() -> list[dict[str, Any]]:
    """The PrometheusRule's groups as the operator chart renders them with default values."""
    return rule_groups()
