"""The course's run times: one record, read by every table and header that states a time.

``data/reference_results/laptop_series/timings.json`` holds one series record per setting
(``smoke``, ``laptop`` and the ``classroom`` setting of 04 and 05 under ``laptop``), each the
``series.json`` of one ``run_series`` on the development machine, with the load and the command.
Every stage stores the ``code_sha256`` of the notebook it timed: the hash of its code cells, the
part that runs (markdown is left out, so that a header can state the time of its own notebook).
A test fails when a committed notebook's code no longer matches its record, and when a table or
header of the docs differs from what ``render`` writes from the record.

The places that state a time carry a marked region, ``<!-- timings:NAME -->`` ...
``<!-- /timings -->`` (in a notebook, in its first markdown cell), rewritten by ``write_marked``.

Usage::

    python benchmarks/series_timings.py --setting smoke      # time it, store it, rewrite the docs
    from envace_lite.course.timings import load_record, stale_notebooks
    stale_notebooks(load_record())                            # [] when every timing is current
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.paths import REPO_ROOT

RECORD = REPO_ROOT / "data" / "reference_results" / "laptop_series" / "timings.json"
"""The one timing record of the course."""

SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": {"profile": "smoke", "only": None, "parameters": {}},
    "laptop": {"profile": "laptop", "only": None, "parameters": {}},
    "classroom": {"profile": "laptop", "only": ["04", "05"], "parameters": {
        "04": {"steps": 1, "micro_sft_steps": 60, "micro_rl_steps": 4},
        "05": {"n_tasks": 1, "max_turns": 1, "new_tokens": 32}}},
}
"""The timed settings: the profile, the notebooks and the ``-p`` parameters of each."""

DOCS = ("README.md", "docs/instructors.md", "docs/before-the-workshop.md")
"""The documents whose marked regions ``render`` writes."""

_MARK = re.compile(r"<!-- timings:([\w-]+) -->(.*?)<!-- /timings -->", re.S)


def code_sha256(path: str | Path) -> str:
    """The sha256 of a notebook's code: its code cells' sources, in order, joined by a NUL.

    Raises:
        OSError, json.JSONDecodeError: the file cannot be read as a notebook.
    """
    cells = json.loads(Path(path).read_text())["cells"]
    code = "\0".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in cells if c["cell_type"] == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def load_record(path: str | Path = RECORD) -> dict[str, Any]:
    """``{setting: series record}`` of the timing record (an empty dict when it is absent)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def stale_notebooks(record: dict[str, Any], source_dir: str | Path = NOTEBOOKS_DIR
                    ) -> list[str]:
    """``setting/notebook`` of every timed stage whose notebook's code changed since (or is
    gone); an empty list when every timing in ``record`` is current."""
    stale = []
    for setting, series in record.items():
        for st in series.get("stages", []):
            nb = Path(source_dir) / f"{st['name']}.ipynb"
            if not nb.exists() or code_sha256(nb) != st.get("code_sha256"):
                stale.append(f"{setting}/{st['name']}")
    return stale


def _seconds(series: dict[str, Any] | None, stem: str) -> float | None:
    st = next((s for s in (series or {}).get("stages", []) if s["name"] == stem), None)
    return st["seconds"] if st and st.get("status") == "ok" else None


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "not timed"
    return f"{seconds:,.1f} s" if seconds < 600 else f"{seconds:,.0f} s ({seconds / 60:.0f} min)"


def _total(series: dict[str, Any] | None) -> float | None:
    stages = (series or {}).get("stages", [])
    if not stages or any(s.get("status") != "ok" for s in stages):
        return None
    return round(sum(s["seconds"] for s in stages), 1)


def _load(series: dict[str, Any] | None) -> str:
    if not series or series.get("load") is None:
        return "load not recorded"
    return (f"{series.get('cpus', '?')} cores, 1-min load {series['load']['start']:.2f} at the "
            f"start, {series['load']['end']:.2f} at the end")


def render(record: dict[str, Any], name: str) -> str:
    """The text of the marked region ``name``, from ``record``.

    Names: ``table`` (the per-notebook table of ``docs/instructors.md``), ``series-smoke``,
    ``series-laptop`` (a series' total), ``classroom-04``, ``classroom-05`` (one notebook in the
    classroom setting), ``load`` (the machine and load of each setting), ``load-<setting>`` (of
    one) and ``nb-<stem>`` (the runtime line of that notebook's header).

    Raises:
        KeyError: an unknown name.
    """
    smoke, laptop, classroom = (record.get(k) for k in ("smoke", "laptop", "classroom"))
    if name == "table":
        stems = [s["name"] for s in (laptop or smoke or {}).get("stages", [])]
        lines = ["| notebook | smoke | laptop | laptop, classroom setting |",
                 "|---|---|---|---|"]
        for stem in stems:
            room = _seconds(classroom, stem)
            lines.append(f"| {stem} | {_fmt(_seconds(smoke, stem))} | "
                         f"{_fmt(_seconds(laptop, stem))} | {_fmt(room) if room else '–'} |")
        lines.append(f"| **series** | **{_fmt(_total(smoke))}** | **{_fmt(_total(laptop))}** | "
                     f"**{_fmt(_total(classroom))}** (04 and 05) |")
        return "\n" + "\n".join(lines) + "\n"
    if name in ("series-smoke", "series-laptop"):
        series = smoke if name == "series-smoke" else laptop
        return f"{_fmt(_total(series))} (commit {(series or {}).get('commit', '?')})"
    if name in ("classroom-04", "classroom-05"):
        stem = next((s["name"] for s in (classroom or {}).get("stages", [])
                     if s["name"].startswith(name[-2:])), name[-2:])
        return _fmt(_seconds(classroom, stem))
    if name == "load":
        return "; ".join(f"{k}: {_load(record.get(k))}" for k in SETTINGS)
    if name.startswith("load-") and name[5:] in SETTINGS:
        return _load(record.get(name[5:]))
    if name.startswith("nb-"):
        stem = name[3:]
        room = _seconds(classroom, stem)
        return (f"smoke {_fmt(_seconds(smoke, stem))} · laptop {_fmt(_seconds(laptop, stem))}"
                + (f" · classroom setting {_fmt(room)}" if room else ""))
    raise KeyError(f"no timing region named {name!r}")


def marked_regions(text: str) -> list[tuple[str, str]]:
    """``(name, current text)`` of every marked region of ``text``."""
    return [(m[1], m[2]) for m in _MARK.finditer(text)]


def write_marked(text: str, record: dict[str, Any]) -> str:
    """``text`` with every marked region rewritten by ``render``."""
    return _MARK.sub(lambda m: f"<!-- timings:{m[1]} -->{render(record, m[1])}<!-- /timings -->",
                     text)


__all__ = ["DOCS", "RECORD", "SETTINGS", "code_sha256", "load_record", "marked_regions",
           "render", "stale_notebooks", "write_marked"]
