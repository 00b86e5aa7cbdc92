"""Install detectron2's Python code into this virtual environment, for CPU use.

Upstream detectron2 publishes no wheels and no package registry serves its C++/CUDA sources
(docs/image.md). The pinned ``detectron2_cpu_wheel`` in pyproject.toml carries upstream's
Python package plus a ``_C`` extension compiled for CPython 3.10; its ``detectron2/`` folder is
unpacked into site-packages without ``_C``: detectron2 then falls back to torchvision's NMS and
ROIAlign, which is all Faster R-CNN + FPN needs. The same code installs it in the image when
``make image`` has no detectron2 source (``DETECTRON2_SOURCE=pypi``):
:func:`imagebuild.detectron2_install.install_from_wheel`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # imagebuild: a host tool, not in the package

from imagebuild.detectron2_install import install_from_wheel, load_pins  # noqa: E402


def main() -> int:
    install_from_wheel(load_pins(ROOT / "pyproject.toml")["detectron2_cpu_wheel"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
