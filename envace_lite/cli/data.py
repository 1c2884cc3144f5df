"""The data-side commands of ``envace-lite``: ``check-benchmarks``, ``drills ...`` and ``data ...``
(registered on the app by ``cli/main.py``; error handling in ``cli/errors.py``).

Commands::

    envace-lite check-benchmarks --suite bfcl-base --split all --json
    envace-lite check-benchmarks --suite tau2-retail-drills --corrupt --sample 200
    envace-lite drills generate --domain retail --seed 0      # counts and skipped drills
    envace-lite drills show lookup:W2611340                   # one registered drill
    envace-lite drills baselines --suite tau2-retail-drills   # the scripted baselines
    envace-lite drills report --run DIR --run DIR --out DIR   # held-out success with CIs
    envace-lite drills reading --eval DIR --out FILE          # ids, facts, writes of an eval
    envace-lite drills copy-base --out data/micro_base        # rebuild the shipped micro base
    envace-lite data build --suite tau2-telecom               # derived tasks into the cache
    envace-lite data card                                     # data/card.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

from envace_lite.cli.errors import drill_errors, existing_folder, read_json_file, user_errors
from envace_lite.config import ConfigError, first_tasks
from envace_lite.progress import progress

data_app = typer.Typer(no_args_is_help=True, help="Derived task files and the data card.")
drills_app = typer.Typer(no_args_is_help=True, help="Drill suites generated from tau2's DBs.")


@user_errors
def check_benchmarks(
    suite: list[str] = typer.Option(..., help="suite(s) to check"),
    split: str = typer.Option("all", help="train | test | all"),
    corrupt: bool = typer.Option(False, help="drop the last state-changing gold call instead "
                                 "(drills: drop the decisive write, or perform the forbidden one)"),
    sample: int = typer.Option(0, help="check a fixed random sample of this many tasks per suite "
                               "(seed 0; 0 = all)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object per suite "
                                 "(default: one line of text per suite)"),
) -> None:
    """Replay every task's gold calls through our adapter; score with the benchmark's evaluator.

    Prints one line per suite (with ``--json``, ``{"suite", "split", "tasks", "passed",
    "failed_ids", "seconds"}``) and exits 1 if any gold replay failed; an unknown suite or split
    is a one-line error (exit 2) before anything runs. With ``--corrupt`` the last
    state-changing gold call is dropped (on the drills: the decisive write is dropped, or the
    forbidden write performed), tasks
    without one are skipped, and it prints ``{"suite", "split", "mode", "tasks", "failed",
    "still_passing_ids", "seconds"}`` (the corrupted replays that still scored 1.0).
    """
    import random

    from envace_lite.envs import list_tasks, make_env
    from envace_lite.envs.base import replay_gold

    if sample < 0:
        raise ConfigError(f"--sample={sample}: expected int >= 0 (0 = all tasks)")
    try:  # every suite's ids before any replay: an unknown suite or split is refused first
        ids_of = {s: list_tasks(s, split) for s in suite}
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    ok = True
    for s in suite:
        start = time.perf_counter()
        ids = ids_of[s]
        if sample and sample < len(ids):
            ids = sorted(random.Random(0).sample(ids, sample))
        passed, failed, skipped, skipped_ids = 0, [], 0, set()
        for tid in progress(ids, desc=s, enabled=not as_json):
            env = make_env(s, tid)
            try:
                if corrupt and hasattr(env, "corrupted_turns"):  # the drills
                    from envace_lite.drills.baselines import play

                    if not (env.drill.write_allowed or env.drill.forbidden is not None):
                        skipped += 1
                        skipped_ids.add(tid)
                        continue
                    reward, _ = play(env, env.corrupted_turns())
                elif corrupt and not any(env.is_state_changing(c.name)
                                         for t in env.gold_turns() for c in t.calls):
                    skipped += 1
                    skipped_ids.add(tid)
                    continue
                else:
                    reward, _ = replay_gold(env, drop_last_write=corrupt)
            finally:
                env.close()
            if reward == 1.0:
                passed += 1
            else:
                failed.append(tid)
        n = len(ids) - skipped
        seconds = round(time.perf_counter() - start, 1)
        if corrupt:
            still = sorted(set(ids) - set(failed) - skipped_ids)
            report = {"suite": s, "split": split, "mode": "corrupted", "tasks": n,
                      "failed": len(failed), "still_passing_ids": still, "seconds": seconds}
            text = f"{s} {split} corrupted: {len(failed)}/{n} fail; still 1.0: {still} ({seconds} s)"
        else:
            report = {"suite": s, "split": split, "tasks": n, "passed": passed,
                      "failed_ids": failed, "seconds": seconds}
            text = f"{s} {split}: {passed}/{n} scored 1.0; failed {failed} ({seconds} s)"
        typer.echo(json.dumps(report) if as_json else text)
        ok = ok and (corrupt or not failed)
    if not ok:
        sys.exit(1)


@drills_app.command("generate")
@drill_errors
def drills_generate(
    domain: str = typer.Option("retail", help="retail | airline"),
    seed: int = typer.Option(0, help="generation seed, 0 .. 2**31-1"),
    tier: list[str] = typer.Option(None, help="tier(s) (default all)"),
    count: int | None = typer.Option(None, help="at most this many drills per tier"),
    out: str = typer.Option("", help="write the drills as JSONL here ('' = counts only)"),
    version: int = typer.Option(1, help="generator version: 1, or 2 (retail: facts copied from "
                                "observations)"),
) -> None:
    """Generate drills from tau2's real database; prints counts and skipped drills per reason
    (and, for version 2 with every tier, the held-out slices' sizes)."""
    from dataclasses import asdict
    from envace_lite.drills.generate import generate, skipped_by_reason

    gen = generate(domain, seed, tiers=tier or None, count=count, version=version)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("".join(json.dumps(asdict(d)) + "\n" for d in gen.drills))
    reasons = skipped_by_reason(gen.skipped)
    summary = {"domain": domain, "seed": seed, "version": version, "drills": len(gen.drills),
               "counts": gen.counts(), "skipped": len(gen.skipped), "skipped_by_reason": reasons}
    if version >= 2 and not tier and count is None:
        from envace_lite.drills.slices import held_out_slices

        summary["slices"] = {k: len(v) for k, v in held_out_slices(gen).items()}
    typer.echo(json.dumps(summary, indent=1))


@drills_app.command("show")
@drill_errors
def drills_show(
    suite: str = typer.Option("tau2-retail-drills", help="tau2-retail-drills | tau2-airline-drills "
                              "| tau2-retail-drills-v2"),
    drill_id: str = typer.Argument(..., help="a drill id, e.g. lookup:W2611340"),
) -> None:
    """Print one registered drill (message, tools, gold, what must be communicated)."""
    from dataclasses import asdict

    from envace_lite.drills.suite import get_drill

    d = asdict(get_drill(suite, drill_id))
    d.pop("observations")
    typer.echo(json.dumps(d, indent=1))


@drills_app.command("baselines")
@drill_errors
def drills_baselines(
    suite: list[str] = typer.Option(["tau2-retail-drills"], help="drill suite(s)"),
    split: str = typer.Option("test", help="train | test | all; on a v2 suite also validation | "
                              "confirmation | rest"),
    limit: int = typer.Option(0, help="first N drills of the split (0 = all)"),
    out: str = typer.Option("", help="write the JSON report here (with every per-task score)"),
) -> None:
    """Score the scripted baselines (do nothing, always refuse, always write, guess the
    commonest fact, the tier template, enumerate every candidate) with the suite's score (tau2's
    evaluator; on v2 also the drill-side reply check); prints success per baseline, overall, per
    tier and per class (read, write, refusal)."""
    from envace_lite.drills.baselines import BASELINES, score_baselines
    from envace_lite.drills.suite import task_ids

    first_tasks([], limit, "--limit")
    # every suite's ids first: a suite that is no drill suite, or an unknown split, is refused
    # (a KeyError naming the choices) before any baseline plays
    for s in suite:
        task_ids(s, split)
    report: dict = {"split": split, "suites": {}}
    for s in suite:
        rep = score_baselines(s, split, limit, show_progress=True)
        report["suites"][s] = rep
        for b in BASELINES:
            v = rep["baselines"][b]
            typer.echo(f"{s} {split} ({rep['tasks']} drills) {b}: {100 * v['success']:.1f} % "
                       f"(tau2 alone {100 * v['tau2_success']:.1f} %); per tier "
                       + ", ".join(f"{t} {100 * x:.0f} %" for t, x in v["per_tier"].items())
                       + "; per class "
                       + ", ".join(f"{c} {100 * x:.0f} %" for c, x in v["per_class"].items()))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=1) + "\n")


