"""The learning experiment of the ``micro`` profile: warm start, then EnvACE, with
held-out checks on the way.

One run (``run_experiment``) does, for one seed and one training mode::

    tokenizer + SFT warm start          (sft.warmstart; skipped when a warm start is given)
    held-out check  "before_sft"        (the seeded random-init model)
    held-out check  "after_sft"         (the warm start, step 0)
    role-wise GRPO, in segments         (train.train, resumed segment by segment)
    held-out check  after each segment  ("after_envace" at the last step)

A held-out check (``heldout_point``) measures two things on TEST tasks the policy never trained
on, so that it tells learning apart from memorising the training tasks:

* the committed-execution reward: ``evaluate.evaluate`` without rehearsal, greedy, in the real
  adapter, scored by the benchmark's own evaluator (paper Table 3's Non-TTS setting);
* rehearsal fidelity: ``fidelity.audit`` on gold (h_t, a_t) pairs of test tasks, grounding
  ``<unavailable>``: exact match and error/no-error agreement of ô_t with the real o_t.

The training curve itself is ``metrics.jsonl``'s ``reward/mean``: the checklist reward of the
training tasks' rollouts under rehearsal (no real environment), at sampling temperature
``rollout.temperature``. The three numbers are different quantities and are labelled so
everywhere (``CURVE_LABELS``).

``summarize_seeds`` gives the learning-curve test: the mean training reward of the first and last
``window`` steps per run, the gap, its mean over seeds and its standard error.

Usage::

    envace-lite experiment --profile micro --seed 0 --mode shared --out runs/experiment/s0
    envace-lite experiment --profile micro --seed 1 --warmstart runs/experiment/s0/warmstart ...
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from envace_lite.config import Config, ConfigError, first_tasks
from envace_lite.pipelines import heldout_background as heldout_bg
from envace_lite.pipelines.heldout_background import SNAPSHOTS
from envace_lite.pipelines.tables import is_error
from envace_lite.progress import get_logger

log = get_logger(__name__)

CURVE_LABELS = {
    "train": "training-task reward under rehearsal (sampled, no real env)",
    "heldout_reward": "held-out committed-execution reward (real env, greedy)",
    "heldout_fidelity": "held-out rehearsal fidelity (exact match, gold pairs)",
}
"""What each plotted quantity is, in words (so that no plot claims more than it measures)."""

STAGES = ("before_sft", "after_sft", "after_envace")


def heldout_point(cfg: Config, checkpoint: str, stage: str, step: int, *, eval_limit: int,
                  fidelity_limit: int, seed: int = 0) -> dict[str, Any]:
    """One held-out check of a policy on test tasks of ``cfg.eval.suites``.

    Args:
        cfg: the run config (profile budgets, rendering).
        checkpoint: a checkpoint folder, or ``"base"`` for the profile's untrained model.
        stage: a label (``before_sft``, ``after_sft``, ``step``, ``after_envace``).
        step: the GRPO step of the checkpoint (0 before RL).
        eval_limit: test tasks per suite for the committed execution.
        fidelity_limit: test tasks per suite whose gold pairs the fidelity audit uses.
        seed: sampling seed of the loaded generator (decoding is greedy here).

    Returns:
        ``{"stage", "step", "committed_reward" (mean over the scored tasks, in [0, 1]),
        "tasks" (scored), "errors", "error_tasks" (episodes that ended in an error,
        ``tables.is_error``: counted apart, in no score and not in ``per_task``),
        "tool_call_share" (share of tasks with ≥ 1 real call), "fidelity_exact",
        "fidelity_error_agreement", "fidelity_pairs", "seconds", "per_task",
        "failed_real_calls"}``.
    """
    from envace_lite.pipelines.evaluate import as_policy, evaluate
    from envace_lite.pipelines.fidelity import audit

    start = time.perf_counter()
    c = copy.deepcopy(cfg)
    c.run.progress = False
    policy = as_policy(checkpoint, c, seed=seed)
    rows = evaluate(policy, list(c.eval.suites), cfg=c, limit=eval_limit, decoding="greedy",
                    rehearsal="none", seed=seed)
    scored = [r for r in rows if not is_error(r)]  # a crashed episode is no failure: apart
    errors = [f"{r['suite']}|{r['task_id']}" for r in rows if is_error(r)]
    if errors:
        log.warning("held-out %s (step %d): %d of %d episodes ended in an error and are left "
                    "out of the score: %s", stage, step, len(errors), len(rows),
                    ", ".join(errors[:5]) + (" ..." if len(errors) > 5 else ""))
    rewards = [float(r["reward"] or 0.0) for r in scored]
    report = audit((policy.generator, policy.tokenizer), list(c.eval.suites), c,
                   limit=fidelity_limit, sources=("gold",), upper_bound=False)
    held = report["held_out"]["overall"]
    point = {
        "stage": stage, "step": step,
        "committed_reward": statistics.fmean(rewards) if rewards else None,
        "tasks": len(scored), "errors": len(errors), "error_tasks": errors,
        "tool_call_share": (sum(1 for r in scored if r.get("real_calls", 0) > 0) / len(scored)
                            if scored else None),
        "fidelity_exact": held["exact_match"], "fidelity_error_agreement": held["error_agreement"],
        "fidelity_pairs": held["pairs"], "seconds": round(time.perf_counter() - start, 1),
        # per task, for paired bootstrap CIs between checkpoints and modes (same task ids)
        "per_task": {f"{r['suite']}|{r['task_id']}": float(r["reward"] or 0.0) for r in scored},
        "failed_real_calls": (statistics.fmean(r.get("failed_real_calls", 0) for r in scored)
                              if scored else None),
    }
    log.info("held-out %s (step %d): committed reward %s on %d tasks, fidelity exact %s / error "
             "agreement %s on %d pairs, %.0f s", stage, step, point["committed_reward"],
             point["tasks"], held["exact_match"], held["error_agreement"], held["pairs"],
             point["seconds"])
    return point


def _segments(steps: int, every: int) -> list[int]:
    """Step counts at which a training segment ends: every ``every`` steps, and ``steps``."""
    if every <= 0 or every >= steps:
        return [steps]
    return sorted({*range(every, steps, every), steps})


RL_STAGES = ("step", "after_envace")


def settle_points(points: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    """The held-out points of a run whose GRPO training ends at ``total`` steps, one per step.

    A run extended past its old last step (a rerun with more ``grpo.steps``) holds that step's
    point as ``after_envace``; it becomes a ``step`` point, and only the point at ``total`` is
    ``after_envace``. When one RL step holds two points (the same checkpoint measured twice, as
    extensions did before this rule), the first is kept and the drop is logged. Points before RL
    (``before_sft``, ``after_sft``) are kept as they are.

    Args:
        points: held-out points in measurement order, each with ``stage`` and ``step``.
        total: the run's GRPO step count (``grpo.steps``).

    Returns:
        A new list sorted by step, then stage (``_point_order``); the dicts are relabelled in
        place.

    Raises:
        ConfigError: an RL point past ``total``: the run was trained further than this config
            asks, and shortening it would mix two runs in one summary (use a new folder).
    """
    past = sorted({p["step"] for p in points if p["stage"] in RL_STAGES and p["step"] > total})
    if past:
        raise ConfigError(f"this run folder holds held-out points at GRPO steps {past}, past "
                          f"grpo.steps={total}: a run is extended, never shortened; pass "
                          f"grpo.steps >= {past[-1]} or use a new --out")
    kept, seen = [], set()
    for p in points:
        if p["stage"] in RL_STAGES:
            if p["step"] in seen:
                log.warning("held-out point at step %d measured twice; keeping the first",
                            p["step"])
                continue
            seen.add(p["step"])
            p["stage"] = "after_envace" if p["step"] == total else "step"
        kept.append(p)
    return sorted(kept, key=_point_order)


POINT_STAGES = ("before_sft", "after_sft", *RL_STAGES)
"""Every held-out stage, in the order points of one step are listed."""


def _point_order(p: dict[str, Any]) -> tuple[int, int]:
    """Sort key of a held-out point: its step, then its stage (``POINT_STAGES``)."""
    stage = p["stage"]
    return p["step"], POINT_STAGES.index(stage) if stage in POINT_STAGES else len(POINT_STAGES)


def run_experiment(config: Config, out: str | Path, *, warmstart_dir: str | Path | None = None,
                   heldout_every: int = 0, eval_limit: int | None = None,
                   fidelity_limit: int = 3, before_sft: bool = True,
                   background_heldout: bool = False) -> dict[str, Any]:
    """One micro learning run: warm start (or reuse one), held-out checks, GRPO in segments.

    Writes into ``out``: ``warmstart/`` (unless ``warmstart_dir`` is given), ``train/`` (the
    GRPO run dir: ``metrics.jsonl``, checkpoints), ``heldout.json`` (the held-out points, in
    order) and ``summary.json`` (the points, the first/last-window training reward, wall times,
    and ``study.reward_control``, so that a control run is never read as the mode's own run).
    A rerun into the same ``out`` resumes: finished held-out points are kept, training resumes
    from its last checkpoint. A rerun with more ``grpo.steps`` extends the run: the old last
    step's ``after_envace`` point becomes a ``step`` point (it is not measured again), whatever
    ``heldout_every`` is, and the new last step gets the one ``after_envace`` point
    (``settle_points``). Training keeps only its last checkpoint, so a rerun with a finer
    ``heldout_every`` cannot measure steps the run had already passed: those points are skipped,
    with a logged warning.

    Args:
        config: the finalized ``Config`` (the entry point resolves it once).
        out: the run folder.
        warmstart_dir: an existing warm-start run dir (its ``checkpoint/`` is the start policy);
            None runs ``sft.warmstart`` into ``out/warmstart``.
        heldout_every: a held-out check every this many GRPO steps (0: only at the end).
        eval_limit: test tasks per suite for the committed reward (default ``eval.limit``;
            0 = all).
        fidelity_limit: test tasks per suite for the fidelity audit's gold pairs (0 = all).
        before_sft: measure the untrained base (``before_sft``). False skips that point (it is
            the same for every run on one base, and under ``study.pretrain`` a config whose
            tokenizer corpus differs from the warm start's would train a base of its own just for
            it); the summary then has no ``before_sft`` point.
        background_heldout: run the held-out checks of ``after_sft`` and of the intermediate
            steps in a second process (one torch thread) while training goes on, and only the
            last one in this process. An intermediate checkpoint is first copied, weights and
            tokenizer only, to ``out/heldout_snapshots/`` (training keeps only its last
            checkpoint), and the copy is deleted once its point is saved; a rerun measures a
            point whose copy is left from an interrupted run. The points are the same checks;
            greedy decoding on one thread may round differently from the thread count of this
            process.

    Returns:
        The summary dict (also written to ``out/summary.json``).

    Raises:
        ConfigError: a negative ``eval_limit`` or ``fidelity_limit``, an ``out`` made under a
            config that changes results (``resume.check_resume_config``; a longer ``grpo.steps``
            may change), or an ``out`` trained or measured past ``grpo.steps`` (a shortened
            run), before anything runs; another live process holds ``out``'s lock.
    """
    from envace_lite.paths import run_folder_lock
    from envace_lite.pipelines.resume import RESUME_FREE, check_resume_config

    cfg = copy.deepcopy(config)
    eval_limit = cfg.eval.limit if eval_limit is None else eval_limit
    first_tasks([], eval_limit, "eval_limit"), first_tasks([], fidelity_limit, "fidelity_limit")
    out = Path(out)
    # a rerun under settings that change results is refused before anything is written (the
    # recorded config holds the warm start's checkpoint, set below)
    check_resume_config(out, cfg, RESUME_FREE + ("model.checkpoint",), ())
    out.mkdir(parents=True, exist_ok=True)
    with run_folder_lock(out, "experiment"):
        return _run_experiment(cfg, out, warmstart_dir, heldout_every, eval_limit,
                               fidelity_limit, before_sft, background_heldout)


def _background_point(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """``heldout_point`` as the background process runs it: looked up there, by name, so that
    the call pickles whatever wraps ``heldout_point`` in this process."""
    return heldout_point(*args, **kwargs)


def _run_experiment(cfg: Config, out: Path, warmstart_dir: str | Path | None, heldout_every: int,
                    eval_limit: int, fidelity_limit: int, before_sft: bool,
                    background_heldout: bool = False) -> dict[str, Any]:
    """``run_experiment``'s work, after its checks and under the folder's lock."""
    from concurrent.futures import Future

    pending: dict[Future, Path | None] = {}
    pool: list[Any] = []  # the background process pool, made at the first background point
    try:
        return _run_segments(cfg, out, warmstart_dir, heldout_every, eval_limit, fidelity_limit,
                             before_sft, background_heldout, pending, pool)
    finally:
        for p in pool:
            p.shutdown(wait=True, cancel_futures=True)


def _run_segments(cfg: Config, out: Path, warmstart_dir: str | Path | None, heldout_every: int,
                  eval_limit: int, fidelity_limit: int, before_sft: bool, background: bool,
                  pending: dict[Any, Path | None], pool: list[Any]) -> dict[str, Any]:
    """The warm start, held-out points and GRPO segments of ``_run_experiment``."""
    import shutil

    from envace_lite.pipelines.resume import CHECKPOINT
    from envace_lite.pipelines.sft import warmstart
    from envace_lite.pipelines.resume import checkpoint_step, last_checkpoint, relocate
    from envace_lite.pipelines.train import read_metrics, train

    seed = cfg.run.seed
    times: dict[str, float] = {}
    points_path = out / "heldout.json"
    total, run_dir = cfg.grpo.steps, out / "train"
    points: list[dict[str, Any]] = (json.loads(points_path.read_text())["points"]
                                    if points_path.exists() else [])
    last = last_checkpoint(run_dir)
    trained = checkpoint_step(last) if last is not None else 0
    if trained > total:
        raise ConfigError(f"{run_dir} is already trained to step {trained}, past "
                          f"grpo.steps={total}: a run is extended, never shortened; pass "
                          f"grpo.steps >= {trained} or use a new --out")

    def save() -> None:
        points_path.write_text(json.dumps({"labels": CURVE_LABELS, "points": points}, indent=1))

    def measured(stage: str, step: int) -> bool:
        # an RL step counts once, whatever its label (settle_points gave it the right one)
        return any(p["step"] == step and (p["stage"] == stage or
                                          (stage in RL_STAGES and p["stage"] in RL_STAGES))
                   for p in points)

    if points:
        points = settle_points(points, total)
        save()

    def keep(p: dict[str, Any]) -> None:
        points.append(p)
        points.sort(key=_point_order)
        save()

    def point(checkpoint: str, stage: str, step: int, later: bool = False) -> None:
        if measured(stage, step):
            return
        kwargs = {"eval_limit": eval_limit, "fidelity_limit": fidelity_limit, "seed": seed}
        if not (background and later):
            keep(heldout_point(cfg, checkpoint, stage, step, **kwargs))
            return
        snap = None
        if Path(checkpoint).parent == run_dir / "checkpoints":  # training deletes it later
            snap = heldout_bg.snapshot(Path(checkpoint), out / SNAPSHOTS / Path(checkpoint).name)
            checkpoint = str(snap)
        if not pool:
            pool.append(heldout_bg.background_pool())
        # a copy: the call is pickled for the other process later, after cfg may have changed
        pending[pool[0].submit(_background_point, copy.deepcopy(cfg), checkpoint, stage, step,
                               **kwargs)] = snap

    try:
        start = time.perf_counter()
        if warmstart_dir is None:
            ws = out / "warmstart"
            if not (ws / CHECKPOINT / "config.json").exists():
                warmstart(cfg, ws, measure=False)
            times["warmstart"] = round(time.perf_counter() - start, 1)
        else:
            ws = Path(warmstart_dir)
        t = time.perf_counter()
        if before_sft:
            point("base", "before_sft", 0)
        point(str(ws / CHECKPOINT), "after_sft", 0, later=total > 0)
        times["heldout_before"] = round(time.perf_counter() - t, 1)

        cfg.model.checkpoint = str(ws / CHECKPOINT)
        relocate(run_dir, cfg.model.checkpoint)
        t = time.perf_counter()
        for end in _segments(total, heldout_every):
            if end < trained:  # a segment this run has passed: nothing to train
                snap = out / SNAPSHOTS / f"checkpoint-{end}"
                if not measured("step", end) and snap.exists():  # copied before an interruption
                    point(str(snap), "step", end)
                    shutil.rmtree(snap, ignore_errors=True)
                elif not measured("step", end):
                    log.warning("no held-out point at step %d: %s was already trained to step "
                                "%d and keeps only its last checkpoint", end, run_dir, trained)
                continue
            seg = copy.deepcopy(cfg)
            seg.grpo.steps = end
            train(seg, run_dir)
            stage = "after_envace" if end == total else "step"
            t_eval = time.perf_counter()
            heldout_bg.collect(pending, keep, wait=end == total)  # the last waits for them
            point(str(run_dir / "checkpoints" / f"checkpoint-{end}"), stage, end,
                  later=end < total)
            times["heldout_during"] = times.get("heldout_during", 0.0) + round(
                time.perf_counter() - t_eval, 1)
    except BaseException:  # Ctrl-C, a crash: keep the points the worker finished
        kept = heldout_bg.collect_finished(pending, keep)
        if kept:
            log.warning("interrupted: kept %d held-out point(s) the background worker had "
                        "finished, in %s", kept, points_path)
        raise
    heldout_bg.collect(pending, keep, wait=True)
    with contextlib.suppress(OSError):  # empty once every copied checkpoint is measured
        (out / SNAPSHOTS).rmdir()
    times["train_and_checks"] = round(time.perf_counter() - t, 1)
    times["total"] = round(time.perf_counter() - start, 1)
    rewards = [r.get("reward/mean") for r in read_metrics(run_dir)]
    summary = {"profile": cfg.profile, "seed": seed, "mode": cfg.grpo.mode,
               "reward_control": cfg.study.reward_control, "steps": total,
               "background_heldout": background, "warmstart": str(ws),
               "labels": CURVE_LABELS, "points": points,
               "window": window_means(rewards), "seconds": times}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    cfg.save(out)
    return summary


def window_means(rewards: list[float | None], window: int = 10) -> dict[str, Any]:
    """Mean training reward of the first and last ``window`` steps (None rewards skipped).

    Returns:
        ``{"window", "first", "last", "gap" (last − first)}``; means are None when a window
        holds no reward.
    """
    vals = [r for r in rewards if r is not None]
    first = statistics.fmean(vals[:window]) if vals[:window] else None
    last = statistics.fmean(vals[-window:]) if vals[-window:] else None
    gap = last - first if first is not None and last is not None else None
    return {"window": window, "first": first, "last": last, "gap": gap}


def summarize_seeds(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Across seeds: the first/last-window gaps, their mean and standard error.

    The test of the learning curve: the last window beats the first on every seed, or the mean
    gap exceeds 2 standard errors (SE = sample std / sqrt(n), n ≥ 2).

    Returns:
        ``{"seeds", "gaps", "mean_gap", "se", "all_positive", "passes"}``.
    """
    gaps = [s["window"]["gap"] for s in summaries if s["window"]["gap"] is not None]
    mean = statistics.fmean(gaps) if gaps else None
    se = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) >= 2 else None
    all_pos = bool(gaps) and all(g > 0 for g in gaps)
    two_se = mean is not None and se is not None and mean > 2 * se
    return {"seeds": [s["seed"] for s in summaries], "gaps": gaps, "mean_gap": mean, "se": se,
            "all_positive": all_pos, "passes": all_pos or two_se}


