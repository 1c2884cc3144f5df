"""Trajectory rewards: checklist judge, optional LLM judge, verifiable rewards (docs/design.md,
"The checklist reward").

A task carries one checklist per reference user turn; each ``ChecklistItem`` has a weight and the
weights of a turn sum to 1. An item passes when ANY step of its user turn satisfies it:

==============  ==================================================================================
``call``        a call with the same tool name whose key arguments equal the item's, after JSON
                normalisation (``tasks.normalize``), AND whose observation is not an error
                (``Observation.error``); other arguments are not compared. Official EnvACE
                reference: its judge prompt rules that a call answered by an error "is not
                valid", and a failed tool call zeroes the turn there
``observation`` the observation of such a matching, non-error call contains every expected value
                (substring)
``communicate`` the turn's final text contains the string: tau2's ``CommunicateEvaluator`` rule,
                ``info.lower() in text.lower().replace(",", "")`` (tau2
                ``evaluator/evaluator_communicate.py``, ``evaluate_communicate_info``; commas are
                removed from the text only, as there)
``no_call``     the turn made no tool call AND was closed (a final answer or a terminal tool). A
                turn cut off by a parse error does not pass: otherwise garbage would earn the full
                reward of every "ask, don't call" turn. Deliberate; it is our rule, not tau2's
                (in ``checklist_reward`` the interrupted-turn rule below now covers it too)
==============  ==================================================================================

R = Σ_turns (Σ passed weights) / number of reference user turns; unreached turns score 0, and so
does an INTERRUPTED turn: a reached user turn that did not close (no final answer text and no
terminal tool; i.e. ``stop_reason`` ``parse_error``, ``context_budget``, ``turn_limit`` or
``env_done`` cut it off) scores 0 whatever it matched before the cut. Official EnvACE reference:
a turn's reward is emitted only when the turn completes, and a parse error or the length cap ends
the episode with reward 0 for the open turn. The paper does not state a rule; partial credit
would pay a good call followed by garbage. Both the rule judge and ``LLMJudge`` apply it
(``_aggregate``).

Per output (``output_rewards``): an EMPTY ACT or REHEARSE output gets R_i − |p|, p =
``cfg.grpo.empty_output_penalty`` (official EnvACE reference: ``invalid_action_penalty_coef`` 0.1
is subtracted from the trajectory score of an output whose text is empty).

A failed judge (LLM judge HTTP error, timeout, bad JSON, wrong item count; or a crashing
``env.score()``) never scores 0: the trajectory gets ``reward=None, reward_valid=False`` and the
trainer masks it out of the loss (docs/design.md, "The reference code, and where we differ"). It is
counted and logged.

Usage::

    from envace_lite.core.rewards import score_trajectories, output_rewards, output_valid
    stats = score_trajectories(trajs)                   # rule judge
    rewards = [r for t in trajs for r in output_rewards(t, cfg.grpo.empty_output_penalty)]
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from envace_lite.config import Config
from envace_lite.envs.tasks import normalize
from envace_lite.progress import get_logger
from envace_lite.types import ChecklistItem, Step, Trajectory

log = get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# The rule-based checklist judge
# ---------------------------------------------------------------------------------------------

def communicated(info: str, text: str) -> bool:
    """tau2's communicate rule: ``info.lower() in text.lower().replace(",", "")``."""
    return str(info).lower() in (text or "").lower().replace(",", "")


def call_matches(item: ChecklistItem, step: Step) -> bool:
    """Same tool name, and every key argument equal after JSON normalisation (absent == None)."""
    if step.call.name != item.tool:
        return False
    args = step.call.arguments if isinstance(step.call.arguments, dict) else {}
    return all(normalize(args.get(k)) == normalize(v) for k, v in item.key_args.items())