@drills_app.command("explain")
@drill_errors
def drills_explain(
    baselines: str = typer.Option(..., help="the JSON of `drills baselines --out` on the same drills"),
    run: list[str] = typer.Option(..., help="a run's summary.json (shipped or finished)"),
    start: list[str] = typer.Option([], help="per run, its start instead of its after_sft point: a "
                                    "summary.json (its after_sft) or a per-task JSON"),
    baseline: str = typer.Option("tier_template", help="the baseline that explains"),
    step: int = typer.Option(-1, help="the RL step compared (-1: the last point)"),
    out: str = typer.Option("", help="write the JSON here"),
) -> None:
    """Per run: the share of its held-out successes that a no-call baseline also scores, its gain
    on the drills that baseline fails, its write-drill successes; then the gain of the runs'
    per-task mean over their starts' (paired 95 % CIs)."""
    from pathlib import Path

    from envace_lite.drills.record import explained, per_task_of, pooled_gain

    if start and len(start) != len(run):
        raise ValueError(f"give one --start per --run ({len(run)}), or none")
    rep = read_json_file(baselines, "--baselines")
    base: dict = {}
    for suite_rep in rep["suites"].values():
        if baseline not in suite_rep["baselines"]:
            raise KeyError(f"unknown baseline {baseline!r}: choose one of "
                           f"{list(suite_rep['baselines'])}")
        base.update(suite_rep["baselines"][baseline]["per_task"])
    finals, starts, rows = [], [], {}
    for k, r in enumerate(run):
        final = per_task_of(r, step=None if step < 0 else step)  # its last point at that step
        first = per_task_of(start[k] if start else r, stage="after_sft")
        finals.append(final)
        starts.append(first)
        rows[r] = explained(final, first, base)
        e = rows[r]
        g = e["baseline_fails"]
        typer.echo(f"{r}: {100 * e['start']:.1f} -> {100 * e['final']:.1f} %; "
                   f"{e['successes']} successes, {e['also_baseline']} also {baseline}'s "
                   f"({100 * (e['share'] or 0):.0f} %); on the {g['tasks']} drills it fails "
                   f"{100 * g['diff']:+.1f} [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]; "
                   f"write drills passed {e['write_successes']}")
    pooled = pooled_gain(starts, finals)
    typer.echo(f"pooled gain over the starts ({len(run)} runs): {100 * pooled['diff']:+.1f} "
               f"[{100 * pooled['lo']:+.1f}, {100 * pooled['hi']:+.1f}] on {pooled['tasks']} drills")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"baseline": baseline, "step": step, "runs": rows,
                                         "starts": start, "pooled_gain": pooled}, indent=1) + "\n")


