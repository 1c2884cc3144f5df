"""The closing "What you just saw" tables: composed from the run's own values, never a claim of an
event the run did not have.

The line builders are checked on rows written by hand (every expected figure computed here by
hand), in both branches (a run with tool calls and imagined observations, a run with none).
Then notebooks 05 and 04 run whole under ``smoke`` with a scripted policy that calls tools and
writes REHEARSE, FEEDBACK and MEMORY outputs, and each line of their closing table is checked
against the tables the notebook printed above it.
"""
from __future__ import annotations

import json
import re

import nbformat
import pytest

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.course.summaries import rehearsal_lines, training_lines
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.types import ToolCall


def row(reward=0.0, tool_calls=0, real_calls=0, failed=0, imagined=0, leaked=0, memory=0,
        tokens=0):
    return {"reward": reward, "tool_calls": tool_calls, "real_calls": real_calls,
            "failed_real_calls": failed, "rehearse_outputs": imagined,
            "rehearsal_real_calls": leaked, "memory_tokens": memory, "generated_tokens": tokens}


BASE = "none (N = 0)"


def test_rehearsal_lines_with_calls_count_what_happened():
    committed = {"parallel": [row(1.0, 2, 2, 1, 3, memory=5), row(0.0, 1, 1, 1, 2)],
                 "sequential": [row(0.0, 1, 1, 0, 4, memory=7), row(0.0, 0, 0, 0, 0)],
                 "none": [row(0.0, 1, 1, 1), row(0.0, 1, 1, 0)]}
    curve = {BASE: [row(0.0, failed=1, tokens=10), row(0.5, failed=1, tokens=20)],
             "select parallel N=2": [row(1.0, failed=0, tokens=100), row(1.0, tokens=60)],
             "rules N=2": [row(1.0, failed=1, tokens=40), row(1.0, tokens=40)],
             "vote N=2": [row(0.0, failed=0, tokens=50), row(0.5, tokens=30)]}
    lines = dict(rehearsal_lines(committed, curve, baseline=BASE))
    # real calls 2+1+1+0+1+1 = 6; tool calls 2+1+1+0+1+1 = 6; failed 1+1+0+0+1+0 = 3;
    # imagined 3+2+4 = 9; memories in 2 of the 4 rehearsed episodes
    assert lines["Did an imagined attempt reach the real environment?"] == (
        "no: 0 real calls during rehearsal; all 6 real calls came from the committed runs")
    assert lines["Did the policy call tools, and did REHEARSE imagine their results?"] == (
        "yes: 6 tool calls in the committed runs (3 of them failed), 9 imagined observations "
        "in the attempts")
    # parallel 0.5, sequential 0.0, none 0.0
    assert lines["Did rehearsal with the paper's memory change the committed reward?"] == (
        "none 0.00, parallel 0.50, sequential 0.00: higher with parallel; a non-empty memory "
        "in 2 of 4 rehearsed episodes")
    # success: N = 0 0.25, select 1.0, rules 1.0, vote 0.25
    assert lines["Which configuration of the select curve succeeded most?"] == (
        "select parallel N=2, rules N=2: 1.00 against 0.25 at N = 0")
    # failed per episode: N = 0 1.0, select 0.0, rules 0.5, vote 0.0
    assert lines["Did choosing among imagined attempts cut the failed real calls?"] == (
        "N = 0: 1.00 failed real calls per episode; fewest with rehearsal: 0.00 "
        "(select parallel N=2, vote N=2)")
    # tokens per episode: N = 0 15, select 80, rules 40, vote 40
    assert lines["What did rehearsal cost?"] == (
        "15 generated tokens per episode at N = 0, up to 80 (select parallel N=2); no real call")
    assert lines["Is this a measurement of rehearsal's effect?"].startswith(
        "no: 2 task(s), one run each")


