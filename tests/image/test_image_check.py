"""scripts/image_check.py (`make image-check`): its pure parts and its refusals.

The compile itself takes tens of minutes on two cores, so the suite does not run it; its
measured result is in docs/image.md.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "image_check.py"


def load():
    spec = importlib.util.spec_from_file_location("image_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arch_list_is_the_dockerfiles_minus_what_nvcc_cannot_build():
    check = load()
    assert check.dockerfile_arch_list() == "7.5;8.0;9.0;10.0;12.0+PTX"
    # CUDA 13's nvcc has no sm_70: it is reported as dropped, not silently skipped.
    assert check.arch_list_for("7.0;8.0;9.0+PTX", {"7.5", "8.0", "9.0", "10.0"}) == (
        "8.0;9.0+PTX",
        ["7.0"],
    )
    assert check.arch_list_for("7.0;8.0", {"7.0", "8.0"}) == ("7.0;8.0", [])


def test_nvcc_wheels_are_pinned_for_the_venv_torch_and_cuda_12_asks_for_a_toolkit(
    tmp_path, monkeypatch
):
    check = load()
    pins = check.megdet_pins()
    venv_cuda = ".".join(torch.version.cuda.split(".")[:2])  # PyPI's torch wheel
    wheels = pins["nvcc_wheels"][venv_cuda]
    assert any(w.startswith("nvidia-cuda-nvcc==" + venv_cuda) for w in wheels)
    assert all("==" in w for w in wheels)
    # The cu126 set's torch is CUDA 12.6; PyPI has no nvcc driver for it: a clear error, no pip.
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(SystemExit) as info:
        check.get_cuda_home(tmp_path, "12.6", pins)
    assert info.value.code == 1


def test_a_source_folder_that_is_not_detectron2_is_refused(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path / "work")],
        env={"DETECTRON2_SRC": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "DETECTRON2_SRC:" in result.stderr and "not a detectron2 source tree" in result.stderr


def test_building_inside_the_repository_is_refused():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(ROOT / "build" / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "inside the repository" in result.stderr
    assert not (ROOT / "build" / "x").exists()  # refused before anything was created
