"""An evaluation results folder's records: what each row was made under, and how rows are read.

``result_config`` is the flat record of the settings that change a row's result and
``config_hash`` its short hash; ``row_key`` identifies a row (a rerun into the same folder skips
known keys); ``check_out`` refuses a folder whose rows were made under another config
(``config_differences``), ``save_config`` writes ``config.json`` without overwriting another
run's; ``read_rows`` returns the last attempt of each episode (``MAX_EPISODE_RETRIES``) and
``error_row`` is the row of an episode that could not start. ``pipelines/evaluate.py`` runs the
episodes that write these rows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envace_lite.config import Config
from envace_lite.paths import read_jsonl
from envace_lite.progress import get_logger

log = get_logger(__name__)


MEMORY_DEFAULTS = {"study.memory_source": "policy", "rehearsal.memory_placement": "message",
                   "rehearsal.strategy": "memory"}
"""The paper's memory: a rehearsal row's ``result_config`` records these keys only when they
differ from these values (``study.memory_source`` is the drills study's lever)."""
PER_ROW_KEYS = ("rehearsal.mode", "rehearsal.n", "rehearsal.policy", "rehearsal.strategy")
"""Result-relevant settings that may differ between the rows of one results folder (a budget
sweep writes N = 1, 2, 3 of both modes into one; the selection controls share one with the
memory mode); every other key of ``result_config`` must agree across the folder
(``check_out``)."""


def result_config(cfg: Config, policy: str, rehearsal_policy: str, mode: str, n: int,
                  seed: int) -> dict[str, Any]:
    """The settings that change an evaluation row's result, as a flat ``{"group.field": value}``.

    Model and checkpoint (the acting policy's label and ``model.*`` that shape its outputs), the
    split, decoding, rendering and prompt/generation limits, the turn limit, the write gate,
    the sampling seed, and the rehearsal mode, N, rehearsing policy and, with rehearsal, its
    decoding, budgets and prompts, and the options beyond the paper (``study.memory_source``,
    ``rehearsal.memory_placement`` and
    ``rehearsal.strategy``, only when they differ from the paper's ``policy``, ``message`` and
    ``memory``). Not in it: the suite, task and repeat (a row's own key), ``eval.limit``
    and ``eval.repeats`` (how many rows, not what a row holds), progress bars and paths.

    Args:
        cfg: the run config (after ``evaluate``'s overrides).
        policy, rehearsal_policy: the labels of ``policy_label``.
        mode: ``none``, ``parallel`` or ``sequential``; n: N (0 without rehearsal).
        seed: the sampling seed of policies loaded by ``evaluate``.
    """
    m, ro, e, r = cfg.model, cfg.rollout, cfg.eval, cfg.rehearsal
    out: dict[str, Any] = {
        "policy": policy, "model.kind": m.kind, "model.name": m.name,
        "model.checkpoint": m.checkpoint, "model.dtype": m.dtype,
        "model.context_window": m.context_window, "eval.split": e.split,
        "eval.decoding": e.decoding, "eval.max_turns": e.max_turns,
        "eval.user_model": e.user_model, "rollout.rendering": ro.rendering,
        "rollout.compact_policy_chars": ro.compact_policy_chars,
        "rollout.max_prompt_tokens": ro.max_prompt_tokens,
        "rollout.max_new_tokens_act": ro.max_new_tokens_act,
        "rehearsal.write_gate": r.write_gate, "seed": seed,
        "rehearsal.mode": mode, "rehearsal.n": n, "rehearsal.policy": rehearsal_policy}
    if mode != "none":
        out |= {"rehearsal.decoding": r.decoding, "rehearsal.max_turns": r.max_turns,
                "rehearsal.memory_max_tokens": r.memory_max_tokens,
                "rehearsal.max_new_tokens_feedback": r.max_new_tokens_feedback,
                "rehearsal.attempt_chars": r.attempt_chars,
                "rehearsal.feedback_system": r.feedback_system,
                "rehearsal.memory_system": r.memory_system,
                "rollout.max_new_tokens_rehearse": ro.max_new_tokens_rehearse}
        # the memory options beyond the paper join the record only when set, so rows written
        # before they existed (the paper's memory) keep their hash; config_differences reads
        # an absent one as its default
        out |= {k: v for k, v in (("study.memory_source", cfg.study.memory_source),
                                  ("rehearsal.memory_placement", r.memory_placement),
                                  ("rehearsal.strategy", r.strategy))
                if v != MEMORY_DEFAULTS[k]}
    return out


def config_hash(config: dict[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of ``config`` as sorted-key JSON."""
    import hashlib

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each key of two ``result_config``s that differs, outside
    ``PER_ROW_KEYS``. The rehearsal settings that only rows with rehearsal record are compared
    when both sides have them (a Non-TTS row and a rehearsal row may share a folder)."""
    only_rehearsal = ("rehearsal.", "rollout.max_new_tokens_rehearse", "study.memory_source")

    def filled(cfg: dict[str, Any]) -> dict[str, Any]:  # a rehearsal row's absent memory keys
        return (MEMORY_DEFAULTS | cfg if cfg.get("rehearsal.mode", "none") != "none" else cfg)

    old, new = filled(old), filled(new)
    diffs = []
    for k in dict.fromkeys([*old, *new]):
        if k in PER_ROW_KEYS or ((k not in old or k not in new) and k.startswith(only_rehearsal)):
            continue
        if old.get(k) != new.get(k):
            diffs.append(f"{k}: {old.get(k)!r} -> {new.get(k)!r}")
    return diffs


def check_out(out: str | Path, config: dict[str, Any], force: bool = False) -> list[str]:
    """Refuse a results folder whose rows were made under another config.

    Args:
        out: the folder (its ``results.jsonl`` is read; a torn last row is ignored).
        config: this run's ``result_config``.
        force: allow it: the new rows get their own ``config_hash`` (so they are never taken for
            the old ones) and the old rows are kept.

    Returns:
        The differences found (empty when the folder is new or agrees).

    Raises:
        ConfigError: some row was made under another config (names the differing keys), or
            rows carry no config record (written before rows were keyed on it), unless ``force``.
    """
    from envace_lite.config import ConfigError

    rows = read_rows(Path(out) / "results.jsonl")
    seen = {r.get("config_hash"): r.get("result_config") for r in rows}
    diffs: list[str] = []
    if None in seen or any(c is None for c in seen.values()):
        diffs.append("rows without a config record (written by an older version)")
    for old in (c for c in seen.values() if c is not None):
        diffs += [d for d in config_differences(old, config) if d not in diffs]
    if diffs and not force:
        raise ConfigError(f"{out} holds results of another config ({'; '.join(diffs)}): use "
                          "another --out, or --force-new-config to add this config's rows beside "
                          "them (rows are keyed on their config hash, never mixed)")
    if diffs:
        log.warning("%s holds results of another config (%s); adding this config's rows beside "
                    "them", out, "; ".join(diffs))
    return diffs


def save_config(out: str | Path, cfg: Config) -> Path:
    """Write ``out/config.json`` unless one is there; a different config goes beside it as
    ``config-<hash of its JSON>.json``, so ``config.json`` never claims settings that its rows
    were not made with. Returns the path written (or the existing ``config.json``)."""
    out = Path(out)
    path = out / "config.json"
    text = json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
    if not path.exists() or path.read_text() == text:
        return cfg.save(out)
    other = out / f"config-{config_hash(cfg.to_dict())}.json"
    other.write_text(text)
    log.info("%s exists with other settings; this run's config is in %s", path, other.name)
    return other


def row_key(row: dict[str, Any]) -> tuple:
    """What identifies a row within a results file (a rerun skips rows with a known key):
    suite, task, repeat, rehearsal mode, N, the two policy labels and the ``config_hash`` of its
    ``result_config`` (rows of another decoding or rendering are never reused)."""
    return (row["suite"], str(row["task_id"]), int(row["repeat"]), row.get("rehearsal", "none"),
            int(row.get("n", 0)), row.get("rehearsal_policy", ""), row.get("policy", ""),
            row.get("config_hash", ""))


MAX_EPISODE_RETRIES = 2
"""How often a rerun into the same folder retries an episode that ended in an error (an
exception in its own work, a USER endpoint that failed, a crashed scoring); after that its last
error row stands, and is counted as an error, never as a failure."""


def _key_or_none(row: dict[str, Any]) -> tuple | None:
    try:
        return row_key(row)
    except (KeyError, TypeError, ValueError):
        return None


def read_rows(path: str | Path, repair: bool = False,
              all_attempts: bool = False) -> list[dict[str, Any]]:
    """The rows of a ``results.jsonl`` (an empty list when it does not exist).

    An episode retried after an error (``MAX_EPISODE_RETRIES``) has one row per attempt; only
    its last is returned (in the place of its first), unless ``all_attempts``. A torn last row
    (a kill mid-write) is dropped with a warning; ``repair`` also cuts it off the file, before
    rows are appended (see ``paths.read_jsonl``).

    Raises:
        ValueError: a row before the last is not JSON.
    """
    rows = read_jsonl(path, repair=repair)
    if all_attempts:
        return rows
    last: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if (key := _key_or_none(r)) is not None:
            last[key] = r
    out, seen = [], set()
    for r in rows:
        key = _key_or_none(r)
        if key is None:
            out.append(r)
        elif key not in seen:
            seen.add(key)
            out.append(last[key])
    return out


def error_row(ep_key: tuple[str, str, int], where: str, exc: BaseException, mode: str,
              n: int, cfg: Config) -> dict[str, Any]:
    """The row of an episode that could not start (its env or its reset raised, e.g. a USER
    endpoint that does not answer): reward 0.0, ``stop_reason="error"``, ``error`` set."""
    suite, task_id, repeat = ep_key
    return {"task_id": task_id, "suite": suite, "repeat": repeat, "reward": 0.0, "turns": 0,
            "user_turns": 0, "tool_calls": 0, "real_calls": 0, "violations": 0,
            "failed_real_calls": 0, "real_call_log": [], "parse_errors": 0,
            "stop_reason": "error", "rehearsal": mode, "n": n, "rehearsal_real_calls": 0,
            "gated_calls": 0, "rendering": cfg.rollout.rendering,
            "decoding": cfg.eval.decoding, "seconds": 0.0,
            "error": f"{where}: {type(exc).__name__}: {exc}"[:500], "details": {}}


__all__ = [
    "MAX_EPISODE_RETRIES",
    "MEMORY_DEFAULTS",
    "PER_ROW_KEYS",
    "check_out",
    "config_differences",
    "config_hash",
    "error_row",
    "read_rows",
    "result_config",
    "row_key",
    "save_config",
]