def test_rehearsal_lines_claim_no_call_when_none_was_made():
    committed = {"parallel": [row()], "sequential": [row()], "none": [row()]}
    curve = {BASE: [row(tokens=8)], "select parallel N=2": [row(tokens=8)]}
    lines = dict(rehearsal_lines(committed, curve, baseline=BASE))
    said = " ".join(lines.values())
    assert lines["Did the policy call tools, and did REHEARSE imagine their results?"].startswith(
        "no: no committed run made a tool call")
    assert lines["Did rehearsal with the paper's memory change the committed reward?"] == (
        "none 0.00, parallel 0.00, sequential 0.00: the same with and without rehearsal; a "
        "non-empty memory in 0 of 2 rehearsed episodes")
    assert lines["Which configuration of the select curve succeeded most?"].startswith(
        "none: every configuration, N = 0 included, scored 0.00")
    assert "mistake" not in said and "imagines" not in said


def test_rehearsal_lines_say_a_leak_and_a_tie():
    committed = {"parallel": [row(1.0, 1, 1, leaked=2)], "none": [row(1.0, 1, 1)]}
    curve = {BASE: [row(1.0)], "select parallel N=1": [row(1.0)], "rules N=1": [row(0.0)]}
    lines = dict(rehearsal_lines(committed, curve, baseline=BASE, min_tasks=1))
    assert lines["Did an imagined attempt reach the real environment?"].startswith(
        "YES: 2 real calls during rehearsal")
    assert lines["Which configuration of the select curve succeeded most?"] == (
        "none beat N = 0 (1.00); select parallel N=1 tied it")
    assert lines["Is this a measurement of rehearsal's effect?"].startswith("1 tasks, one run")
    assert lines["Did choosing among imagined attempts cut the failed real calls?"] == (
        "N = 0: 0.00 failed real calls per episode; no configuration had fewer")
    curve["rules N=1"] = [row(0.0, leaked=3)]
    assert dict(rehearsal_lines(committed, curve, baseline=BASE))["What did rehearsal cost?"] \
        .endswith("; and 3 real calls during rehearsal, a defect")
    with pytest.raises(KeyError):
        rehearsal_lines(committed, curve, baseline="N = 0")


def test_training_lines_follow_the_signs_and_the_signal():
    own = [{"nonzero_adv_group_frac": 0.0, "reward/mean": 0.25, "tool_calls": 3,
            "rehearse/outputs": 3, "real_calls": 0},
           {"nonzero_adv_group_frac": 0.5, "reward/mean": 0.75, "tool_calls": 1,
            "rehearse/outputs": 1, "real_calls": 0}]
    lines = dict(training_lines(loss_gap=2e-7, grad_gap=3e-6, gain=0.012,
                                moved=[(0.5, 0.1), (-0.5, -0.2), (0.5, -0.01), (0.0, 0.3)],
                                own=own, model="m", mode_rewards={"shared": 0.1234}))
    assert lines["Does the hand loss and gradient equal the TRL trainer's?"] == (
        "loss gap 2.0e-07, gradient gap 3.0e-06: equal (< 1e-5): the trainer computes exactly "
        "the loss written above")
    # A ≠ 0 on 3 outputs; 2 of them moved with its sign
    assert lines["Did one optimizer step move each output with the sign of its advantage?"] == (
        "2 of 3 outputs with A ≠ 0 moved with its sign; Σ A·Δ log-prob rose by 1.2e-02")
    assert lines["Did the profile's own run (m, 2 steps) call tools?"] == (
        "yes: 4 tool calls, 4 imagined observations, 0 real calls")
    assert lines["Did it have a learning signal?"] == (
        "yes, on 1 of 2 steps: rewards differed inside a group; training reward 0.25 to 0.75")
    assert lines["The modes under one budget"].startswith("shared: 0.123: a few fresh steps")
    quiet = dict(training_lines(loss_gap=1e-3, grad_gap=0.0, gain=-1.0, moved=[], model="m",
                                own=[{"nonzero_adv_group_frac": 0.0, "reward/mean": 0.0}],
                                mode_rewards=None))
    assert quiet["Does the hand loss and gradient equal the TRL trainer's?"].endswith(
        "NOT equal (over 1e-5)")
    assert quiet["Did the profile's own run (m, 1 steps) call tools?"].startswith("no: its")
    assert quiet["Did it have a learning signal?"].startswith("no: every trajectory")
    assert quiet["The modes under one budget"] == "skipped"


