"""Paired bootstrap CIs (``envace_lite.pipelines.stats``), with values worked out by hand."""
from __future__ import annotations

import pytest

from envace_lite.pipelines.stats import bootstrap_mean, paired_bootstrap, per_tier, tier_of


def test_paired_bootstrap_three_tasks_by_hand():
    # diffs (after - before) = [1, 0, 0]: mean 1/3. A resample of 3 draws has mean k/3 where k
    # counts the draws of task a: P(k=0) = (2/3)^3 = 0.296 > 2.5 %, so the 2.5 % quantile is 0;
    # P(k=3) = 1/27 = 3.7 % > 2.5 %, so the 97.5 % quantile is 1.
    r = paired_bootstrap({"a": 0.0, "b": 0.0, "c": 1.0}, {"a": 1.0, "b": 0.0, "c": 1.0})
    assert r["tasks"] == 3
    assert r["before"] == pytest.approx(1 / 3) and r["after"] == pytest.approx(2 / 3)
    assert r["diff"] == pytest.approx(1 / 3)
    assert (r["lo"], r["hi"]) == (0.0, 1.0)
    assert r["excludes_zero"] is False


def test_paired_bootstrap_constant_gain_and_pairing():
    before = {f"t{i}": 0.0 for i in range(20)}
    after = {f"t{i}": 1.0 for i in range(20)} | {"extra": 0.0}  # unpaired key is ignored
    r = paired_bootstrap(before, after)
    assert (r["tasks"], r["diff"], r["lo"], r["hi"], r["excludes_zero"]) == (20, 1.0, 1.0, 1.0, True)
    assert paired_bootstrap(before, after, seed=3) == paired_bootstrap(before, after, seed=3)


def test_bootstrap_mean_and_errors():
    r = bootstrap_mean({"a": 1.0, "b": 1.0})
    assert (r["mean"], r["lo"], r["hi"]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="share no task"):
        paired_bootstrap({"a": 1.0}, {"b": 1.0})
    with pytest.raises(ValueError, match="at least 100"):
        paired_bootstrap({"a": 1.0}, {"a": 1.0}, resamples=10)
    with pytest.raises(ValueError, match="no values"):
        bootstrap_mean({})


def test_per_tier():
    vals = {"s|lookup:W1": 1.0, "s|lookup:W2": 0.0, "s|cancel:W1": 1.0}
    assert tier_of("s|cancel:W1") == "cancel" and tier_of("two_hop:u_1") == "two_hop"
    assert per_tier(vals) == {"cancel": {"tasks": 1, "mean": 1.0},
                              "lookup": {"tasks": 2, "mean": 0.5}}
