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


STUDY = "envace_lite.drills"
"""The drills study: beyond the paper, fenced off from its mechanisms."""
WIRES_THE_STUDY_IN = ("envace_lite.cli",)
"""The command line: its ``drills`` commands and drill-suite checks call the study directly.
Everything else reaches the drill suites and micro bases through the registries, which
``envace_lite.plugins`` fills by importing the study by name on first use."""


def imports_of_the_study(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(module, drills module)`` for every module outside the study and the command line that
    imports the study."""
    def inside(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return sorted(
        (a, b) for a, targets in graph.items() for b in targets
        if inside(b, STUDY) and not inside(a, STUDY)
        and not any(inside(a, w) for w in WIRES_THE_STUDY_IN)
    )


def test_the_study_check_sees_an_import_of_the_drills(tmp_path):
    pkg = tmp_path / "envace_lite"
    for sub in ("core", "drills", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "drills" / "suite.py").write_text("from envace_lite.core import engine\n")
    (pkg / "core" / "engine.py").write_text("X = 1\n")
    (pkg / "cli" / "main.py").write_text("from envace_lite.drills import suite\n")
    assert imports_of_the_study(import_graph(pkg)) == []
    (pkg / "core" / "rollout.py").write_text("def f():\n    from envace_lite.drills.suite import g\n")
    assert imports_of_the_study(import_graph(pkg)) == [
        ("envace_lite.core.rollout", "envace_lite.drills.suite")]


def test_the_mechanisms_never_import_the_drills_study():
    found = imports_of_the_study(import_graph())
    assert found == [], "imports of the drills study: " + ", ".join(f"{a} -> {b}" for a, b in found)


def test_the_pipelines_never_import_the_course():
    """The course (notebook helpers, figures, the series runner) sits on top of the pipelines:
    no arrow runs back from ``envace_lite.pipelines`` to ``envace_lite.course``."""
    graph = import_graph()
    back = sorted((a, b) for a, targets in graph.items() for b in targets
                  if a.startswith("envace_lite.pipelines") and b.startswith("envace_lite.course"))
    assert back == [], "pipelines -> course: " + ", ".join(f"{a} -> {b}" for a, b in back)
