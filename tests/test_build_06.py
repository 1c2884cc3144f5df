"""Notebook 06's ``build`` cells against the package, on rows whose aggregates are computed by hand.

The ``build`` cells of ``notebooks/06_evaluation_and_figures.ipynb`` are extracted and executed in
order, in a namespace that holds what the notebook's setup gives them: ``configs`` (label -> the
evaluation rows of one configuration), ``before`` and ``after`` (task key -> reward, the two
results the paired bootstrap compares). Their results (``avg_at_k``, ``per_repeat``,
``task_means``, ``ci``, ``bench_avg``, ``overall_by_hand``, ``gain``) are compared with values
written out by hand below, with ``tables.summarize`` and with ``stats.paired_bootstrap`` within
1e-6 (paper §3.1: Avg@k; the CIs: ``tables.ci95`` and ``envace_lite/pipelines/stats.py``). The shipped
drills run gives the real numbers of the notebook's own example.
"""
from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
from test_notebooks import exec_build_cells, load

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.course.shipped import reference_results
from envace_lite.pipelines.stats import paired_bootstrap
from envace_lite.pipelines.tables import summarize

NOTEBOOK = NOTEBOOKS_DIR / "06_evaluation_and_figures.ipynb"
Z = 1.959963984540054  # the 97.5 % normal quantile


def row(task: str, k: int, reward: float, suite: str = "tau2-telecom") -> dict:
    return {"suite": suite, "task_id": task, "repeat": k, "reward": reward}


def run_build_cells(configs: dict, before: dict | None = None, after: dict | None = None) -> dict:
    ns = {"configs": configs, "before": {"t": 0.0} if before is None else before,
          "after": {"t": 0.0} if after is None else after, "pd": pd}
    return exec_build_cells(NOTEBOOK, ns, at_least=6)


# name -> (rows, {suite: (Avg@k, pass rate per repeat, CI or None)}, {benchmark: Avg.}, Overall)
CASES = {
    # telecom: a = [1, 0], b = [1, 1]: repeats 2/2 and 1/2 -> 0.75; task means 0.5, 1:
    # s = sqrt(2 · 0.25²) = 0.3536, half = z · 0.3536 / sqrt(2) = z · 0.25 = 0.49, clipped at 1.
    # BFCL base: x = [0, 0], y = [1, 0]: repeats 1/2 and 0/2 -> 0.25; task means 0, 0.5: half 0.49
    # again, clipped at 0. Overall = (0.75 + 0.25) / 2.
    "k = 2, two benchmarks": (
        [row("a", 0, 1.0), row("a", 1, 0.0), row("b", 0, 1.0), row("b", 1, 1.0),
         row("x", 0, 0.0, "bfcl-base"), row("x", 1, 0.0, "bfcl-base"),
         row("y", 0, 1.0, "bfcl-base"), row("y", 1, 0.0, "bfcl-base")],
        {"tau2-telecom": (0.75, [1.0, 0.5], (0.75 - Z * 0.25, 1.0)),
         "bfcl-base": (0.25, [0.5, 0.0], (0.0, 0.25 + Z * 0.25))},
        {"tau2": 0.75, "bfcl": 0.25}, 0.5),
    # b lacks repeat 1: by repeat (2/2 + 0/1) / 2 = 0.5; the CI is over task means 0.5 and 1
    "a missing row": (
        [row("a", 0, 1.0), row("a", 1, 0.0), row("b", 0, 1.0)],
        {"tau2-telecom": (0.5, [1.0, 0.0], (0.75 - Z * 0.25, 1.0))}, {"tau2": 0.5}, 0.5),
    # the drills are in neither benchmark: no Avg., no Overall; one task: no CI
    "drills only": (
        [row("lookup:W1", 0, 1.0, "tau2-retail-drills")],
        {"tau2-retail-drills": (1.0, [1.0], None)}, {}, None),
    # a -ticket stand-in counts for tau2; tau2 Avg. = (0.5 + 1) / 2; ticket CI: means 1, 0,
    # s = sqrt(0.5), half = z · 0.5 -> clipped to [0, 1]
    "ticket suite": (
        [row("p", 0, 1.0, "tau2-retail-ticket"), row("q", 0, 0.0, "tau2-retail-ticket"),
         row("r", 0, 1.0), row("s", 0, 0.0, "bfcl-base")],
        {"tau2-retail-ticket": (0.5, [0.5], (0.0, 1.0)), "tau2-telecom": (1.0, [1.0], None),
         "bfcl-base": (0.0, [0.0], None)},
        {"tau2": 0.75, "bfcl": 0.0}, 0.375),
}


