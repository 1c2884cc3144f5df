"""The drills reproduction's report: held-out success per mode and seed, with paired CIs.

Input: finished ``run_experiment`` folders (their ``summary.json``, which holds the held-out
points), one per (mode, seed), each evaluated on the same held-out drills (tasks are paired by
id; a mode's seeds are compared on the tasks they share). Output (``report``): for every run, its SFT
start, its final point and the paired bootstrap CI of the gain (``stats.paired_bootstrap``), per
tier; for every mode, the per-task mean over its seeds and its CI; the paired comparison of the
modes with ``shared`` on the same tasks; and, for shuffled-reward control runs
(``study.reward_control="shuffle"``, beyond the paper), the paired difference real − control on
the same warm starts: the share of RL's effect that comes from the reward's information.
``figure`` draws the whole effect: held-out success after SFT vs after each mode, seed by seed.

Usage::

    from envace_lite.drills.report import report, figure
    rep = report(["runs/drills/shared_s0", "runs/drills/per_role_s0"])
    figure(rep, "effect.png")
    table = sweep("runs/drills/sweep_none_n0", ["runs/drills/sweep_parallel_n2"])
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from envace_lite.pipelines.stats import bootstrap_mean, paired_bootstrap, per_tier
from envace_lite.types import TRAIN_MODES


def load_run(folder: str | Path, control: str | None = None) -> dict[str, Any]:
    """``{"folder", "mode", "reward_control", "group", "seed", "points", "seconds"}`` of a finished
    experiment folder.

    ``reward_control`` is the summary's (``study.reward_control``; a summary written before the
    field counts as ``"none"``), or ``control`` when given: that marks an older control run.
    ``group`` is the mode, with ``+<control>`` for a control run (``"shared+shuffle"``), so that a
    control run is never averaged into its mode's own runs.

    Raises:
        FileNotFoundError: the folder has no ``summary.json`` (the run did not finish).
    """
    folder = Path(folder)
    s = json.loads((folder / "summary.json").read_text())
    rc = control or s.get("reward_control", "none")
    return {"folder": str(folder), "mode": s["mode"], "reward_control": rc,
            "group": s["mode"] if rc == "none" else f"{s['mode']}+{rc}", "seed": s["seed"],
            "points": s["points"], "seconds": s.get("seconds", {})}


def _point(run: dict[str, Any], stage: str, optional: bool = False) -> dict[str, Any] | None:
    """The run's last held-out point of ``stage``; None for a missing ``optional`` one (e.g.
    ``before_sft`` of a run made with ``--no-before-sft``).

    Raises:
        KeyError: a missing point that is not ``optional``.
    """
    pts = [p for p in run["points"] if p["stage"] == stage]
    if not pts:
        if optional:
            return None
        raise KeyError(f"{run['folder']}: no held-out point {stage!r}")
    return pts[-1]


def _at_step(run: dict[str, Any], step: int) -> dict[str, Any]:
    """The run's held-out point at RL step ``step`` (a ``step`` or ``after_envace`` point).

    Raises:
        KeyError: the run has no point at that step; the message names the steps it has.
    """
    pts = [p for p in run["points"] if p["stage"] in ("step", "after_envace") and p["step"] == step]
    if not pts:
        have = sorted({p["step"] for p in run["points"] if p["stage"] in ("step", "after_envace")})
        raise KeyError(f"{run['folder']}: no held-out point at step {step}; it has steps {have}")
    return pts[-1]


def _pooled(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]],
            seeds: list[int]) -> dict[str, Any]:
    """Paired CI of ``b - a`` on the per-task means of the final points over ``seeds`` (each a
    key of both ``a`` and ``b``, seed -> that run's ``{"final": {task: reward}}``)."""
    return paired_bootstrap(_seed_mean([a[sd]["final"] for sd in seeds]),
                            _seed_mean([b[sd]["final"] for sd in seeds]))


def _seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """The per-task mean over seeds, on the tasks every seed holds."""
    keys = sorted(set.intersection(*(set(x) for x in per_seed)))
    return {k: statistics.fmean(x[k] for x in per_seed) for k in keys}


def _check_errors(run: dict[str, Any], points: list[dict[str, Any] | None],
                  allow: bool) -> int:
    """The error rows of the points a run is compared at; refused unless ``allow``.

    Raises:
        ValueError: a point holds episodes that ended in an error and ``allow`` is False.
    """
    bad = [(p["stage"], p["step"], p["errors"]) for p in points if p and p.get("errors")]
    if bad and not allow:
        where = ", ".join(f"{st} step {sp}: {n}" for st, sp, n in bad)
        raise ValueError(f"{run['folder']}: held-out points with episodes that ended in an error "
                         f"({where}); they are left out of the score, so the compared points "
                         "cover different tasks: rerun them, or pass --allow-errors to compare "
                         "on the tasks both scored")
    return sum(n for _, _, n in bad)


def report(folders: list[str | Path], controls: list[str | Path] = (),
           step: int | None = None, allow_errors: bool = False) -> dict[str, Any]:
    """The reproduction's numbers (see the module docstring).

    Args:
        folders: finished experiment folders, one per (mode, seed); a folder whose summary
            records ``reward_control="shuffle"`` joins the group ``<mode>+shuffle``.
        controls: folders of shuffled-reward control runs whose summaries predate the field
            (read as ``reward_control="shuffle"``).
        step: compare every run at this RL step (its ``step`` or ``after_envace`` point)
            instead of at its last ``after_envace`` point; None: the last one.
        allow_errors: compare points that hold episodes ended in an error (on the tasks both
            points scored; each run row counts them in ``errors``); refused otherwise.

    Returns:
        ``{"runs": [{mode, reward_control, group, seed, sft, final, gain (paired CI),
        per_tier_sft, per_tier_final, curve [(step, success)], failed_real_calls}], "modes":
        {group: {seeds, sft, final (CI over tasks of the per-task seed mean), gain_vs_sft
        (paired)}}, "vs_shared": {mode: paired CI of mode - shared on the per-task means over the
        seeds both ran, with those "seeds"}, "vs_control": {group:
        {"seeds", "per_seed": {seed: paired CI of real - control}, "pooled": paired CI of real -
        control on the per-task means over those seeds}}}``. A control is paired with the
        real-reward run of its mode and seed (the same warm start), at both runs' last point;
        seeds without such a run are left out of ``vs_control``. Likewise a mode is compared
        with ``shared`` on their common seeds only, and a mode with none is left out of
        ``vs_shared``.

    Raises:
        ValueError: two folders of the same group and seed (their results would be mixed),
            or a compared point with error rows without ``allow_errors``.
        KeyError: a run lacks its ``after_sft`` point, or the point at ``step``.
    """
    runs = [load_run(f) for f in folders] + [load_run(f, "shuffle") for f in controls]
    out: dict[str, Any] = {"runs": [], "modes": {}, "vs_shared": {}, "vs_control": {}}
    by_group: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        if r["seed"] in by_group.get(r["group"], {}):
            raise ValueError(f"two runs of {r['group']} seed {r['seed']}: "
                             f"{by_group[r['group']][r['seed']]['folder']} and {r['folder']}; "
                             "pass one folder per mode and seed")
        sft = _point(r, "after_sft")
        final = _point(r, "after_envace") if step is None else _at_step(r, step)
        base = _point(r, "before_sft", optional=True)
        errors = _check_errors(r, [base, sft, final], allow_errors)
        curve = [(p["step"], p["committed_reward"]) for p in r["points"]
                 if p["stage"] in ("after_sft", "step", "after_envace")]
        out["runs"].append({
            "mode": r["mode"], "reward_control": r["reward_control"], "group": r["group"],
            "seed": r["seed"], "folder": r["folder"], "errors": errors,
            "before_sft": (base or {}).get("committed_reward"),
            "sft": sft["committed_reward"], "final": final["committed_reward"],
            "gain": paired_bootstrap(sft["per_task"], final["per_task"]),
            "per_tier_sft": per_tier(sft["per_task"]), "per_tier_final": per_tier(final["per_task"]),
            "curve": curve, "failed_real_calls": final.get("failed_real_calls"),
            "fidelity_exact": [(p["step"], p["fidelity_exact"]) for p in r["points"]],
            "seconds": r["seconds"]})
        by_group.setdefault(r["group"], {})[r["seed"]] = {
            "folder": r["folder"], "mode": r["mode"], "control": r["reward_control"],
            "sft": sft["per_task"], "final": final["per_task"]}
    for group, seeds in by_group.items():
        rs = list(seeds.values())
        fin, sft = _seed_mean([x["final"] for x in rs]), _seed_mean([x["sft"] for x in rs])
        out["modes"][group] = {"seeds": len(rs), "sft": bootstrap_mean(sft),
                               "final": bootstrap_mean(fin),
                               "gain_vs_sft": paired_bootstrap(sft, fin),
                               "per_tier_final": per_tier(fin)}
    shared = by_group.get("shared", {})
    for group, seeds in by_group.items():
        common = sorted(set(seeds) & set(shared))
        if group == "shared" or next(iter(seeds.values()))["control"] != "none" or not common:
            continue
        # the same warm starts on both sides: shared's other seeds stay out of the comparison
        out["vs_shared"][group] = {**_pooled(shared, seeds, common), "seeds": common}
    for group, seeds in by_group.items():
        first = next(iter(seeds.values()))
        real = by_group.get(first["mode"], {})
        common = sorted(set(seeds) & set(real))
        if first["control"] == "none" or not common:
            continue
        out["vs_control"][group] = {
            "seeds": common,
            "per_seed": {sd: paired_bootstrap(seeds[sd]["final"], real[sd]["final"])
                         for sd in common},
            "pooled": _pooled(seeds, real, common)}
    return out


_BARE_ORDER_ID = re.compile(r"W\d{7}")


def is_hash_slip(call: dict[str, Any]) -> bool:
    """Whether a logged real call is the paper's Fig. 7 slip: an order id without its ``#``.

    Args:
        call: one entry of a row's ``real_call_log`` (``testtime.episode.call_log``): ``{"name",
            "arguments", ...}``.

    Returns:
        True when a top-level string argument is exactly ``W`` and 7 digits (``W4284542``,
        where tau2's retail tools take ``#W4284542``; their order lookup raises
        ``ValueError("Order not found")`` for it, tau2 ``domains/retail/tools.py``), else False.
        Other failed calls (another id, a wrong tool or argument) are not slips. The test is
        strict, so a count of slips is a lower bound: a lowercase ``w``, a wrong number of
        digits, or a bare id inside a list or a nested object counts as another failure.
    """
    args = call.get("arguments")
    return isinstance(args, dict) and any(
        isinstance(v, str) and _BARE_ORDER_ID.fullmatch(v) is not None for v in args.values())


def failed_call_kinds(rows: list[dict[str, Any]]) -> dict[str, int] | None:
    """Failed real calls of committed executions, split into Fig. 7 slips and the rest.

    Args:
        rows: ``evaluate`` rows.

    Returns:
        ``{"hash_slip": k, "other": m}`` over every failed logged call (``is_hash_slip``), or
        None when a row has no ``real_call_log`` (rows written before the log existed).
    """
    if any("real_call_log" not in r for r in rows):
        return None
    failed = [c for r in rows for c in r["real_call_log"] if c.get("error")]
    slips = sum(is_hash_slip(c) for c in failed)
    return {"hash_slip": slips, "other": len(failed) - slips}


def sweep(baseline: str | Path, folders: list[str | Path]) -> dict[str, Any]:
    """A private-rehearsal sweep on the drills: each eval folder against the N = 0 folder.

    Reads each folder's ``results.jsonl`` (``evaluate``'s rows; tasks are paired by suite, task
    and repeat). The rehearsal test of the drills (paper Table 3, Fig. 6): committed
    success beats N = 0, or failed real calls per episode (real calls the environment answered
    with an error) drop by at least 30 %. A degenerate outcome passes the second test: a policy
    that stops calling tools has no failed call, so read ``success`` and
    ``episodes_with_ok_real_call`` beside it.

    Args:
        baseline: the N = 0 (no rehearsal) eval folder.
        folders: the rehearsal eval folders (the baseline may be among them).

    Returns:
        ``{name: {...}}``, keyed by folder name, the baseline first, each with ``rehearsal``,
        ``n``, ``tasks``, ``memory_source`` and ``memory_placement`` (the row's
        ``result_config``, else the folder's ``config.json``, else the paper's), ``success``
        (the mean reward) and ``success_ci`` (``bootstrap_mean``), ``vs_n0``
        (``paired_bootstrap`` of success), ``failed_real_calls_per_episode``,
        ``failed_real_calls_vs_n0`` (``paired_bootstrap`` of the per-episode count),
        ``failed_real_calls_change`` (relative; None when N = 0 had none),
        ``real_calls_per_episode``, ``episodes_with_real_call``, ``episodes_with_ok_real_call``
        (a real call answered without an error), ``failed_call_kinds`` (the failed real calls
        that are Fig. 7 slips and the others, ``failed_call_kinds``; None for rows without a
        call log), ``memory_tokens_per_episode`` and ``empty_memories``.

    Raises:
        FileNotFoundError: a folder has no ``results.jsonl``.
        ValueError: a folder holds rows of more than one configuration (rehearsal mode, N,
            rehearsing policy, config hash) or a task twice, or shares no task with the baseline.
    """
    from envace_lite.pipelines.run_records import MEMORY_DEFAULTS, read_rows

    def rows(folder: str | Path) -> list[dict[str, Any]]:
        path = Path(folder) / "results.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{folder}: no results.jsonl (did the eval run?)")
        rs = read_rows(path)
        groups = {(r.get("rehearsal", "none"), r.get("n", 0), r.get("rehearsal_policy", ""),
                   r.get("config_hash", "")) for r in rs}
        if len(groups) != 1:
            raise ValueError(f"{folder}: rows of {len(groups)} configurations (rehearsal, N, "
                             f"rehearsal policy, config hash): {sorted(groups)}; give one "
                             "folder per configuration")
        keys = [key(r) for r in rs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{folder}: a task appears twice in one configuration")
        return rs

    def key(r: dict[str, Any]) -> str:
        return f"{r['suite']}|{r['task_id']}|{r['repeat']}"

    def memory(folder: str | Path, row: dict[str, Any]) -> dict[str, str]:
        # the row's own record first (written since the options exist), then the folder's
        # config.json (rows written before), then the paper's defaults
        cfg_path = Path(folder) / "config.json"
        saved = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        rc = row.get("result_config", {})
        out = {}
        for k, v in MEMORY_DEFAULTS.items():
            group, _, name = k.partition(".")
            out[k.split(".")[1]] = rc.get(k, saved.get(group, {}).get(name, v))
        return out

    base = rows(baseline)
    s0 = {key(r): float(r["reward"]) for r in base}
    f0 = {key(r): float(r["failed_real_calls"]) for r in base}
    out: dict[str, Any] = {}
    for folder in [baseline, *[f for f in folders if Path(f) != Path(baseline)]]:
        rs = rows(folder)
        s = {key(r): float(r["reward"]) for r in rs}
        f = {key(r): float(r["failed_real_calls"]) for r in rs}
        fvs = paired_bootstrap(f0, f)
        n = len(rs)
        out[Path(folder).name] = {
            "rehearsal": rs[0]["rehearsal"], "n": rs[0]["n"], "tasks": n, **memory(folder, rs[0]),
            "success": sum(s.values()) / n, "success_ci": bootstrap_mean(s),
            "vs_n0": paired_bootstrap(s0, s),
            "failed_real_calls_per_episode": sum(f.values()) / n,
            "failed_real_calls_vs_n0": fvs,
            "failed_real_calls_change": (fvs["diff"] / fvs["before"] if fvs["before"] else None),
            "real_calls_per_episode": sum(r["real_calls"] for r in rs) / n,
            "episodes_with_real_call": sum(r["real_calls"] > 0 for r in rs),
            "episodes_with_ok_real_call": sum(r["real_calls"] > r["failed_real_calls"]
                                              for r in rs),
            "failed_call_kinds": failed_call_kinds(rs),
            "memory_tokens_per_episode": sum(r.get("memory_tokens", 0) for r in rs) / n,
            "empty_memories": sum(r.get("empty_memories", 0) for r in rs)}
    return out


def figure(rep: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Held-out success after SFT and after RL, per mode and seed, with the paired CI of each gain.

    Returns:
        The PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(rep["runs"], key=lambda r: (TRAIN_MODES.index(r["mode"])
                                              if r["mode"] in TRAIN_MODES else 9,
                                              r.get("reward_control", "none") != "none", r["seed"]))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(runs) + 2), 4.2))
    xs = range(len(runs))
    sft = [100 * r["sft"] for r in runs]
    fin = [100 * r["final"] for r in runs]
    lo = [100 * (r["gain"]["lo"]) for r in runs]
    hi = [100 * (r["gain"]["hi"]) for r in runs]
    ax.bar([x - 0.2 for x in xs], sft, 0.4, label="after SFT (start)", color="#bbbbbb")
    ax.bar([x + 0.2 for x in xs], fin, 0.4, label="after RL", color="#3b7dd8")
    for x, s, f, a, b in zip(xs, sft, fin, lo, hi):
        ax.errorbar(x + 0.2, f, yerr=[[max(0.0, (f - s) - a)], [max(0.0, b - (f - s))]],
                    color="black", capsize=3, lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r.get('group', r['mode'])}\ns{r['seed']}" for r in runs], fontsize=8)
    ax.set_ylabel("held-out success (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left")
    n = runs[0]["gain"]["tasks"] if runs else 0
    ax.set_title(title or f"Held-out drills ({n} test tasks, real env, tau2 scoring); "
                 "bars: 95% paired CI of the gain", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["figure", "load_run", "report", "sweep"]
