"""Shared fixtures for the trainer tests: a small shapes dataset."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> dict[str, Path]:
    """A small deterministic shapes dataset (written once per test session)."""
    from megdet.trainer.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), train=64, val=16, seed=1)
