"""One home per name: every name of ``envace_lite`` is imported from the module that defines it.

A module *defines* a name when it binds it at module level (``def``, ``class``, an assignment,
also under a module-level ``if``/``try``/``with``). A module *re-exports* a name when it imports
it (from another ``envace_lite`` module or from outside the package: ``tau2``, ``pathlib``) and
then lists it in ``__all__``, or when some caller gets it through that module. The test walks
every module of the package with ``ast`` and fails when

- a module lists in ``__all__`` a name that it imports from another ``envace_lite`` module;
- a module of the package, a test, a benchmark, a ``scaled/`` script, a ``notebooks/`` script or
  the code cells of ``notebooks/*.ipynb`` imports a name (``from M import name``, at any depth)
  from a module ``M`` that only imports it, or reads it as an attribute of ``M`` (``m.name``
  after ``import M as m`` / ``from pkg import m``; patching ``m.name``, by assignment or
  ``setattr(m, "name", ...)``, replaces ``M``'s own binding and is allowed).

There is no exception for a sub-package's ``__init__.py``: ``envace_lite.protocol`` defines the
parsers, and the prompts, tags and JSON helpers are imported from ``protocol.prompts``,
``protocol.tags`` and ``protocol.json_text``, never through it. Each failure names the module,
the name, its home and where it is listed or imported.
"""
from __future__ import annotations

import ast
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "envace_lite"
CALLER_DIRS = ("envace_lite", "tests", "benchmarks", "scaled", "notebooks")


