"""Tests of the training figures (envace_lite.course.plotting) and the ablation, fidelity, cost and sweep
figures (envace_lite.course.eval_figures) of notebooks 04-07, and of the course's loaders of shipped
reference results.

Default tier: synthetic rows and reports, written to a temp dir where a file is needed (never into
``data/reference_results``). Each test reads back what a figure draws: line data, bar heights,
labels and titles.
"""
from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure

from envace_lite.course import shipped
from envace_lite.course import eval_figures
from envace_lite.course import plotting


def rows(rewards, parse=None, signal=None):
    parse = parse or [0.5] * len(rewards)
    signal = signal or [1.0] * len(rewards)
    return [{"step": i + 1, "reward/mean": r, "act/parse_error_rate": p,
             "rehearse/parse_error_rate": None, "nonzero_adv_group_frac": s}
            for i, (r, p, s) in enumerate(zip(rewards, parse, signal))]


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def bar_heights(ax, label):
    [container] = [c for c in ax.containers if c.get_label() == label]
    return [round(b.get_height(), 6) for b in container]


def test_training_curves_reward_and_heldout_on_the_same_axes(tmp_path):
    run = tmp_path / "shared_s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(
        [0.0, 0.2, None, 0.4], parse=[1.0, 0.8, 0.6, 0.4])))
    heldout = [{"stage": "after_envace", "step": 4, "committed_reward": 0.3, "fidelity_exact": 0.1,
                "fidelity_error_agreement": 0.7},
               {"stage": "after_sft", "step": 0, "committed_reward": 0.1, "fidelity_exact": 0.05,
                "fidelity_error_agreement": None}]
    fig = plotting.plot_training_curves(run, heldout, profile="micro",
                                        source="shipped (micro, s0, abc1234)")
    assert isinstance(fig, Figure)
    ax, dx = fig.axes
    lines = lines_by_label(ax)
    reward = lines["shared: training-task reward under rehearsal"]
    assert list(reward.get_xdata()) == [1, 2, 4] and list(reward.get_ydata()) == [0.0, 0.2, 0.4]
    committed = lines["held-out committed reward (real env, Non-TTS)"]
    assert list(committed.get_xdata()) == [0, 4] and list(committed.get_ydata()) == [0.1, 0.3]
    exact = lines["held-out fidelity: exact ô = o"]
    assert list(exact.get_ydata()) == [0.05, 0.1]
    agree = lines["held-out fidelity: error agreement"]
    assert list(agree.get_xdata()) == [4]  # the None point is left out
    assert "micro" in ax.get_title() and "shipped (micro, s0, abc1234)" in ax.get_title()
    assert {t.get_text() for t in ax.texts} == {"after envace", "after sft"}
    diag = lines_by_label(dx)
    assert list(diag["ACT parse-error rate"].get_ydata()) == [1.0, 0.8, 0.6, 0.4]
    assert "REHEARSE parse-error rate" not in diag  # all None: not drawn
    assert list(diag["groups with A ≠ 0"].get_ydata()) == [1.0] * 4


def test_training_curves_smooth_and_without_heldout():
    fig = plotting.plot_training_curves(rows([0.0, 1.0, 0.0, 1.0]), profile="smoke",
                                        source="fresh", mode="act_only", smooth=2,
                                        diagnostics=False)
    [ax] = fig.axes
    line = lines_by_label(ax)["act_only: training-task reward under rehearsal (moving avg 2)"]
    assert list(line.get_ydata()) == [0.0, 0.5, 0.5, 0.5]
    assert len(ax.get_lines()) == 2  # the faint raw curve and the smoothed one; no held-out
    assert "fresh" in ax.get_title() and "smoke" in ax.get_title()


def test_mode_curves_mean_and_band_across_seeds():
    runs = {"shared": [rows([0.0, 0.4]), rows([0.2, 0.8])], "act_only": [rows([0.1, 0.1])]}
    fig = plotting.plot_mode_curves(runs, profile="micro", source="shipped (micro, s0,1, x)")
    [ax] = fig.axes
    lines = lines_by_label(ax)
    shared = lines["shared (mean of 2 seeds)"]
    assert list(shared.get_xdata()) == [1, 2]
    assert list(shared.get_ydata()) == pytest.approx([0.1, 0.6])
    assert list(lines["act_only (mean of 1 seed)"].get_ydata()) == [0.1, 0.1]
    [band] = ax.collections  # a band only where there are several seeds
    verts = band.get_paths()[0].vertices
    assert verts[:, 1].min() == pytest.approx(0.0) and verts[:, 1].max() == pytest.approx(0.8)
    assert "shipped (micro, s0,1, x)" in ax.get_title() and "micro" in ax.get_title()