@drills_app.command("report")
@drill_errors
def drills_report(
    run: list[str] = typer.Option(..., help="finished experiment folder(s), one per mode and seed"),
    control: list[str] = typer.Option([], help="shuffled-reward control run(s) whose summary "
                                      "predates its reward_control field"),
    out: str = typer.Option("", help="write report.json and effect.png here"),
    step: int = typer.Option(-1, help="compare every run at this RL step (-1: its last point)"),
    allow_errors: bool = typer.Option(False, help="compare points holding episodes that ended "
                                      "in an error, on the tasks both scored (refused otherwise)"),
) -> None:
    """Held-out success per mode and seed on the drills, with paired bootstrap 95 % CIs; with
    control runs (``study.reward_control=shuffle``), real − control on the same warm starts."""
    from envace_lite.drills.report import figure, report

    for name, folders in (("--run", run), ("--control", control)):
        for folder in folders:  # finished experiment folders, before any report
            existing_folder(folder, name, "summary.json")
            if "points" not in read_json_file(Path(folder) / "summary.json", name):
                raise ConfigError(f"{name} {folder}: its summary.json holds no held-out points "
                                  "(pass a folder written by envace-lite experiment)")
    rep = report(run, control, None if step < 0 else step, allow_errors=allow_errors)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
        figure(rep, Path(out) / "effect.png")
    for r in rep["runs"]:
        g = r["gain"]
        typer.echo(f"{r['group']:>14} s{r['seed']}: after SFT {100 * r['sft']:.1f} % -> "
                   f"{100 * r['final']:.1f} %  gain {100 * g['diff']:+.1f} "
                   f"[{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}] on {g['tasks']} tasks"
                   + (f" ({r['errors']} error rows left out)" if r["errors"] else ""))
    for mode, v in rep["vs_shared"].items():
        typer.echo(f"{mode} - shared (seeds {', '.join(map(str, v['seeds']))}): "
                   f"{100 * v['diff']:+.1f} [{100 * v['lo']:+.1f}, {100 * v['hi']:+.1f}]")
    for group, v in rep["vs_control"].items():
        mode = group.split("+")[0]
        for sd, d in list(v["per_seed"].items()) + [("pooled", v["pooled"])]:
            name = f"s{sd}" if sd != "pooled" else "seeds " + ", ".join(map(str, v["seeds"]))
            typer.echo(f"{mode} - {group} ({name}): {100 * d['diff']:+.1f} "
                       f"[{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]")


