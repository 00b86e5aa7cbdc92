"""The project's pin list (pyproject.toml), read for the Dockerfile and its tests.

Standard library only: the Dockerfile runs this file before anything is installed::

    python imagebuild/pins.py pyproject.toml train --exclude torch torchvision > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any


def load_pyproject(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def requirements(
    pyproject: dict[str, Any], extras: list[str], exclude: tuple[str, ...] = ()
) -> list[str]:
    """The base dependencies plus the given extras, minus the named packages, as written."""
    project = pyproject["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    skip = {_normalize(name) for name in exclude}
    return [r for r in reqs if _normalize(_name(r)) not in skip]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="print pinned requirements from pyproject.toml")
    parser.add_argument("pyproject")
    parser.add_argument("extras", nargs="*")
    parser.add_argument("--exclude", nargs="*", default=[])
    args = parser.parse_args(argv)
    data = load_pyproject(args.pyproject)
    print("\n".join(requirements(data, args.extras, tuple(args.exclude))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
