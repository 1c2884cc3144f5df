"""Tests of the notebook course: structure, teach cells, exercises, helpers, headless runner.

Default tier: the structure of every committed notebook, the ``teach`` cells against their package
twins, the solutions against the check cells, and the runner's failure, timeout and parameter
handling on small synthetic notebooks. ``slow`` (CI): the whole smoke series (00-07) through
``run_series``, and notebook 02 opened alone with its defaults. ``real_model`` (by hand): 02 and 05
under their real default profile (laptop) with ``jupyter nbconvert --execute``.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from papermill.translators import PythonTranslator

from envace_lite.course import helpers as course
from envace_lite.course import series as nbs
from envace_lite.course.series_pages import minimal_html
from envace_lite.core.advantages import rolewise_advantages
from envace_lite.pipelines.fidelity_metrics import aggregate, pair_metrics
from envace_lite.pipelines.tables import ci95, summarize

NOTEBOOKS = nbs.discover()
SERIES = ["00_tour", "01_tools_environments_tasks", "02_act_and_rehearse",
          "03_rolewise_advantages", "04_training_with_trl", "05_private_rehearsal",
          "06_evaluation_and_figures", "07_fidelity_audit"]
REQUIRED_PARAMETERS = ["profile", "seed", "run_dir", "artifacts_dir"]
FORBIDDEN = ["!pip", "%pip", "pip install", "login(", "input(", "plt.show", "MPLBACKEND",
             "matplotlib.use("]
PARAMETER_LINE = re.compile(r"^(\w+): (str|int|float|bool) = (.+?)  # \S.*$")


def load(path: Path):
    return nbformat.read(str(path), as_version=4)


def tagged(nb, tag: str) -> list:
    return [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]


def exec_build_cells(path: Path, ns: dict, at_least: int) -> dict:
    """Exec the ``build`` cells of the notebook at ``path`` (at least ``at_least`` of them) in
    ``ns``, in order; return ``ns``."""
    cells = tagged(load(path), "build")
    assert len(cells) >= at_least
    run_cells([c.source for c in cells], ns)
    return ns


def run_cells(sources: list[str], ns: dict | None = None) -> str:
    """Exec code cells in one namespace; return what they printed."""
    ns = {} if ns is None else ns
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for src in sources:
            exec(compile(src, "<cell>", "exec"), ns)  # noqa: S102 (our own committed cells)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------
# Structure of every committed notebook
# ---------------------------------------------------------------------------------------------

def test_the_course_notebooks_exist():
    stems = [p.stem for p in NOTEBOOKS]
    assert stems == SERIES
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+", s) for s in stems)
    assert len({s[:2] for s in stems}) == len(stems)  # one notebook per number


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_structure(path):
    nb = load(path)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert "papermill" not in nb.metadata and "widgets" not in nb.metadata
    # no outputs, no execution counts, no run metadata
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, c.source[:60]
        assert not {"papermill", "execution", "collapsed", "scrolled"} & set(c.metadata)
    # opening cells in order: title + goals + runtime, versions, parameters, config
    title, versions, params, config = nb.cells[:4]
    assert title.cell_type == "markdown" and title.source.startswith(f"# {path.stem[:2]} ")
    assert "Learning goals" in title.source
    # the run time, written from the timing record (tests/test_timings.py checks the figures)
    [runtime] = [line for line in title.source.splitlines() if line.startswith("**Run time**")]
    assert f"<!-- timings:nb-{path.stem} -->" in runtime, runtime
    assert versions.cell_type == "code" and "versions()" in versions.source
    assert tagged(nb, "parameters") == [params]  # exactly one, the third cell
    # flat typed literals, one per line, each with a help comment
    declared = {}
    for line in params.source.splitlines():
        m = PARAMETER_LINE.match(line)
        assert m, f"not 'name: type = literal  # help': {line!r}"
        value = ast.literal_eval(m.group(3))
        assert type(value).__name__ == m.group(2)
        declared[m.group(1)] = value
    assert list(declared)[:4] == REQUIRED_PARAMETERS
    assert declared["profile"] == "laptop" and declared["run_dir"] == ""
    assert declared["artifacts_dir"] == ""
    assert course.parameters_of(nb) == declared
    # papermill's own parser reads every parameter with its help text
    inspected = {p.name: p for p in PythonTranslator.inspect(params)}
    assert list(inspected) == list(declared) and all(p.help for p in inspected.values())
    # the config cell checks names and types against this notebook's own parameters cell, then
    # builds the config
    calls = [n for n in ast.walk(ast.parse(config.source)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "check_params"]
    assert len(calls) == 1 and ast.literal_eval(calls[0].args[1]) == path.stem
    assert config.source.index("check_params(") < config.source.index("get_config(profile")
    # the cells before the config cell bind no public literal (check_params relies on it)
    assert "=" not in versions.source.replace("==", "")
    # nothing that blocks or breaks headless runs
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for bad in FORBIDDEN:
        assert bad not in text, bad
    # 1-3 exercises, each with a check cell that calls check_exercise, and a solutions file
    exercises, checks = tagged(nb, "exercise"), tagged(nb, "check")
    assert 1 <= len(exercises) == len(checks) <= 3
    assert all("check_exercise(" in c.source for c in checks)
    assert (course.NOTEBOOKS_DIR / "solutions" / f"{path.stem}.py").exists()
    # figures are saved under the run dir
    for c in nb.cells:
        if ".savefig(" in c.source:
            assert ".savefig(run_dir /" in c.source


# ---------------------------------------------------------------------------------------------
# Teach cells against their package twins, on hand-computed cases
# ---------------------------------------------------------------------------------------------

# (rewards, task_ids, roles, valid, singleton, expected advantages), computed by hand
ROLEWISE_CASES = [
    # μ_{x,act} = (1 + 0 + 0.5) / 3 = 0.5; μ_{x,rehearse} = (1 + 1 + 0) / 3 = 2/3
    ([1.0, 1.0, 1.0, 0.0, 0.0, 0.5], ["x"] * 6,
     ["act", "rehearse", "rehearse", "act", "rehearse", "act"], None, "self",
     [0.5, 1 / 3, 1 / 3, -0.5, -2 / 3, 0.0]),
    # two tasks; y's lone REHEARSE output: A = 0 (paper) ...
    ([0.2, 0.6, 0.9, 0.9], ["x", "x", "y", "y"], ["act", "act", "act", "rehearse"], None, "self",
     [-0.2, 0.2, 0.0, 0.0]),
    # ... or A = R without a baseline (reference code); y's lone ACT output likewise
    ([0.2, 0.6, 0.9, 0.9], ["x", "x", "y", "y"], ["act", "act", "act", "rehearse"], None, "none",
     [-0.2, 0.2, 0.9, 0.9]),
    # masked outputs: A = 0 and out of the mean, μ_{x,act} = (0.3 + 0.9) / 2 = 0.6
    ([0.3, 5.0, 0.9, 0.7], ["x"] * 4, ["act", "act", "act", "rehearse"],
     [True, False, True, True], "self", [-0.3, 0.0, 0.3, 0.0]),
    # the empty-output penalty enters as the output's own reward: μ_act = (1 - 0.1 + 0) / 3 = 0.3
    ([1.0, -0.1, 0.0], ["x"] * 3, ["act"] * 3, None, "self", [0.7, -0.4, -0.3]),
]


def check_rolewise(inline, twin):
    """``rolewise_advantages_inline`` and its twin on the hand cases, then on random groups."""
    for rewards, xs, roles, valid, singleton, want in ROLEWISE_CASES:
        mine = inline(rewards, xs, roles, valid, singleton=singleton)
        pkg = twin(rewards, xs, roles, valid, singleton=singleton).tolist()
        assert mine == pytest.approx(want, abs=1e-6)
        assert pkg == pytest.approx(want, abs=1e-6)
    rng = random.Random(0)  # and on random groups, against each other
    for _ in range(50):
        n = rng.randint(1, 12)
        args = ([round(rng.uniform(-0.1, 1), 3) for _ in range(n)],
                [rng.choice("xyz") for _ in range(n)],
                [rng.choice(["act", "rehearse"]) for _ in range(n)],
                [rng.random() > 0.2 for _ in range(n)])
        for singleton in ("self", "none"):
            assert inline(*args, singleton=singleton) == pytest.approx(
                twin(*args, singleton=singleton).tolist(), abs=1e-6)


def _eval_row(task: str, k: int, reward: float, suite: str = "tau2-telecom") -> dict:
    return {"suite": suite, "task_id": task, "repeat": k, "reward": reward}


# (rows, {suite: Avg@k}), by hand: the pass rate of each repeat, then their mean
AVG_AT_K_CASES = [
    # repeat 0 passes 2/2, repeat 1 passes 1/2: (1 + 0.5) / 2
    ([_eval_row("a", 0, 1.0), _eval_row("a", 1, 0.0), _eval_row("b", 0, 1.0),
      _eval_row("b", 1, 1.0)], {"tau2-telecom": 0.75}),
    # b lacks repeat 1: (2/2 + 0/1) / 2 = 0.5 by repeat (0.75 by task)
    ([_eval_row("a", 0, 1.0), _eval_row("a", 1, 0.0), _eval_row("b", 0, 1.0)],
     {"tau2-telecom": 0.5}),
    # suites never mix
    ([_eval_row("a", 0, 1.0), _eval_row("b", 0, 0.0), _eval_row("x", 0, 0.25, "bfcl-base")],
     {"tau2-telecom": 0.5, "bfcl-base": 0.25}),
]


def check_avg_at_k(inline, twin):
    for rows, want in AVG_AT_K_CASES:
        mine = inline(rows)
        pkg = {s: v["avg_at_k"] for s, v in twin(rows)["suites"].items()}
        assert mine == pytest.approx(want, abs=1e-6) and pkg == pytest.approx(want, abs=1e-6)


# (task means, (low, high) or None), by hand with z = 1.959964: mean ± z · s / sqrt(T), clipped
CI95_CASES = [([1.0], None), ([0.0, 0.0], (0.0, 0.0)),
              ([0.2, 0.4], (0.3 - 0.1959964, 0.3 + 0.1959964)),  # s = 0.1·sqrt(2)
              ([1.0, 0.0, 1.0, 1.0], (0.75 - 0.4899910, 1.0)),  # s = 0.5; clipped above
              ([0.0, 0.0, 0.0, 1.0], (0.0, 0.25 + 0.4899910))]  # clipped below


def check_ci95(inline, twin):
    for values, want in CI95_CASES:
        for got in (inline(values), twin(values)):
            assert (got is None) == (want is None)
            assert want is None or got == pytest.approx(want, abs=1e-6)
    rng = random.Random(0)
    for _ in range(50):
        values = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(rng.randint(2, 30))]
        assert inline(values) == pytest.approx(twin(values), abs=1e-9)


# (rehearsed text, rehearsed error, real text, real error) pairs -> overall rates, by hand
FIDELITY_CASES = [
    # key order does not matter; text is compared stripped and case-sensitive: 1 exact of 2,
    # leaves b[0], b[1], a match; "$" does not
    ([('{"b": [1, 2], "a": 1}', False, '{"a": 1, "b": [1, 2]}', False),
      (" Done", False, "done", False)],
     {"exact_match": 0.5, "field_precision": 0.75, "field_recall": 0.75, "error_agreement": 1.0}),
    # Fig. 7: the error predicted, and an invented order (2 leaves) for the same bare call
    ([("Error: Order not found", True, "Error: Order not found", True),
      ('{"order_id": "W1", "status": "pending"}', False, "Error: Order not found", True)],
     {"exact_match": 0.5, "field_precision": 1 / 3, "field_recall": 0.5, "error_agreement": 0.5}),
    # nested leaves: id and items[0].name match, status does not, items[1].name is missing
    ([('{"id": 1, "status": "pending", "items": [{"name": "Lamp"}]}', False,
       '{"id": 1, "status": "delivered", "items": [{"name": "Lamp"}, {"name": "Desk"}]}', False)],
     {"exact_match": 0.0, "field_precision": 2 / 3, "field_recall": 0.5, "error_agreement": 1.0}),
]


def check_fidelity(inline, twin):
    from envace_lite.types import Observation

    for pairs, want in FIDELITY_CASES:
        pkg = twin([pair_metrics(Observation(r, error=re_), Observation(o, error=oe), False)
                    for r, re_, o, oe in pairs])
        mine = inline(pairs)
        for k, v in want.items():
            assert mine[k] == pytest.approx(v, abs=1e-6) and pkg[k] == pytest.approx(v, abs=1e-6)


def teach_twins():
    """name of an inline teaching function -> (its package twin, a check of both on hand cases)."""
    return {"rolewise_advantages_inline": (rolewise_advantages, check_rolewise),
            "avg_at_k_inline": (summarize, check_avg_at_k),
            "ci95_inline": (ci95, check_ci95),
            "fidelity_inline": (aggregate, check_fidelity)}


def test_every_teach_cell_has_a_package_twin():
    found = 0
    for path in NOTEBOOKS:
        for cell in tagged(load(path), "teach"):
            defined = [n.name for n in ast.parse(cell.source).body
                       if isinstance(n, ast.FunctionDef)]
            assert defined and all(d in teach_twins() for d in defined), (path.stem, defined)
            found += 1
    assert found >= 3


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if tagged(load(p), "teach")],
                         ids=lambda p: p.stem)
def test_teach_cells_match_the_package(path):
    for cell in tagged(load(path), "teach"):
        ns: dict = {}
        run_cells([cell.source], ns)  # alone: a teach cell imports what it uses
        found = [name for name in teach_twins() if name in ns]
        assert found
        for name in found:
            twin, check = teach_twins()[name]
            check(ns[name], twin)


# ---------------------------------------------------------------------------------------------
# Exercises: the solutions solve every check; the placeholders are "not attempted"
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_solutions_pass_the_check_cells(path):
    nb = load(path)
    checks = [c.source for c in tagged(nb, "check")]
    solution = (course.NOTEBOOKS_DIR / "solutions" / f"{path.stem}.py").read_text()
    lines = run_cells([solution, *checks]).splitlines()
    assert lines == [f"Exercise {k}: solved" for k in range(1, len(checks) + 1)]
    # the committed placeholders: every check says "not attempted", and none raises
    lines = run_cells([c.source for c in tagged(nb, "exercise")] + checks).splitlines()
    assert len(lines) == len(checks) and all(": not attempted" in line for line in lines)


def test_check_exercise_never_raises(capsys):
    def boom():
        raise ZeroDivisionError("x")

    for test, want in ((lambda: True, "solved"), (lambda: None, "not attempted"),
                       (lambda: False, "wrong"), (lambda: "off by one", "wrong: off by one"),
                       (boom, "wrong: your code raised ZeroDivisionError: x")):
        course.check_exercise("E", test)
        assert capsys.readouterr().out.startswith(f"E: {want}")


# ---------------------------------------------------------------------------------------------
# The helpers of the opening cells
# ---------------------------------------------------------------------------------------------

def test_check_parameters_rejects_unknown_and_missing_names():
    import math

    ns = {"profile": "smoke", "seed": 0, "run_dir": "", "artifacts_dir": "", "math": math,
          "versions": course.versions, "_private": 3, "In": [], "Out": {}}
    names = ["profile", "seed", "run_dir", "artifacts_dir"]
    assert course.check_parameters(ns, names) == {"profile": "smoke", "seed": 0, "run_dir": "",
                                               "artifacts_dir": ""}
    with pytest.raises(KeyError, match=r"unknown notebook parameter\(s\) \['sede'\]"):
        course.check_parameters({**ns, "sede": 1}, names)
    with pytest.raises(KeyError, match=r"\['seed'\] are not set"):
        course.check_parameters({k: v for k, v in ns.items() if k != "seed"}, names)


def test_stage_dir_and_artifact(tmp_path, monkeypatch):
    from envace_lite.config import get_config

    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    cfg = get_config("smoke", {"run.seed": 3})
    alone = course.stage_dir("", "02_x", cfg)
    assert alone.parent.parent == tmp_path / "runs" / "notebooks"
    assert alone.parent.name.startswith("smoke__s3__") and alone.name == "02_x"
    assert json.loads((alone / "config.json").read_text())["run"]["seed"] == 3
    given = course.stage_dir(str(tmp_path / "series" / "02_x"), "02_x", cfg)
    assert given == tmp_path / "series" / "02_x" and (given / "config.json").exists()
    (given / "outputs.jsonl").write_text("{}")
    found = course.artifact(str(tmp_path / "series"), "02_x", "outputs.jsonl")
    assert found == given / "outputs.jsonl"
    assert course.artifact(str(tmp_path / "series"), "02_x", "missing.json") is None
    assert course.artifact("", "02_x", "outputs.jsonl") is None


# ---------------------------------------------------------------------------------------------
# The runner on small synthetic notebooks (a kernel, no model)
# ---------------------------------------------------------------------------------------------

def synthetic(folder: Path, stem: str, body: list[str], extra: str = "") -> Path:
    params = ('profile: str = "laptop"  # the profile\nseed: int = 0  # the seed\n'
              'run_dir: str = ""  # output folder\nartifacts_dir: str = ""  # earlier outputs\n'
              + extra)
    names = [line.split(":")[0] for line in params.splitlines()]
    config = (f"from pathlib import Path\nfrom envace_lite.course.helpers import check_parameters\n"
              f"check_parameters(globals(), {names!r})\n"
              "Path(run_dir).mkdir(parents=True, exist_ok=True)")
    params_cell = new_code_cell(params)
    params_cell.metadata["tags"] = ["parameters"]
    cells = [new_markdown_cell(f"# {stem}"), new_code_cell("print('versions')"), params_cell,
             new_code_cell(config)] + [new_code_cell(b) for b in body]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    path = folder / f"{stem}.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_series_stops_at_a_failed_cell_and_keeps_what_ran(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    figure = ("from matplotlib.figure import Figure\nfig = Figure()\n"
              "fig.add_subplot().plot([1, 2])\n"
              "fig.savefig(Path(run_dir) / 'line.png')\n"
              "(Path(run_dir) / 'seen.json').write_text(artifacts_dir)")
    synthetic(src, "00_ok", [figure])
    synthetic(src, "01_boom", ["x = 1", "raise ValueError('boom in cell five')", "y = 2"])
    synthetic(src, "02_never", ["pass"])
    out = tmp_path / "series"
    with pytest.raises(nbs.NotebookFailed) as err:
        nbs.run_series("smoke", out=out, source_dir=src)
    e = err.value
    assert e.notebook == "01_boom" and e.cell == 5 and e.series_dir == out
    assert "notebook 01_boom failed at cell 5" in str(e)
    assert "ValueError: boom in cell five" in str(e)
    # what ran is kept: the first notebook with its figure and export, the failed one with its error
    assert (out / "00_ok" / "00_ok.ipynb").exists() and (out / "00_ok" / "00_ok.html").exists()
    assert (out / "00_ok" / "line.png").exists()
    assert (out / "00_ok" / "seen.json").read_text() == str(out)  # artifacts_dir = the series
    params = json.loads((out / "00_ok" / "parameters.json").read_text())
    assert params == {"profile": "smoke", "seed": 0, "run_dir": str(out / "00_ok"),
                      "artifacts_dir": str(out)}
    failed = load(out / "01_boom" / "01_boom.ipynb")
    assert any(o.get("ename") == "ValueError" for c in failed.cells for o in c.get("outputs", []))
    assert not (out / "02_never").exists()
    meta = json.loads((out / "series.json").read_text())
    assert [s["status"] for s in meta["stages"]] == ["ok", "failed", "not run"]
    index = (out / "index.html").read_text()
    assert "href='00_ok/00_ok.ipynb'" in index and "href='00_ok/00_ok.html'" in index
    assert "<img src='00_ok/line.png'" in index and "failed" in index and "not run" in index


def test_unknown_parameters_fail_before_any_notebook_starts(tmp_path):
    from envace_lite.config import ConfigError

    src = tmp_path / "nbs"
    src.mkdir()
    synthetic(src, "00_p", ["print(lr)"], extra="lr: float = 0.1  # learning rate\n")
    with pytest.raises(ConfigError, match="no notebook of this series takes a parameter 'sede': "
                                          "they take lr"):
        nbs.run_series("smoke", out=tmp_path / "a", source_dir=src, parameters={"sede": 1})
    with pytest.raises(ConfigError, match="notebook 00_p has no parameter 'sede': it takes lr"):
        nbs.run_series("smoke", out=tmp_path / "b", source_dir=src,
                       parameters={"00": {"sede": 1}})
    with pytest.raises(ConfigError, match="notebook 01 is not in this series"):
        nbs.run_series("smoke", out=tmp_path / "c", source_dir=src, parameters={"01": {"lr": 1}})
    assert not any((tmp_path / d).exists() for d in "abc")  # nothing ran, nothing was written
    series = nbs.run_series("smoke", out=tmp_path / "d", source_dir=src, parameters={"lr": 0.5})
    assert json.loads((series / "00_p" / "parameters.json").read_text())["lr"] == 0.5
    with pytest.raises(ConfigError, match="no notebook matches"):
        nbs.run_series("smoke", ["07"], out=tmp_path / "e", source_dir=src)


def test_scrub_paths_replaces_machine_paths_in_outputs(tmp_path):
    import nbformat

    from envace_lite.paths import REPO_ROOT

    series = tmp_path / "smoke__s0__x"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(run_dir)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        f"outputs in {series / '02_a'}; notebooks in {REPO_ROOT / 'notebooks'}\n"))]
    nb.cells = [cell]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, str(path))
    assert nbs.scrub_paths(path, series) == 1
    text = nbformat.read(str(path), as_version=4).cells[0].outputs[0]["text"]
    assert text == "outputs in smoke__s0__x/02_a; notebooks in ./notebooks\n"
    assert nbformat.read(str(path), as_version=4).cells[0].source == "print(run_dir)"


def test_a_notebook_past_its_wall_clock_bound_is_stopped(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    synthetic(src, "00_slow", ["import os\n(Path(run_dir) / 'pid').write_text(str(os.getpid()))",
                               "import time\ntime.sleep(120)"])
    # 30 s: a kernel start alone can take 10 s on a loaded 2-core machine
    with pytest.raises(nbs.NotebookFailed, match="wall-clock bound of 30 s") as err:
        nbs.run_series("smoke", out=tmp_path / "s", source_dir=src, timeout=30)
    assert err.value.cell == 5
    kernel = int((tmp_path / "s" / "00_slow" / "pid").read_text())
    deadline = time.time() + 15
    while alive(kernel) and time.time() < deadline:  # the kernel does not outlive papermill
        time.sleep(0.2)
    assert not alive(kernel)
    stage = json.loads((tmp_path / "s" / "series.json").read_text())["stages"][0]
    assert stage["status"] == "timeout" and stage["seconds"] < 60


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_minimal_html_exporter_escapes_and_embeds():
    nb = new_notebook(cells=[new_markdown_cell("# <b>t</b>"), new_code_cell("x = '<script>'")])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="<script>1</script>"),
                           nbformat.v4.new_output("display_data", data={"image/png": "AAAA"})]
    page = minimal_html(nb)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "data:image/png;base64,AAAA" in page


def test_cli_notebooks_passes_its_options(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from envace_lite.cli.main import app

    seen = {}

    def fake(profile, names, out, parameters, **kw):
        seen.update(profile=profile, names=names, out=out, parameters=parameters, **kw)
        (tmp_path / "series.json").write_text(json.dumps(
            {"stages": [{"name": "00_tour", "status": "ok", "seconds": 1.5}]}))
        return tmp_path

    monkeypatch.setattr(nbs, "run_series", fake)
    res = CliRunner().invoke(app, ["notebooks", "--profile", "smoke", "--only", "00, 02",
                                   "-p", "suite=bfcl-base", "-p", "02:task_index=3",
                                   "--timeout", "99"])
    assert res.exit_code == 0, res.output
    assert seen == {"profile": "smoke", "names": ["00", "02"], "out": None, "seed": 0,
                    "parameters": {"suite": "bfcl-base", "02": {"task_index": 3}},
                    "cell_timeout": None, "timeout": 99, "force": False}
    assert "00_tour" in res.output and "ok" in res.output and "index.html" in res.output


# ---------------------------------------------------------------------------------------------
# The real notebooks, executed (slow: CI runs them)
# ---------------------------------------------------------------------------------------------

def assert_closes_with_what_you_saw(executed, name: str) -> None:
    """The notebook has one "What you just saw" section, followed only by its exercises, and
    the cell under it computed what it shows in this run (a code cell with output)."""
    heads = [i for i, c in enumerate(executed.cells) if c.cell_type == "markdown"
             and c.source.startswith("## What you just saw")]
    assert len(heads) == 1, f"{name}: no (or more than one) 'What you just saw' section"
    table = executed.cells[heads[0] + 1]
    assert table.cell_type == "code" and table.get("outputs"), name
    assert "what_you_saw(" in table.source, f"{name}: the table is not drawn by what_you_saw"
    later = [c.source for c in executed.cells[heads[0] + 1:] if c.cell_type == "markdown"]
    assert not any(s.startswith("## ") and not s.startswith("## Exercises") for s in later), (
        f"{name}: a section after 'What you just saw' other than the exercises")


@pytest.mark.slow
def test_smoke_series_runs_every_notebook(tmp_path):
    series = nbs.run_series("smoke", [s[:2] for s in SERIES], out=tmp_path / "series")
    meta = json.loads((series / "series.json").read_text())
    assert [s["name"] for s in meta["stages"]] == SERIES
    assert all(s["status"] == "ok" for s in meta["stages"]), meta
    index = (series / "index.html").read_text()
    for stage in meta["stages"]:
        name = stage["name"]
        executed = load(series / name / f"{name}.ipynb")
        outputs = [o for c in executed.cells for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.output_type == "error"]
        # every figure is saved, linked from the index, and shown in the executed notebook
        assert stage["figures"], name
        assert sum("image/png" in o.get("data", {}) for o in outputs) >= len(stage["figures"])
        for fig in stage["figures"]:
            assert f"href='{name}/{fig}'" in index
        assert f"href='{name}/{name}.ipynb'" in index and f"href='{name}/{name}.html'" in index
        assert (series / name / f"{name}.html").stat().st_size > 10_000
        text = "".join(o.get("text", "") for o in outputs)
        assert text.count(": not attempted") == len(tagged(executed, "check"))
        # quiet headless runs: no stderr block of TRL's or datasets' bars, or of weight loading
        stderr = "".join(o.get("text", "") for o in outputs
                         if o.output_type == "stream" and o.get("name") == "stderr")
        assert not re.search(r"examples/s|Building labels|Truncating train|Loading weights|"
                             r"dequantiz|Map:|it/s\]", stderr), (name, stderr[:300])
        assert json.loads((series / name / "config.json").read_text())["profile"] == "smoke"
        assert_closes_with_what_you_saw(executed, name)
        # the summary table whole in the HTML hand-out: no cell cut by pandas ("..." at its end)
        html = (series / name / f"{name}.html").read_text()
        summary = html.split('id="What-you-just-saw"', 1)[1].split('id="Exercises"', 1)[0]
        assert "<td>" in summary and not re.findall(r"<td>[^<]*\.\.\.</td>", summary), name
        for handout in (series / name / f"{name}.ipynb", series / name / f"{name}.html"):
            assert str(tmp_path) not in handout.read_text(), handout  # no machine path
    # 03 read what 02 wrote, through artifacts_dir
    executed = load(series / "03_rolewise_advantages" / "03_rolewise_advantages.ipynb")
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    # (the hand-out shows the series folder by its name: machine paths are scrubbed)
    assert f"outputs from {series.name}/02_act_and_rehearse/outputs.jsonl" in text
    # 06 read the mode runs that 04 trained, through artifacts_dir
    executed = load(series / "06_evaluation_and_figures" / "06_evaluation_and_figures.ipynb")
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert f"notebook 04's runs from {series.name}/04_training_with_trl/modes" in text
    # 05: rehearsal made no real call, and the committed runs did the executing
    rows = [json.loads(x) for x in (series / "05_private_rehearsal" / "rows.jsonl").read_text()
            .splitlines()]
    assert {r["rehearsal"] for r in rows} == {"parallel", "sequential"}
    assert all(r["rehearsal_real_calls"] == 0 for r in rows)


@pytest.mark.slow
def test_notebook_02_alone_with_its_defaults(tmp_path, monkeypatch):
    """Opened alone: empty run_dir and artifacts_dir; only the profile is set (to smoke)."""
    import papermill as pm

    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "02.ipynb"
    pm.execute_notebook(str(course.NOTEBOOKS_DIR / "02_act_and_rehearse.ipynb"), str(out),
                        parameters={"profile": "smoke"}, kernel_name="python3",
                        execution_timeout=300, progress_bar=False, cwd=str(course.NOTEBOOKS_DIR))
    [stage] = (tmp_path / "runs" / "notebooks").glob("smoke__s0__*/02_act_and_rehearse")
    assert (stage / "outputs.jsonl").exists() and (stage / "act_history.png").exists()
    assert json.loads((stage / "config.json").read_text())["profile"] == "smoke"


@pytest.mark.real_model
@pytest.mark.parametrize("stem,output", [("02_act_and_rehearse", "outputs.jsonl"),
                                         ("05_private_rehearsal", "rows.jsonl")])
def test_notebook_alone_under_laptop_with_nbconvert(tmp_path, stem, output):
    """Its true defaults (laptop: SmolLM2), as a student runs it; minutes on CPU."""
    env = {**os.environ, "ENVACE_RUNS": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook",
                    "--execute", "--ExecutePreprocessor.timeout=1800",
                    "--ExecutePreprocessor.kernel_name=python3",
                    str(course.NOTEBOOKS_DIR / f"{stem}.ipynb"),
                    "--output-dir", str(tmp_path)], check=True, env=env, cwd=course.NOTEBOOKS_DIR)
    executed = load(tmp_path / f"{stem}.ipynb")
    assert not [o for c in executed.cells for o in c.get("outputs", [])
                if o.output_type == "error"]
    [stage] = (tmp_path / "runs" / "notebooks").glob(f"laptop__s0__*/{stem}")
    assert (stage / output).exists()


def test_running_cell_reads_papermill_status(tmp_path):
    path = tmp_path / "executed.ipynb"
    assert nbs.running_cell(path) is None  # not written yet
    cells = ([new_markdown_cell("# t"), new_code_cell("x = 0"), new_markdown_cell("## 2. Rows\ntext")]
             + [new_code_cell(f"x = {i}") for i in (1, 2)])
    for cell, status in zip([cells[1], *cells[3:]], ["completed", "running", "pending"]):
        cell.metadata["papermill"] = {"status": status}
    nbformat.write(new_notebook(cells=cells), str(path))
    assert nbs.running_cell(path) == (2, 3, "2. Rows")  # the section the running cell is in
    cells[3].metadata["papermill"]["status"] = "completed"  # between two saves
    nbformat.write(new_notebook(cells=cells), str(path))
    assert nbs.running_cell(path) == (3, 3, "2. Rows")
    cells[4].metadata["papermill"]["status"] = "completed"  # the kernel closes, not starts
    nbformat.write(new_notebook(cells=cells), str(path))
    assert nbs.running_cell(path) == (3, 3, nbs.FINISHED)
    path.write_text('{"cells": [')  # half-written
    assert nbs.running_cell(path) is None