@drills_app.command("reading")
@drill_errors
def drills_reading(
    eval_dir: str = typer.Option(..., "--eval",
                                 help="an envace-lite eval folder on a drills suite"),
    warmstart: str = typer.Option("", help="the warm-start run folder of the policy evaluated "
                                  "(its SFT steps, time and rows go into the record)"),
    name: str = typer.Option("", help="the lever's name in the record"),
    load: float = typer.Option(-1.0, help="the 1-minute load average when the SFT started"),
    command: str = typer.Option("", help="the commands that made the policy and the evaluation"),
    out: str = typer.Option("", help="write the record (JSON) here"),
) -> None:
    """What a drills evaluation says about reading (``drills/reading.py``): success per tier and
    class, ids, exact facts, writes; ``seed`` is the warm start's, ``eval_seed`` the eval's."""
    from envace_lite.paths import git_commit
    from envace_lite.drills.reading import read_rows, reading_metrics

    folder = existing_folder(eval_dir, "--eval", "results.jsonl")
    rows = read_rows(folder / "results.jsonl")
    splits = sorted({str(r.get("split", "")) for r in rows})
    seeds = sorted({(r.get("result_config") or {}).get("seed", 0) for r in rows})
    m = reading_metrics(rows)
    record: dict = {"point": name or folder.name, "split": ",".join(splits),
                    "suite": ",".join(sorted({r["suite"] for r in rows})),
                    "eval_seed": seeds[0] if len(seeds) == 1 else seeds,
                    "episodes": m["success"]["of"], "errors": m["errors"],
                    "success": m["success"]["n"] / m["success"]["of"] if m["success"]["of"]
                    else 0.0, "successes": m["success"]["n"],
                    "write_successes": m["write_drills_passed"]["n"],
                    "real_calls": m["real_calls"],
                    "failed_real_calls": m["failed_real_calls"], "reading": m,
                    "code_commit": git_commit()}
    if warmstart:
        ws = existing_folder(warmstart, "--warmstart", "summary.json")
        summary = json.loads((ws / "summary.json").read_text())
        cfg = json.loads((ws / "config.json").read_text()) if (ws / "config.json").exists() else {}
        sft, record["seed"] = summary.get("sft", {}), cfg.get("run", {}).get("seed", 0)
        record["warmstart"] = {
            "config": dict(cfg.get("warmstart", {})), "study": dict(cfg.get("study", {})),
            "checkpoint": cfg.get("model", {}).get("checkpoint", ""),
            "rows": {k: summary.get("rows", {}).get(k) for k in
                     ("act_rows", "rehearse_rows", "tokens", "rows_too_long")},
            "steps": sft.get("steps"), "seconds": summary.get("seconds"),
            "loss_first": sft.get("loss_first"), "loss_last": sft.get("loss_last")}
    if load >= 0:
        record["load_at_start"] = load
    if command:
        record["commands"] = command
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=1) + "\n")
    s, ids, fact = m["success"], m["correct_ids"], m["fact_exact"]
    pct = lambda v: "n/a" if v["rate"] is None else f"{100 * v['rate']:.1f} %"  # noqa: E731
    hops = ", ".join(f"{v['n']}/{v['of']}" for v in m["two_hop_steps"])
    typer.echo(f"{record['point']}: success {s['n']}/{s['of']} ({pct(s)}); "
               + ", ".join(f"{t} {v['n']}/{v['of']}" for t, v in m["per_tier"].items())
               + f"; correct ids {ids['n']}/{ids['of']} ({pct(ids)}); fact exact "
               f"{fact['n']}/{fact['of']}; writes made {m['writes_made']}, right "
               f"{m['writes_right']}" + (f"; two-hop steps {hops}" if hops else "")
               + f"; errors {m['errors']}")


