"""The evaluation harness: rows, hand-computed aggregates (Avg@k, CI, Overall), resumable runs,
the budget sweep and its plot, and the ``eval`` / ``fidelity`` commands on the tiny model."""
from __future__ import annotations

import json
import math

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.cli.main import app
from envace_lite.config import get_config
from envace_lite.course.eval_figures import plot_budget_sweep
from envace_lite.pipelines.evaluate import Policy, budget_sweep, evaluate
from envace_lite.pipelines.run_records import read_rows
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import qwen3_tokenizer
from envace_lite.pipelines.tables import ci95, config_label, summarize, summarize_runs, table3
from envace_lite.types import ToolCall

ROW_KEYS = {"task_id", "suite", "repeat", "reward", "turns", "user_turns", "real_calls",
            "rehearsal_real_calls", "rehearsal_tokens", "memory_tokens", "gated_calls",
            "grounding", "rendering", "decoding", "seconds", "rehearsal", "n", "policy",
            "rehearsal_policy", "rehearse_outputs"}


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def row(suite, tid, repeat, reward, **kw):
    return {"suite": suite, "task_id": tid, "repeat": repeat, "reward": reward, **kw}


# ---------------------------------------------------------------------------------------------
# Aggregates, computed by hand
# ---------------------------------------------------------------------------------------------

def test_ci95_by_hand():
    # mean 0.75, sample sd 0.5, half-width 1.959964 * 0.5 / 2 = 0.489991; clipped at 1
    lo, hi = ci95([1.0, 0.0, 1.0, 1.0])
    assert lo == pytest.approx(0.260009, abs=1e-6) and hi == 1.0
    lo, hi = ci95([0.2, 0.4])  # mean 0.3, sd 0.141421, half 1.959964 * 0.1 = 0.195996
    assert (lo, hi) == pytest.approx((0.104004, 0.495996), abs=1e-6)
    assert ci95([1.0]) is None and ci95([]) is None


def test_summary_avg_at_k_benchmark_avg_and_overall_by_hand():
    rows = [
        # telecom, k=2: repeat 0 -> 1/2, repeat 1 -> 2/2; Avg@2 0.75; task means a=1, b=0.5
        row("tau2-telecom", "a", 0, 1.0), row("tau2-telecom", "b", 0, 0.0),
        row("tau2-telecom", "a", 1, 1.0), row("tau2-telecom", "b", 1, 1.0),
        # airline ticket (NON-OFFICIAL): 0 in both repeats
        row("tau2-airline-ticket", "q", 0, 0.0), row("tau2-airline-ticket", "q", 1, 0.0),
        # BFCL base: repeat 0 -> 1/3, repeat 1 -> 2/3; Avg@2 0.5
        row("bfcl-base", "x", 0, 0.0), row("bfcl-base", "y", 0, 1.0), row("bfcl-base", "z", 0, 0.0),
        row("bfcl-base", "x", 1, 0.0), row("bfcl-base", "y", 1, 1.0), row("bfcl-base", "z", 1, 1.0),
        # BFCL miss_param: 1 then 0; Avg@2 0.5
        row("bfcl-miss_param", "p", 0, 1.0), row("bfcl-miss_param", "p", 1, 0.0),
    ]
    s = summarize(rows)
    tel = s["suites"]["tau2-telecom"]
    assert (tel["avg_at_k"], tel["k"], tel["tasks"], tel["per_repeat"]) == (0.75, 2, 2, [0.5, 1.0])
    # task means 1.0 and 0.5: mean 0.75, sd 0.353553, half 1.959964 * 0.25 = 0.489991
    assert tel["ci95"] == pytest.approx((0.260009, 1.0), abs=1e-6)
    assert s["suites"]["tau2-airline-ticket"]["official"] is False
    assert s["suites"]["bfcl-base"]["avg_at_k"] == pytest.approx(0.5)
    assert s["suites"]["bfcl-miss_param"]["ci95"] is None  # a single task
    assert s["benchmarks"]["tau2"]["avg"] == pytest.approx(0.375)  # (0.75 + 0) / 2
    assert s["benchmarks"]["bfcl"]["avg"] == pytest.approx(0.5)  # (0.5 + 0.5) / 2
    assert s["overall"] == pytest.approx(0.4375) and s["overall_over"] == ["tau2", "bfcl"]
    table = table3({"none": s})
    line = table.splitlines()[2]
    assert line == ("| none | 0.0* | – | 75.0 | 37.5 | 50.0 | – | 50.0 | – | 50.0 | 43.8 |")
    assert "NON-OFFICIAL" in table


def test_config_labels_and_grouping():
    a = row("bfcl-base", "x", 0, 1.0, rehearsal="none", n=0, policy="p", rehearsal_policy="")
    b = row("bfcl-base", "x", 0, 0.0, rehearsal="parallel", n=2, policy="p", rehearsal_policy="p")
    c = row("bfcl-base", "x", 0, 0.0, rehearsal="parallel", n=2, policy="p",
            rehearsal_policy="base")
    assert [config_label(r) for r in (a, b, c)] == ["none", "parallel/N=2",
                                                    "parallel/N=2/rehearsal=base"]
    runs = summarize_runs([a, b, c])
    assert list(runs) == ["none", "parallel/N=2", "parallel/N=2/rehearsal=base"]
    assert runs["none"]["overall"] == 1.0 and runs["parallel/N=2"]["overall"] == 0.0


# ---------------------------------------------------------------------------------------------
# evaluate(): rows, rehearsal, resumable output
# ---------------------------------------------------------------------------------------------