@dataclass
class Module:
    """What one module of the package binds at module level."""

    name: str
    path: Path
    defines: set[str] = field(default_factory=set)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (module, name)
    all: list[str] | None = None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _top_level(body: list[ast.stmt]):
    """Module-level statements, including those under a module-level if/try/with."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_level(part)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _targets(node: ast.expr):
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)


def _absolute(node: ast.ImportFrom, module: str, is_init: bool) -> str:
    """The absolute module of a ``from ... import`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    here = module.split(".") if is_init else module.split(".")[:-1]
    here = here[:len(here) - node.level + 1]
    return ".".join(here + ([node.module] if node.module else []))


def package_modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of ``envace_lite`` under ``root``, by dotted name."""
    mods: dict[str, Module] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        name = _module_name(path, root)
        is_init = path.name == "__init__.py"
        mod = Module(name, path)
        for node in _top_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.defines.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    mod.defines.update(_targets(t))
                    if isinstance(t, ast.Name) and t.id == "__all__":
                        mod.all = [e.value for e in getattr(node.value, "elts", [])
                                   if isinstance(e, ast.Constant)]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                mod.defines.update(_targets(node.target))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname or not a.name.startswith(PACKAGE + "."):
                        mod.imports[a.asname or a.name.split(".")[0]] = (a.name, "")
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(node, name, is_init)
                for a in node.names:
                    mod.imports[a.asname or a.name] = (src, a.name)
        mods[name] = mod
    for mod in mods.values():  # an imported submodule is a module, not a re-exported name
        for local, (src, orig) in list(mod.imports.items()):
            if f"{src}.{orig}" in mods:
                del mod.imports[local]
                mod.defines.add(local)
    return mods


def home(mods: dict[str, Module], module: str, name: str) -> str | None:
    """The module that defines ``name`` as ``module`` binds it (None: unknown there)."""
    seen = set()
    while (module, name) not in seen:
        seen.add((module, name))
        mod = mods.get(module)
        if mod is None:
            return None
        if name in mod.defines:
            return module
        if name not in mod.imports:
            return None
        module, name = mod.imports[name]
    return None


def reexported_home(mods: dict[str, Module], module: str, name: str) -> str | None:
    """``name``'s home when ``module`` only imports it from another package module, else None."""
    mod = mods.get(module)
    if mod is None or name not in mod.imports:
        return None
    return home(mods, module, name) or ".".join(p for p in mod.imports[name] if p)


def caller_sources(root: Path = ROOT) -> list[tuple[str, str]]:
    """``(path, source)`` of every file that may import from the package; a notebook's code
    cells joined, its ``%``/``!`` lines blanked."""
    out = []
    for d in CALLER_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            out.append((str(path.relative_to(root)), path.read_text()))
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        src = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                        for line in src.splitlines())
        out.append((str(nb.relative_to(root)), src))
    return out


def _module_aliases(tree: ast.AST, mods: dict[str, Module]) -> dict[str, str]:
    """Local names bound to package modules anywhere in a file (``import a.b as x``,
    ``from a import b``, ``from envace_lite import protocol``)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    aliases[a.asname] = a.name
    return aliases


def _patched(tree: ast.AST, aliases: dict[str, str]) -> set[tuple[str, str]]:
    """``(module, name)`` pairs a file patches: ``m.name = ...`` or ``setattr(m, "name", ...)``."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            out.add((aliases[node.value.id], node.attr))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id",
                                                                                  None)) == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
              and node.args[0].id in aliases and isinstance(node.args[1], ast.Constant)):
            out.add((aliases[node.args[0].id], node.args[1].value))
    return out


def reexports(root: Path = ROOT) -> dict[tuple[str, str, str], set[str]]:
    """``{(module, name, home): {where, ...}}``: each name a module re-exports, with the
    ``__all__`` that lists it and the ``path:line`` of each caller that gets it there."""
    mods = package_modules(root)
    found: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for mod in mods.values():
        listed = f"__all__ of {mod.path.relative_to(root)}"
        for name in mod.all or []:
            if name in mod.imports:
                where = reexported_home(mods, mod.name, name)
                if where:
                    found[(mod.name, name, where)].add(listed)
            elif name not in mod.defines:
                found[(mod.name, name, "nowhere: not defined")].add(listed)
    for path, src in caller_sources(root):
        tree = ast.parse(src, path)
        aliases = _module_aliases(tree, mods)
        patched = _patched(tree, aliases)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in mods and not node.level:
                for a in node.names:
                    where = reexported_home(mods, node.module, a.name)
                    if where:
                        found[(node.module, a.name, where)].add(f"{path}:{node.lineno}")
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                  and isinstance(node.value, ast.Name) and node.value.id in aliases):
                module = aliases[node.value.id]
                where = reexported_home(mods, module, node.attr)
                if where and (module, node.attr) not in patched:
                    found[(module, node.attr, where)].add(f"{path}:{node.lineno} (attribute)")
    return found


def reexport_problems(root: Path = ROOT) -> list[str]:
    """One line per re-export: ``module: name (home: M) -- where``."""
    return [f"{m}: {n} (home: {h}) -- {', '.join(sorted(w)[:4])}"
            + (f" and {len(w) - 4} more" if len(w) > 4 else "")
            for (m, n, h), w in sorted(reexports(root).items())]


def test_every_name_is_imported_from_its_home():
    problems = reexport_problems()
    assert not problems, (f"{len(problems)} re-exported names; import each from its home and "
                          "drop it from the re-exporting module:\n" + "\n".join(problems))


def test_the_checker_finds_a_re_export(tmp_path):
    """The walk itself, on a made-up package: a module that imports a name and lists it in
    ``__all__``, a caller that imports a name from it or reads one as its attribute, and a
    sub-package ``__init__`` that lists its own sub-package's name are reported with module,
    name and home; a name an ``__init__`` imports for its own use and a patched attribute are
    not."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "home.py").write_text("from pathlib import Path\n\nVALUE = 1\n\n"
                                 "def f():\n    return Path(str(VALUE))\n")
    (pkg / "relay.py").write_text("from envace_lite.home import VALUE, f\n\n"
                                  "__all__ = ['VALUE', 'g']\n\ndef g():\n    return f()\n")
    (pkg / "sub" / "__init__.py").write_text("from envace_lite.sub.inner import X, Y\n"
                                             "__all__ = ['X']\n\ndef own():\n    return Y\n")
    (pkg / "sub" / "inner.py").write_text("X = 2\nY = 3\n")
    (pkg / "other.py").write_text("from envace_lite.sub.inner import X\n__all__ = ['X']\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "from envace_lite.relay import f, g\nfrom envace_lite.sub import X\n"
        "from envace_lite import relay\nrelay.VALUE\nfrom envace_lite.home import Path\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text(
        "from envace_lite import relay\nreal = relay.f\nrelay.f = lambda: 0\n"
        "from envace_lite import sub\nsub.X\nsub.own()\n")
    assert reexport_problems(tmp_path) == [
        "envace_lite.home: Path (home: pathlib.Path) -- tests/test_x.py:5",
        "envace_lite.other: X (home: envace_lite.sub.inner) -- __all__ of envace_lite/other.py",
        "envace_lite.relay: VALUE (home: envace_lite.home) -- __all__ of envace_lite/relay.py, "
        "tests/test_x.py:4 (attribute)",
        "envace_lite.relay: f (home: envace_lite.home) -- tests/test_x.py:1",
        "envace_lite.sub: X (home: envace_lite.sub.inner) -- __all__ of "
        "envace_lite/sub/__init__.py, benchmarks/b.py:5 (attribute), tests/test_x.py:2"]
