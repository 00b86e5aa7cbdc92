"""Shared fixtures for the trainer tests: a small shapes dataset."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> dict[str, Path]:
    """A small deterministic shapes dataset (written once per test session)."""
    from megdet.trainer.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), train=64, val=16, seed=1)


@pytest.fixture
def captured_warnings(caplog):
    """``with captured_warnings(name):`` puts a logger's warnings in caplog, even after
    detectron2's setup_logger turned the logger's propagation off."""

    @contextlib.contextmanager
    def capture(name: str):
        logger = logging.getLogger(name)
        # Exactly one path to caplog, whatever the propagation state: its handler here and
        # propagation off (else a propagating logger would record every warning twice).
        propagate, logger.propagate = logger.propagate, False
        logger.addHandler(caplog.handler)
        try:
            with caplog.at_level(logging.WARNING, logger=name):
                yield
        finally:
            logger.removeHandler(caplog.handler)
            logger.propagate = propagate

    return capture