def test_ablation_bars_ours_beside_the_paper():
    ours = {"shared": 30.0, "per_role": 20.0, "act_only": None}
    paper = shipped.PAPER["fig3"]["Qwen3-8B"]
    fig = eval_figures.plot_ablation(ours, profile="micro", source="fresh", paper=paper,
                                 errors={"shared": 5.0})
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "shared", "per_role", "act_only", "base", "GRPO"]
    assert bar_heights(ax, "ours: micro, fresh") == [30.0, 20.0, 0.0, 0.0, 0.0]
    assert bar_heights(ax, "paper (Qwen3-8B, τ²-Bench)") == [36.7, 35.5, 0.0, 30.0, 31.2]
    texts = [t.get_text() for t in ax.texts]
    assert "30.0" in texts and "n/a" in texts and "36.7" in texts
    assert "micro" in ax.get_title() and "fresh" in ax.get_title()


def test_ablation_without_paper():
    fig = eval_figures.plot_ablation({"shared": 12.5, "per_role": 7.5}, profile="smoke",
                                 source="fresh", ylabel="training reward (%)")
    [ax] = fig.axes
    assert bar_heights(ax, "ours: smoke, fresh") == [12.5, 7.5]
    assert ax.get_ylabel() == "training reward (%)"


def report(tools, upper=None):
    def agg(pairs, exact):
        return {"pairs": pairs, "exact_match": exact, "error_agreement": 0.5}
    rep = {"held_out": {"slices": {"tool": {t: agg(p, e) for t, (p, e) in tools.items()}}},
           "grounded_upper_bound": None}
    if upper:
        rep["grounded_upper_bound"] = {"slices": {"tool": {t: agg(p, e)
                                                           for t, (p, e) in upper.items()}}}
    return rep


def test_fidelity_by_tool_bars_sorted_by_pairs(tmp_path):
    rep = report({"ls": (3, 0.5), "cd": (7, 0.25), "mv": (3, None)}, upper={"cd": (2, 1.0)})
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(rep))
    fig = eval_figures.plot_fidelity_by_tool(path, profile="laptop", source="shipped (laptop, s0, x)")
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cd", "ls", "mv"]
    assert bar_heights(ax, "held-out, <unavailable>") == [25.0, 50.0, 0.0]
    assert bar_heights(ax, "grounded UPPER BOUND (train)") == [100.0, 0.0, 0.0]
    assert [t.get_text() for t in ax.texts] == ["n=7", "n=3", "n=3"]
    assert "exact_match" in ax.get_title() and "shipped (laptop, s0, x)" in ax.get_title()
    fig = eval_figures.plot_fidelity_by_tool(rep, profile="smoke", source="fresh",
                                         metric="error_agreement", top=1)
    [ax] = fig.axes
    assert bar_heights(ax, "held-out, <unavailable>") == [50.0]


def test_rehearsal_cost_counts_calls_and_tokens():
    base = {"real_calls": 2, "rehearsal_real_calls": 0}
    rows_ = [{**base, "rehearsal": "parallel", "n": 2, "rehearse_outputs": 4,
              "rehearsal_tokens": 100, "memory_tokens": 10},
             {**base, "rehearsal": "parallel", "n": 2, "rehearse_outputs": 2,
              "rehearsal_tokens": 50, "memory_tokens": 5},
             {**base, "rehearsal": "sequential", "n": 2, "rehearse_outputs": 1,
              "rehearsal_tokens": 30, "memory_tokens": 0}]
    fig = eval_figures.plot_rehearsal_cost(rows_, profile="smoke", source="fresh")
    ax, tx = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["parallel N=2", "sequential N=2"]
    assert bar_heights(ax, "imagined calls (REHEARSE outputs)") == [6, 1]
    assert bar_heights(ax, "real calls (committed run)") == [4, 2]
    assert bar_heights(ax, "real calls during rehearsal") == [0, 0]
    assert bar_heights(tx, "rehearsal tokens (attempts, feedback, memory)") == [150, 30]
    assert bar_heights(tx, "memory m_x tokens") == [15, 0]
    assert "smoke" in ax.get_title() and "fresh" in ax.get_title()


# ---------------------------------------------------------------------------------------------
# Shipped reference results (a SMALL placeholder in a temp dir; never committed)
# ---------------------------------------------------------------------------------------------

def placeholder(root):
    folder = root / "micro_training"
    for mode, seed, rewards in (("shared", 0, [0.1, 0.3]), ("shared", 1, [0.2, 0.4]),
                                ("act_only", 0, [0.0, 0.1])):
        run = folder / f"{mode}_s{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(rewards)))
    (folder / "not_a_run").mkdir()
    (folder / "meta.json").write_text(json.dumps({
        "profile": "micro", "seed": [0, 1], "commit": "abc1234", "command": "make micro",
        "date": "2026-11-29", "source": "shipped"}))
    (folder / "heldout.json").write_text(json.dumps({"checkpoints": [
        {"stage": "before_sft", "step": 0, "committed_reward": 0.0},
        {"stage": "after_envace", "step": 2, "committed_reward": 0.2},
        {"stage": "after_envace", "step": 2, "committed_reward": 0.1, "mode": "act_only"}]}))
    return folder


