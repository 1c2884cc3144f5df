"""Scripted baselines on the drill suites (the "cannot be gamed" check): policies that make no
call, always refuse, always write, or guess the commonest fact, played in the real ``DrillEnv``
and scored by tau2's evaluator. ``play`` also replays the corrupted gold
(``DrillEnv.corrupted_turns``).

Usage::

    from envace_lite.envs import make_env
    from envace_lite.drills.baselines import BASELINES, baseline_turns, play
    env = make_env("tau2-retail-drills", "lookup:W2611340")
    {b: play(env, baseline_turns(env.drill, b))[0] for b in BASELINES}
"""
from __future__ import annotations

import copy
from functools import cache
from typing import Any

from envace_lite.envs.base import GoldTurn
from envace_lite.drills.spec import TIER_TOOLS, Drill
from envace_lite.drills.suite import DrillEnv, registered_drills
from envace_lite.types import ToolCall

BASELINES = ("do_nothing", "always_refuse", "always_write", "guess_commonest")
"""Scripted policies reported on the held-out drills (this repository's target: each under 35 %).
``guess_commonest`` measures the one way left to game the score: naming, without any call, the
tier's most common fact among the TRAIN drills (e.g. ``delivered``)."""


@cache
def commonest_fact(domain: str, tier: str) -> str:
    """The most common ``communicate[0]`` among the train drills of a tier (ties: alphabetical)."""
    counts: dict[str, int] = {}
    for d in registered_drills(domain).drills:
        if d.split == "train" and d.tier == tier:
            counts[d.communicate[0]] = counts.get(d.communicate[0], 0) + 1
    return min(counts, key=lambda k: (-counts[k], k)) if counts else ""


def baseline_turns(drill: Drill, kind: str) -> list[GoldTurn]:
    """The calls and closing text of a scripted baseline on ``drill``.

    ``do_nothing``: no call, "Thank you for reaching out." ``always_refuse``: no call, a polite
    refusal. ``always_write``: the solver's reads, then the requested write whatever the rule
    says (the gold write, or the forbidden one), and a confirmation naming the write's outcome
    (``cancelled``, ``return requested`` or the new flight); on a drill without a write request
    it makes no call and says "Done." ``guess_commonest``: no call, "It is <the tier's commonest
    train fact>." (``commonest_fact``).

    Raises:
        KeyError: an unknown ``kind`` (the message names ``BASELINES``).
    """
    if kind not in BASELINES:
        raise KeyError(f"unknown baseline {kind!r}: choose one of {list(BASELINES)}")
    if kind == "do_nothing":
        return [GoldTurn([], final_text="Thank you for reaching out.")]
    if kind == "always_refuse":
        return [GoldTurn([], final_text="I'm sorry, but I cannot help with this request.")]
    if kind == "guess_commonest":
        return [GoldTurn([], final_text=f"It is {commonest_fact(drill.domain, drill.tier)}.")]
    reads = [g for g in drill.gold if g["name"] in TIER_TOOLS[(drill.domain, drill.tier)][:1]]
    if drill.write_allowed:
        write, outcome = drill.gold[-1], drill.communicate[0]
    elif drill.forbidden is not None:
        write = drill.forbidden
        outcome = {"cancel_pending_order": "cancelled",
                   "return_delivered_order_items": "return requested"}.get(
            write["name"], str(write["arguments"].get("flights", [{}])[0].get("flight_number")))
    else:
        return [GoldTurn([], final_text="Done.")]
    steps = [[ToolCall(g["name"], copy.deepcopy(g["arguments"]))] for g in reads + [write]]
    return [GoldTurn(steps, final_text=f"Done: your request is complete ({outcome}).")]


def play(env: DrillEnv, turns: list[GoldTurn]) -> tuple[float, dict[str, Any]]:
    """Play scripted ``turns`` in ``env`` (reset here) and score with tau2's evaluator."""
    env.reset()
    for turn in turns:
        for s in turn.steps:
            env.step(list(s))
            if env.done:
                break
        if not env.done and turn.final_text is not None:
            env.end_turn(turn.final_text)
    return env.score()


__all__ = [
    "BASELINES",
    "baseline_turns",
    "commonest_fact",
    "play",
]