# ---------------------------------------------------------------------------------------------
# Notebooks 05 and 04, whole, under smoke with a scripted policy that calls tools
# ---------------------------------------------------------------------------------------------

def scripted_policy(tok):
    """ACT: one get_order_details call with the ticket's order id (and its '#'; on a suite
    without that tool, its first tool), then a reply that repeats the last tool response;
    REHEARSE: a record; FEEDBACK and MEMORY: tagged text."""

    def answer(role, prompt):
        text = tok.decode(prompt)
        if role == "act":
            if "<tool_response>" in text:
                last = text.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0]
                return f"Here is what I found: {last.strip()[:200]}"
            tools = re.search(r"<tools>\n(.*?)</tools>", text, re.S)[1]
            if "get_order_details" not in tools:  # another suite: its first tool, no arguments
                name = re.search(r'"name": "(\w+)"|^\s*(\w+)\(', tools, re.M)
                return assistant_text([ToolCall(name[1] or name[2], {})])
            ids = re.findall(r"#?W\d{7}", text)
            order = "#" + ids[-1].lstrip("#") if ids else "#W0000000"
            return assistant_text([ToolCall("get_order_details", {"order_id": order})])
        if role == "rehearse":
            return rehearsal_text('{"order_id": "#W0000001", "status": "pending"}')
        if role == "feedback":
            return "<assessment>The call reads the order.</assessment><revision>Keep it.</revision>"
        return "<memory>Read the order with its '#' first.</memory>"
    return answer


def run_whole(name: str, params: dict) -> dict:
    """Every code cell of a notebook from its parameters cell on, in one namespace, with the
    parameters overridden (papermill's way) and magics skipped."""
    import matplotlib

    matplotlib.use("Agg")
    cells = [c for c in nbformat.read(str(NOTEBOOKS_DIR / f"{name}.ipynb"), as_version=4).cells
             if c.cell_type == "code"]
    first = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    space: dict = {}
    exec(compile(cells[first].source, "<parameters>", "exec"), space)  # noqa: S102 (our own)
    space.update(params)
    for c in cells[first + 1:]:
        src = "\n".join(x for x in c.source.splitlines() if not x.startswith("%"))
        exec(compile(src, f"<{name}>", "exec"), space)  # noqa: S102
    return space