@drills_app.command("sweep")
@drill_errors
def drills_sweep(
    baseline: str = typer.Option(..., help="the N = 0 eval folder (envace-lite eval --rehearsal none)"),
    run: list[str] = typer.Option(..., help="rehearsal eval folder(s) on the same policy and tasks"),
    out: str = typer.Option("", help="write sweep.json here"),
) -> None:
    """Private rehearsal on the drills: success and failed real calls vs N = 0, paired CIs."""
    from envace_lite.drills.report import sweep

    existing_folder(baseline, "--baseline", "results.jsonl")
    for folder in run:
        existing_folder(folder, "--run", "results.jsonl")
    table = sweep(baseline, run)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "sweep.json").write_text(json.dumps(table, indent=1) + "\n")
    for name, v in table.items():
        d, f = v["vs_n0"], v["failed_real_calls_vs_n0"]
        change = v["failed_real_calls_change"]
        typer.echo(f"{name}: success {100 * v['success']:.1f} % "
                   f"({100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}] vs N = 0); "
                   f"failed real calls / episode {v['failed_real_calls_per_episode']:.2f} "
                   f"({f['diff']:+.2f} [{f['lo']:+.2f}, {f['hi']:+.2f}]"
                   + (f", {100 * change:+.0f} %" if change is not None else "") + "); "
                   + (f"{kinds['hash_slip']} of {kinds['hash_slip'] + kinds['other']} failed "
                      "calls are # slips; " if (kinds := v["failed_call_kinds"])
                      else "failed calls not split (rows without a call log); ")
                   + f"{v['episodes_with_ok_real_call']} / {v['tasks']} episodes with an accepted "
                   "real call")


@drills_app.command("copy-base")
@user_errors
def drills_copy_base(
    out: str = typer.Option(..., help="the base folder to write (the shipped one: data/micro_base)"),
    profile: str = typer.Option("drills", help="the profile whose tokenizer corpus and model "
                                "shape the base takes"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """Build the micro base: tokenizer + copy warm-up + manifest (about 12 min on 2 cores)."""
    from envace_lite.config import get_config, parse_overrides
    from envace_lite.drills.copy_warmup import build_base

    cfg = get_config(profile, {"study.pretrain": "copy", **parse_overrides(set_)})
    command = " ".join(["envace-lite drills copy-base --out", out]
                       + ([f"--profile {profile}"] if profile != "drills" else [])
                       + [f"--set {item}" for item in set_])
    start = time.perf_counter()
    manifest = build_base(cfg, out, command)
    typer.echo(f"base written to {out} in {time.perf_counter() - start:.0f} s: "
               f"{json.dumps(manifest['result'])}")


@data_app.command("build")
@user_errors
def data_build(
    suite: list[str] = typer.Option(..., help="suite(s)"),
    split: str = typer.Option("all", help="train | test | all"),
    rebuild: bool = typer.Option(False, help="ignore the cache"),
) -> None:
    """Build (or load) the derived tasks: checklists and grounding from real gold replays."""
    from envace_lite.envs import list_tasks
    from envace_lite.envs.tasks import load_tasks

    try:  # every suite and the split before any build
        for s in suite:
            list_tasks(s, split)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    for s in suite:
        splits = ("train", "test") if split == "all" else (split,)
        for sp in splits:
            tasks = load_tasks(s, sp, rebuild=rebuild)
            flagged = sum(1 for t in tasks if t.flags)
            typer.echo(f"{s} {sp}: {len(tasks)} tasks, {flagged} with flagged gold calls")


@data_app.command("card")
@user_errors
def data_card_cmd(
    suite: list[str] = typer.Option(None, help="suites (default: all training suites)"),
) -> None:
    """Write ``data/card.json`` with counts, fingerprints and flagged gold calls."""
    from envace_lite.envs import BFCL_SUITES, list_tasks, registered_suites
    from envace_lite.envs.tasks import write_data_card

    suites = suite or ["tau2-telecom", "tau2-retail-ticket", "tau2-airline-ticket", *BFCL_SUITES,
                       *registered_suites()]
    try:  # every suite before any work
        for s in suites:
            list_tasks(s, "all")
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    typer.echo(f"wrote {write_data_card(suites)}")


__all__ = ["check_benchmarks", "data_app", "drills_app"]
