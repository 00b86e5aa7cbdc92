"""Install detectron2 into the running Python: from its git source with the C++/CUDA ops, or the
pinned PyPI wheel's Python code without them.

Upstream detectron2 publishes no wheels and no package registry serves its C++/CUDA sources
(docs/image.md, "detectron2 from a registry"), so there are two sources:

``git``
    ``git fetch`` the pinned commit from a repository (GitHub, a mirror, or a local path such as
    a bare clone mounted into the build), check that ``HEAD`` is that commit, and
    ``pip install`` it with its extension. With a non-empty ``--archs`` list the CUDA ops are
    compiled for those archs (``FORCE_CUDA=1``: no GPU is visible in a build); nvcc is
    ``$CUDA_HOME/bin/nvcc`` when there is one (the nvidia/cuda devel image), else NVIDIA's nvcc
    wheels from PyPI at the versions ``[tool.megdet.nvcc_wheels]`` pins for torch's CUDA. An
    empty ``--archs`` builds the C++ ops only.
``pypi``
    The pinned ``detectron2_cpu_wheel`` (upstream's Python code, built for CPython 3.10):
    unpack its ``detectron2/`` folder into site-packages and delete its ``_C`` extension, which
    was built against another Python and torch. Faster R-CNN + FPN then takes NMS and ROIAlign
    from torchvision (CPU and CUDA); rotated boxes and deformable convolution are unavailable.

Standard library only: the image's build stage runs this before the project is installed, and
the dev setup (``scripts/install_detectron2_cpu.py``) runs it too::

    python detectron2_install.py --pyproject pyproject.toml --source pypi
    python detectron2_install.py --pyproject pyproject.toml --source git \\
        --repo https://github.com/facebookresearch/detectron2 --archs "8.0;9.0+PTX"
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

#: Written into the installed ``detectron2/`` folder: which source it came from.
MARKER = ".megdet-source"


class InstallError(Exception):
    """A detectron2 install that cannot go on; the message says why."""


def say(message: str) -> None:
    print(f"detectron2-install: {message}", flush=True)


def load_pins(pyproject: Path) -> dict:
    """pyproject.toml's ``[tool.megdet]`` table."""
    with open(pyproject, "rb") as f:
        return tomllib.load(f)["tool"]["megdet"]


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def install_from_wheel(requirement: str, site: Path | None = None) -> Path:
    """Unpack the Python code of ``requirement`` (a cp310 wheel) into ``site``, without ``_C``."""
    site = site or site_packages()
    target = site / "detectron2"
    marker = target / MARKER
    if marker.exists() and marker.read_text().strip() == requirement:
        say(f"{requirement} already installed in {site}")
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.10", requirement, "-d", tmp],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("*.whl")
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site, members=[m for m in zf.namelist() if m.startswith("detectron2/")])
    for ext in target.glob("_C*.so"):
        ext.unlink()
    marker.write_text(requirement + "\n")
    say(f"installed {requirement}'s Python code into {site} (no _C extension)")
    return target


def fetch_source(repo: str, commit: str, dest: Path) -> None:
    """A checkout of ``commit`` from ``repo`` in ``dest``, verified."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise InstallError(f"--commit: {commit!r} is not a full 40-hex-digit commit")
    dest.mkdir(parents=True, exist_ok=True)
    git = ["git", "-c", "advice.detachedHead=false"]
    for cmd in (["init", "--quiet"], ["fetch", "--quiet", "--depth", "1", repo, commit],
                ["checkout", "--quiet", "FETCH_HEAD"]):  # fmt: skip
        subprocess.run([*git, *cmd], cwd=dest, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=dest, capture_output=True, text=True, check=True
    ).stdout.strip()
    if head != commit:
        raise InstallError(f"{repo}: fetched {head}, the pin is {commit}")
    say(f"source: {repo} at {commit} (verified)")


def torch_cuda() -> str | None:
    import torch

    return torch.version.cuda


def cuda_home_from_wheels(wheels: list[str], target: Path) -> Path:
    """Install NVIDIA's nvcc/header/runtime wheels into ``target``; return the CUDA_HOME."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-deps",
         "--target", str(target), *wheels],
        check=True,
    )  # fmt: skip
    nvcc = sorted(target.glob("nvidia/*/bin/nvcc"))
    if not nvcc:
        raise InstallError(f"no bin/nvcc in {wheels}")
    home = nvcc[0].parent.parent
    # torch's cpp_extension links with -L$CUDA_HOME/lib -lcudart: the wheels ship only .so.N.
    for lib in (home / "lib").glob("libcudart.so.*"):
        link = home / "lib" / "libcudart.so"
        if not link.exists():
            link.symlink_to(lib.name)
    return home


def cuda_env(pins: dict, work: Path, archs: str) -> dict[str, str]:
    """The environment that makes torch's cpp_extension compile the CUDA ops for ``archs``."""
    cuda = torch_cuda()
    if not cuda:
        raise InstallError("--archs given but torch is a CPU build: nothing to compile CUDA for")
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    env: dict[str, str] = {}
    if not (home / "bin" / "nvcc").is_file():
        key = ".".join(cuda.split(".")[:2])
        wheels = pins.get("nvcc_wheels", {}).get(key)
        if not wheels:
            known = ", ".join(sorted(pins.get("nvcc_wheels", {}))) or "none"
            raise InstallError(
                f"torch is built with CUDA {cuda}, there is no {home}/bin/nvcc and "
                f"[tool.megdet.nvcc_wheels] has no nvcc for {key} (only for {known})"
            )
        home = cuda_home_from_wheels(wheels, work / "cuda")
        # torch's ATen/cuda headers include cuBLAS/cuSPARSE headers: a devel image has them
        # in CUDA_HOME, a toolkit from wheels has not: torch's own nvidia-* wheels do.
        includes = [str(h.parent) for h in site_packages().glob("nvidia/*/include/cusparse.h")]
        env["CPATH"] = ":".join(filter(None, [*includes, os.environ.get("CPATH", "")]))
    return {
        **env,
        "FORCE_CUDA": "1",
        "CUDA_HOME": str(home),
        "TORCH_CUDA_ARCH_LIST": archs,
        "PATH": f"{home / 'bin'}:{os.environ.get('PATH', '')}",
    }


