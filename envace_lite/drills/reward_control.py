"""The shuffled-reward control (``study.reward_control="shuffle"``; beyond the paper): a
null-signal control run for the drills study (``docs/drills.md``).

``shuffle_rewards`` permutes the judged rewards inside each task's group, so that a run against
it, on the same warm start, separates what the reward teaches from what the update alone does.
``drills/__init__.py`` registers it with ``core.rewards.register_reward_control``, chosen by
``study.reward_control="shuffle"`` (``chosen``); the trainer applies it after the judge
(``rewards.chosen_reward_controls``, ``core.grpo.RoleWiseGRPOTrainer._score``).
"""
from __future__ import annotations

import random

from envace_lite.config import Config
from envace_lite.types import Trajectory

CONTROL = "shuffle"
"""The name this control is registered and chosen under (``study.reward_control``)."""


def shuffle_rewards(trajs: list[Trajectory], seed: int) -> int:
    """Permute the valid trajectory rewards inside each task's group (a null-signal control).

    A control, not the method (``study.reward_control="shuffle"``): each group (the
    trajectories of one ``task.id``) keeps its multiset of rewards, so its baseline and the size
    of its advantages are unchanged, but which trajectory gets which reward is random. Masked
    trajectories (``reward_valid`` False) stay masked and out of the permutation; rewards never
    move between tasks. ``reward_details`` stay with their trajectory and gain
    ``shuffled_from`` (the judged reward before the permutation). Not a perfect null: the
    empty-output penalty (``output_rewards``) is applied afterwards to the trajectory's own
    outputs, so that part of the signal stays.

    Args:
        trajs: judged trajectories (``score_trajectories`` first).
        seed: the permutation's seed (``random.Random``); the trainer passes one per step.

    Returns:
        The number of trajectories whose reward changed.
    """
    rng = random.Random(seed)
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        if t.reward_valid:
            groups.setdefault(t.task.id, []).append(t)
    changed = 0
    for tid in sorted(groups):
        group = groups[tid]
        rewards = [t.reward for t in group]
        rng.shuffle(rewards)
        for t, r in zip(group, rewards):
            changed += int(r != t.reward)
            t.reward_details = {**(t.reward_details or {}), "shuffled_from": t.reward}
            t.reward = r
    return changed


def chosen(cfg: Config) -> bool:
    """Whether ``cfg`` asks for the shuffled-reward control (``study.reward_control``)."""
    return cfg.study.reward_control == CONTROL


__all__ = ["CONTROL", "chosen", "shuffle_rewards"]
