"""Scripted baselines on the drill suites (the "cannot be gamed" check): policies that make no
call (do nothing, refuse, guess the commonest fact, state the tier's commonest train fact in the
gold wording, list every candidate value), or that write whatever the rule says, played in the
real ``DrillEnv`` and scored by its ``score`` (tau2's evaluator; on a v2 suite also the drill-side
reply check, ``check.py``). ``play`` also replays the corrupted gold
(``DrillEnv.corrupted_turns``); ``score_baselines`` scores every baseline on a split or slice.

Usage::

    from envace_lite.envs import make_env
    from envace_lite.drills.baselines import BASELINES, baseline_turns, play, score_baselines
    env = make_env("tau2-retail-drills", "lookup:W2611340")
    {b: play(env, baseline_turns(env.drill, b))[0] for b in BASELINES}
    score_baselines("tau2-retail-drills-v2", "confirmation")["baselines"]["enumerate"]["success"]
"""
from __future__ import annotations

import copy
import re
import time
from collections import Counter
from functools import cache
from typing import Any

from envace_lite.drills.spec import GENERATOR_VERSION, TIER_TOOLS, Drill
from envace_lite.drills.suite import DrillEnv, registered_drills
from envace_lite.envs.base import GoldTurn
from envace_lite.progress import progress
from envace_lite.types import ToolCall

BASELINES = ("do_nothing", "always_refuse", "always_write", "guess_commonest", "tier_template",
             "enumerate")
"""Scripted policies reported on the held-out drills. The trivial no-call policies: ``do_nothing``,
``always_refuse``, ``guess_commonest`` ("It is <the tier's commonest train fact>."),
``tier_template`` (the tier's commonest train reply of a drill that needs no write, with its
commonest facts: ``template_reply``) and ``enumerate`` (every value the tier's train drills
communicate, in one reply: ``enumerate_reply``). ``always_write`` makes the solver's first read
and the requested write whatever the rule says, and names only the write's outcome."""


@cache
def commonest_fact(domain: str, tier: str, version: int = GENERATOR_VERSION) -> str:
    """The most common ``communicate[0]`` among the train drills of a tier (ties: alphabetical)."""
    counts = Counter(d.communicate[0] for d in registered_drills(domain, version).drills
                     if d.split == "train" and d.tier == tier)
    return min(counts, key=lambda k: (-counts[k], k)) if counts else ""


def reply_pattern(drill: Drill) -> str:
    """The drill's gold reply as a template: the last occurrence of each communicated value
    becomes ``{k}`` (its index in ``communicate``) and every order id ``{order}``.
    ``"I'm sorry, order #W1 cannot be cancelled because it is delivered."`` ->
    ``"I'm sorry, order {order} cannot be cancelled because it is {0}."``."""
    text = drill.final_text
    for k, value in enumerate(drill.communicate):
        head, sep, tail = text.rpartition(value)
        if sep:
            text = head + "{" + str(k) + "}" + tail
    return re.sub(r"#W\d+", "{order}", text)


@cache
def tier_template(domain: str, tier: str,
                  version: int = GENERATOR_VERSION) -> tuple[str, tuple[str, ...]]:
    """``(pattern, facts)`` of the ``tier_template`` baseline: among the tier's train drills that
    need no write (a reply without a call can pass no write drill), the commonest
    ``reply_pattern``, and for each of its slots the commonest value among the train drills of
    that pattern (ties: alphabetical). On v1 retail: lookup "Your order {order} is pending.",
    two-hop "... delivered.", cancel "... cannot be cancelled because it is delivered.", return
    "... cannot be returned because it is pending."."""
    drills = [d for d in registered_drills(domain, version).drills
              if d.split == "train" and d.tier == tier and not d.write_allowed]
    if not drills:
        return "", ()
    patterns = Counter(reply_pattern(d) for d in drills)
    pattern = min(patterns, key=lambda p: (-patterns[p], p))
    chosen = [d for d in drills if reply_pattern(d) == pattern]
    facts = []
    for k in range(len(chosen[0].communicate)):
        counts = Counter(d.communicate[k] for d in chosen)
        facts.append(min(counts, key=lambda v: (-counts[v], v)))
    return pattern, tuple(facts)


def template_reply(drill: Drill, version: int = GENERATOR_VERSION) -> str:
    """The ``tier_template`` reply to ``drill``: its tier's pattern filled with the tier's facts
    and the order id the message names (``#`` + ``W1234567``; none when it names none)."""
    pattern, facts = tier_template(drill.domain, drill.tier, version)
    m = re.search(r"\bW\d{7}\b", drill.message)
    text = pattern.replace("{order}", "#" + m.group(0) if m else "")
    for k, value in enumerate(facts):
        text = text.replace("{" + str(k) + "}", value)
    return re.sub(r" {2,}", " ", text)


@cache
def tier_candidates(domain: str, tier: str, version: int = GENERATOR_VERSION) -> tuple[str, ...]:
    """Every value the train drills of a tier communicate, sorted (v1 retail lookup: cancelled,
    delivered, pending, processed)."""
    return tuple(sorted({v for d in registered_drills(domain, version).drills
                         if d.split == "train" and d.tier == tier for v in d.communicate}))


def enumerate_reply(values: tuple[str, ...] | list[str]) -> str:
    """One reply naming every value: ``"It is one of: a, b or c."`` (``"It is a."`` for one)."""
    values = list(values)
    if len(values) < 2:
        return f"It is {values[0] if values else 'unknown'}."
    return f"It is one of: {', '.join(values[:-1])} or {values[-1]}."


