"""The course's timing record: one file, the hash of each notebook's code, and every stated time
rewritten from it.

The helpers are checked on a record written by hand; then the committed record itself: its
hashes equal the committed notebooks' (a notebook whose code changed after it was timed fails
here: time it again with ``benchmarks/series_timings.py``), and every marked region of the docs
and of the notebooks' headers says what the record says.
"""
from __future__ import annotations

import hashlib
import json

import pytest

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.course.timings import (DOCS, RECORD, SETTINGS, code_sha256, load_record,
                                        marked_regions, render, stale_notebooks, write_marked)
from envace_lite.paths import REPO_ROOT


def notebook(tmp_path, name, *sources):
    cells = [{"cell_type": "markdown", "source": "# title", "metadata": {}}] + [
        {"cell_type": "code", "source": s, "metadata": {}, "outputs": [],
         "execution_count": None} for s in sources]
    path = tmp_path / f"{name}.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_code_sha256_hashes_the_code_cells_only(tmp_path):
    path = notebook(tmp_path, "00_a", "x = 1", ["y = ", "2"])
    assert code_sha256(path) == hashlib.sha256(b"x = 1\0y = 2").hexdigest()
    data = json.loads(path.read_text())
    data["cells"][0]["source"] = "# another title: a header may state its own time"
    path.write_text(json.dumps(data))
    assert code_sha256(path) == hashlib.sha256(b"x = 1\0y = 2").hexdigest()


def test_stale_notebooks_names_a_changed_and_a_missing_notebook(tmp_path):
    a = notebook(tmp_path, "00_a", "x = 1")
    notebook(tmp_path, "01_b", "y = 2")
    record = {"smoke": {"stages": [{"name": "00_a", "code_sha256": code_sha256(a)},
                                   {"name": "01_b", "code_sha256": "0" * 64},
                                   {"name": "02_c", "code_sha256": "0" * 64}]}}
    assert stale_notebooks(record, tmp_path) == ["smoke/01_b", "smoke/02_c"]
    assert stale_notebooks({}, tmp_path) == []


HAND = {
    "smoke": {"commit": "abc1234", "cpus": 2, "load": {"start": 0.5, "end": 1.25},
              "stages": [{"name": "00_a", "seconds": 20.0, "status": "ok"},
                         {"name": "04_b", "seconds": 61.25, "status": "ok"}]},
    "laptop": {"commit": "abc1234", "cpus": 2, "load": {"start": 0.1, "end": 2.0},
               "stages": [{"name": "00_a", "seconds": 15.5, "status": "ok"},
                          {"name": "04_b", "seconds": 1546.0, "status": "ok"}]},
    "classroom": {"commit": "abc1234", "stages": [{"name": "04_b", "seconds": 150.0,
                                                   "status": "ok"}]},
}


def test_render_states_the_records_seconds():
    table = render(HAND, "table").strip().splitlines()
    assert table[2] == "| 00_a | 20.0 s | 15.5 s | – |"
    # 1546 s is at least 10 minutes: whole seconds with the minutes beside them
    assert table[3] == "| 04_b | 61.2 s | 1,546 s (26 min) | 150.0 s |"
    # the totals: 20 + 61.25 = 81.25; 15.5 + 1546 = 1561.5
    assert table[4] == ("| **series** | **81.2 s** | **1,562 s (26 min)** | **150.0 s** "
                        "(04 and 05) |")
    assert render(HAND, "nb-04_b") == ("smoke 61.2 s · laptop 1,546 s (26 min) · classroom "
                                       "setting 150.0 s")
    assert render(HAND, "nb-00_a") == "smoke 20.0 s · laptop 15.5 s"
    assert render(HAND, "classroom-04") == "150.0 s"
    assert render(HAND, "series-smoke") == "81.2 s (commit abc1234)"
    assert render(HAND, "load").startswith(
        "smoke: 2 cores, 1-min load 0.50 at the start, 1.25 at the end; laptop: 2 cores")
    assert render(HAND, "load-laptop") == ("2 cores, 1-min load 0.10 at the start, 2.00 at the "
                                          "end")
    assert render(HAND, "load-classroom") == "load not recorded"
    assert render({}, "nb-00_a") == "smoke not timed · laptop not timed"
    for unknown in ("nb", "tables", "load-gpu"):
        with pytest.raises(KeyError):
            render(HAND, unknown)


def test_write_marked_rewrites_every_region_and_nothing_else():
    text = ("before <!-- timings:classroom-04 -->old<!-- /timings --> middle\n"
            "<!-- timings:nb-00_a -->?<!-- /timings --> after")
    new = write_marked(text, HAND)
    assert new == ("before <!-- timings:classroom-04 -->150.0 s<!-- /timings --> middle\n"
                   "<!-- timings:nb-00_a -->smoke 20.0 s · laptop 15.5 s<!-- /timings --> after")
    assert marked_regions(new) == [("classroom-04", "150.0 s"),
                                   ("nb-00_a", "smoke 20.0 s · laptop 15.5 s")]
    assert write_marked(new, HAND) == new


# ---------------------------------------------------------------------------------------------
# The committed record
# ---------------------------------------------------------------------------------------------

def test_the_record_holds_every_setting_timed_at_the_committed_notebooks():
    record = load_record()
    assert set(record) == set(SETTINGS), f"{RECORD} lacks {set(SETTINGS) - set(record)}"
    for setting, series in record.items():
        assert all(st["status"] == "ok" for st in series["stages"]), setting
        assert series["load"]["start"] is not None and series["cpus"], setting
        assert series["profile"] == SETTINGS[setting]["profile"]
    stems = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert [st["name"] for st in record["laptop"]["stages"]] == stems
    assert [st["name"] for st in record["smoke"]["stages"]] == stems
    assert stale_notebooks(record) == [], (
        "these notebooks' code changed after their timing: run benchmarks/series_timings.py "
        "for their settings")


def test_every_stated_time_is_the_records():
    record = load_record()
    texts = {rel: (REPO_ROOT / rel).read_text() for rel in DOCS}
    for nb in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        head = next(c for c in json.loads(nb.read_text())["cells"]
                    if c["cell_type"] == "markdown")
        texts[nb.name] = "".join(head["source"])
        assert (f"nb-{nb.stem}", render(record, f"nb-{nb.stem}")) in marked_regions(
            texts[nb.name]), f"{nb.name}: its header does not state its recorded time"
    for where, text in texts.items():
        for name, said in marked_regions(text):
            assert said == render(record, name), (where, name)
    assert "table" in {n for n, _ in marked_regions(texts["docs/instructors.md"])}
