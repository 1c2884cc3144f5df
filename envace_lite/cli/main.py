"""The ``envace-lite`` command line.

Commands::

    envace-lite eval --profile laptop --suite tau2-telecom --suite bfcl-base --limit 3
    envace-lite eval --profile laptop --suite bfcl-base --rehearsal parallel --n 2 --out DIR
    envace-lite fidelity --profile laptop --suite tau2-telecom --suite bfcl-base --limit 3
    envace-lite check-benchmarks --suite bfcl-base --split all --json
    envace-lite check-benchmarks --suite tau2-retail-drills --corrupt --sample 200
    envace-lite drills generate --domain retail --seed 0      # counts and skipped drills
    envace-lite drills baselines --suite tau2-retail-drills   # the scripted baselines
    envace-lite data build --suite tau2-telecom        # derived tasks into the cache
    envace-lite data card                              # data/card.json
    envace-lite train --profile smoke --mode shared --steps 3
    envace-lite warmstart --profile micro              # SFT on real two-role transcripts
    envace-lite notebooks --profile smoke --only 00,01  # the course, headless (papermill)

Every command defaults to the ``laptop`` profile; tests and CI pass ``--profile smoke``. The
data-side commands (``check-benchmarks``, ``drills``, ``data``) are in ``cli/data.py``; the error
handling below is ``cli/errors.py``'s, and options become a config in ``cli/options.py``.

A user mistake (an unknown profile or key, a ``--set`` value of the wrong type or out of range,
an ``--out`` holding another config) prints one line, ``error: ...``, and exits 2 before any run
dir is created or model loaded; ``envace-lite --debug CMD ...`` shows the traceback instead. A
judge that does not answer exits 1 the same way.
"""
from __future__ import annotations

import json
import sys
import time

import typer

from envace_lite.cli.data import check_benchmarks, data_app, drills_app
from envace_lite.cli.errors import (
    STATE,
    check_run_suites,
    checkpoint_option,
    config_for,
    existing_folder,
    make_run_folder,
    probe_user,
    user_errors,
)
from envace_lite.cli.options import parse_notebook_params, resolve_config
from envace_lite.config import (
    ConfigError,
    check_profile,
    first_tasks,
)
from envace_lite.profiles import PROFILES
from envace_lite.progress import get_logger
from envace_lite.types import DECODING, REHEARSAL_MODES, TRAIN_MODES

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="envace-lite: EnvACE world rehearsal, on a laptop.")
app.add_typer(data_app, name="data")
app.add_typer(drills_app, name="drills")
log = get_logger("envace_lite.cli.main")

PROFILE_HELP = " | ".join(PROFILES)
"""The ``--profile`` choices, read from ``profiles.PROFILES``."""
MODE_HELP = " | ".join(TRAIN_MODES)
"""The ``--mode`` choices (``types.TrainMode``)."""


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="show the traceback of a user "
                                     "mistake instead of one line")) -> None:
    """envace-lite: EnvACE world rehearsal, on a laptop."""
    STATE["debug"] = debug


