"""controller/ has no import loop, counting the imports hidden inside functions.

A function-local import breaks a loop only at import time; the two modules still depend on
each other, so a change in either can break the other. The graph below is read from the AST
(every ``import``/``from ... import`` anywhere in a module, ``TYPE_CHECKING`` blocks included)
so such a loop shows up here even though ``import megdet.controller.x`` succeeds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "megdet.controller"
ROOT = Path(__file__).resolve().parents[2] / "controller"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, anywhere in its body."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = _resolve(name, path.name == "__init__.py", node)
                # "from pkg import mod" names a module; "from mod import thing" names its module.
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod for a in node.names
                ]
            else:
                continue
            for target in targets:
                # The nearest enclosing module of the package ("a.b.c" when c is a function).
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and target != PACKAGE:
                    deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_controller_has_no_import_loop():
    graph = import_graph()
    assert len(graph) > 30, "the graph did not find controller/'s modules"
    loops = cycles(graph)
    detail = [
        f"{sorted(loop)}: "
        + ", ".join(f"{a} -> {b}" for a in loop for b in sorted(graph[a]) if b in loop)
        for loop in loops
    ]
    assert not loops, "import loops in controller/: " + "; ".join(detail)


def test_the_graph_sees_function_local_imports(tmp_path):
    """The check itself: a loop closed only by an import inside a function is still a loop."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "low.py").write_text(
        "def f():\n    from megdet.controller.high import g\n    return g\n"
    )
    (tmp_path / "high.py").write_text(
        "from megdet.controller import low\n\ndef g():\n    return low\n"
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "leaf.py").write_text("from ..low import f\n")
    graph = import_graph(tmp_path)
    assert graph[f"{PACKAGE}.sub.leaf"] == {f"{PACKAGE}.low"}
    assert cycles(graph) == [[f"{PACKAGE}.high", f"{PACKAGE}.low"]]


@pytest.mark.parametrize("loop", [["a", "b"], ["a", "b", "c"]])
def test_cycles_finds_loops_of_any_length(loop):
    graph = {m: {loop[(i + 1) % len(loop)]} for i, m in enumerate(loop)}
    graph["free"] = {"a"}
    assert cycles(graph) == [sorted(loop)]
