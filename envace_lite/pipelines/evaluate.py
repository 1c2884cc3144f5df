"""Evaluation runs: committed execution with or without private rehearsal, resumable.

``evaluate`` runs one configuration (a policy, suites, a rehearsal mode and budget N, repeats,
decoding) and returns one row per task and repeat. The episodes themselves run in
``execute.run_committed`` (turn-synchronous batches, on ``episode.Episode`` states):
without rehearsal that is the paper's Non-TTS evaluation, with it the §2.3 procedure
(``rehearsal.py``). The aggregates and tables of those rows (Avg@k, Table 3, the usage table,
the per-task table) are in ``tables.py``.

``budget_sweep`` runs N ∈ {1, 2, 3} for both modes (paper Fig. 6; ``eval_figures.plot_budget_sweep``).
Results go to ``DIR/results.jsonl`` (one row per finished episode, appended at once, so a rerun
into the same DIR skips what is done, and loads no model when nothing is left) and
``DIR/summary.json`` (``tables.write_summary``). What a row was made under, and how rows are
read back, is in ``run_records.py``.

Usage::

    envace-lite eval --profile laptop --suite tau2-telecom --suite bfcl-base --limit 5 \\
        --rehearsal parallel --n 2 --out runs/eval/par2
    from envace_lite.pipelines.evaluate import evaluate
    from envace_lite.pipelines.tables import summarize
    rows = evaluate("base", ["bfcl-base"], rehearsal="sequential", n=2, cfg=get_config("smoke"), limit=1)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace_lite.testtime.execute import run_committed
from envace_lite.testtime.episode import Episode
from envace_lite.testtime.gate import WriteGate
from envace_lite.config import Config
from envace_lite.envs import list_tasks, make_env
from envace_lite.llm.generation import Generator
from envace_lite.paths import append_jsonl, check_checkpoint, run_folder_lock
from envace_lite.progress import get_logger, progress
from envace_lite.pipelines.run_records import (
    MAX_EPISODE_RETRIES, check_out, config_hash, error_row, read_rows, result_config, row_key)
from envace_lite.pipelines.tables import is_error, sweep_point, write_summary
from envace_lite.types import DECODING, REHEARSING_MODES

log = get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------

@dataclass
class Policy:
    """A policy handle: a generator, its tokenizer, and a label recorded in every row."""

    generator: Generator
    tokenizer: Any
    label: str = "policy"


def as_policy(spec: Any, cfg: Config, seed: int = 0,
              allow_profile_mismatch: bool = False) -> Policy:
    """A ``Policy`` from a handle, a ``(generator, tokenizer)`` pair, ``"base"`` or a checkpoint.

    Args:
        spec: a ``Policy``; a ``(generator, tokenizer)`` tuple; ``"base"`` (the profile's base
            model, ``model.checkpoint`` ignored); ``""`` (the config's own model and checkpoint);
            or a checkpoint folder (written by ``save_pretrained``).
        cfg: the run config (model kind, dtype, device).
        seed: the generator's sampling seed.
        allow_profile_mismatch: load a checkpoint trained under another profile or model
            (logged); otherwise it is refused (``paths.check_checkpoint``).

    Raises:
        ConfigError: the checkpoint folder is absent, or was trained under another profile or
            model (unless ``allow_profile_mismatch``).
    """
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return Policy(spec[0], spec[1], "policy")
    from envace_lite.llm.generation import HFGenerator
    from envace_lite.models.load import load_policy

    label = policy_label(spec, cfg)
    c = copy.deepcopy(cfg)
    if str(spec) == "base":
        c.model.checkpoint = ""
    elif str(spec):
        c.model.checkpoint = str(spec)
    if c.model.checkpoint:
        check_checkpoint(c.model.checkpoint, c, allow_profile_mismatch)
    model, tok = load_policy(c)
    return Policy(HFGenerator(model, tok, seed=seed,
                              prefix_cache=cfg.rollout.prefix_cache_tokens), tok, label)


def policy_label(spec: Any, cfg: Config) -> str:
    """The label ``as_policy(spec, cfg)`` gives, without loading anything."""
    if isinstance(spec, Policy):
        return spec.label
    if isinstance(spec, tuple) and len(spec) == 2:
        return "policy"
    if not isinstance(spec, (str, Path)):
        raise TypeError(f"policy {spec!r}: pass a Policy, (generator, tokenizer), 'base' or a "
                        "checkpoint folder")
    spec = str(spec)
    return "base" if spec == "base" else (spec or cfg.model.checkpoint or cfg.model.name)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


USER_SUITES = ("tau2-retail", "tau2-airline")
"""The suites whose episodes need a USER endpoint (``eval.user_url``)."""


def check_suites(suites: list[str], split: str,
                 user_url: str | None = "") -> dict[str, list[str]]:
    """Every suite's task ids for ``split``, before any episode runs.

    Args:
        suites, split: what will run.
        user_url: ``eval.user_url``; None for a command that has no USER endpoint at all.

    Raises:
        ConfigError: an unknown suite or split (naming the valid ones), or a USER-endpoint suite
            (``tau2-retail``, ``tau2-airline``) without ``eval.user_url``, or a ``user_url``
            that is not an ``http(s)://host...`` URL.
    """
    from urllib.parse import urlparse

    from envace_lite.config import ConfigError

    try:
        ids = {s: list_tasks(s, split) for s in suites}
    except KeyError as e:
        raise ConfigError(e.args[0] if e.args else str(e)) from None
    needs_user = [s for s in suites if s in USER_SUITES]
    if needs_user and user_url is None:
        raise ConfigError(f"suite {needs_user[0]} needs a USER endpoint, which this command "
                          f"does not take: use {needs_user[0]}-ticket (NON-OFFICIAL)")
    if needs_user and not user_url:
        raise ConfigError(f"suite {needs_user[0]} needs a USER endpoint: pass --user-url "
                          "http://HOST:PORT/v1 (and --user-model), or use "
                          f"{needs_user[0]}-ticket (NON-OFFICIAL, no USER simulator)")
    if user_url:
        u = urlparse(user_url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ConfigError(f"--user-url {user_url!r}: expected http(s)://HOST:PORT/v1")
    return ids


def _user_for(suite: str, cfg: Config) -> Any:
    if suite not in USER_SUITES or not cfg.eval.user_url:
        return None
    from envace_lite.envs.tau2 import OpenAICompatibleUser

    return OpenAICompatibleUser(cfg.eval.user_url, cfg.eval.user_model)


def evaluate(policy: Any, suite: str | list[str], rehearsal: str | None = None,
             n: int | None = None, rehearsal_policy: Any = None, repeats: int | None = None,
             decoding: str | None = None, *, cfg: Config,
             limit: int | None = None, split: str | None = None, write_gate: bool | None = None,
             out: str | Path | None = None, seed: int = 0,
             force_new_config: bool = False,
             allow_profile_mismatch: bool = False,
             strategy: str | None = None) -> list[dict[str, Any]]:
    """Evaluate one configuration on the first ``limit`` test tasks of each suite.

    Args:
        policy: the acting policy (see ``as_policy``).
        suite: one suite or a list (``tau2-retail``/``tau2-airline`` need ``eval.user_url``;
            their ``-ticket`` variants are NON-OFFICIAL).
        rehearsal: None (Non-TTS), ``parallel`` or ``sequential``.
        n: N, rehearsals per user turn (default ``cfg.rehearsal.n``).
        rehearsal_policy: who rehearses (see ``as_policy``; default ``cfg.rehearsal.policy``,
            and "" there means the acting policy). Strategy ``select``: it plays REHEARSE only;
            ``rules`` and ``vote`` never load it.
        repeats: k of Avg@k (default ``cfg.eval.repeats``).
        decoding: ``greedy`` or ``sample`` (default ``cfg.eval.decoding``); recorded per row.
        cfg: the finalized ``Config`` (the entry point resolves it once).
        limit, split, write_gate: override ``eval.limit`` (0 = all), ``eval.split``,
            ``rehearsal.write_gate``.
        out: a folder: rows are appended to ``out/results.jsonl`` as episodes finish, rows
            already there (same ``row_key``, which holds the ``config_hash``) are skipped and
            returned as they were, and ``out/summary.json`` is rewritten at the end. A folder
            holding rows of another result config is refused (``check_out``).
        seed: sampling seed of policies loaded here (part of the result config).
        force_new_config: accept an ``out`` holding rows of another config; this config's rows
            are added beside them, under their own hash.
        allow_profile_mismatch: see ``as_policy``.
        strategy: ``rehearsal.strategy`` (default ``cfg.rehearsal.strategy``): ``memory``,
            ``select``, ``rules`` or ``vote`` (``selection.py``).

    An episode that ends in an error (``is_error``: an exception in its own work, a USER
    endpoint that failed mid-episode or at its reset, a crashed scoring) is logged with the
    error, its row written, and a rerun into the same ``out`` retries it, at most
    ``MAX_EPISODE_RETRIES`` times; the summary counts such rows apart from failures and leaves
    them out of pass@k. ``out`` is locked while rows are written (``paths.run_folder_lock``).

    Returns:
        The rows of this configuration (done earlier or now; a retried episode's last attempt),
        suite by suite, repeat-major, each with ``policy``, ``rehearsal_policy`` and
        ``attempt`` added (see ``run_committed``).

    Raises:
        ValueError: a negative ``limit`` (or ``eval.limit``), or an unknown ``decoding``.
        ConfigError: ``out`` holds rows of another result config (a ``ValueError``), unless
            ``force_new_config``; an unknown suite or split, or a USER-endpoint suite without
            ``eval.user_url`` (``check_suites``), all before any episode; another live process
            holds ``out``'s lock (``paths.RunFolderLocked``).
    """
    cfg = copy.deepcopy(cfg)
    e, r = cfg.eval, cfg.rehearsal
    e.repeats = e.repeats if repeats is None else repeats
    e.decoding = e.decoding if decoding is None else decoding
    e.limit = e.limit if limit is None else limit
    if e.limit < 0:  # ids[:-1] would silently run all tasks but the last
        from envace_lite.config import ConfigError

        raise ConfigError(f"limit must be >= 0 (0 = all tasks), got {e.limit}")
    e.split = e.split if split is None else split
    r.write_gate = r.write_gate if write_gate is None else write_gate
    if e.decoding not in DECODING:
        raise ValueError(f"decoding={e.decoding!r}: use one of {sorted(DECODING)}")
    mode = rehearsal or "none"
    r.mode, r.n = mode, r.n if n is None else n
    r.strategy = r.strategy if strategy is None else strategy
    from envace_lite.testtime.selection import STRATEGIES

    if r.strategy not in STRATEGIES:
        raise ValueError(f"strategy={r.strategy!r}: use one of {STRATEGIES}")
    rspec = r.policy if rehearsal_policy is None else rehearsal_policy
    own = mode == "none" or rspec in ("", None) or r.strategy in ("rules", "vote")
    labels = {"policy": policy_label(policy, cfg),
              "rehearsal_policy": "" if mode == "none" else policy_label(
                  policy if own else rspec, cfg), "split": e.split}
    rconfig = result_config(cfg, labels["policy"], labels["rehearsal_policy"], mode,
                            r.n if mode != "none" else 0, seed)
    labels |= {"config_hash": config_hash(rconfig), "result_config": rconfig}
    suites = [suite] if isinstance(suite, str) else list(suite)
    ids_of = check_suites(suites, e.split, cfg.eval.user_url)  # every suite, before any episode
    if out is not None:
        check_out(out, rconfig, force=force_new_config)
        Path(out).mkdir(parents=True, exist_ok=True)
        with run_folder_lock(out, "eval"):
            return _evaluate(policy, rspec, own, cfg, suites, ids_of, mode, labels, Path(out),
                             seed, allow_profile_mismatch)
    return _evaluate(policy, rspec, own, cfg, suites, ids_of, mode, labels, None, seed,
                     allow_profile_mismatch)


def _evaluate(policy: Any, rspec: Any, own: bool, cfg: Config, suites: list[str],
              ids_of: dict[str, list[str]], mode: str, labels: dict[str, Any],
              out: Path | None, seed: int, allow_profile_mismatch: bool) -> list[dict[str, Any]]:
    """``evaluate``'s episodes, after its checks (and under the folder's lock)."""
    e, r = cfg.eval, cfg.rehearsal
    n_used = r.n if mode != "none" else 0
    loaded: dict[str, Policy] = {}  # policies are loaded only when an episode must run

    def policies() -> tuple[Policy, Policy]:
        if not loaded:
            allow = {"allow_profile_mismatch": True} if allow_profile_mismatch else {}
            loaded["act"] = as_policy(policy, cfg, seed, **allow)
            loaded["rehearse"] = loaded["act"] if own else as_policy(rspec, cfg, seed, **allow)
        return loaded["act"], loaded["rehearse"]
    results = out / "results.jsonl" if out is not None else None
    attempts: dict[tuple, list[dict[str, Any]]] = {}
    for x in read_rows(results, repair=True, all_attempts=True) if results is not None else []:
        attempts.setdefault(row_key(x), []).append(x)  # repair: cut a torn last row
    attempt: dict[tuple[str, str, int], int] = {}
    bar: list[Any] = []  # the suite's bar over its episodes to run (done, rate, time left)

    def write(row: dict[str, Any]) -> None:
        row.update(labels)
        row["attempt"] = attempt.get((row["suite"], str(row["task_id"]), int(row["repeat"])), 1)
        if is_error(row):
            log.error("%s %s (repeat %d): episode error, not counted in pass@k (attempt %d of "
                      "%d): %s", row["suite"], row["task_id"], row["repeat"], row["attempt"],
                      MAX_EPISODE_RETRIES + 1, row.get("error") or row["details"].get(
                          "score_error"))
        if results is not None:
            append_jsonl(results, row)
        if bar:
            bar[0].update(1)

    rows: list[dict[str, Any]] = []
    for s in suites:
        ids = ids_of[s]
        ids = ids[: e.limit] if e.limit else ids
        keys = [(s, tid, k) for k in range(e.repeats) for tid in ids]
        episodes, have = [], {}
        for s_, tid, k in keys:
            key = (s_, tid, k, mode, n_used, labels["rehearsal_policy"], labels["policy"],
                   labels["config_hash"])
            tries = attempts.get(key, [])
            if tries and (not is_error(tries[-1]) or len(tries) > MAX_EPISODE_RETRIES):
                have[(tid, k)] = tries[-1]  # done, or out of retries (an error it stays)
                continue
            attempt[(s_, str(tid), k)] = len(tries) + 1
            if tries:
                log.info("%s %s (repeat %d): retrying after an error (attempt %d of %d)", s_,
                         tid, k, len(tries) + 1, MAX_EPISODE_RETRIES + 1)
            try:
                env = make_env(s_, tid, **({"user": u} if (u := _user_for(s_, cfg)) else {}))
                msgs = env.reset()
            except Exception as exc:  # noqa: BLE001 (e.g. a USER endpoint down: an error row)
                row = error_row((s_, tid, k), "reset", exc, mode, n_used, cfg)
                write(row)
                have[(tid, k)] = row
                continue
            gate = WriteGate(msgs) if r.write_gate else None
            episodes.append(Episode(s_, tid, k, env, msgs, gate=gate))
        log.info("%s: %d episodes to run, %d already done (%s, N=%s)", s, len(episodes),
                 len(have), mode, n_used)
        fresh: list[dict[str, Any]] = []
        if episodes:
            acting, rehearsing = policies()
            bar[:] = [progress(total=len(episodes), enabled=cfg.run.progress, unit="episode",
                               desc=f"{s} ({mode}, N={n_used})")]
            try:
                fresh = run_committed(acting.generator, acting.tokenizer, episodes, cfg,
                                      rehearsal=None if mode == "none" else mode, n=r.n,
                                      rehearsal_generator=rehearsing.generator,
                                      rehearsal_tokenizer=rehearsing.tokenizer, on_row=write)
            finally:
                bar.pop().close()
        for ep, row in zip(episodes, fresh):
            have[(ep.task_id, ep.repeat)] = row
        rows += [have[(tid, k)] for _, tid, k in keys]
    if out is not None:
        write_summary(out, read_rows(results))
    return rows


def evaluate_suites(generator: Generator, tokenizer: Any, cfg: Config,
                    suites: list[str] | None = None) -> list[dict[str, Any]]:
    """Committed execution (``cfg.rehearsal.mode``) on ``cfg.eval``'s suites; see ``evaluate``."""
    mode = cfg.rehearsal.mode
    return evaluate((generator, tokenizer), suites or cfg.eval.suites,
                    rehearsal=None if mode == "none" else mode, cfg=cfg)


# ---------------------------------------------------------------------------------------------
# Fig. 6: the rehearsal-budget sweep
# ---------------------------------------------------------------------------------------------

def budget_sweep(policy: Any, suite: str | list[str], ns: tuple[int, ...] = (1, 2, 3),
                 modes: tuple[str, ...] = REHEARSING_MODES, baseline: bool = True,
                 **kwargs: Any) -> list[dict[str, Any]]:
    """Paper Fig. 6: evaluate every mode at every N (plus the Non-TTS baseline) in one call.

    Args:
        policy, suite: as in ``evaluate``; the policy is loaded once.
        ns: the budgets N.
        modes: rehearsal modes.
        baseline: also run without rehearsal (a point with ``mode="none"``, ``n=0``).
        **kwargs: passed to ``evaluate`` (``cfg``, ``limit``, ``rehearsal_policy``, ``out`` ...).

    Returns:
        One point per configuration: ``{"mode", "n", "overall", "tau2", "bfcl", "suites":
        {suite: avg_at_k}, "episodes"}`` (``eval_figures.plot_budget_sweep`` draws them).
    """
    cfg = kwargs.pop("cfg")
    allow = kwargs.get("allow_profile_mismatch", False)
    acting = as_policy(policy, cfg, kwargs.get("seed", 0), allow)
    rspec = kwargs.pop("rehearsal_policy", None)
    rspec = cfg.rehearsal.policy if rspec is None else rspec
    if rspec not in (None, "") and not isinstance(rspec, Policy):  # load it once, not per run
        rspec = as_policy(rspec, cfg, kwargs.get("seed", 0), allow)
    runs = ([("none", 0)] if baseline else []) + [(m, k) for m in modes for k in ns]
    points = []
    for mode, k in runs:
        rows = evaluate(acting, suite, None if mode == "none" else mode, n=k or None,
                        rehearsal_policy=rspec or "", cfg=cfg, **kwargs)
        points.append(sweep_point(mode, k, rows))
    return points


__all__ = [
    "USER_SUITES",
    "Policy",
    "as_policy",
    "budget_sweep",
    "evaluate",
    "check_suites",
    "evaluate_suites",
    "policy_label",
]
