"""Keeps the dev-only packages (pyproject.toml, ``[tool.megdet.packaging] dev_only``) out of
built wheels.

pyproject.toml lists them with the others so that the editable install of the dev venv
(``pip install -e .``, ``make setup``) maps them; a wheel (``pip install .``, ``pip wheel .``,
the images' ``pip install /src``) is built without them. Everything else is in pyproject.toml.
"""

import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PYPROJECT = Path(__file__).resolve().parent / "pyproject.toml"
DEV_ONLY = tuple(tomllib.loads(PYPROJECT.read_text())["tool"]["megdet"]["packaging"]["dev_only"])


def is_dev_only(package: str) -> bool:
    return any(package == p or package.startswith(p + ".") for p in DEV_ONLY)


class BuildPyWithoutDevOnly(build_py):
    """build_py for a wheel: the listed packages minus the dev-only ones (an editable install,
    which maps the source folders instead of copying them, keeps them all)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.editable_mode:
            self.packages = [p for p in self.packages if not is_dev_only(p)]


setup(cmdclass={"build_py": BuildPyWithoutDevOnly})
