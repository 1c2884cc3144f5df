"""What a shipped drills result explains: the share of a run's held-out successes that a no-call
baseline also scores, the run's gain on the drills that baseline fails, and the write drills it
passes; and the gain of a run against another start (e.g. a warm start before a lever).

Inputs are shipped files: a run's ``summary.json`` (its held-out points, each with ``per_task``
rewards keyed ``"<suite>|<drill id>"``), a per-task file (``{"per_task": {...}}``) and the JSON of
``envace-lite drills baselines --out`` (each baseline's ``per_task``).

Usage::

    from envace_lite.drills.record import explained, per_task_of
    final = per_task_of("summary.json", step=36); start = per_task_of("summary.json", "after_sft")
    explained(final, start, baseline_per_task)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envace_lite.drills.suite import get_drill
from envace_lite.pipelines.stats import paired_bootstrap


def per_task_of(path: str | Path, stage: str | None = None, step: int | None = None) -> dict:
    """The ``per_task`` rewards of a shipped file: a per-task file's own (``stage`` and ``step``
    ignored), or the last held-out point of a summary (``{"points": [...]}``, sorted by step) at
    ``stage`` and/or ``step`` (neither: its last point).

    Raises:
        FileNotFoundError: no such file. KeyError: no point matches (the message names the
            points the file holds).
    """
    raw = json.loads(Path(path).read_text())
    if "points" not in raw:
        return dict(raw["per_task"])
    pts = [p for p in raw["points"] if (stage is None or p["stage"] == stage)
           and (step is None or p["step"] == step) and "per_task" in p]
    if not pts:
        have = [(p["stage"], p["step"]) for p in raw["points"]]
        raise KeyError(f"{path}: no held-out point at stage={stage!r} step={step!r}; it holds "
                       f"{have}")
    return dict(pts[-1]["per_task"])


def is_write(key: str) -> bool:
    """True for a ``"<suite>|<drill id>"`` key whose drill's write is allowed."""
    suite, _, drill_id = key.partition("|")
    return get_drill(suite, drill_id).write_allowed


def explained(final: dict[str, float], start: dict[str, float],
              baseline: dict[str, float], seed: int = 0) -> dict[str, Any]:
    """How much of a run's result a baseline explains, on the drills all three hold.

    Args:
        final: the run's per-task rewards at the point compared.
        start: its start (e.g. after SFT), per task.
        baseline: a baseline's per-task rewards (``drills baselines`` JSON).
        seed: the bootstrap seed (``pipelines.stats.paired_bootstrap``).

    Returns:
        ``{"tasks", "start", "final", "successes", "also_baseline", "share", "baseline_fails":
        {paired gain on the drills the baseline fails}, "write_successes"}`` (``start`` and
        ``final``: mean rewards over the drills).
    """
    keys = sorted(set(final) & set(start) & set(baseline))
    won = [k for k in keys if final[k] > 0]
    also = [k for k in won if baseline[k] > 0]
    failed = [k for k in keys if baseline[k] <= 0]
    return {
        "tasks": len(keys), "start": sum(start[k] for k in keys) / max(1, len(keys)),
        "final": sum(final[k] for k in keys) / max(1, len(keys)), "successes": len(won), "also_baseline": len(also),
        "share": len(also) / len(won) if won else None,
        "baseline_fails": paired_bootstrap({k: start[k] for k in failed},
                                           {k: final[k] for k in failed}, seed=seed)
        if failed else None,
        "write_successes": sum(1 for k in won if is_write(k)),
    }


def write_passes(paths: list[str | Path]) -> dict[str, int]:
    """Write-drill successes over every held-out point with ``per_task`` rewards in ``paths``
    (summaries, ``heldout.json`` lists of points, per-task files); files without points count 0.

    Returns:
        ``{"files", "points", "write_drills", "write_successes"}`` (``write_drills``: the write
        drills summed over the points).
    """
    out = {"files": 0, "points": 0, "write_drills": 0, "write_successes": 0}
    for path in paths:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        points = raw.get("points", [raw]) if isinstance(raw, dict) else raw
        points = [p for p in points if isinstance(p, dict) and "per_task" in p]
        out["files"] += bool(points)
        for p in points:
            writes = [k for k in p["per_task"] if is_write(k)]
            out["points"] += 1
            out["write_drills"] += len(writes)
            out["write_successes"] += sum(p["per_task"][k] > 0 for k in writes)
    return out


def pooled_gain(starts: list[dict[str, float]], finals: list[dict[str, float]],
                seed: int = 0) -> dict[str, Any]:
    """The paired gain of per-task means over several runs (e.g. two seeds): mean of ``finals``
    minus mean of ``starts`` on the drills every file holds (``pipelines.stats.paired_bootstrap``)."""
    keys = set.intersection(*(set(d) for d in starts + finals))
    mean = lambda ds: {k: sum(d[k] for d in ds) / len(ds) for k in keys}  # noqa: E731
    return paired_bootstrap(mean(starts), mean(finals), seed=seed)


def seed_task_bootstrap(starts: list[dict[str, float]], finals: list[dict[str, float]], *,
                        resamples: int = 20_000, seed: int = 0,
                        level: float = 0.95) -> dict[str, Any]:
    """The mean gain over runs (one per training seed) and drills, with a bootstrap that
    resamples seeds and drills together: each resample draws the runs with replacement, then the
    drills with replacement, and averages ``final - start`` over both. A gain then counts
    between-seed variance, which a drill-only bootstrap of per-task means treats as fixed.

    Args:
        starts, finals: per run (same order), drill key -> reward; only drills every run holds
            are used.
        resamples: bootstrap resamples (>= 100). seed: the resampling seed. level: in (0, 1).

    Returns:
        ``{"runs", "tasks", "diff", "lo", "hi", "excludes_zero", "per_run"}`` (``per_run``: each
        run's own mean gain).

    Raises:
        ValueError: no run, unequal lists, no drill in common, ``resamples < 100`` or ``level``
            outside (0, 1).
    """
    import random

    if not starts or len(starts) != len(finals):
        raise ValueError(f"seed_task_bootstrap: {len(starts)} starts for {len(finals)} finals")
    keys = sorted(set.intersection(*(set(d) for d in starts + finals)))
    if not keys:
        raise ValueError("seed_task_bootstrap: the runs share no drill")
    if resamples < 100 or not 0.0 < level < 1.0:
        raise ValueError(f"resamples={resamples}, level={level}: use >= 100 and a level in (0, 1)")
    gains = [[f[k] - s[k] for k in keys] for s, f in zip(starts, finals)]
    runs, n = len(gains), len(keys)
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        picked = [gains[rng.randrange(runs)] for _ in range(runs)]
        cols = [rng.randrange(n) for _ in range(n)]
        means.append(sum(g[c] for g in picked for c in cols) / (runs * n))
    means.sort()
    tail = (1.0 - level) / 2.0
    lo, hi = means[int(tail * (resamples - 1))], means[int(round((1.0 - tail) * (resamples - 1)))]
    per_run = [sum(g) / n for g in gains]
    return {"runs": runs, "tasks": n, "diff": sum(per_run) / runs, "lo": lo, "hi": hi,
            "excludes_zero": lo > 0.0 or hi < 0.0, "per_run": per_run}


__all__ = ["explained", "is_write", "per_task_of", "pooled_gain", "seed_task_bootstrap",
           "write_passes"]
