"""Compile detectron2's extension (C++ and CUDA ops) at the pinned commit against the pinned torch.

The image's build stage does this inside ``nvidia/cuda:<CUDA_VERSION>-devel``; this script does
the same compile on any Linux machine with a C++ compiler, so the Dockerfile's riskiest step can
be checked without Docker or a GPU (``make image-check``)::

    DETECTRON2_SRC=/path/to/detectron2 python scripts/image_check.py   # an unpacked source tree
    python scripts/image_check.py                                      # clone the pinned commit

Everything happens under ``--work`` (default: a fresh folder in /tmp), never in the repository:
the source copy, nvcc and the built ``detectron2/_C*.so``.

nvcc: CUDA_HOME if it has ``bin/nvcc``; otherwise NVIDIA's nvcc, headers and runtime wheels from
PyPI, at the versions ``[tool.megdet] nvcc_wheels`` pins for torch's CUDA major.minor
(``torch.version.cuda``), installed with ``pip install --target`` into the work folder. PyPI
has an nvcc driver for CUDA 13 only, so without a toolkit this checks the CUDA 13 combination
(PyPI's torch), not the image's CUDA 12.6 one.
Architectures: the Dockerfile's ``TORCH_CUDA_ARCH_LIST`` default, minus those that nvcc no
longer supports (CUDA 13 dropped sm_70), which are reported, not hidden.

Exit status 0 when the extension built with CUDA and imports; 1 otherwise; 2 on bad input.
Standard library only, apart from the torch that it checks against.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_ARCH_ARG = re.compile(r'^ARG TORCH_CUDA_ARCH_LIST="([^"]+)"', re.MULTILINE)


def fail(message: str, code: int = 1) -> None:
    print(f"image-check: error: {message}", file=sys.stderr)
    sys.exit(code)


def say(message: str) -> None:
    print(f"image-check: {message}", flush=True)


def megdet_pins() -> dict:
    """pyproject.toml's [tool.megdet] table."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["megdet"]


def dockerfile_arch_list() -> str:
    """The Dockerfile's TORCH_CUDA_ARCH_LIST default, e.g. ``7.0;8.0;9.0+PTX``."""
    match = _ARCH_ARG.search((REPO / "Dockerfile").read_text())
    if not match:
        fail('Dockerfile: no ARG TORCH_CUDA_ARCH_LIST="..." default found')
    return match.group(1)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    say("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kwargs)


def get_source(work: Path, pins: dict) -> tuple[Path, str]:
    """A writable copy of the detectron2 source in ``work/src``, and how its commit was checked."""
    dest = work / "src"
    given = os.environ.get("DETECTRON2_SRC")
    commit = pins["detectron2_commit"]
    if given:
        src = Path(given)
        if not (src / "setup.py").is_file() or not (src / "detectron2").is_dir():
            fail(f"DETECTRON2_SRC: {src} is not a detectron2 source tree (no setup.py)", 2)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("build", "*.so", ".git"))
        head = _git_head(src)
        if head is None:
            return dest, f"DETECTRON2_SRC={src} (no .git: commit {commit} NOT verified)"
        if head != commit:
            fail(f"DETECTRON2_SRC: {src} is at {head}, the pin is {commit}", 2)
        return dest, f"DETECTRON2_SRC={src} at {commit} (verified)"
    dest.mkdir()
    run(["git", "init", "--quiet"], cwd=dest)
    run(["git", "fetch", "--quiet", "--depth", "1", pins["detectron2_repo"], commit], cwd=dest)
    run(["git", "checkout", "--quiet", "FETCH_HEAD"], cwd=dest)
    if _git_head(dest) != commit:
        fail(f"the clone is not at {commit}")
    return dest, f"cloned {pins['detectron2_repo']} at {commit} (verified)"


def _git_head(path: Path) -> str | None:
    if not (path / ".git").exists():
        return None
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def get_cuda_home(work: Path, torch_cuda: str, pins: dict) -> Path:
    """A CUDA_HOME with bin/nvcc matching torch's CUDA major.minor."""
    given = os.environ.get("CUDA_HOME")
    if given and (Path(given) / "bin" / "nvcc").is_file():
        return Path(given)
    key = ".".join(torch_cuda.split(".")[:2])
    wheels = pins.get("nvcc_wheels", {}).get(key)
    if not wheels:
        known = ", ".join(sorted(pins.get("nvcc_wheels", {})))
        fail(
            f"torch is built with CUDA {torch_cuda} and [tool.megdet] nvcc_wheels has no nvcc "
            f"for it (only for {known}; NVIDIA's CUDA 12 wheels ship no nvcc driver): set "
            f"CUDA_HOME to a CUDA {key} toolkit with bin/nvcc"
        )
    sys.path.insert(0, str(REPO))  # imagebuild: a host tool, not in the package
    from imagebuild.detectron2_install import InstallError, cuda_home_from_wheels

    try:  # the image's build installs nvcc the same way (imagebuild/detectron2_install.py)
        return cuda_home_from_wheels(wheels, work / "cuda-wheels")
    except (InstallError, subprocess.CalledProcessError) as err:
        fail(f"nvcc from the wheels {wheels}: {err}")
        raise  # fail() exits; this keeps the type checker's view of the return


