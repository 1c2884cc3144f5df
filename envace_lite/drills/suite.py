"""The drill suites: ``tau2-retail-drills`` and ``tau2-airline-drills`` (generator v1) and
``tau2-retail-drills-v2`` (generator v2), their registered drills (generated once with
``DEFAULT_SEED``, cached on disk), ``DrillEnv`` and the registry hooks ``envs.make_env`` and
``envs.list_tasks`` call. A v2 suite scores with tau2's evaluator and the drill-side reply check
(``check.py``), and its test split has the held-out slices of ``slices.py`` as splits.

=================================  =========================================================
``tau2-retail-drills``             drills generated from tau2's retail DB: lookup, two-hop,
                                   rule-gated cancel and return, scored by tau2's evaluator
``tau2-airline-drills``            likewise for airline: lookup, two-hop,
                                   basic-economy-gated change
``tau2-retail-drills-v2``          retail drills v2: every drill asks for a fact copied from
                                   an observation; held-out slices ``validation`` and
                                   ``confirmation``
``tau2-retail-drills-v2-compact``  the same drills, records shown compact (``records.py``, a
                                   study lever)
=================================  =========================================================

What a drill is, its tiers and its split rule: ``drills/spec.py``; how drills are generated:
``drills/generate.py``; the scripted baselines scored on these suites: ``drills/baselines.py``.
``drills/__init__.py`` registers these suites with ``envs`` (``envs.register_suites``).

Usage::

    from envace_lite.envs import list_tasks, make_env
    from envace_lite.envs.base import replay_gold
    ids = list_tasks("tau2-retail-drills", "test")         # round-robin over tiers
    env = make_env("tau2-retail-drills", ids[0])
    replay_gold(env)                                          # (1.0, {...})
    list_tasks("tau2-retail-drills-v2", "validation")       # v2's tuning slice
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, replace
from functools import cache
from typing import Any

from tau2.data_model.message import AssistantMessage, UserMessage

from envace_lite.envs.base import GoldTurn
from envace_lite.drills.generate import generate, skipped_by_reason
from envace_lite.drills.records import COMPACT_SUITES, compact_record
from envace_lite.drills.spec import (
    DEFAULT_SEED,
    GENERATOR_VERSION,
    TEST_SHARE,
    TIERS,
    Drill,
    Generation,
)
from envace_lite.envs.tau2 import (
    TICKET_INSTRUCTION,
    Tau2Env,
    tau2_constant,
    new_environment,
)
from envace_lite.types import Observation, Task, ToolCall

DRILL_DOMAINS: dict[str, str] = {"tau2-retail-drills": "retail", "tau2-airline-drills": "airline",
                                 "tau2-retail-drills-v2": "retail",
                                 "tau2-retail-drills-v2-compact": "retail"}
"""Suite name -> tau2 domain."""

SUITE_VERSIONS: dict[str, int] = {"tau2-retail-drills": 1, "tau2-airline-drills": 1,
                                  "tau2-retail-drills-v2": 2, "tau2-retail-drills-v2-compact": 2}
"""Suite name -> generator version (``spec.GENERATOR_VERSIONS``). A v2 suite is scored by tau2's
evaluator and the drill-side reply check (``check.py``), and its test split is cut into the
held-out slices (``slices.py``). ``tau2-retail-drills-v2-compact`` is v2's drills with their
records in the compact rendering (``records.py``, a study lever)."""

SPLITS = ("train", "test", "all")
"""The splits every drill suite has; a v2 suite also has ``slices.SLICES``."""


@cache
def registered_drills(domain: str, version: int = GENERATOR_VERSION) -> Generation:
    """The registered suite's generation (``DEFAULT_SEED``, all tiers, generator ``version``),
    cached on disk."""
    from envace_lite.paths import cache_dir

    path = cache_dir("drills") / f"{domain}__v{version}__s{DEFAULT_SEED}.json"
    if path.exists():
        try:
            raw = json.loads(path.read_text())
            return Generation(domain=raw["domain"], seed=raw["seed"],
                              drills=[Drill(**d) for d in raw["drills"]], skipped=raw["skipped"])
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # a torn or stale cache file is rebuilt below
    gen = generate(domain, DEFAULT_SEED, version=version)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"domain": gen.domain, "seed": gen.seed, "skipped": gen.skipped,
                               "drills": [asdict(d) for d in gen.drills]}))
    tmp.replace(path)
    return gen


@cache
def _by_id(domain: str, version: int = GENERATOR_VERSION) -> dict[str, Drill]:
    return {d.id: d for d in registered_drills(domain, version).drills}


def registered(suite: str) -> Generation:
    """The generation behind a registered suite (its domain and generator version).

    Raises:
        KeyError: unknown suite (the message names the drill suites).
    """
    return registered_drills(_suite_domain(suite), SUITE_VERSIONS[suite])


def get_drill(suite: str, drill_id: str) -> Drill:
    """The registered drill ``drill_id`` of ``suite``.

    Raises:
        KeyError: unknown suite, or a drill id that does not exist (the message says how to list
            them and shows the id format).
    """
    domain = _suite_domain(suite)
    try:
        drill = _by_id(domain, SUITE_VERSIONS[suite])[drill_id]
    except KeyError:
        tiers = "|".join(TIERS[domain])
        raise KeyError(f"unknown {suite} drill id {drill_id!r}: ids look like '<{tiers}>:<entity>'"
                       f"; list them with `envace-lite drills generate --out FILE` or "
                       f"list_tasks({suite!r}, 'all')") from None
    if suite in COMPACT_SUITES:
        return _compact_drill(domain, SUITE_VERSIONS[suite], drill_id)
    return drill


@cache
def _compact_drill(domain: str, version: int, drill_id: str) -> Drill:
    """The drill with every observation in the compact rendering (``records.compact_record``)."""
    drill = _by_id(domain, version)[drill_id]
    return replace(drill, observations=[{**o, "content": compact_record(o["content"])}
                                        for o in drill.observations])


def _suite_domain(suite: str) -> str:
    if suite not in DRILL_DOMAINS:
        raise KeyError(f"unknown drill suite {suite!r}: choose one of {list(DRILL_DOMAINS)}")
    return DRILL_DOMAINS[suite]


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
class DrillEnv(Tau2Env):
    """One drill in tau2's environment (ticket protocol: the first text reply ends the episode).

    Only the tier's tools are shown; a call to any other tool is answered with an error and not
    executed. Execution, the DB hashes and scoring are ``Tau2Env``'s (tau2's own evaluator on the
    drill's ``Task``).
    """

    def __init__(self, suite: str, drill: Drill, max_steps: int = 100,
                 max_errors: int = 10) -> None:
        self.drill = drill
        self.version = SUITE_VERSIONS.get(suite, GENERATOR_VERSION)
        super().__init__(suite, drill.id, max_steps=max_steps, max_errors=max_errors,
                         task=drill.tau2_task(), mode=(drill.domain, "ticket"))

    def _hash_key(self) -> tuple[str, bool, str]:
        """Every drill starts from the pristine database: one initial hash per domain."""
        return self.domain, False, "<pristine>"

    def system_prompt(self) -> str:
        """tau2's ``SYSTEM_PROMPT`` with our NON-OFFICIAL ``TICKET_INSTRUCTION`` and the domain
        policy, as for the ``-ticket`` suites."""
        return _system_prompt(self.domain)

    def reset(self) -> list[dict[str, Any]]:
        """A fresh tau2 environment; returns ``[system, user]`` (the drill's message)."""
        self._env = new_environment(self.domain)
        self.trajectory = [UserMessage(role="user", content=self.drill.message)]
        self.real_calls, self.done, self.termination = 0, False, None
        self._steps = self._errors = self._n = 0
        self._hash = None
        return [{"role": "system", "content": self.system_prompt()},
                {"role": "user", "content": self.drill.message}]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """tau2's OpenAI schemas of the tier's tools, in ``TIER_TOOLS`` order (fresh copies)."""
        return json.loads(json.dumps(_schemas(self.domain, tuple(self.drill.tools))))

    def step(self, calls: list[ToolCall]) -> list[Observation]:
        """``Tau2Env.step`` for the tier's tools; any other tool gets an error, unexecuted."""
        out: list[Observation] = []
        allowed = set(self.drill.tools)
        batch: list[ToolCall] = []

        def flush() -> None:
            if batch:
                out.extend(super(DrillEnv, self).step(list(batch)))
                batch.clear()

        for c in calls:
            if c.name in allowed or self.done:
                batch.append(c)
                continue
            flush()
            self.real_calls += 1
            self._errors += 1
            out.append(Observation(f"Error: unknown tool {c.name!r}; available: "
                                   f"{sorted(allowed)}", True))
            self._check_limits()
        flush()
        if self.suite in COMPACT_SUITES:  # the same rule as the drill's own observations
            out = [replace(o, content=compact_record(o.content)) for o in out]
        return out

    def score(self) -> tuple[float, dict[str, Any]]:
        """``Tau2Env.score`` (tau2's evaluator, unchanged); on a v2 suite, a reply that tau2
        passes must also pass the drill-side check (``check.check_reply``: exactly one value of
        each communicated kind, and it is the fact), else it scores 0.

        Returns:
            ``(reward, details)``; on v2 also ``details["tau2_reward"]`` (the evaluator's reward)
            and ``details["drill_check"]`` (``{"passed", "reason"}``).
        """
        reward, details = super().score()
        if self.version < 2:
            return reward, details
        from envace_lite.drills.check import check_reply

        texts = [m.content for m in self.trajectory
                 if isinstance(m, AssistantMessage) and not m.is_tool_call() and m.content]
        passed, reason = check_reply(texts[-1] if texts else "", list(self.drill.communicate))
        details["tau2_reward"] = reward
        details["drill_check"] = {"passed": passed, "reason": reason}
        return (reward if passed else 0.0), details

    def gold_turns(self) -> list[GoldTurn]:
        """One turn: the solver's calls one per ACT reply, then its closing message."""
        return [GoldTurn([[ToolCall(g["name"], copy.deepcopy(g["arguments"]), call_id=f"gold_{i}")]
                          for i, g in enumerate(self.drill.gold)],
                         final_text=self.drill.final_text, communicate=list(self.drill.communicate),
                         failing=[], key_args=[None] * len(self.drill.gold))]

    def corrupted_turns(self) -> list[GoldTurn]:
        """The corrupted replay of a drill with a write: drop the decisive write (write drills),
        or perform the forbidden one and report success (refusal drills).

        Raises:
            ValueError: for a drill without a write request (nothing to corrupt).
        """
        d = self.drill
        calls = [ToolCall(g["name"], copy.deepcopy(g["arguments"]), call_id=f"gold_{i}")
                 for i, g in enumerate(d.gold)]
        if d.write_allowed:
            return [GoldTurn([[c] for c in calls[:-1]], final_text="I have taken care of it.")]
        if d.forbidden is not None:
            bad = ToolCall(d.forbidden["name"], copy.deepcopy(d.forbidden["arguments"]),
                           call_id="forbidden")
            return [GoldTurn([[c] for c in calls] + [[bad]],
                             final_text="Done: your request has been completed.")]
        raise ValueError(f"drill {d.id} has no write request to corrupt")


@cache
def _system_prompt(domain: str) -> str:
    policy = new_environment(domain).get_policy()
    return tau2_constant("agent.llm_agent", "SYSTEM_PROMPT").format(
        agent_instruction=TICKET_INSTRUCTION, domain_policy=policy)


@cache
def _schemas(domain: str, names: tuple[str, ...]) -> list[dict[str, Any]]:
    env = new_environment(domain)
    by_name = {t.name: t.openai_schema for t in env.get_tools()}
    return [by_name[n] for n in names]


# ---------------------------------------------------------------------------------------------
# Registry hooks and derived tasks
# ---------------------------------------------------------------------------------------------
def task_ids(suite: str, split: str) -> list[str]:
    """Drill ids of ``suite`` in ``split`` (``train``, ``test``, ``all``; on a v2 suite also a
    held-out slice: ``validation``, ``confirmation``, ``rest``), round-robin over tiers.

    Raises:
        KeyError: unknown suite or split.
    """
    valid = splits(suite)
    if split not in valid:
        raise KeyError(f"unknown split {split!r} of {suite}: choose one of {list(valid)}")
    gen = registered(suite)
    if split not in SPLITS:  # a held-out slice of a v2 suite
        from envace_lite.drills.slices import held_out_slices

        return held_out_slices(gen)[split]
    # the split keeps the order of the whole list (round-robin over tiers, then filtered), so
    # the first N test drills mix the tiers; shipped results name the drills they used
    return [d.id for d in gen.drills if split == "all" or d.split == split]


def splits(suite: str) -> tuple[str, ...]:
    """The splits of a drill suite: ``train``, ``test``, ``all``, and on a v2 suite the held-out
    slices ``validation``, ``confirmation`` and ``rest`` (``slices.py``).

    Raises:
        KeyError: unknown suite.
    """
    from envace_lite.drills.slices import SLICES

    _suite_domain(suite)
    return SPLITS + (SLICES if SUITE_VERSIONS[suite] >= 2 else ())


def make(suite: str, task_id: str, **kwargs: Any) -> DrillEnv:
    """A ``DrillEnv`` for one registered drill (call ``reset()`` to start).

    Raises:
        KeyError: unknown suite or drill id.
    """
    kwargs.pop("user", None)  # the ticket protocol has no user simulator
    return DrillEnv(suite, get_drill(suite, task_id), **kwargs)


def drill_prompt(suite: str, drill_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(messages, tool schemas)`` a drill's episode starts with (what ``DrillEnv.reset`` and
    ``tool_schemas`` return), without building an environment.

    Raises:
        KeyError: unknown suite or drill id.
    """
    d = get_drill(suite, drill_id)
    messages = [{"role": "system", "content": _system_prompt(d.domain)},
                {"role": "user", "content": d.message}]
    return messages, json.loads(json.dumps(_schemas(d.domain, tuple(d.tools))))


def card(domain: str, version: int = GENERATOR_VERSION) -> dict[str, Any]:
    """The data card entry of a domain's registered drills: generator, seed, tiers, counts, the
    split rule, and every skipped drill with its reason; for v2 also the held-out slices' sizes
    (``slices``)."""
    gen = registered_drills(domain, version)
    extra: dict[str, Any] = {}
    if version >= 2:
        from envace_lite.drills.slices import held_out_slices

        extra["slices"] = {k: len(v) for k, v in held_out_slices(gen).items()}
    return {
        "generator": f"envace_lite.drills.generate.generate v{version}",
        "seed": gen.seed, "tiers": list(TIERS[domain]), "counts": gen.counts(),
        "tasks": len(gen.drills),
        "split_rule": f"by user: test iff sha1(user_id)/2**160 < {TEST_SHARE}",
        "skipped": len(gen.skipped), "skipped_by_reason": skipped_by_reason(gen.skipped),
        "skipped_ids": gen.skipped, **extra,
    }


def suite_tasks(suite: str, split: str, rendering: str = "compact") -> list[Task]:
    """The drills of ``suite``/``split`` as ``Task`` objects: checklists (``build_checklist``)
    and grounding from the solver's real calls and observations (this module); the last
    gold call of a drill whose write is allowed is the one that changed state."""
    from envace_lite.envs import list_tasks
    from envace_lite.envs.tasks import build_checklist

    tasks = []
    for tid in list_tasks(suite, split):
        d = get_drill(suite, tid)
        calls = [ToolCall(g["name"], json.loads(json.dumps(g["arguments"])), call_id=f"gold_{i}")
                 for i, g in enumerate(d.gold)]
        obs = [Observation(o["content"], o["error"], d.write_allowed and i == len(calls) - 1)
               for i, o in enumerate(d.observations)]
        messages, tools = drill_prompt(suite, tid)
        tasks.append(Task(
            id=d.id, suite=suite, split=d.split, messages=messages, tools=tools,
            user_turns=[[messages[1]]],
            checklist=[build_checklist(calls, obs, [None] * len(calls), list(d.communicate))],
            grounding=[[{"call": c.to_dict(), "observation": o.to_dict()}
                        for c, o in zip(calls, obs)]],
            gold_calls=[[c.to_dict() for c in calls]], rendering=rendering,
            flags=[f"tier:{d.tier}"],
        ))
    return tasks


def suite_card(suite: str) -> dict[str, Any]:
    """The data card's ``generation`` fields of ``suite`` (``card`` of its domain)."""
    return card(_suite_domain(suite), SUITE_VERSIONS[suite])

__all__ = [
    "DRILL_DOMAINS",
    "SPLITS",
    "SUITE_VERSIONS",
    "DrillEnv",
    "card",
    "drill_prompt",
    "get_drill",
    "make",
    "registered",
    "splits",
    "suite_card",
    "suite_tasks",
    "task_ids",
]
