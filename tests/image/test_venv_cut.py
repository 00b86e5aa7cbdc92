"""The build stage's last step: what no process of a run loads leaves the venv the train stage
copies (docs/benchmarks.md, "Time to the first iteration on the real node"). The Dockerfile's
own command runs on a tree of look-alike files: the files it removes, and those it must keep."""

from __future__ import annotations

import subprocess
from pathlib import Path

from imagebuild import recipes

ROOT = Path(__file__).resolve().parents[2]
SITE = "lib/python3.11/site-packages"

#: Removed: static archives (linking only) and the NVIDIA libraries nothing in the venv loads.
REMOVED = (
    f"{SITE}/triton/backends/nvidia/lib/cupti/libcupti_static.a",
    f"{SITE}/nvidia/cu13/lib/libcudart_static.a",
    f"{SITE}/numpy/_core/lib/libnpymath.a",
    f"{SITE}/nvidia/cu13/lib/libcusolverMg.so.12",
    f"{SITE}/nvidia/cu13/lib/libnvrtc.alt.so.13",
    f"{SITE}/nvidia/cu13/lib/libnvrtc-builtins.alt.so.13.0",
    f"{SITE}/nvidia/cu13/lib/libnvblas.so.13",
    f"{SITE}/nvidia/cu13/lib/libcufftw.so.12",
)
#: Kept: what `import torch` maps on the CPU (bench/first_iteration.py's floor lists them), the
#: libraries a GPU run may load (cuDNN's engines, the linear algebra), triton and headers.
KEPT = (
    f"{SITE}/nvidia/cu13/lib/libcusolver.so.12",
    f"{SITE}/nvidia/cu13/lib/libnvrtc.so.13",
    f"{SITE}/nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
    f"{SITE}/nvidia/cu13/lib/libcufft.so.12",
    f"{SITE}/nvidia/cu13/lib/libcublas.so.13",
    f"{SITE}/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9",
    f"{SITE}/torch/lib/libtorch_cuda_linalg.so",
    f"{SITE}/triton/_C/libtriton.so",
    f"{SITE}/triton/backends/nvidia/include/cuda.h",
    f"{SITE}/torch/_C.cpython-311-x86_64-linux-gnu.so",
    f"{SITE}/numpy/_core/lib/npy-pkg-config/npymath.ini",
    f"{SITE}/torch/lib/libtorch_cpu.so.a.txt",
    "bin/python3.11",
)


def cut_command() -> str:
    """The build stage's RUN that cuts the venv (the one that names libcusolverMg)."""
    steps = recipes.stage_instructions((ROOT / "Dockerfile").read_text())["build"]
    (command,) = [rest for keyword, rest in steps if keyword == "RUN" and "cusolverMg" in rest]
    return command


def test_the_cut_is_the_build_stages_last_step() -> None:
    steps = recipes.stage_instructions((ROOT / "Dockerfile").read_text())["build"]
    assert steps[-1] == ("RUN", cut_command())


def test_the_cut_removes_what_no_run_loads_and_keeps_the_rest(tmp_path) -> None:
    venv = tmp_path / "venv"
    for name in REMOVED + KEPT:
        (venv / name).parent.mkdir(parents=True, exist_ok=True)
        (venv / name).write_bytes(b"x")
    command = cut_command().replace("/opt/venv", str(venv))
    subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True)
    assert [name for name in REMOVED if (venv / name).exists()] == []
    assert [name for name in KEPT if not (venv / name).exists()] == []