def library_include_dirs() -> list[Path]:
    """Include folders of the nvidia-* wheels installed with torch (cusparse.h, cublas_v2.h)."""
    import site

    dirs = []
    for root in site.getsitepackages():
        dirs += [h.parent for h in Path(root).glob("nvidia/*/include/cusparse.h")]
    return dirs


def supported_archs(nvcc: Path) -> set[str]:
    """Compute capabilities this nvcc compiles for, e.g. {"7.5", "8.0", ...}."""
    out = subprocess.run([str(nvcc), "--list-gpu-arch"], capture_output=True, text=True, check=True)
    return {f"{m[0]}.{m[1:]}" for m in re.findall(r"compute_(\d+)", out.stdout)}


def arch_list_for(requested: str, supported: set[str]) -> tuple[str, list[str]]:
    """The requested arch list minus unsupported entries, and the dropped entries."""
    kept, dropped = [], []
    for entry in requested.split(";"):
        base = entry.removesuffix("+PTX")
        (kept if base in supported else dropped).append(entry)
    if not kept:
        fail(f"nvcc supports none of TORCH_CUDA_ARCH_LIST={requested}")
    return ";".join(kept), dropped


def verify(src: Path) -> str:
    """Import the built extension in a fresh process and return what it reports."""
    code = (
        "import torch, detectron2._C as C; "
        "assert C.has_cuda(), 'built without CUDA'; "
        "print('torch', torch.__version__, 'CUDA', torch.version.cuda, "
        "'| detectron2._C CUDA', C.get_cuda_version(), '|', C.get_compiler_version())"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=src, env=env, capture_output=True, text=True
    )
    if out.returncode:
        fail(f"the built extension does not import:\n{out.stderr[-3000:]}")
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", help="work folder (default: a new folder under /tmp)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "1")))
    parser.add_argument("--cpu-only", action="store_true", help="skip the CUDA sources")
    args = parser.parse_args(argv)
    import torch

    pins = megdet_pins()
    work = Path(args.work or tempfile.mkdtemp(prefix="megdet-image-check-"))
    if REPO in work.resolve().parents or work.resolve() == REPO:
        fail(f"--work: {work} is inside the repository; build outside it", 2)
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    src, provenance = get_source(work, pins)
    say(f"source: {provenance}")
    env = {**os.environ, "MAX_JOBS": str(args.jobs)}
    if not args.cpu_only:
        home = get_cuda_home(work, torch.version.cuda or "", pins)
        archs, dropped = arch_list_for(dockerfile_arch_list(), supported_archs(home / "bin/nvcc"))
        if dropped:
            say(f"nvcc in {home} cannot build {';'.join(dropped)}; building {archs} only")
        env.update(FORCE_CUDA="1", CUDA_HOME=str(home), TORCH_CUDA_ARCH_LIST=archs)
        env["PATH"] = f"{home / 'bin'}:{env['PATH']}"
        # torch's ATen/cuda headers include cuBLAS/cuSPARSE/cuSOLVER headers, which a devel
        # image has in /usr/local/cuda and pip gives with torch's own nvidia-* wheels.
        extra = [str(p) for p in library_include_dirs() if p != home / "include"]
        env["CPATH"] = ":".join(filter(None, [*extra, os.environ.get("CPATH", "")]))
        say(f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {home}, archs {archs}")
    else:
        env["FORCE_CUDA"] = "0"
        env["CUDA_HOME"] = ""
    build_start = time.monotonic()
    run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src, env=env)
    build_s = time.monotonic() - build_start
    if args.cpu_only:
        say(f"OK: C++ ops built in {build_s:.0f} s")
        return 0
    say(f"OK: {verify(src)}")
    say(f"compile {build_s:.0f} s, total {time.monotonic() - start:.0f} s, work folder {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