def judge_turn(items: list[ChecklistItem], steps: list[Step], final_text: str,
               closed: bool | None = None) -> list[bool]:
    """Verdicts of one user turn's checklist.

    Args:
        items: the turn's checklist.
        steps: the steps of THIS user turn (terminal pseudo-tools are never recorded as steps).
        final_text: the ACT final answer that closed the turn ("" if none).
        closed: whether the turn was closed (final answer or terminal tool); default: a non-empty
            ``final_text``. Only ``no_call`` items read it: the zero score of an interrupted turn
            is applied by the aggregation (``checklist_reward``), not here.

    Returns:
        One bool per item, in order. A step whose observation is an error
        (``Observation.error``) never satisfies a ``call`` or ``observation`` item (official
        EnvACE reference).
    """
    closed = bool((final_text or "").strip()) if closed is None else closed
    ok_steps = [s for s in steps if not s.observation.error]
    verdicts = []
    for it in items:
        if it.kind == "call":
            ok = any(call_matches(it, s) for s in ok_steps)
        elif it.kind == "observation":
            values = [str(v) for v in (it.expected or [])]
            ok = any(call_matches(it, s) and all(v in s.observation.content for v in values)
                     for s in ok_steps)
        elif it.kind == "communicate":
            ok = communicated(str(it.expected), final_text)
        elif it.kind == "no_call":
            ok = closed and not steps
        else:
            raise ValueError(f"unknown checklist kind {it.kind!r}: use call, observation, "
                             "communicate or no_call")
        verdicts.append(bool(ok))
    return verdicts


def _turn_closed(traj: Trajectory, u: int) -> bool:
    """Whether reached user turn ``u`` closed: its final answer text (``rollout._close_user_turn``
    writes ``final_texts[u]``), or the terminal tool that ended the episode in it (``stop_reason``
    ``terminal_tool``). Every other stop (``parse_error``, ``context_budget``, ``turn_limit``,
    ``env_done``) leaves the last reached turn open."""
    if u < len(traj.final_texts) and traj.final_texts[u].strip():
        return True
    return u == traj.user_turns_reached - 1 and traj.stop_reason == "terminal_tool"


def aggregate_verdicts(traj: Trajectory, verdicts: list[list[bool]], judge: str) -> tuple[float, dict]:
    """R and details from per-reached-turn verdicts.

    Unreached turns score 0, and so do reached turns that did not close (``_turn_closed``): an
    interrupted turn gets no partial credit (official EnvACE reference). ``items`` keep the raw
    verdicts, so the viewer still shows what an interrupted turn matched; ``closed`` says which
    turns counted.
    """
    checklist = traj.task.checklist
    n_turns = max(1, len(checklist))
    scores, items, closed = [], [], []
    for u, turn in enumerate(checklist):
        v = verdicts[u] if u < len(verdicts) else [False] * len(turn)
        c = u < len(verdicts) and _turn_closed(traj, u)
        scores.append(sum(it.weight for it, ok in zip(turn, v) if ok) if c else 0.0)
        items.append([{"kind": it.kind, "tool": it.tool, "weight": it.weight, "passed": ok}
                      for it, ok in zip(turn, v)])
        closed.append(c)
    return sum(scores) / n_turns, {"judge": judge, "turn_scores": scores, "items": items,
                                   "closed": closed, "user_turns": len(checklist),
                                   "reached": traj.user_turns_reached}


def checklist_reward(traj: Trajectory) -> tuple[float, dict[str, Any]]:
    """R_i = Σ turn scores / reference user turns, with the rule judge (docs/design.md,
    "The checklist reward").

    A reached turn that did not close scores 0 (see the module docstring).

    Returns:
        ``(R in [0, 1], details)``; details hold ``turn_scores`` (one per reference user turn),
        ``items`` (per turn, per item: kind, tool, weight, passed: the raw verdict, also for a
        turn that scored 0), ``closed`` (per turn: whether it counted), ``user_turns``,
        ``reached``.
    """
    verdicts = []
    for u in range(min(traj.user_turns_reached, len(traj.task.checklist))):
        steps = [s for s in traj.steps if s.user_turn == u]
        final = traj.final_texts[u] if u < len(traj.final_texts) else ""
        verdicts.append(judge_turn(traj.task.checklist[u], steps, final, _turn_closed(traj, u)))
    return aggregate_verdicts(traj, verdicts, "rule")


