"""Every third-party module an image's code imports is a package that image installs.

The images install the base dependencies plus one extra (pyproject.toml; the Dockerfile reads
them with imagebuild/pins.py): the training image ``[train]`` (and detectron2 from
``[tool.megdet]``), the controller image ``[controller]``. The dev venv has every extra, so a
module that only one extra happens to provide works here and fails in a pod: the first real
pod found the trainer's metrics exporter importing prometheus_client, which only the controller
extra had (ModuleNotFoundError in every rank). This reads the imports (every one, including
those inside functions) of the folders each image runs and maps them to their distributions
with the venv's own metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import pytest

from imagebuild.pins import load_pyproject, requirements

ROOT = Path(__file__).resolve().parents[2]
#: What runs in each image, and the extras it is built with (the Dockerfile's pins.py calls).
IMAGES = {
    "train": (("megdet", "trainer", "image", "monitoring"), ["train"]),
    "controller": (("megdet", "controller", "monitoring"), ["controller"]),
}
#: Files no image runs: development tools with their own [dev] packages.
DEV_TOOLS = {
    "monitoring/dashboards.py": "make dashboards (grafana-foundation-sdk)",
    "monitoring/fleet.py": "make dashboards (grafana-foundation-sdk)",
    "monitoring/efficiency.py": "make dashboards (grafana-foundation-sdk)",
    "monitoring/panels.py": "make dashboards (grafana-foundation-sdk)",
    "monitoring/queries.py": "the monitoring tests' PromQL checks (promql-parser)",
}
#: Folders of a package an image holds but does not run: the MegDetRun API tooling (make crd,
#: megdet validate/render) runs on a user's machine, the cluster policy in the controller and
#: megdet validate; the controller image runs both, its [controller] extra installs what they
#: import (the controller case checks that).
NOT_RUN = {"train": ("megdet/api/", "megdet/policy/")}
#: Installed by the Dockerfile from [tool.megdet], not from a pin list.
OUTSIDE_PINS = {"detectron2"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a ``try`` that catches ImportError: optional imports with
    their own message (``megdet plan --plot`` without matplotlib says which extra it needs)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def imported_modules(path: Path) -> set[str]:
    tops = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    guarded = _guarded(tree)
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return {
        t for t in tops if t not in sys.stdlib_module_names and t not in ("megdet", "__future__")
    }


def third_party_imports(
    folders: tuple[str, ...], skip: tuple[str, ...] = ()
) -> dict[str, set[str]]:
    """Top-level module -> the files importing it, over ``folders`` less those under ``skip``."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in DEV_TOOLS or rel.startswith(skip):
                continue
            for module in imported_modules(path):
                found.setdefault(module, set()).add(rel)
    return found


def with_their_requirements(names: set[str]) -> set[str]:
    """``names`` and every distribution they require, transitively, as installed here (pip
    installs those too: importing one, such as the Kubernetes client's urllib3, is safe)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(normalize(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0]))
    return seen


@pytest.mark.parametrize("image", list(IMAGES))
def test_every_module_an_image_imports_is_installed_in_it(image: str) -> None:
    folders, extras = IMAGES[image]
    declared = {
        normalize(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0])
        for req in requirements(load_pyproject(ROOT / "pyproject.toml"), extras)
    }
    installed = with_their_requirements(declared)
    distributions = metadata.packages_distributions()
    missing = {}
    for module, files in sorted(third_party_imports(folders, NOT_RUN.get(image, ())).items()):
        if module in OUTSIDE_PINS:
            continue
        owners = {normalize(d) for d in distributions.get(module, [])}
        assert owners, f"{module} (imported by {sorted(files)}) is not installed in the dev venv"
        if not owners & installed:
            missing[module] = (sorted(owners), sorted(files))
    assert not missing, (
        f"the {image} image installs the base dependencies and [{', '.join(extras)}] only; "
        f"these imports come from elsewhere: {missing}"
    )


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    """The trainer imports heavy modules lazily, inside functions: the check must see those."""
    source = tmp_path / "lazy.py"
    source.write_text("import os\n\ndef f():\n    from prometheus_client import values\n")
    assert imported_modules(source) == {"prometheus_client"}


def test_an_import_guarded_by_its_own_message_is_optional(tmp_path: Path) -> None:
    source = tmp_path / "plot.py"
    source.write_text(
        "def plot():\n    try:\n        import matplotlib\n    except ImportError:\n"
        "        raise SystemExit('needs megdet[train]')\n    import numpy\n"
    )
    assert imported_modules(source) == {"numpy"}


def test_dev_tools_named_here_exist() -> None:
    for rel in DEV_TOOLS:
        assert (ROOT / rel).is_file(), rel