def install_from_git(pins: dict, repo: str, commit: str, archs: str, jobs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="detectron2-") as tmp:
        src = Path(tmp) / "src"
        fetch_source(repo, commit, src)
        env = {**os.environ, "MAX_JOBS": str(jobs)}
        if archs:
            env.update(cuda_env(pins, Path(tmp), archs))
            say(f"compiling the C++ and CUDA ops for {archs} with {env['CUDA_HOME']}/bin/nvcc")
        else:
            env.update(FORCE_CUDA="0", CUDA_HOME="")
            say("compiling the C++ ops only (no --archs)")
        # --no-deps: detectron2's setup.py caps iopath below our pin and asks for black and
        # scipy, which training does not import; its runtime deps come from the pin list.
        start = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps",
             "--no-build-isolation", str(src)],
            check=True, env=env,
        )  # fmt: skip
        say(f"built and installed in {time.monotonic() - start:.0f} s")
    (site_packages() / "detectron2" / MARKER).write_text(f"{repo}@{commit} archs={archs}\n")
    check_extension(cuda=bool(archs))
    if archs:
        (library,) = (site_packages() / "detectron2").glob("_C*.so")
        found = check_archs(library, archs)
        say(f"{library.name} holds GPU code for {' '.join(sorted(found))}")


#: A CUDA fat binary's header magic (little endian), as nvcc embeds it in ``.nv_fatbin``.
FATBIN_MAGIC = 0xBA55ED50


def fatbin_archs(data: bytes) -> set[str]:
    """The GPU code in a shared library's fat binaries: ``sm_XY`` cubins, ``compute_XY`` PTX.

    Layout (what cuobjdump reads): a 16-byte header (magic, version, header size, payload
    size), then entries of (kind: 1 PTX / 2 cubin, _, entry header size, payload size, ...,
    arch at byte 28).
    """
    found: set[str] = set()
    magic = struct.pack("<I", FATBIN_MAGIC)
    pos = data.find(magic)
    while pos != -1:
        header, payload = struct.unpack_from("<HQ", data, pos + 6)
        entry, end = pos + header, pos + header + payload
        while entry + 32 <= end:
            kind, _, entry_header, size = struct.unpack_from("<HHIQ", data, entry)
            if kind not in (1, 2) or entry_header == 0:
                break
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            found.add(f"{'compute' if kind == 1 else 'sm'}_{arch}")
            entry += entry_header + size
        pos = data.find(magic, max(end, pos + 4))
    return found


def expected_archs(arch_list: str) -> set[str]:
    """``7.5;9.0+PTX`` -> {"sm_75", "sm_90", "compute_90"}."""
    out = set()
    for entry in filter(None, (a.strip() for a in arch_list.split(";"))):
        digits = entry.removesuffix("+PTX").replace(".", "")
        out.add(f"sm_{digits}")
        if entry.endswith("+PTX"):
            out.add(f"compute_{digits}")
    return out


def check_archs(library: Path, arch_list: str) -> set[str]:
    """Fail unless ``library`` holds code for every arch of ``arch_list``; return what it holds."""
    found = fatbin_archs(library.read_bytes())
    missing = expected_archs(arch_list) - found
    if missing:
        raise InstallError(
            f"{library.name} has no code for {', '.join(sorted(missing))} "
            f"(TORCH_CUDA_ARCH_LIST={arch_list}; it holds {', '.join(sorted(found)) or 'none'})"
        )
    return found


def check_extension(cuda: bool) -> None:
    """Import the built ``detectron2._C`` in a fresh process; with ``cuda``, require CUDA ops."""
    code = (
        "import torch, detectron2._C as C; "
        f"assert {cuda} <= C.has_cuda(), 'detectron2 was built without CUDA'; "
        "print('torch', torch.__version__, '| detectron2._C CUDA', C.get_cuda_version(), "
        "'|', C.get_compiler_version())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=False
    )
    if out.returncode:
        raise InstallError(f"the built extension does not import:\n{out.stderr[-3000:]}")
    say(f"OK: {out.stdout.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pyproject", type=Path, required=True)
    parser.add_argument("--source", required=True, help="git or pypi")
    parser.add_argument("--repo", help="git: the repository (default: [tool.megdet])")
    parser.add_argument("--commit", help="git: the commit (default: [tool.megdet])")
    parser.add_argument("--archs", default="", help="git: TORCH_CUDA_ARCH_LIST; empty: C++ only")
    parser.add_argument("--jobs", type=int, default=1, help="git: parallel compile jobs")
    args = parser.parse_args(argv)
    try:
        pins = load_pins(args.pyproject)
        if args.source == "pypi":
            install_from_wheel(pins["detectron2_cpu_wheel"])
        elif args.source == "git":
            repo = args.repo or pins["detectron2_repo"]
            commit = args.commit or pins["detectron2_commit"]
            install_from_git(pins, repo, commit, args.archs.strip(), args.jobs)
        else:
            raise InstallError(f"--source: {args.source!r} is not one of: git, pypi")
    except InstallError as exc:
        print(f"detectron2-install: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"detectron2-install: error: {' '.join(map(str, exc.cmd))} failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