# ---------------------------------------------------------------------------------------------
# Scoring a batch, and per-output rewards for the trainer
# ---------------------------------------------------------------------------------------------

def verifiable_reward(traj: Trajectory) -> tuple[float, dict[str, Any]]:
    """The benchmark's own evaluator on the trajectory's env (``real`` mode keeps it).

    Raises:
        ValueError: the trajectory has no env (only ``real`` mode rollouts can be scored so).
    """
    if traj.env is None:
        raise ValueError(f"{traj.task.id}: no env on this trajectory; 'verifiable' rewards need "
                         "rollout(mode='real'), before close_envs()")
    reward, details = traj.env.score()
    return float(reward), {"judge": "verifiable", **details}


def score_trajectories(trajs: list[Trajectory], judge: Any = "rule") -> dict[str, Any]:
    """Set ``reward``, ``reward_valid`` and ``reward_details`` on every trajectory.

    Args:
        trajs: rollouts.
        judge: ``"rule"`` (``checklist_reward``), ``"verifiable"`` (``env.score()``, real mode)
            or an ``LLMJudge`` (any callable ``traj -> (R, details)``).

    A judge that raises, or returns a NaN or infinite reward (refused, logged as an error),
    leaves the trajectory masked: ``reward`` None, ``reward_valid`` False, ``judge_error`` in
    its details; its outputs then take no part in any baseline or the loss (``output_valid``).

    Returns:
        ``{"n", "invalid", "reward_mean"}`` (the mean over valid trajectories; None if none).
    """
    if isinstance(judge, str):
        fns = {"rule": checklist_reward, "verifiable": verifiable_reward}
        if judge not in fns:
            raise ValueError(f"judge={judge!r}: use 'rule', 'verifiable' or an LLMJudge")
        fn = fns[judge]
        if judge == "verifiable" and any(t.env is None for t in trajs):
            raise ValueError("'verifiable' rewards need trajectories of rollout(mode='real') "
                             "that still hold their env (score before close_envs)")
    else:
        fn = judge
    invalid = 0
    for t in trajs:
        try:
            reward, details = fn(t)
            t.reward, t.reward_valid, t.reward_details = float(reward), True, details
        except Exception as e:  # noqa: BLE001 (a failed judge masks the trajectory, never crashes)
            t.reward, t.reward_valid, t.reward_details = None, False, {"judge_error": repr(e)}
        if t.reward_valid and not usable_reward(t.reward):  # NaN would poison the group's mean
            log.error("%s #%d: the judge returned a reward that is not finite in float32 (%r, "
                      "|R| > %g); refused, the trajectory is masked from the baselines and the "
                      "loss", t.task.id, t.index, t.reward, REWARD_LIMIT)
            what = "non-finite reward" if not math.isfinite(t.reward) else "reward past 1e30"
            t.reward_details = {**(t.reward_details or {}), "judge_error": f"{what} {t.reward!r}"}
            t.reward, t.reward_valid = None, False
        if not t.reward_valid:
            invalid += 1
            log.warning("%s #%d: judge failed, masked from the loss: %s", t.task.id, t.index,
                        t.reward_details["judge_error"][:200])
    valid = [t.reward for t in trajs if t.reward_valid]
    return {"n": len(trajs), "invalid": invalid,
            "reward_mean": sum(valid) / len(valid) if valid else None}


REWARD_LIMIT = 1e30
"""The largest |R| a trajectory may carry. Advantages are float32 (3.4e38 at most): a reward of
1e39 would be inf there, and two of 3e38 overflow their group's mean, so that every advantage of
the group turns NaN. Within ±1e30, groups of up to 1e8 outputs stay finite."""


def usable_reward(reward: float) -> bool:
    """True when ``reward`` is finite and within ``REWARD_LIMIT`` (so finite in float32 sums)."""
    return math.isfinite(reward) and abs(reward) <= REWARD_LIMIT


RewardControl = Callable[[list[Trajectory], int], int]
"""``control(trajs, seed) -> changed``: rewrites judged trajectory rewards in place (a control
run's rewards, beyond the paper) and returns how many changed."""