@pytest.mark.parametrize("name", list(CASES))
def test_build_cells_match_hand_computed_aggregates_and_summarize(name):
    rows, suites, benches, overall = CASES[name]
    ns = run_build_cells({"c": rows})
    summ = summarize(rows)
    for suite, (avg, per_repeat, ci) in suites.items():
        key = ("c", suite)
        assert ns["avg_at_k"][key] == pytest.approx(avg, abs=1e-6)
        assert ns["per_repeat"][key] == pytest.approx(per_repeat, abs=1e-6)
        assert summ["suites"][suite]["avg_at_k"] == pytest.approx(avg, abs=1e-6)
        assert summ["suites"][suite]["per_repeat"] == pytest.approx(per_repeat, abs=1e-6)
        if ci is None:
            assert ns["ci"][key] is None and summ["suites"][suite]["ci95"] is None
        else:
            assert ns["ci"][key] == pytest.approx(ci, abs=1e-6)
            assert summ["suites"][suite]["ci95"] == pytest.approx(ci, abs=1e-6)
    assert {b: v for (lab, b), v in ns["bench_avg"].items()} == pytest.approx(benches, abs=1e-6)
    assert {b: v["avg"] for b, v in summ["benchmarks"].items()} == pytest.approx(benches, abs=1e-6)
    if overall is None:
        assert ns["overall_by_hand"]["c"] is None and summ["overall"] is None
    else:
        assert ns["overall_by_hand"]["c"] == pytest.approx(overall, abs=1e-6)
        assert summ["overall"] == pytest.approx(overall, abs=1e-6)


def test_build_aggregates_on_random_rows_equal_summarize():
    rng = random.Random(0)
    for _ in range(30):
        rows = []
        for suite in rng.sample(["tau2-telecom", "tau2-retail-ticket", "bfcl-base",
                                 "bfcl-miss_func", "tau2-retail-drills"], rng.randint(1, 3)):
            for t in range(rng.randint(1, 6)):
                for k in range(rng.randint(1, 3)):
                    if rng.random() > 0.15:  # a few rows missing
                        rows.append(row(f"t{t}", k, float(rng.random() < 0.4), suite))
        if not rows:
            continue
        ns = run_build_cells({"c": rows})
        summ = summarize(rows)
        for suite, v in summ["suites"].items():
            assert ns["avg_at_k"]["c", suite] == pytest.approx(v["avg_at_k"], abs=1e-9)
            got = ns["ci"]["c", suite]
            assert (got is None) == (v["ci95"] is None)
            assert got is None or got == pytest.approx(v["ci95"], abs=1e-9)
        assert (ns["overall_by_hand"]["c"] is None) == (summ["overall"] is None)


