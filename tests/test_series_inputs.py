"""Bad inputs to ``envace-lite notebooks``: one line, exit 2, and no notebook started.

Every case runs the real command (typer's runner) with ``ENVACE_RUNS`` in a fresh folder; the
series folder must not exist afterwards, which shows that the check ran before any kernel.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from envace_lite.cli.main import app

CASES = [
    (["--profile", "smok"], "unknown profile 'smok': choose one of"),
    (["--profile", "smoke", "--only", "00,02", "-p", "02:task_index=3"],
     "notebook 02_act_and_rehearse has no parameter 'task_index': it takes"),
    (["--profile", "smoke", "--only", "04", "-p", "04:train_run_dir=NOWHERE"],
     "train_run_dir='NOWHERE': no such folder"),
    (["--profile", "smoke", "--only", "09"], "no notebook matches ['09']"),
    (["--profile", "smoke", "--only", "00", "-p", "02:task_id=x"],
     "-p 02:...: notebook 02 is not in this series"),
    (["--profile", "smoke", "--only", "00,01", "-p", "sute=bfcl-base"],
     "no notebook of this series takes a parameter 'sute'"),
    (["--profile", "smoke", "--only", "01", "-p", "01:task_index=abc"],
     "notebook parameter task_index='abc': expected int"),
    (["--profile", "smoke", "--only", "01", "-p", "seed=3"],
     "-p seed: set by the runner"),
    (["--profile", "smoke", "-p", "02task_id"], "use name=value or NN:name=value"),
    (["--profile", "gpu", "--only", "02"], "--profile gpu: model.device='cuda' needs a CUDA GPU"),
    # suites, split and task index, checked against what the kernel would read
    (["--profile", "smoke", "--only", "01", "-p", "tau2_suite=tau2-bogus"],
     "notebook 01_tools_environments_tasks parameter tau2_suite: unknown suite 'tau2-bogus'"),
    (["--profile", "smoke", "--only", "01", "-p", "task_index=-99999"],
     "parameter task_index=-99999: the train split has 74 tasks in tau2-telecom, 150 tasks in "
     "bfcl-base; use 0 to 73"),
    (["--profile", "smoke", "--only", "01", "-p", "01:split=validation"],
     "parameter split: unknown split 'validation'"),
    (["--profile", "smoke", "--only", "07", "-p", "drill_suite=nope"],
     "notebook 07_fidelity_audit parameter drill_suite: unknown suite 'nope'"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_series_input_is_one_line_before_any_notebook(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    out = tmp_path / "series"
    result = CliRunner().invoke(app, ["notebooks", *args, "--out", str(out)])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0]
    assert not out.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("meta, message", [
    ({"profile": "laptop", "stages": [{"name": "00_tour", "status": "not run"}]},
     "holds a series of profile 'laptop', not 'smoke'"),
    ({"profile": "smoke", "started": "2026-12-01 10:00:00",
      "stages": [{"name": "00_tour", "status": "ok"}]}, "holds a finished smoke series"),
    ("not json", "its series.json is unreadable"),
    (None, "holds files of something else than a series"),
])
def test_notebooks_out_into_another_series_is_refused_unless_forced(meta, message, tmp_path,
                                                                     monkeypatch):
    """A series --out of another profile, a finished series or other files: one line, exit 2,
    the folder untouched; --force passes the check (the refused case then runs)."""
    from envace_lite.course import series as series_mod

    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    out = tmp_path / "series"
    out.mkdir()
    if meta is None:
        (out / "notes.txt").write_text("mine")
    else:
        (out / "series.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = CliRunner().invoke(app, ["notebooks", "--profile", "smoke", "--only", "00",
                                      "--out", str(out)])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert "--force" in lines[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    series_mod.check_series_folder(out, "smoke", force=True)  # --force: no refusal
    # an unfinished series of the same profile is run again, not refused
    (out / "series.json").write_text(json.dumps(
        {"profile": "smoke", "stages": [{"name": "00_tour", "status": "failed"}]}))
    series_mod.check_series_folder(out, "smoke")
