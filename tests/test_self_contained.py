"""The tree points only inside itself: no pointer to a design document or issue tracker that the
repository does not hold, and no absolute machine path.

Cited design decisions live in ``docs/design.md`` and are cited by section name. The notebooks,
their solutions and the data READMEs are scanned too. ``benchmarks/results/`` is left out: its JSON files are records of
past measurements (their ``machine`` and ``setup`` fields say where they ran), kept as measured.
"""
from __future__ import annotations

import base64
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["envace_lite", "scaled", "benchmarks", "docs", "tests", "notebooks", "data", "README.md",
           "requirements-nodeps.txt", "Makefile", ".ci"]
SKIPPED = [ROOT / "benchmarks" / "results", ROOT / "notebooks" / "runs"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".sbatch", ".txt", ".cfg", ".jinja",
            ".ipynb", ""}

# the patterns are assembled so that this file does not match itself
OUTSIDE = {
    "design-doc pointer": re.compile("DESIGN" + r" §"),
    "issue number": re.compile(r"\bissues? ?#?\d+", re.IGNORECASE),
    "house-style rule number": re.compile("STYLE" + r" rules? \d+"),
    "shared folder": re.compile(r"\.\./" + "shared|/shared/" + "(?:DESIGN|STYLE|notes|paper)"),
    "absolute machine path": re.compile(
        r"(?<![\w.~$])/(?:" + "work|home|root|Users|tmp|mnt|scratch" + r")/"),
}


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in candidates:
            if (f.is_file() and f.suffix in SUFFIXES and f != Path(__file__).resolve()
                    and not any(skip in f.parents for skip in SKIPPED)
                    and "__pycache__" not in f.parts):
                files.append(f)
    return files


def scan(text: str) -> list[tuple[int, str]]:
    """``(line number, what)`` for every line of ``text`` that points outside the repository."""
    return [(n, what) for n, line in enumerate(text.splitlines(), 1)
            for what, pattern in OUTSIDE.items() if pattern.search(line)]


def test_the_patterns_catch_what_they_mean():
    # six pointer-shaped lines (a design-doc section, two issue numbers, a style rule, a
    # machine path, a sibling folder), stored encoded so that this file holds none of them
    bad = base64.b64decode("IyBzZWUgREVTSUdOIMKnOAojIGZpeGVkIGluIGlzc3VlIDcKIyBhcyBpbiBpc3N1ZSAjMTIKIyAoU1RZTEUgcnVsZSAxMSkKQ0tQVCA9ICIvd29yay9ja3B0L3giCiMgcmVhZCAuLi9zaGFyZWQvREVTSUdOLm1k").decode()
    assert [n for n, _ in scan(bad)] == [1, 2, 3, 4, 5, 6]
    good = ['# docs/design.md, "Parsing"', "# Error: order #12 not found",
            'CACHE = "~/.cache/envace_lite"', 'URL = "http://127.0.0.1:8000/v1"',
            "# runs/warmstart/laptop__s0/checkpoint and .venv-vllm/bin/python"]
    assert [scan(line) for line in good] == [[]] * len(good)


def test_the_tree_points_only_inside_itself():
    files = scanned_files()
    assert len(files) > 50  # the scan sees the package, the tests and the docs
    found = [f"{f.relative_to(ROOT)}:{n}: {what}" for f in files
             for n, what in scan(f.read_text(errors="replace"))]
    assert not found, "pointers outside the repository:\n" + "\n".join(found[:40])


CITATION = re.compile(r'design\.md`*[,:]? *\\?["\u201c]([^"\\\u201d]+)')
"""A cited section: ``docs/design.md, "Name"`` (quotes escaped in notebook JSON, lines wrapped)."""


def test_every_cited_design_section_exists():
    heads = [line.lstrip("#").strip() for line in (ROOT / "docs" / "design.md").read_text()
             .splitlines() if line.startswith("#")]
    cited, missing = 0, []
    for f in scanned_files():
        text = f.read_text(errors="replace")
        for m in CITATION.finditer(text):
            # a wrapped citation: drop line breaks, comment markers and indentation
            name = re.sub(r"\s*\n[\s#]*", " ", m.group(1)).strip().rstrip(".,;")
            cited += 1
            if not any(h.startswith(name) or name.startswith(h) for h in heads):
                missing.append(f"{f.relative_to(ROOT)}: {name!r}")
    assert cited > 50 and not missing, missing
