"""The command line, run through its real entry points with tiny budgets."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from envace_lite.cli.main import app

runner = CliRunner()


def test_check_benchmarks_gold_and_corrupted_json():
    res = runner.invoke(app, ["check-benchmarks", "--suite", "bfcl-base", "--split", "test", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output.strip().splitlines()[-1])
    assert report.pop("seconds") > 0  # the replay's wall time, reported with the result
    assert report == {"suite": "bfcl-base", "split": "test", "tasks": 50, "passed": 50,
                      "failed_ids": []}
    res = runner.invoke(app, ["check-benchmarks", "--suite", "tau2-airline-ticket", "--split",
                              "test", "--corrupt", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output.strip().splitlines()[-1])
    assert report["seconds"] > 0
    # 14 of the 20 airline test tasks have a write call; dropping it always fails
    assert (report["tasks"], report["failed"], report["still_passing_ids"]) == (14, 14, [])


def test_eval_smoke_writes_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path))
    res = runner.invoke(app, ["eval", "--profile", "smoke", "--suite", "bfcl-base", "--limit", "1"])
    assert res.exit_code == 0, res.output
    (run_dir,) = list((tmp_path / "eval").iterdir())
    assert run_dir.name.startswith("smoke__s0__")
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["profile"] == "smoke" and cfg["eval"]["limit"] == 1
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["multi_turn_base_5"]
    assert "| bfcl-base | multi_turn_base_5 |" in (run_dir / "results.md").read_text()
    assert "pass@1" in res.output


def test_unknown_override_is_refused():
    res = runner.invoke(app, ["eval", "--profile", "smoke", "--set", "rollout.nope=1"])
    # a user mistake: one line on stderr and exit 2 (a traceback only with --debug)
    assert res.exit_code == 2 and "error: unknown config key 'rollout.nope'" in res.output


def test_resolve_config_applies_files_then_extra_then_sets_then_final(tmp_path):
    from envace_lite.cli.options import resolve_config

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("grpo.steps: 5\ngrpo.beta: 0.5\nrun.seed: 3\n")
    b.write_text("grpo.steps: 7\n")
    cfg = resolve_config("smoke", [str(a), str(b)], ["grpo.beta=0.25", "grpo.mode=per_role"],
                         extra={"run.seed": 9, "grpo.beta": 0.75}, final={"grpo.mode": "act_only"})
    # steps: b after a → 7; seed: extra after the files → 9; beta: --set after extra → 0.25;
    # mode: final after --set → act_only
    assert (cfg.grpo.steps, cfg.run.seed, cfg.grpo.beta, cfg.grpo.mode) == (7, 9, 0.25, "act_only")


@pytest.mark.parametrize("args", [
    ["eval", "--profile", "smoke", "--limit", "-1"],
    ["fidelity", "--profile", "smoke", "--limit", "-1"],
    ["experiment", "--profile", "smoke", "--eval-limit", "-1"],
    ["experiment", "--profile", "smoke", "--fidelity-limit", "-1"],
    ["drills", "baselines", "--limit", "-1"],
])
def test_negative_limit_is_one_line_exit_2_before_anything(tmp_path, monkeypatch, args):
    from envace_lite.models import load as models

    def boom(*a, **k):
        raise AssertionError("no model may load")

    monkeypatch.setattr(models, "load_policy", boom)
    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    out = tmp_path / ("report.json" if args[0] == "drills" else "out")
    for extra in (["--out", str(out)], []):  # with and without a folder of one's own
        res = runner.invoke(app, [*args, *extra])
        assert res.exit_code == 2, res.output
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), res.output
        assert "=-1: expected int >= 0" in lines[0] and "Traceback" not in res.output
        assert not out.exists() and not (tmp_path / "runs").exists()


def test_eval_limit_zero_runs_every_task(tmp_path, monkeypatch):
    from test_reliability import script_committed

    from envace_lite.pipelines import evaluate as ev
    from envace_lite.pipelines import tables

    ran = script_committed(monkeypatch, ["t0", "t1", "t2"])
    monkeypatch.setattr(ev, "as_policy", lambda *a, **k: ev.Policy(None, None, "fake"))
    for name in ("write_summary", "format_table", "summarize_runs", "table3", "usage_table"):
        monkeypatch.setattr(tables, name, lambda *a, **k: "")
    for limit, expected in (("0", ["t0", "t1", "t2"]), ("2", ["t0", "t1"])):
        ran.clear()
        out = tmp_path / f"limit{limit}"
        res = runner.invoke(app, ["eval", "--profile", "smoke", "--suite", "bfcl-base",
                                  "--limit", limit, "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert ran == expected
        assert json.loads((out / "config.json").read_text())["eval"]["limit"] == int(limit)


def test_help_lists_the_choices_from_their_homes():
    from envace_lite.profiles import PROFILES
    from envace_lite.types import TRAIN_MODES

    for cmd in ("eval", "fidelity", "train", "warmstart", "experiment", "notebooks"):
        res = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "240"})
        assert res.exit_code == 0, res.output
        assert " | ".join(PROFILES) == "smoke | micro | laptop | colab | gpu | scaled | drills"
        assert " | ".join(PROFILES) in res.output, cmd
    for cmd in ("train", "experiment"):
        res = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "240"})
        assert "shared | per_role | act_only | act_only_real" == " | ".join(TRAIN_MODES)
        assert " | ".join(TRAIN_MODES) in res.output, cmd
    res = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "240"})
    assert "none | parallel | sequential" in res.output
    assert "sample (T=0.6, top-p 0.95)" in res.output


def test_command_names_and_their_order():
    import typer.main

    group = typer.main.get_command(app)
    assert list(group.list_commands(None)) == [
        "eval", "fidelity", "check-benchmarks", "train", "warmstart", "experiment", "notebooks",
        "data", "drills"]
    assert list(group.commands["drills"].list_commands(None)) == [
        "generate", "show", "baselines", "explain", "report", "reading", "sweep", "copy-base"]
    assert list(group.commands["data"].list_commands(None)) == ["build", "card"]


def _dead_url() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


MISSING = "{tmp}/no-such-folder"
BAD_INPUTS = [
    (["eval", "--suite", "bfcl-base", "--suite", "bfcl-bse"], "unknown suite 'bfcl-bse'"),
    (["eval", "--suite", "bfcl-base", "--split", "tst"], "unknown split 'tst'"),
    (["eval", "--suite", "tau2-retail"], "suite tau2-retail needs a USER endpoint"),
    (["eval", "--suite", "tau2-retail", "--user-url", "localhost:8000"],
     "--user-url 'localhost:8000': expected http(s)://"),
    (["eval", "--suite", "tau2-retail", "--user-url", "{dead}"], "USER endpoint"),
    (["eval", "--suite", "bfcl-base", "--checkpoint", MISSING], "the folder is absent"),
    (["eval", "--suite", "bfcl-base", "--rehearsal", "parallel", "--rehearsal-checkpoint",
      MISSING], "--rehearsal-checkpoint"),
    (["eval", "--suite", "bfcl-base", "--rehearsal", "sideways"], "rehearsal.mode='sideways'"),
    (["eval", "--suite", "bfcl-base", "--repeats", "0"], "eval.repeats=0"),
    (["fidelity", "--source", "gld"], "--source 'gld': choose from ['gold', 'policy']"),
    (["fidelity", "--suite", "bfcl-bse"], "unknown suite 'bfcl-bse'"),
    (["fidelity", "--suite", "tau2-retail"], "use tau2-retail-ticket"),
    (["fidelity", "--checkpoint", MISSING], "the folder is absent"),
    (["fidelity", "--suite", "tau2-retail-drills-v2-compact", "--split", "validaton"],
     "unknown split 'validaton'"),
    (["fidelity", "--suite", "bfcl-base", "--split", "validation"], "unknown split 'validation'"),
    (["train", "--set", "grpo.act_only_baseline=trajectories"],
     "grpo.act_only_baseline='trajectories' applies to the act_only modes only"),
    (["train", "--set", f"model.checkpoint={MISSING}"], "model.checkpoint"),
    (["train", "--steps", "-1"], "grpo.steps=-1"),
    (["warmstart", "--set", f"model.checkpoint={MISSING}"], "the folder is absent"),
    (["experiment", "--warmstart", MISSING], "--warmstart"),
    (["experiment", "--heldout-every", "-1"], "--heldout-every=-1: expected int >= 0"),
    (["data", "build", "--suite", "bfcl-bse"], "unknown suite 'bfcl-bse'"),
    (["data", "build", "--suite", "bfcl-base", "--split", "tst"], "unknown split 'tst'"),
    (["data", "card", "--suite", "bfcl-bse"], "unknown suite 'bfcl-bse'"),
    (["drills", "report", "--run", MISSING], "--run"),
    (["drills", "report", "--run", "{tmp}"], "holds no summary.json"),
    (["drills", "sweep", "--baseline", MISSING, "--run", MISSING], "--baseline"),
    (["check-benchmarks", "--suite", "bfcl-base", "--sample", "-1"], "--sample=-1"),
    # experiment's held-out split, checked before the warm start
    (["experiment", "--set", "eval.split=bogus"], "unknown split 'bogus'"),
    (["experiment", "--set", "eval.split=validation"], "unknown split 'validation'"),
    (["warmstart", "--set", 'grpo.suites=["tau2-bogus"]'], "grpo.suites: unknown suite"),
    (["train", "--set", 'grpo.suites=["bfcl-bse"]'], "grpo.suites: unknown suite 'bfcl-bse'"),
    # a GPU profile on a machine without CUDA, a hub model missing from the offline cache
    (["eval", "--profile", "gpu", "--suite", "bfcl-base"], "model.device='cuda' needs a CUDA GPU"),
    (["train", "--profile", "colab"], "needs a CUDA GPU and this machine has none"),
    (["eval", "--profile", "gpu", "--suite", "bfcl-base", "--set", "model.device=cpu"],
     "model.name='Qwen/Qwen3-1.7B' is not in the local Hugging Face cache"),
    (["experiment", "--profile", "scaled", "--set", "model.device=cpu"],
     "model.name='Qwen/Qwen3-8B' is not in the local Hugging Face cache"),
    # a strategy without rehearsal is refused, not dropped
    (["eval", "--suite", "bfcl-base", "--strategy", "select"],
     "--strategy select applies to private rehearsal"),
    # a malformed checkpoint record
    (["eval", "--suite", "bfcl-base", "--checkpoint", "{tmp}/badrecord"],
     "envace_checkpoint.json is damaged (not JSON"),
    # an empty baselines file is named
    (["drills", "explain", "--baselines", "{tmp}/empty.json", "--run", "{tmp}/empty.json"],
     "--baselines {tmp}/empty.json is empty"),
    (["eval", "--suite", "bfcl-base", "--limit", "1"], "cannot create the run folder"),  # read-only
    (["train"], "cannot create the run folder"),  # a runs folder that is a file
]
PROFILED = ("eval", "fidelity", "train", "warmstart", "experiment")


@pytest.mark.parametrize("args,message", BAD_INPUTS,
                         ids=[f"{i}-{a[0]}" for i, (a, _) in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_exit_2_and_no_run_folder(tmp_path, monkeypatch, args, message):
    from envace_lite.models import load as models

    def boom(*a, **k):
        raise AssertionError("no model may load")

    monkeypatch.setattr(models, "load_policy", boom)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runs = tmp_path / "runs"
    if "cannot create" in message:  # a runs root no folder can be made under
        runs.write_text("a file where the runs folder should be")
    monkeypatch.setenv("ENVACE_RUNS", str(runs))
    (tmp_path / "badrecord").mkdir()
    (tmp_path / "badrecord" / "envace_checkpoint.json").write_text('{"profile": ')
    (tmp_path / "empty.json").write_text("")
    args = [a.format(tmp=tmp_path, dead=_dead_url()) for a in args]
    message = message.format(tmp=tmp_path)
    if args[0] in PROFILED:
        args = [args[0], "--profile", "smoke", *args[1:]]
    before = sorted(p.name for p in tmp_path.iterdir())
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert res.stdout == "" and "Traceback" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder left behind
    assert not runs.is_dir()


def test_ctrl_c_is_one_line_exit_130_naming_what_was_kept(tmp_path, monkeypatch):
    """Ctrl-C in eval (after the run folder), train and notebooks: one line, exit 130; the
    series writes series.json and index.html with the running notebook marked interrupted."""
    from envace_lite.course import series as series_mod
    from envace_lite.pipelines import evaluate, train

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(evaluate, "evaluate", interrupt)
    monkeypatch.setattr(evaluate, "as_policy", lambda *a, **k: None)
    out = tmp_path / "ev"
    res = CliRunner().invoke(app, ["eval", "--profile", "smoke", "--suite", "bfcl-base",
                                   "--limit", "1", "--out", str(out)])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 130 and lines == [
        f"interrupted: what finished is kept in {out}; rerun the same command to go on"], lines
    monkeypatch.setattr(train, "train", interrupt)
    res = CliRunner().invoke(app, ["train", "--profile", "smoke", "--steps", "1"])
    assert res.exit_code == 130 and "interrupted: what finished is kept in the command's run " \
        "folder" in res.output
    calls = []

    def second_interrupts(src, stage, params, *a):
        calls.append(src.stem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"name": src.stem, "status": "ok", "seconds": 1.0, "cell": None, "error": ""}

    monkeypatch.setattr(series_mod, "run_notebook", second_interrupts)
    series = tmp_path / "series"
    res = CliRunner().invoke(app, ["notebooks", "--profile", "smoke", "--only", "00,01,02",
                                   "--out", str(series)])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 130 and len(lines) == 1, res.output
    assert lines[0] == (f"interrupted: series.json and index.html written in {series}, notebook "
                        "01_tools_environments_tasks marked interrupted; rerun the same command "
                        "to go on")
    meta = json.loads((series / "series.json").read_text())
    assert [s["status"] for s in meta["stages"]] == ["ok", "interrupted", "not run"]
    assert (series / "index.html").exists()