def scripted_policy(tok):
    """ACT: an ``ls`` call, then (after its result) a closing text; the other roles answer in
    their formats. Decided from the prompt, so batching does not matter."""

    def fn(role, prompt):
        if role == "act":
            last = tok.decode(prompt).rsplit("<|im_start|>user\n", 1)[-1]
            if last.startswith("<tool_response>"):
                return "Done."
            return assistant_text([ToolCall("ls", {})])
        return {"rehearse": rehearsal_text('{"current_directory_content": []}'),
                "feedback": "<assessment>fine</assessment><revision>none</revision>",
                "memory": "<memory>ls first</memory>"}[role]
    return Policy(ScriptedGenerator(fn, tok), tok, "scripted")


def test_evaluate_rows_and_rerun_skips_done_rows(tok, tmp_path):
    cfg = get_config("smoke", {"eval.max_turns": 10, "rollout.max_new_tokens_act": 256,
                               "rehearsal.max_turns": 3})
    pol = scripted_policy(tok)
    rows = evaluate(pol, "bfcl-base", rehearsal="parallel", n=1, repeats=2, decoding="sample",
                    cfg=cfg, limit=1, out=tmp_path)
    assert [(r["task_id"], r["repeat"]) for r in rows] == [("multi_turn_base_5", 0),
                                                          ("multi_turn_base_5", 1)]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert (r["rehearsal"], r["n"], r["decoding"], r["grounding"]) == ("parallel", 1,
                                                                          "sample", "none")
        assert r["rehearsal_real_calls"] == 0 and r["real_calls"] == 4 and r["user_turns"] == 4
        assert r["policy"] == r["rehearsal_policy"] == "scripted"
        assert r["rehearse_outputs"] == 4 and r["memory_tokens"] > 0
    assert len(read_rows(tmp_path / "results.jsonl")) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["configs"]["parallel/N=1"]["episodes"] == 2
    assert summary["configs"]["parallel/N=1"]["share_rehearsed"] == 1.0
    assert summary["configs"]["parallel/N=1"]["share_real_call"] == 1.0
    assert "| parallel/N=1 | 2 | 0 | 100.0 % | 100.0 % | 8 | 0 |" in summary["usage"]
    # a rerun into the same folder skips both rows: the policy is never called
    pol2 = scripted_policy(tok)
    again = evaluate(pol2, "bfcl-base", rehearsal="parallel", n=1, repeats=2, decoding="sample",
                     cfg=cfg, limit=1, out=tmp_path)
    assert pol2.generator.calls == [] and again == rows
    assert len(read_rows(tmp_path / "results.jsonl")) == 2
    # another rehearsal configuration (same decoding: another one is refused, see
    # tests/test_reliability.py) in the same folder runs and is summarized apart
    evaluate(pol2, "bfcl-base", decoding="sample", cfg=cfg, limit=1, out=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["configs"]) == {"parallel/N=1", "none"}
    assert summary["configs"]["none"]["share_rehearsed"] == 0.0


def test_budget_sweep_points_and_plot(tok, tmp_path):
    cfg = get_config("smoke", {"eval.max_turns": 10, "rollout.max_new_tokens_act": 256,
                               "rehearsal.max_turns": 2})
    points = budget_sweep(scripted_policy(tok), "bfcl-base", ns=(1, 2), cfg=cfg, limit=1,
                          out=tmp_path)
    assert [(p["mode"], p["n"]) for p in points] == [
        ("none", 0), ("parallel", 1), ("parallel", 2), ("sequential", 1), ("sequential", 2)]
    assert all(p["bfcl"] == p["overall"] == p["suites"]["bfcl-base"] for p in points)
    rows = read_rows(tmp_path / "results.jsonl")
    assert len(rows) == 5 and {r["rehearsal_real_calls"] for r in rows} == {0}
    fig = plot_budget_sweep(points)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.lines) == 3  # parallel, sequential and the dashed Non-TTS line
    fig.savefig(tmp_path / "sweep.png")


# ---------------------------------------------------------------------------------------------
# The commands, on the tiny model
# ---------------------------------------------------------------------------------------------

runner = CliRunner()
SMALL = ["--set", "eval.max_turns=1", "--set", "rehearsal.max_turns=1",
         "--set", "rollout.max_new_tokens_act=8", "--set", "rollout.max_new_tokens_rehearse=8",
         "--set", "rehearsal.max_new_tokens_feedback=8", "--set", "rehearsal.memory_max_tokens=8"]


def test_eval_command_with_rehearsal_and_resume(tmp_path):
    args = ["eval", "--profile", "smoke", "--suite", "bfcl-base", "--limit", "1", "--rehearsal",
            "sequential", "--n", "2", "--out", str(tmp_path), *SMALL]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = read_rows(tmp_path / "results.jsonl")
    assert len(rows) == 1 and ROW_KEYS <= set(rows[0])
    assert (rows[0]["rehearsal"], rows[0]["n"], rows[0]["rehearsal_real_calls"]) == (
        "sequential", 2, 0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "sequential/N=2" in summary["configs"] and "| sequential/N=2 |" in res.output
    assert math.isfinite(summary["configs"]["sequential/N=2"]["overall"])
    res = runner.invoke(app, args)  # the rerun skips the finished row
    assert res.exit_code == 0, res.output
    assert len(read_rows(tmp_path / "results.jsonl")) == 1


def test_fidelity_command(tmp_path):
    res = runner.invoke(app, ["fidelity", "--profile", "smoke", "--suite", "bfcl-base",
                              "--limit", "1", "--source", "gold", "--out", str(tmp_path),
                              "--set", "rollout.max_new_tokens_rehearse=8"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert report["held_out"]["overall"]["pairs"] > 0
    assert report["grounded_upper_bound"]["label"].startswith("UPPER BOUND")
    assert (tmp_path / "fidelity.png").stat().st_size > 0
