"""The API package sits above the running operator: ``megdet.api`` may import the controller's
modules, ``controller/`` imports nothing of ``megdet.api``, not even inside a function. So the
operator's image and process never load the CRD generator or ``megdet validate``, and a change
in megdet/api/ cannot break the operator."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = "megdet.api"


def api_imports(source: str) -> list[str]:
    """The modules of ``megdet.api`` that ``source`` imports anywhere in its body."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
            if node.module == "megdet":
                names = [f"megdet.{alias.name}" for alias in node.names]
        else:
            continue
        found += [name for name in names if name == API or name.startswith(f"{API}.")]
    return found


def test_the_controller_imports_nothing_of_the_api_package() -> None:
    modules = sorted((ROOT / "controller").rglob("*.py"))
    assert len(modules) > 20
    found = {
        str(path.relative_to(ROOT)): imports
        for path in modules
        if (imports := api_imports(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_check_sees_function_local_and_package_imports() -> None:
    source = (
        "import yaml\n"
        "from megdet.controller.api import KIND\n"
        "def main():\n"
        "    from megdet.api.crd import spec_schema\n"
        "    import megdet.api.schema\n"
        "    from megdet import api, plan\n"
    )
    assert api_imports(source) == ["megdet.api.crd", "megdet.api.schema", "megdet.api"]
