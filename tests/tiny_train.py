"""The one command line of a tiny CPU training run, for every test folder that starts one.

``megdet train --config megdet_tiny_cpu`` on a ``shapes`` dataset (the tests' ``shapes``
fixture: ``train_json``, ``train_images`` and, for evaluation, ``val_json``, ``val_images``).
Imported as ``from tests.tiny_train import train_command`` (tests/conftest.py puts the
repository root on ``sys.path``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["train_command"]


def train_command(
    shapes: Mapping[str, Path],
    output: Path,
    *overrides: str,
    workers: int | None = 2,
    val: bool = True,
) -> list[str]:
    """``python -m megdet train`` of the tiny CPU config into ``output``, then ``overrides``
    (detectron2 ``KEY value`` pairs). ``workers=None``: one process, no ``--num-workers``;
    ``val=False``: no evaluation data."""
    cmd = [sys.executable, "-m", "megdet", "train", "--config", "megdet_tiny_cpu"]
    if workers is not None:
        cmd += ["--num-workers", str(workers)]
    cmd += ["--output", str(output), "--train-json", str(shapes["train_json"])]
    cmd += ["--train-images", str(shapes["train_images"])]
    if val:
        cmd += ["--val-json", str(shapes["val_json"]), "--val-images", str(shapes["val_images"])]
    return cmd + list(overrides)