_REWARD_CONTROLS: dict[str, RewardControl] = {}

ControlChoice = Callable[[Config], bool]
"""``chosen(cfg) -> bool``: whether a run config asks for a registered control (the plugin that
registers the control reads its own setting)."""

_CONTROL_CHOICES: dict[str, ControlChoice] = {}


def register_reward_control(name: str, control: RewardControl,
                            chosen: ControlChoice | None = None) -> None:
    """Serve ``study.reward_control=name`` with ``control`` (a plugin registers its controls on
    import; ``plugins.py``: the drills study's ``shuffle``). ``chosen(cfg)`` says whether a run
    config asks for it (``chosen_reward_controls``); without it the control is served by name
    only (``reward_control``)."""
    _REWARD_CONTROLS[name] = control
    if chosen is not None:
        _CONTROL_CHOICES[name] = chosen


def chosen_reward_controls(cfg: Config) -> list[tuple[str, RewardControl]]:
    """``(name, control)`` of every registered control that ``cfg`` asks for, in registration
    order; [] for a config of the paper (the trainer then keeps the judged rewards). A plugin
    whose config group ``cfg`` sets is loaded first (``plugins.load_plugins_for``)."""
    from envace_lite.plugins import load_plugins_for

    load_plugins_for(cfg)
    return [(name, _REWARD_CONTROLS[name]) for name, chosen in _CONTROL_CHOICES.items()
            if chosen(cfg)]


def reward_control(name: str) -> RewardControl:
    """The control registered for ``study.reward_control=name`` (the drills study's lever,
    applied by the trainer after the judge), loading the plugins first when it is not registered
    yet.

    Raises:
        KeyError: a name that no plugin registers.
    """
    if name not in _REWARD_CONTROLS:
        from envace_lite.plugins import load_plugins

        load_plugins()
    if name not in _REWARD_CONTROLS:
        raise KeyError(f"unknown study.reward_control {name!r}: choose one of "
                       f"{sorted(_REWARD_CONTROLS)}")
    return _REWARD_CONTROLS[name]


def output_rewards(traj: Trajectory, penalty: float = -0.1) -> list[float]:
    """One reward per output of ``traj.outputs``, in order (docs/design.md, "Training").

    An EMPTY output (``Output.empty``: an ACT or REHEARSE output with no text) gets
    ``R_i − |penalty|``, applied per output before the baseline; every other output gets R_i.
    Official EnvACE reference: the trainer subtracts ``invalid_action_penalty_coef`` (0.1) from
    the trajectory score of each output whose text is empty (``is_action_valid`` 0). Only the
    magnitude is used, so the config's signed ``-0.1`` and the reference's coefficient ``0.1``
    both give R_i − 0.1: an empty output is never rewarded above its trajectory. The trajectory's
    R is unchanged. An invalid trajectory (failed judge) gets 0.0 placeholders: the caller must
    pass ``output_valid(traj)`` as the mask.

    Args:
        traj: a scored trajectory.
        penalty: ``cfg.grpo.empty_output_penalty``; its magnitude is subtracted.

    Raises:
        ValueError: the trajectory was not scored.
    """
    if not traj.reward_valid:
        return [0.0] * len(traj.outputs)
    if traj.reward is None:
        raise ValueError(f"{traj.task.id} #{traj.index} is not scored: call score_trajectories")
    r = float(traj.reward)
    return [r - abs(penalty) if o.empty else r for o in traj.outputs]


def output_valid(traj: Trajectory) -> list[bool]:
    """Per output: trainable and counted in the baselines. False for every output of a trajectory
    whose judge failed, and for REHEARSE outputs of the frozen simulator (``act_only``)."""
    return [traj.reward_valid and o.source == "policy" for o in traj.outputs]


__all__ = [
    "ControlChoice",
    "RewardControl",
    "aggregate_verdicts",
    "checklist_reward",
    "chosen_reward_controls",
    "communicated",
    "judge_turn",
    "output_rewards",
    "output_valid",
    "register_reward_control",
    "reward_control",
    "score_trajectories",
    "verifiable_reward",
]