@pytest.mark.slow
def test_notebook_05_summary_states_its_own_run(tmp_path, monkeypatch):
    import envace_lite.llm.generation as generation

    monkeypatch.setattr(generation, "HFGenerator",
                        lambda model, tok, seed=0: ScriptedGenerator(scripted_policy(tok), tok))
    ns = run_whole("05_private_rehearsal", {"profile": "smoke", "run_dir": str(tmp_path),
                                            "select_ns": "1,2"})
    lines, by_mode, controls = dict(ns["saw"]), ns["by_mode"], ns["controls"]
    assert by_mode["tool calls"].sum() > 0 and by_mode["imagined observations"].sum() > 0
    assert lines["Did an imagined attempt reach the real environment?"] == (
        f"no: 0 real calls during rehearsal; all {by_mode['real calls'].sum()} real calls came "
        "from the committed runs")
    assert lines["Did the policy call tools, and did REHEARSE imagine their results?"] == (
        f"yes: {by_mode['tool calls'].sum()} tool calls in the committed runs "
        f"({by_mode['failed real calls'].sum()} of them failed), "
        f"{by_mode['imagined observations'].sum()} imagined observations in the attempts")
    reward = by_mode["mean reward"]
    memory = lines["Did rehearsal with the paper's memory change the committed reward?"]
    assert memory.startswith(f"none {reward['none']:.2f}, parallel {reward['parallel']:.2f}, "
                             f"sequential {reward['sequential']:.2f}: ")
    assert memory.endswith(f"a non-empty memory in "
                           f"{by_mode.drop('none')['episodes with a memory'].sum()} of 4 "
                           "rehearsed episodes")
    success = controls["success"]
    best = lines["Which configuration of the select curve succeeded most?"]
    if success.max() == 0:
        assert best.startswith("none: every configuration")
    elif success.max() == success[BASE]:
        assert best.startswith(f"none beat N = 0 ({success[BASE]:.2f})")
    else:
        assert best.endswith(f": {success.max():.2f} against {success[BASE]:.2f} at N = 0")
        assert all(label in best for label in success.index[success == success.max()])
    failed = controls["failed real calls / episode"]
    assert lines["Did choosing among imagined attempts cut the failed real calls?"].startswith(
        f"N = 0: {failed[BASE]:.2f} failed real calls per episode; " + (
            "no configuration had fewer" if failed.drop(BASE).min() >= failed[BASE] else
            f"fewest with rehearsal: {failed.drop(BASE).min():.2f}"))
    tokens = controls["generated tokens / episode"]
    assert lines["What did rehearsal cost?"].startswith(
        f"{tokens[BASE]:.0f} generated tokens per episode at N = 0, up to {tokens.max():.0f}")


@pytest.mark.slow
def test_notebook_04_summary_states_its_own_run(tmp_path, monkeypatch):
    import envace_lite.pipelines.train as train_mod

    real_train = train_mod.train

    def scripted_train(cfg, run_dir=None, resume=True, **kw):
        from envace_lite.models.load import load_policy

        _, tok = load_policy(cfg)
        return real_train(cfg, run_dir, resume,
                          generator=ScriptedGenerator(scripted_policy(tok), tok), **kw)

    monkeypatch.setattr(train_mod, "train", scripted_train)
    ns = run_whole("04_training_with_trl", {"profile": "smoke", "run_dir": str(tmp_path),
                                            "steps": 2, "modes": "shared"})
    lines, own = dict(ns["saw"]), ns["rows_own"]
    calls = sum(r["tool_calls"] for r in own)
    assert calls > 0
    assert lines[f"Did the profile's own run ({ns['run_cfg'].model.name}, {len(own)} steps) "
                 "call tools?"] == (
        f"yes: {calls} tool calls, {sum(r['rehearse/outputs'] for r in own)} imagined "
        f"observations, {sum(r['real_calls'] for r in own)} real calls")
    signal = [r["nonzero_adv_group_frac"] or 0 for r in own]
    assert lines["Did it have a learning signal?"].startswith(
        f"yes, on {sum(s > 0 for s in signal)} of {len(own)} steps" if any(signal) else
        f"no: every trajectory of a task got the same reward on all {len(own)} steps")
    assert lines["Does the hand loss and gradient equal the TRL trainer's?"].startswith(
        f"loss gap {ns['loss_gap']:.1e}, gradient gap {ns['grad_gap']:.1e}: equal")
    moved = ns["moved"]
    agree = int((((moved["Δ mean log-prob"] > 0) == (moved["A"] > 0)) & (moved["A"] != 0)).sum())
    assert lines["Did one optimizer step move each output with the sign of its advantage?"] \
        .startswith(f"{agree} of {int((moved['A'] != 0).sum())} outputs")
    summary = ns["summary"]["mean reward/mean"]
    assert lines["The modes under one budget"].startswith(f"shared: {summary['shared']:.3f}")
    json.dumps(ns["saw"])  # plain strings, as the HTML hand-out shows them
