"""The import graph of ``envace_lite`` has no cycle.

Every ``import`` counts: module level, inside functions (lazy imports), and under
``TYPE_CHECKING``. A cycle means a type or a piece of state lives in the wrong module
(docs/design.md, "Package layout").
"""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "envace_lite"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{a: {b, ...}}``: module ``a`` imports ``b`` (or a name from ``b``), anywhere in ``a``."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join(here + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = subs or [base]  # submodules by name, else the module itself
            for t in targets:
                # the deepest module of the package the import names
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("envace_lite"):
                    graph[name].add(t)
    return graph


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "envace_lite"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from envace_lite.b import X\n")
    (pkg / "b.py").write_text("def f():\n    from envace_lite import a\n")
    g = import_graph(pkg)
    assert g == {"envace_lite": set(), "envace_lite.a": {"envace_lite.b"},
                 "envace_lite.b": {"envace_lite.a"}}
    assert find_cycle(g) in (["envace_lite.a", "envace_lite.b", "envace_lite.a"],
                             ["envace_lite.b", "envace_lite.a", "envace_lite.b"])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``graphlib``'s), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return None


def test_no_import_cycle_in_envace_lite():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
