"""Paired bootstrap confidence intervals over tasks, and per-tier breakdowns.

Two policies evaluated on the SAME held-out tasks give paired rewards ``a[i], b[i]``. The paired
bootstrap resamples task indices with replacement and recomputes ``mean(b - a)``; the 2.5 % and
97.5 % quantiles of those means are the 95 % CI of the gain: the percentile interval (Efron &
Tibshirani 1993, ch. 13) of a paired resampling, as used to compare two systems on one test set
(Koehn 2004, "Statistical significance tests for machine translation evaluation"). A CI that excludes 0 says the gain
is larger than what task sampling alone would produce.

Usage::

    from envace_lite.pipelines.stats import paired_bootstrap
    paired_bootstrap({"t1": 0.0, "t2": 1.0}, {"t1": 1.0, "t2": 1.0})   # {"diff": 0.5, ...}
"""
from __future__ import annotations

import random
import statistics
from typing import Any


def paired_bootstrap(before: dict[str, float], after: dict[str, float], *, resamples: int = 10_000,
                     seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """The mean gain ``after - before`` over the tasks both hold, with its paired bootstrap CI.

    Args:
        before, after: task key -> reward (in [0, 1]); only keys present in both are paired.
        resamples: bootstrap resamples (>= 100).
        seed: the resampling seed (the result is deterministic for a seed).
        level: the CI's coverage, in (0, 1).

    Returns:
        ``{"tasks", "before", "after", "diff", "lo", "hi", "excludes_zero"}``; means in reward
        units (a success rate when rewards are 0/1).

    Raises:
        ValueError: no task in common, ``resamples < 100``, or ``level`` outside (0, 1).
    """
    keys = sorted(set(before) & set(after))
    if not keys:
        raise ValueError("paired_bootstrap: the two results share no task")
    if resamples < 100:
        raise ValueError(f"resamples={resamples}: use at least 100")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: use a value in (0, 1)")
    diffs = [after[k] - before[k] for k in keys]
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = means[int(tail * (resamples - 1))]
    hi = means[int(round((1.0 - tail) * (resamples - 1)))]
    return {"tasks": n, "before": statistics.fmean(before[k] for k in keys),
            "after": statistics.fmean(after[k] for k in keys), "diff": statistics.fmean(diffs),
            "lo": lo, "hi": hi, "excludes_zero": lo > 0.0 or hi < 0.0}


def bootstrap_mean(values: dict[str, float], *, resamples: int = 10_000, seed: int = 0,
                   level: float = 0.95) -> dict[str, Any]:
    """The mean of ``values`` with its (unpaired) bootstrap CI over tasks.

    Args:
        values: task key -> reward.
        resamples, seed, level: as in ``paired_bootstrap``.

    Returns:
        ``{"tasks", "mean", "lo", "hi"}``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("bootstrap_mean: no values")
    zero = dict.fromkeys(values, 0.0)
    r = paired_bootstrap(zero, values, resamples=resamples, seed=seed, level=level)
    return {"tasks": r["tasks"], "mean": r["after"], "lo": r["lo"], "hi": r["hi"]}


def tier_of(task_key: str) -> str:
    """The tier of a drill task key (``"suite|tier:entity"`` or ``"tier:entity"``)."""
    return task_key.split("|")[-1].split(":")[0]


def per_tier(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{tier: {"tasks", "mean"}}`` of drill rewards keyed by ``"suite|tier:entity"``."""
    groups: dict[str, list[float]] = {}
    for k, v in values.items():
        groups.setdefault(tier_of(k), []).append(v)
    return {t: {"tasks": len(v), "mean": statistics.fmean(v)} for t, v in sorted(groups.items())}


__all__ = ["bootstrap_mean", "paired_bootstrap", "per_tier", "tier_of"]
