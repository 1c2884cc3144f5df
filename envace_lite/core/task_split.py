"""Which train-split tasks the warm start and RL use: train split only, SFT and RL halves disjoint.

``split_sft_rl`` sends a task to SFT iff a hash of its scenario (``scenario_key``) falls under
``warmstart.sft_share``, so the halves do not depend on the order or number of tasks loaded;
``training_tasks(cfg, "sft" | "rl")`` loads ``grpo.suites``' train split, splits it and cuts each
task to ``warmstart.max_user_turns``; ``heldout_tasks`` mixes test-split tasks for first-turn
checks. ``core/transcripts.py`` builds the warm-start transcripts of these tasks.
"""
from __future__ import annotations

import copy
import hashlib

from envace_lite.config import Config
from envace_lite.types import Task


SCENARIO_SUITES: dict[str, str] = {}
"""Suite -> the suite whose scenarios it renders otherwise (``register_scenario_suite``): both
hash to the same SFT/RL halves."""


def register_scenario_suite(suite: str, same_as: str) -> None:
    """Let ``suite``'s tasks split as ``same_as``'s of the same id (a rendering of its scenarios,
    e.g. a plugin's suite that shows the same tasks' records otherwise)."""
    SCENARIO_SUITES[suite] = same_as


def scenario_key(task: Task) -> str:
    """The key the SFT/RL split hashes: BFCL's entry index (shared by its four categories, which
    are the same 200 scenarios by index: docs/design.md, "Benchmarks and training data"), else
    ``suite:id`` (the suite a registered rendering renders, ``SCENARIO_SUITES``)."""
    if task.suite.startswith("bfcl-"):
        return "bfcl:" + task.id.rsplit("_", 1)[-1]
    return f"{SCENARIO_SUITES.get(task.suite, task.suite)}:{task.id}"


def sft_fraction(task: Task) -> float:
    """A stable number in [0, 1) per scenario: ``sha1(scenario_key) / 2**32``."""
    return int(hashlib.sha1(scenario_key(task).encode()).hexdigest()[:8], 16) / 2**32


def split_sft_rl(tasks: list[Task], sft_share: float) -> tuple[list[Task], list[Task]]:
    """Split train tasks into disjoint SFT and RL sets.

    Rule: a task goes to SFT iff ``sft_fraction(task) < sft_share``. The rule reads only the
    scenario id, so it does not depend on the order or number of tasks loaded, and one BFCL
    scenario never lands on both sides through two categories.

    Raises:
        ValueError: a task is not from the train split.
    """
    require_train(tasks)
    sft = [t for t in tasks if sft_fraction(t) < sft_share]
    rl = [t for t in tasks if sft_fraction(t) >= sft_share]
    return sft, rl


def require_train(tasks: list[Task]) -> None:
    """Raise ``ValueError`` unless every task is from the train split (evaluation uses test)."""
    bad = [f"{t.suite}/{t.id}:{t.split}" for t in tasks if t.split != "train"]
    if bad:
        raise ValueError(f"warm-start transcripts take train-split tasks only; got {bad[:5]}")


def truncate_user_turns(task: Task, n: int) -> Task:
    """A copy of ``task`` that keeps its first ``n`` reference user turns (``n <= 0``: all)."""
    if n <= 0 or len(task.user_turns) <= n:
        return task
    t = copy.copy(task)
    t.user_turns, t.checklist = task.user_turns[:n], task.checklist[:n]
    t.grounding, t.gold_calls = task.grounding[:n], task.gold_calls[:n]
    t.flags = [f for f in task.flags if not f.startswith("gold_call_error:")
               or int(f.split(":")[1]) < n]
    return t


def training_tasks(cfg: Config, purpose: str) -> list[Task]:
    """The warm-start (``sft``) or RL (``rl``) tasks of ``cfg``: the train split of
    ``grpo.suites``, split by ``split_sft_rl(warmstart.sft_share)``, each cut to
    ``warmstart.max_user_turns``. RL on a warm-started policy must use ``training_tasks(cfg,
    "rl")`` (``train(cfg, tasks=...)``) so that no SFT task is trained on twice, unless
    ``warmstart.rl_overlap`` asks RL to take every train task (SFT tasks included)."""
    from envace_lite.envs.tasks import load_tasks

    if purpose not in ("sft", "rl"):
        raise ValueError(f"purpose={purpose!r}: use 'sft' or 'rl'")
    tasks = [t for s in cfg.grpo.suites for t in load_tasks(s, "train", cfg.rollout.rendering)]
    sft, rl = split_sft_rl(tasks, cfg.warmstart.sft_share)
    if purpose == "rl" and cfg.warmstart.rl_overlap:
        rl = tasks
    return [truncate_user_turns(t, cfg.warmstart.max_user_turns)
            for t in (sft if purpose == "sft" else rl)]


def heldout_tasks(cfg: Config, limit: int) -> list[Task]:
    """Test-split tasks of ``grpo.suites``, round-robin over suites, for first-turn checks."""
    from envace_lite.envs.tasks import load_tasks

    per = [load_tasks(s, "test", cfg.rollout.rendering) for s in cfg.grpo.suites]
    mixed = [t for group in zip(*per) for t in group] if len(per) > 1 else per[0]
    return mixed[:limit]


__all__ = ["SCENARIO_SUITES", "heldout_tasks", "register_scenario_suite", "require_train",
           "scenario_key", "sft_fraction", "split_sft_rl",
           "training_tasks", "truncate_user_turns"]