@app.command("eval")
@user_errors
def eval_cmd(
    profile: str = typer.Option("laptop", help=PROFILE_HELP),
    suite: list[str] = typer.Option(None, help="suite(s); default: the profile's eval.suites"),
    limit: int | None = typer.Option(None, help="tasks per suite (0 = all)"),
    split: str = typer.Option("test", help="task split"),
    seed: int = typer.Option(0, help="run seed"),
    checkpoint: str = typer.Option("", help="the acting policy: a checkpoint folder, or '' for "
                                   "the profile's model"),
    rehearsal: str = typer.Option("none", help=" | ".join(REHEARSAL_MODES) + " (paper §2.3)"),
    n: int | None = typer.Option(None, help="N, rehearsals per user turn (default: profile's)"),
    rehearsal_checkpoint: str = typer.Option(
        "", help="who rehearses: '' (the acting policy), 'base', or a checkpoint folder"),
    strategy: str | None = typer.Option(
        None, help="how the rehearsal reaches the committed run: memory (m_x, paper §2.3) | "
        "select (REHEARSE and checks choose the committed call) | rules (checks only) | vote "
        "(majority of N sampled first calls); default: the profile's"),
    sweep_n: list[int] = typer.Option([1, 2, 3], "--sweep-n", help="the budgets N of --sweep"),
    repeats: int | None = typer.Option(None, help="repeats per task (Avg@k)"),
    decoding: str | None = typer.Option(None, help=" | ".join(
        f"{k} (T={t:g}, top-p {p:g})" for k, (t, p) in DECODING.items())),
    write_gate: bool = typer.Option(False, help="refuse unseen-id / bad-schema writes"),
    sweep: bool = typer.Option(False, help="budget sweep N in --sweep-n x both modes (+ Non-TTS); "
                               "writes sweep.json and sweep.png"),
    user_url: str = typer.Option("", help="USER endpoint for tau2-retail/airline (OpenAI API)"),
    user_model: str = typer.Option("", help="model name at --user-url"),
    out: str = typer.Option("", help="results folder; a rerun into it skips finished rows "
                            "('' = a new runs/eval/<profile>__s<seed>__<time>/)"),
    force_new_config: bool = typer.Option(
        False, help="accept an --out holding rows of another config: this config's rows are "
        "added beside them, under their own config hash (config.json is kept)"),
    allow_profile_mismatch: bool = typer.Option(
        False, help="evaluate a checkpoint trained under another profile or model (refused "
        "otherwise)"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """Committed execution, optionally after private rehearsal; writes results.jsonl,
    summary.json and results.md, and prints the per-task table and the Table 3-shaped summary.
    Every option is checked before any run folder or model (suites, split, --user-url and its
    endpoint, checkpoints, --out); an episode that ends in an error is counted apart and retried
    by a rerun into the same --out."""
    from envace_lite.pipelines.evaluate import (
        USER_SUITES,
        as_policy,
        budget_sweep,
        check_suites,
        evaluate,
        policy_label,
    )
    from envace_lite.pipelines.run_records import check_out, read_rows, result_config, save_config
    from envace_lite.paths import run_folder_lock
    from envace_lite.pipelines.tables import (
        format_table,
        is_error,
        summarize_runs,
        table3,
        usage_table,
        write_summary,
    )

    final = {key: value for key, value in (("eval.limit", limit), ("eval.repeats", repeats),
                                            ("rehearsal.n", n), ("eval.decoding", decoding),
                                            ("rehearsal.strategy", strategy))
             if value is not None}
    if checkpoint:
        final["model.checkpoint"] = checkpoint
    if rehearsal_checkpoint:
        final["rehearsal.policy"] = rehearsal_checkpoint
    if write_gate:
        final["rehearsal.write_gate"] = True
    if user_url:
        final.update({"eval.user_url": user_url, "eval.user_model": user_model})
    cfg = resolve_config(profile, [], set_, final=final, extra={
        "run.seed": seed, "eval.split": split, "rehearsal.mode": rehearsal})
    if strategy is not None and cfg.rehearsal.mode == "none" and not sweep:  # else dropped
        raise ConfigError(f"--strategy {strategy} applies to private rehearsal: add --rehearsal "
                          "parallel (or sequential) and --n")
    # every option before any run folder or model: all suites and the split, the USER URL,
    # the checkpoints, and (last, one request) that the USER endpoint answers
    suites = suite or cfg.eval.suites
    check_suites(suites, cfg.eval.split, cfg.eval.user_url)
    checkpoint_option(cfg.model.checkpoint, cfg, "--checkpoint", allow_profile_mismatch)
    from envace_lite.models.hub import check_model_reachable

    check_model_reachable(cfg)
    if cfg.rehearsal.mode != "none" or sweep:
        checkpoint_option(cfg.rehearsal.policy, cfg, "--rehearsal-checkpoint",
                          allow_profile_mismatch)
    if cfg.eval.user_url and any(s in USER_SUITES for s in suites):
        probe_user(cfg.eval.user_url, cfg.eval.user_model)
    if out:  # an --out of another config is refused before anything is written into it
        mode = cfg.rehearsal.mode
        label = policy_label("", cfg)
        check_out(out, result_config(cfg, label, "" if mode == "none" else policy_label(
            cfg.rehearsal.policy or "", cfg), mode, cfg.rehearsal.n if mode != "none" else 0,
            seed), force=force_new_config)
    run_dir = make_run_folder(out, "eval", profile, seed, cfg.run.runs_root)
    with run_folder_lock(run_dir, "eval"):
        save_config(run_dir, cfg)
        start = time.perf_counter()
        if sweep:
            from envace_lite.course.eval_figures import plot_budget_sweep

            points = budget_sweep(as_policy("", cfg, seed, allow_profile_mismatch), suites,
                                  ns=tuple(sweep_n),
                                  cfg=cfg, out=run_dir, seed=seed,
                                  force_new_config=force_new_config,
                                  allow_profile_mismatch=allow_profile_mismatch)
            (run_dir / "sweep.json").write_text(json.dumps(points, indent=1))
            plot_budget_sweep(points).savefig(run_dir / "sweep.png", dpi=120)
        else:
            evaluate("", suites, cfg.rehearsal.mode, cfg=cfg, out=run_dir, seed=seed,
                     force_new_config=force_new_config,
                     allow_profile_mismatch=allow_profile_mismatch)
        rows = read_rows(run_dir / "results.jsonl")
        write_summary(run_dir, rows)
    typer.echo(format_table(rows))
    summaries = summarize_runs(rows)
    typer.echo("\n" + table3(summaries) + "\n\n" + usage_table(summaries))
    if errors := sum(is_error(r) for r in rows):
        typer.echo(f"\n{errors} episode(s) ended in an error (not counted in pass@k); a rerun "
                   f"into --out {run_dir} retries them")
    typer.echo(f"\nwall time {time.perf_counter() - start:.1f} s; results in {run_dir}")


@app.command("fidelity")
@user_errors
def fidelity_cmd(
    profile: str = typer.Option("laptop", help=PROFILE_HELP),
    suite: list[str] = typer.Option(["tau2-telecom", "bfcl-base"], help="suite(s)"),
    limit: int = typer.Option(3, help="tasks per suite, 0 = all (of --split; train for the "
                              "upper bound)"),
    source: list[str] = typer.Option(["gold", "policy"], help="gold and/or policy pairs"),
    split: str = typer.Option("test", help="held-out pairs from this split (a v2 drills suite "
                              "also has validation and confirmation)"),
    grounded: bool = typer.Option(False, help="also rehearse the held-out pairs with their "
                                  "task's grounding shown, as RL shows it"),
    upper_bound: bool = typer.Option(True, help="also the grounded upper bound (train pairs)"),
    checkpoint: str = typer.Option("", help="a checkpoint folder, or '' for the profile's model"),
    seed: int = typer.Option(0, help="run seed"),
    out: str = typer.Option("", help="output folder ('' = runs/fidelity/<profile>__s<seed>__"
                            "<time>/)"),
    allow_profile_mismatch: bool = typer.Option(
        False, help="audit a checkpoint trained under another profile or model"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """The rehearsal fidelity audit: REHEARSE's ô_t vs the real o_t on held-out pairs; writes
    fidelity.json and fidelity.png."""
    from envace_lite.pipelines.evaluate import as_policy, check_suites
    from envace_lite.pipelines.fidelity import SOURCES, audit

    first_tasks([], limit, "--limit")  # before any run dir or model
    if bad := [x for x in source if x not in SOURCES]:
        raise ConfigError(f"--source {bad[0]!r}: choose from {list(SOURCES)}")
    cfg = resolve_config(profile, [], set_, extra={"run.seed": seed},
                         final={"model.checkpoint": checkpoint} if checkpoint else None)
    check_suites(list(suite), split, None)
    checkpoint_option(cfg.model.checkpoint, cfg, "--checkpoint", allow_profile_mismatch)
    from envace_lite.models.hub import check_model_reachable

    check_model_reachable(cfg)
    run_dir = make_run_folder(out, "fidelity", profile, seed, cfg.run.runs_root)
    cfg.save(run_dir)
    start = time.perf_counter()
    policy = as_policy("", cfg, seed, allow_profile_mismatch)
    report = audit((policy.generator, policy.tokenizer), list(suite), cfg, limit=limit,
                   sources=tuple(source), upper_bound=upper_bound, out=run_dir, split=split,
                   grounded=grounded)
    from envace_lite.course.eval_figures import plot_fidelity

    plot_fidelity(report).savefig(run_dir / "fidelity.png", dpi=120)
    held, ub = report["held_out"]["overall"], report["grounded_upper_bound"]
    shown = report["held_out_grounded"]
    typer.echo(json.dumps({"held_out": {k: v for k, v in held.items() if k != "confusion"},
                           "confusion": held["confusion"],
                           "error_prediction": report["held_out"]["error_prediction"],
                           "held_out_grounded": shown and {
                               **{k: v for k, v in shown["overall"].items() if k != "confusion"},
                               "error_prediction": shown["error_prediction"]},
                           "grounded_upper_bound": ub and {"label": ub["label"],
                                                           **ub["overall"]},
                           "replay_mismatches": report["replay_mismatches"]}, indent=1))
    typer.echo(f"wall time {time.perf_counter() - start:.1f} s; report in {run_dir}")


app.command("check-benchmarks")(check_benchmarks)  # from cli/data.py; here for the help's order


@app.command("train")
@user_errors
def train_cmd(
    profile: str = typer.Option("laptop", help=PROFILE_HELP),
    mode: str | None = typer.Option(None, help=MODE_HELP),
    steps: int | None = typer.Option(None, help="optimizer steps (default: the profile's)"),
    seed: int = typer.Option(0, help="run seed"),
    run_dir: str = typer.Option("", help="run dir to write or resume ('' = a new one)"),
    overrides_file: list[str] = typer.Option([], "--overrides", help="YAML/JSON file(s) of "
                                             "group.field: value, applied in order (e.g. scaled/"
                                             "overrides/reference.yaml); --set, --mode, --steps "
                                             "win over them"),
    allow_profile_mismatch: bool = typer.Option(
        False, help="start from a model.checkpoint trained under another profile or model"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """Role-wise GRPO training; resumes ``--run-dir`` from its last checkpoint (refused under
    settings that change results: the folder's config.json names them)."""
    from envace_lite.pipelines.train import train

    flags = {"grpo.mode": mode, "grpo.steps": steps}
    try:
        cfg = resolve_config(profile, overrides_file, set_, extra={"run.seed": seed},
                             final={k: v for k, v in flags.items() if v is not None})
    except ValueError as e:  # an invalid combination (Config.finalize): one line
        raise e if isinstance(e, ConfigError) else ConfigError(str(e)) from None
    checkpoint_option(cfg.model.checkpoint, cfg, "model.checkpoint", allow_profile_mismatch)
    check_run_suites(cfg, heldout=False)
    from envace_lite.models.hub import check_model_reachable

    check_model_reachable(cfg)
    start = time.perf_counter()
    out = train(cfg, run_dir or None)  # it checks the rest before it makes the run folder
    typer.echo(f"trained {cfg.grpo.steps} steps ({cfg.grpo.mode}) in "
               f"{time.perf_counter() - start:.1f} s; run in {out}")


@app.command("warmstart")
@user_errors
def warmstart_cmd(
    profile: str = typer.Option("laptop", help=PROFILE_HELP),
    seed: int = typer.Option(0, help="run seed"),
    run_dir: str = typer.Option("", help="run dir ('' = runs/warmstart/<profile>__s<seed>__<time>)"),
    measure: bool = typer.Option(True, help="held-out first-turn call rates before and after"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """SFT warm start on real two-role transcripts; prints the checkpoint for model.checkpoint."""
    from envace_lite.pipelines.resume import CHECKPOINT
    from envace_lite.pipelines.sft import warmstart

    cfg = resolve_config(profile, [], set_, extra={"run.seed": seed})
    checkpoint_option(cfg.model.checkpoint, cfg, "model.checkpoint")
    check_run_suites(cfg, heldout=False)
    from envace_lite.models.hub import check_model_reachable

    check_model_reachable(cfg)
    folder = make_run_folder(run_dir, "warmstart", cfg.profile, seed, cfg.run.runs_root)
    start = time.perf_counter()
    out = warmstart(cfg, folder, measure=measure)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("first_turn_before", "first_turn_after"):
        if key in summary:
            rates = {k: v for k, v in summary[key].items() if k != "samples"}
            typer.echo(f"{key}: {json.dumps(rates)}")
    typer.echo(f"warm start in {time.perf_counter() - start:.1f} s; "
               f"checkpoint: --set model.checkpoint={out / CHECKPOINT}")


@app.command("experiment")
@user_errors
def experiment_cmd(
    profile: str = typer.Option("micro", help=PROFILE_HELP),
    seed: int = typer.Option(0, help="run seed (SFT, if run here, and GRPO)"),
    mode: str | None = typer.Option(None, help=MODE_HELP),
    steps: int | None = typer.Option(None, help="GRPO steps (default: the profile's)"),
    out: str = typer.Option("", help="run folder ('' = runs/experiment/<profile>__s<seed>__"
                            "<time>); a rerun into it resumes"),
    warmstart_dir: str = typer.Option("", "--warmstart", help="reuse this warm-start run dir "
                                      "('' = run the warm start here)"),
    heldout_every: int = typer.Option(0, help="held-out check every N GRPO steps (0: at the end)"),
    eval_limit: int | None = typer.Option(None, help="held-out test tasks per suite (0 = all)"),
    fidelity_limit: int = typer.Option(3, help="test tasks per suite for gold pairs (0 = all)"),
    before_sft: bool = typer.Option(True, "--before-sft/--no-before-sft",
                                    help="measure the untrained base first (the same for every "
                                    "run on one base)"),
    background_heldout: bool = typer.Option(False, help="held-out checks before the last one "
                                            "in a second process, beside training"),
    set_: list[str] = typer.Option([], "--set", help="config override group.field=value"),
) -> None:
    """Warm start → held-out check → role-wise GRPO → held-out checks (``pipelines/learning_curve.py``)."""
    from pathlib import Path

    from envace_lite.pipelines.learning_curve import run_experiment

    if eval_limit is not None:  # before any run dir
        first_tasks([], eval_limit, "--eval-limit")
    first_tasks([], fidelity_limit, "--fidelity-limit")
    if heldout_every < 0:
        raise ConfigError(f"--heldout-every={heldout_every}: expected int >= 0 (0 = at the end)")
    final = {key: value for key, value in (("grpo.mode", mode), ("grpo.steps", steps))
             if value is not None}
    cfg = resolve_config(profile, [], set_, extra={"run.seed": seed}, final=final)
    checkpoint_option(cfg.model.checkpoint, cfg, "model.checkpoint")
    check_run_suites(cfg, heldout=True)  # before the warm start, as eval checks them
    from envace_lite.models.hub import check_model_reachable

    check_model_reachable(cfg)
    if warmstart_dir:
        from envace_lite.pipelines.resume import CHECKPOINT

        existing_folder(warmstart_dir, "--warmstart", CHECKPOINT)
        checkpoint_option(str(Path(warmstart_dir) / CHECKPOINT), cfg, "--warmstart")
    if out:  # a rerun under settings that change results: refused before anything is written
        from envace_lite.pipelines.resume import RESUME_FREE, check_resume_config

        check_resume_config(out, cfg, RESUME_FREE + ("model.checkpoint",), ())
    folder = make_run_folder(out, "experiment", cfg.profile, seed, cfg.run.runs_root)
    s = run_experiment(cfg, folder, warmstart_dir=warmstart_dir or None,
                       heldout_every=heldout_every, eval_limit=eval_limit,
                       fidelity_limit=fidelity_limit, before_sft=before_sft,
                       background_heldout=background_heldout)
    typer.echo(json.dumps({"window": s["window"], "seconds": s["seconds"],
                           "points": s["points"]}, indent=1))
    typer.echo(f"run in {folder}")


@app.command("notebooks")
@user_errors
def notebooks_cmd(
    profile: str = typer.Option("laptop", help=PROFILE_HELP),
    only: str = typer.Option("", help="comma-separated notebook prefixes, e.g. 00,02 ('' = all)"),
    seed: int = typer.Option(0, help="run seed, passed to every notebook"),
    out: str = typer.Option("", help="series dir ('' = runs/notebooks/<profile>__s<seed>__"
                            "<time>/)"),
    cell_timeout: int = typer.Option(0, help="seconds per cell (0 = the profile's default)"),
    timeout: int = typer.Option(0, help="wall-clock seconds per notebook (0 = the profile's)"),
    param: list[str] = typer.Option([], "--param", "-p", help="notebook parameter name=value "
                                    "(JSON value) for every notebook declaring it, or "
                                    "NN:name=value for notebook NN only"),
    force: bool = typer.Option(False, help="write into an --out that holds a finished series, "
                               "another profile's, or other files (refused otherwise)"),
) -> None:
    """Execute the notebooks in order with papermill into one series run dir, with HTML exports
    and an index page; a failed cell stops the series and names the notebook and the cell."""
    from envace_lite.course.series import NotebookFailed, run_series

    check_profile(profile)  # before any kernel starts
    names = [s.strip() for s in only.split(",") if s.strip()] or None
    parameters = parse_notebook_params(param)
    from envace_lite.course.helpers import model_folder
    from envace_lite.models.hub import check_model_reachable

    dirs = [v for v in [parameters.get("model_dir")] + [p.get("model_dir") for p in
            parameters.values() if isinstance(p, dict)] if isinstance(v, str) and v]
    # the kernels load the profile's model, or the local folder a model_dir parameter names
    check_model_reachable(config_for(profile, model_folder(dirs[0] if dirs else "")))
    try:  # unknown notebooks or parameters raise ConfigError before any kernel starts
        series = run_series(profile, names, out or None, parameters, seed=seed,
                            cell_timeout=cell_timeout or None, timeout=timeout or None,
                            force=force)
    except NotebookFailed as e:
        typer.echo(f"FAILED: {e}\nindex: {e.series_dir / 'index.html'}", err=True)
        sys.exit(1)
    stages = json.loads((series / "series.json").read_text())["stages"]
    for st in stages:
        typer.echo(f"{st['name']:<32} {st['status']:<8} {st['seconds']:7.1f} s")
    typer.echo(f"index: {series / 'index.html'}")


if __name__ == "__main__":
    app()