def test_reference_results_loader(tmp_path):
    folder = placeholder(tmp_path)
    assert shipped.reference_results("missing", root=tmp_path) is None
    ref = shipped.reference_results("micro_training", root=tmp_path)
    assert ref.path == folder and ref.meta["commit"] == "abc1234"
    assert ref.label == "shipped (micro, s0,1, abc1234)"
    runs = shipped.training_runs(ref.path)
    assert list(runs) == ["act_only", "shared"] and list(runs["shared"]) == [0, 1]
    assert runs["shared"][1] == folder / "shared_s1"
    assert [p["stage"] for p in shipped.heldout_points(ref.path, "shared")] == [
        "before_sft", "after_envace"]
    assert [p.get("mode") for p in shipped.heldout_points(ref.path, "act_only")] == [
        None, "act_only"]
    assert len(shipped.heldout_points(ref.path)) == 3
    assert shipped.heldout_points(tmp_path) == []
    # the loaders feed the figures directly
    fig = plotting.plot_mode_curves({m: list(s.values()) for m, s in runs.items()},
                                    profile="micro", source=ref.label)
    shared = lines_by_label(fig.axes[0])["shared (mean of 2 seeds)"]
    assert list(shared.get_ydata()) == pytest.approx([0.15, 0.35])
    bare = tmp_path / "bare"
    bare.mkdir()
    assert shipped.reference_results("bare", root=tmp_path).label == "shipped (?, s?, ?)"


def test_sweep_points_from_rows_match_plot_budget_sweep():
    def row(suite, mode, n, reward, task="t1"):
        return {"suite": suite, "task_id": task, "repeat": 0, "reward": reward,
                "rehearsal": mode, "n": n, "policy": "base",
                "rehearsal_policy": "" if mode == "none" else "base"}

    rows_ = [row("bfcl-base", "none", 0, 0.0), row("bfcl-base", "none", 0, 1.0, "t2"),
             row("bfcl-base", "parallel", 1, 1.0), row("bfcl-base", "parallel", 2, 1.0),
             row("bfcl-base", "sequential", 2, 0.0)]
    points = shipped.sweep_points(rows_)
    by = {(p["mode"], p["n"]): p for p in points}
    assert by[("none", 0)]["bfcl"] == 0.5 and by[("none", 0)]["episodes"] == 2
    assert by[("parallel", 2)]["bfcl"] == 1.0 and by[("sequential", 2)]["bfcl"] == 0.0
    assert all("rehearsal_policy" not in p for p in points)  # it rehearses itself
    fig = eval_figures.plot_budget_sweep(points, metric="bfcl")
    lines = lines_by_label(fig.axes[0])
    assert list(lines["parallel"].get_xdata()) == [1, 2]
    assert list(lines["parallel"].get_ydata()) == [100.0, 100.0]
    assert list(lines["Non-TTS"].get_ydata()) == [50.0, 50.0]


def test_paper_numbers_are_the_summary_s():
    t3 = shipped.PAPER["table3"]
    for tau2, bfcl, overall in t3.values():  # Overall = mean of the two benchmark Avg.s
        assert overall == pytest.approx((tau2 + bfcl) / 2, abs=0.06)
    assert shipped.PAPER["fig6"]["parallel"] == {1: 42.12, 2: 43.88, 3: 39.00}


def test_fidelity_by_tool_draws_the_fallback_when_every_bar_is_equal():
    # error agreement is 0.5 on every tool of report(): one value says nothing about the tools
    rep = report({"ls": (3, 0.5), "cd": (7, 0.25)})
    fig = eval_figures.plot_fidelity_by_tool(rep, profile="smoke", source="fresh",
                                         metric="error_agreement")
    [ax] = fig.axes
    assert bar_heights(ax, "held-out, <unavailable>") == [25.0, 50.0]  # exact match, cd then ls
    assert "error_agreement is 50 % on every tool" in ax.get_title()
    assert ax.get_ylabel() == "exact_match (%)"


def test_training_curves_stack_the_labels_of_stages_at_one_step():
    heldout = [{"stage": "before_sft", "step": 0, "committed_reward": 0.0},
               {"stage": "after_sft", "step": 0, "committed_reward": 0.0},
               {"stage": "after_envace", "step": 4, "committed_reward": 0.0}]
    fig = plotting.plot_training_curves(rows([0.1, 0.2, 0.3, 0.4]), heldout, profile="micro",
                                        source="fresh", diagnostics=False)
    [ax] = fig.axes
    offsets = {t.get_text(): t.xyann for t in ax.texts}
    assert offsets["before sft"] != offsets["after sft"]
    assert abs(offsets["after sft"][1] - offsets["before sft"][1]) == 10


def test_act_history_labels_stay_inside_the_axes():
    from envace_lite.types import Task, Trajectory

    traj = Trajectory(Task("t", "toy", "test", [], [], [[]], [[]], [[]], [[]]), 0,
                      act_ids=list(range(100)), act_mask=[0] * 100, act_prompt_len=10,
                      act_spans=[(1, 4), (20, 30), (97, 100)])
    fig = plotting.plot_act_history(traj)
    [ax] = fig.axes
    placed = {t.get_text(): (t.get_position()[0], t.get_ha()) for t in ax.texts}
    assert placed == {"a_0": (1, "left"), "a_1": (25.0, "center"), "a_2": (100, "right")}