def ship(out: str | Path, dest: str | Path, command: str, commit: str | None = None) -> Path:
    """Copy a finished run's small results into ``dest`` as shipped reference results.

    Copies ``train/metrics.jsonl``, ``heldout.json`` and ``summary.json`` (no checkpoints) and
    writes ``meta.json``: profile, seed, mode, steps, reward control, commit (``commit``, else
    this checkout's ``paths.git_commit()``), the command, the date and ``"source": "shipped"``.

    Raises:
        FileNotFoundError: ``out`` has no ``summary.json`` (the run did not finish).
    """
    import shutil

    from envace_lite.paths import git_commit

    out, dest = Path(out), Path(dest)
    summary = json.loads((out / "summary.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "train" / "metrics.jsonl", dest / "metrics.jsonl")
    for name in ("heldout.json", "summary.json"):
        shutil.copy(out / name, dest / name)
    meta = {k: summary[k] for k in ("profile", "seed", "mode", "steps")}
    meta["reward_control"] = summary.get("reward_control", "none")  # absent: no control
    meta |= {"commit": commit or git_commit(), "command": command, "source": "shipped",
             "date": time.strftime("%Y-%m-%d"), "seconds": summary["seconds"]}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))
    return dest


__all__ = ["CURVE_LABELS", "STAGES", "heldout_point", "run_experiment", "ship", "summarize_seeds",
           "window_means"]
