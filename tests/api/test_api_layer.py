"""The API package sits above the running operator: ``megdet.api`` may import the controller's
modules, ``controller/`` imports nothing of ``megdet.api``, not even inside a function. So the
operator's image and process never load the CRD generator or ``megdet validate``, and a change
in megdet/api/ cannot break the operator.

The cluster's policy (``megdet/policy/``) sits below both: the controller enforces it and
``megdet.api`` writes it into the admission policy, and it imports neither of them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = "megdet.api"
CONTROLLER = "megdet.controller"


def imports_of(source: str, *packages: str, module: str = "") -> list[str]:
    """The modules of ``packages`` that ``source`` imports anywhere in its body; ``module``
    (its dotted name) resolves its relative imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
            names = [base]
            if base == "megdet" or not node.module:
                names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [n for n in names for p in packages if n == p or n.startswith(f"{p}.")]
    return found


def api_imports(source: str) -> list[str]:
    """The modules of ``megdet.api`` that ``source`` imports anywhere in its body."""
    return imports_of(source, API)


def _importers(folder: str, package: str, *packages: str) -> dict[str, list[str]]:
    """Each module of ``folder`` (the package ``package``) that imports one of ``packages``."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder).with_suffix("")
        module = ".".join((package, *rel.parts))  # resolves its relative imports
        if imports := imports_of(path.read_text(encoding="utf-8"), *packages, module=module):
            found[str(path.relative_to(ROOT))] = imports
    return found


def test_the_controller_imports_nothing_of_the_api_package() -> None:
    assert len(list((ROOT / "controller").rglob("*.py"))) > 20
    assert _importers("controller", CONTROLLER, API) == {}


def test_the_policy_imports_nothing_of_the_controller_or_the_api_package() -> None:
    # Its two enforcers import it: megdet.api writes it into the admission policy, the
    # controller runs its check.
    names = {path.name for path in (ROOT / "megdet" / "policy").glob("*.py")}
    assert names >= {"__init__.py", "rules.py", "knobs.py", "reserved.py", "cel.py"}
    assert _importers("megdet/policy", "megdet.policy", CONTROLLER, API) == {}


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


def test_the_check_sees_relative_imports_out_of_the_policy() -> None:
    source = (
        "from . import cel\n"
        "from .. import controller\n"
        "from ..api import fields\n"
        "def f():\n"
        "    from ..controller.render import render_run\n"
    )
    found = imports_of(source, CONTROLLER, API, module="megdet.policy.rules")
    assert found == ["megdet.controller", "megdet.api", "megdet.controller.render"]