def baseline_turns(drill: Drill, kind: str, version: int = GENERATOR_VERSION) -> list[GoldTurn]:
    """The calls and closing text of a scripted baseline on ``drill`` (of generator ``version``,
    whose train drills the fact-guessing baselines read).

    ``do_nothing``: no call, "Thank you for reaching out." ``always_refuse``: no call, a polite
    refusal. ``always_write``: the solver's reads, then the requested write whatever the rule
    says (the gold write, or the forbidden one), and a confirmation naming the write's outcome
    (``cancelled``, ``return requested`` or the new flight); on a drill without a write request
    it makes no call and says "Done." ``guess_commonest``: no call, "It is <the tier's commonest
    train fact>." (``commonest_fact``). ``tier_template``: no call, ``template_reply``.
    ``enumerate``: no call, ``enumerate_reply(tier_candidates(...))``.

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
        fact = commonest_fact(drill.domain, drill.tier, version)
        return [GoldTurn([], final_text=f"It is {fact}.")]
    if kind == "tier_template":
        return [GoldTurn([], final_text=template_reply(drill, version))]
    if kind == "enumerate":
        values = tier_candidates(drill.domain, drill.tier, version)
        return [GoldTurn([], final_text=enumerate_reply(values))]
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
    """Play scripted ``turns`` in ``env`` (reset here) and score with ``env.score()``."""
    env.reset()
    for turn in turns:
        for s in turn.steps:
            env.step(list(s))
            if env.done:
                break
        if not env.done and turn.final_text is not None:
            env.end_turn(turn.final_text)
    return env.score()


def drill_class(drill: Drill) -> str:
    """``write`` (the rule allows the requested write), ``refusal`` (it forbids it) or ``read``."""
    return "write" if drill.write_allowed else "refusal" if drill.forbidden is not None else "read"


def score_baselines(suite: str, split: str, limit: int = 0,
                    baselines: tuple[str, ...] = BASELINES,
                    show_progress: bool = False) -> dict[str, Any]:
    """Every baseline on the drills of ``suite``/``split`` (a split or, on v2, a held-out slice),
    played in the real environment and scored by ``DrillEnv.score``.

    Args:
        suite: a drill suite (``suite.DRILL_DOMAINS``).
        split: ``train``, ``test``, ``all``, or a v2 slice (``validation``, ``confirmation``,
            ``rest``).
        limit: the first N drills of the split (0: all).
        baselines: a subset of ``BASELINES``.
        show_progress: a bar over the drills (drills done, rate and time left, on stderr).

    Returns:
        ``{"suite", "split", "tasks", "composition": {tier: {class: n}}, "seconds",
        "baselines": {name: {"success", "tau2_success", "per_tier", "per_class", "per_task"}}}``:
        ``success`` is the suite's score; ``tau2_success`` tau2's evaluator alone (they differ
        only on v2, where the drill-side check also applies); ``per_class`` splits ``read``,
        ``write`` and ``refusal`` drills; ``per_task`` maps ``"<suite>|<id>"`` to the score.

    Raises:
        KeyError: unknown suite, split or baseline (the message names the choices).
    """
    from envace_lite.envs import list_tasks, make_env

    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise KeyError(f"unknown baseline {bad[0]!r}: choose one of {list(BASELINES)}")
    ids = list_tasks(suite, split)
    ids = ids[:limit] if limit > 0 else ids
    start = time.perf_counter()
    per_task: dict[str, dict[str, float]] = {b: {} for b in baselines}
    tau2: dict[str, float] = {b: 0.0 for b in baselines}
    drills: dict[str, Drill] = {}
    for tid in progress(ids, enabled=show_progress, desc=f"{suite} {split}", unit="drill"):
        env = make_env(suite, tid)
        try:
            drills[tid] = env.drill
            for b in baselines:
                r, details = play(env, baseline_turns(env.drill, b, env.version))
                per_task[b][f"{suite}|{tid}"] = r
                tau2[b] += details.get("tau2_reward", r)
        finally:
            env.close()
    composition: dict[str, dict[str, int]] = {}
    for d in drills.values():
        c = composition.setdefault(d.tier, {})
        c[drill_class(d)] = c.get(drill_class(d), 0) + 1

    def mean_by(b: str, key: Any) -> dict[str, float]:
        groups: dict[str, list[float]] = {}
        for tid, d in drills.items():
            groups.setdefault(key(d), []).append(per_task[b][f"{suite}|{tid}"])
        return {k: sum(v) / len(v) for k, v in groups.items()}

    n = max(1, len(ids))
    return {
        "suite": suite, "split": split, "tasks": len(ids), "composition": composition,
        "seconds": round(time.perf_counter() - start, 1),
        "baselines": {b: {"success": sum(per_task[b].values()) / n, "tau2_success": tau2[b] / n,
                          "per_tier": mean_by(b, lambda d: d.tier),
                          "per_class": mean_by(b, drill_class), "per_task": per_task[b]}
                      for b in baselines},
    }


__all__ = [
    "BASELINES",
    "baseline_turns",
    "commonest_fact",
    "drill_class",
    "enumerate_reply",
    "play",
    "reply_pattern",
    "score_baselines",
    "template_reply",
    "tier_candidates",
    "tier_template",
]