# (before, after, (diff, lo, hi)), by hand; with 10,000 resamples an outcome of probability
# >= 3.7 % always reaches the 2.5 % and 97.5 % quantiles
PAIRED_CASES = {
    # no change: every resample mean is 0
    "equal": ({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}, (0.0, 0.0, 0.0)),
    # the same gain on every task
    "constant gain": ({k: 0.0 for k in "abcd"}, {k: 0.5 for k in "abcd"}, (0.5, 0.5, 0.5)),
    # d = [0, 1]: a resample mean is 0 or 1 with probability 1/4 each -> [0, 1]
    "two tasks": ({"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, (0.5, 0.0, 1.0)),
    # d = [1, 1, 0] (d, only in `after`, is not paired): P(mean 0) = 1/27 = 3.7 % -> lo 0;
    # P(mean 1) = 8/27 -> hi 1
    "unpaired key ignored": ({"a": 0.0, "b": 0.0, "c": 1.0},
                             {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, (2 / 3, 0.0, 1.0)),
}


@pytest.mark.parametrize("name", list(PAIRED_CASES))
def test_build_paired_bootstrap_matches_hand_values_and_the_package(name):
    before, after, (diff, lo, hi) = PAIRED_CASES[name]
    ns = run_build_cells({"c": [row("a", 0, 1.0)]}, before, after)
    assert (ns["gain"]["diff"], ns["gain"]["lo"], ns["gain"]["hi"]) == pytest.approx(
        (diff, lo, hi), abs=1e-6)
    pkg = paired_bootstrap(before, after)
    assert (pkg["diff"], pkg["lo"], pkg["hi"]) == pytest.approx((diff, lo, hi), abs=1e-6)


def test_build_paired_bootstrap_on_random_results_equals_the_package():
    rng = random.Random(1)
    for _ in range(5):
        keys = [f"t{i}" for i in range(rng.randint(2, 40))]
        before = {k: float(rng.random() < 0.3) for k in keys}
        after = {k: float(rng.random() < 0.5) for k in keys}
        ns = run_build_cells({"c": [row("a", 0, 1.0)]}, before, after)
        pkg = paired_bootstrap(before, after)
        assert {k: ns["gain"][k] for k in ("diff", "lo", "hi")} == pytest.approx(
            {k: pkg[k] for k in ("diff", "lo", "hi")}, abs=1e-12)


def _build_on_shipped(drills):
    """The build cells on a shipped folder's shared s0 run: its held-out drills after SFT and
    after RL, one row per drill."""
    run = json.loads((drills.path / "shared_s0_summary.json").read_text())
    per_task = {p["stage"]: p["per_task"] for p in run["points"]}
    configs = {stage: [{"suite": k.split("|")[0], "task_id": k.split("|")[1], "repeat": 0,
                        "reward": v} for k, v in per_task[stage].items()]
               for stage in ("after_sft", "after_envace")}
    return run_build_cells(configs, per_task["after_sft"], per_task["after_envace"])


def test_build_on_the_shipped_drills_gives_the_shipped_numbers():
    """The notebook's real example: the shared s0 run's 120 held-out drills after SFT and RL."""
    drills = reference_results("drills_micro")
    assert drills is not None
    ns = _build_on_shipped(drills)
    key = ("after_sft", "tau2-retail-drills")
    assert ns["avg_at_k"][key] == pytest.approx(23 / 120)  # 23 of 120 drills passed after SFT
    half = Z * math.sqrt(23 * 97 / (120 * 119)) / math.sqrt(120)  # s² = T p (1 - p) / (T - 1)
    assert ns["ci"][key] == pytest.approx((23 / 120 - half, 23 / 120 + half), abs=1e-9)
    assert ns["overall_by_hand"]["after_sft"] is None  # the drills are in neither benchmark
    # the gain and its paired CI: +0.0 [-7.5, +7.5] points, as in the shipped report.json
    assert (ns["gain"]["diff"], ns["gain"]["lo"], ns["gain"]["hi"]) == pytest.approx(
        (0.0, -0.075, 0.075), abs=1e-9)


def test_build_on_the_notebooks_shipped_drills_gives_the_shipped_numbers():
    """The folder the notebook reads: the copy-warm-up policy, shared s0, after SFT and after 12
    GRPO steps (45 and 43 of 120 held-out drills)."""
    drills = reference_results("drills_rl")
    assert drills is not None
    ns = _build_on_shipped(drills)
    key = ("after_envace", "tau2-retail-drills")
    assert ns["avg_at_k"][key] == pytest.approx(43 / 120)
    half = Z * math.sqrt(43 * 77 / (120 * 119)) / math.sqrt(120)  # s² = T p (1 - p) / (T - 1)
    assert ns["ci"][key] == pytest.approx((43 / 120 - half, 43 / 120 + half), abs=1e-9)
    # the gain: 2 drills fewer of 120, and the shipped report's paired CI [-8/120, +4/120]
    assert (ns["gain"]["diff"], ns["gain"]["lo"], ns["gain"]["hi"]) == pytest.approx(
        (-2 / 120, -8 / 120, 4 / 120), abs=1e-9)
    shipped = json.loads((drills.path / "report.json").read_text())["runs"][0]
    assert (shipped["mode"], shipped["seed"]) == ("shared", 0)
    assert shipped["gain"]["diff"] == pytest.approx(ns["gain"]["diff"], abs=1e-12)


def test_build_cells_come_before_the_package_functions():
    cells = [c for c in load(NOTEBOOK).cells if c.cell_type == "code"]
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in cells]
    built = [k for k, t in enumerate(tags) if "build" in t]
    for call in ("summarize(", "paired_bootstrap("):
        first = next(k for k, c in enumerate(cells) if call in c.source)
        assert "build-check" in tags[first], call
        assert any(k < first for k in built)
    first = next(k for k, c in enumerate(cells) if "summarize(" in c.source)
    assert sum(k < first for k in built) >= 4  # the table, Avg@k, the CI, Avg. and Overall
    assert (len(built) + sum("build-check" in t for t in tags)) / len(cells) >= 0.25
