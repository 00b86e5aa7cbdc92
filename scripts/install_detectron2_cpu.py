"""Install detectron2's Python code into this virtual environment, for CPU use.

Upstream detectron2 publishes no wheels and its PyPI lookalikes do not build. The pinned
``detectron2_cpu_wheel`` in pyproject.toml carries upstream's Python package plus a ``_C``
extension compiled for CPython 3.10. We unpack its ``detectron2/`` folder into site-packages and
drop ``_C``: without it detectron2 falls back to torchvision's NMS and ROIAlign, which is all
Faster R-CNN + FPN needs. The container image builds upstream from a pinned commit instead,
with its CUDA ops (see the Dockerfile).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["megdet"]
    requirement = pins["detectron2_cpu_wheel"]
    site = Path(sysconfig.get_paths()["purelib"])
    marker = site / "detectron2" / ".megdet-source"
    if marker.exists() and marker.read_text().strip() == requirement:
        print(f"detectron2 ({requirement}) already installed in {site}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.10",
                requirement,
                "-d",
                tmp,
            ],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        target = site / "detectron2"
        shutil.rmtree(target, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.startswith("detectron2/")]
            zf.extractall(site, members=members)
    for ext in target.glob("_C*.so"):
        ext.unlink()
    marker.write_text(requirement + "\n")
    print(f"installed detectron2 from {requirement} into {site} (no _C extension)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
