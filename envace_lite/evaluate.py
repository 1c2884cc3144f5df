"""Committed execution in the real environment, and evaluation runs.

A *committed execution* is one episode in which every ACT output is executed for real
(``Env.step``) and the benchmark's own evaluator scores the result (paper §2.3: the one real run
that follows private rehearsal; without rehearsal it is the plain Non-TTS evaluation).

Episodes of all tasks advance **turn-synchronously**: at each step the ACT prompts of every live
episode go to the generator in one batch (batched generation is about 8x faster than one sequence
at a time on CPU, DESIGN §5), then each reply is parsed and executed.

Per episode the loop is (DESIGN §8, notes/benchmarks_offline.md §5.2):

- tool calls → ``env.step`` → one user-role ``<tool_response>`` message joins the history;
- a text reply (or a reply that fails to parse, as BFCL's decoder failure does) → ``env.end_turn``;
  the next scripted user message joins the history, or the episode ends;
- it also ends on the turn limit, the context budget, or a terminal tool (telecom ``done``).

Usage::

    envace-lite eval --profile laptop --suite tau2-telecom --suite bfcl-base --limit 3
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace_lite import protocol
from envace_lite.config import Config
from envace_lite.envs import Env, list_tasks, make_env
from envace_lite.generation import Generator, chat_ids
from envace_lite.progress import get_logger, progress

log = get_logger(__name__)

DECODING = {"greedy": (0.0, 1.0), "sample": (0.6, 0.95)}
"""``(temperature, top_p)`` per decoding name: greedy, or the reference's validation sampling."""


@dataclass
class Episode:
    """One live committed execution (internal state of ``run_committed``)."""

    suite: str
    task_id: str
    repeat: int
    env: Env
    messages: list[dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    user_turns: int = 1
    tool_calls: int = 0
    violations: int = 0
    parse_errors: int = 0
    stop_reason: str = ""
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0

    @property
    def live(self) -> bool:
        return not self.stop_reason


def _step_episode(ep: Episode, text: str, cfg: Config) -> None:
    """Apply one ACT output to a live episode (execute calls or close the user turn)."""
    tools = ep.env.tool_schemas()
    parsed = protocol.parse_act(text, tools)
    ep.turns += 1
    ep.history.append({"role": "assistant", "content": text})
    if parsed.kind == "calls":
        real = [c for c in parsed.calls if c.name not in ep.env.terminal_tools]
        ep.tool_calls += len(real)
        ep.violations += sum(1 for c in parsed.calls if c.violations)
        observations = ep.env.step(parsed.calls)
        if ep.env.done:
            ep.stop_reason = "terminal_tool"
            return
        ep.history.append(protocol.tool_response_message(observations))
    else:
        if parsed.kind == "error":
            ep.parse_errors += 1
            log.info("%s: parse error %s (%s); treated as a text reply",
                     ep.task_id, parsed.error_code.value, parsed.reason)
        nxt = ep.env.end_turn(text if parsed.kind == "error" else parsed.text)
        if nxt is None:
            ep.stop_reason = "final_answer"
            return
        ep.user_turns += 1
        ep.history.extend(nxt)
    if ep.turns >= cfg.eval.max_turns:
        ep.stop_reason = "turn_limit"


def run_committed(
    generator: Generator,
    tokenizer: Any,
    episodes: list[Episode],
    cfg: Config,
) -> list[dict[str, Any]]:
    """Run ``episodes`` to the end, turn-synchronously, and score each with its benchmark.

    Args:
        generator: the policy (``HFGenerator``, ``ScriptedGenerator``, ...).
        tokenizer: the policy's tokenizer (its chat template renders the prompts).
        episodes: fresh episodes (``Episode(suite, task_id, repeat, env, env.reset())``).
        cfg: the run config (rendering, budgets, decoding, turn limit).

    Returns:
        One row per episode with ``task_id, suite, repeat, reward, turns, user_turns, tool_calls,
        real_calls, violations, parse_errors, stop_reason, rehearsal_real_calls (0: no
        rehearsal here), grounding ("none"), rendering, decoding, seconds`` and ``details``.
    """
    temperature, top_p = DECODING[cfg.eval.decoding]
    budget = cfg.rollout.max_prompt_tokens
    bar = progress(total=len(episodes), desc="episodes", enabled=cfg.run.progress)
    while any(ep.live for ep in episodes):
        live, prompts = [], []
        for ep in episodes:
            if not ep.live:
                continue
            msgs = protocol.act_messages(ep.messages, ep.env.tool_schemas(), cfg.rollout.rendering,
                                         cfg.rollout.compact_policy_chars, ep.history)
            ids = chat_ids(tokenizer, msgs)
            if len(ids) > budget:
                ep.stop_reason = "context_budget"
                log.info("%s: prompt of %d tokens is over the budget of %d; episode ends",
                         ep.task_id, len(ids), budget)
                continue
            live.append(ep)
            prompts.append(ids)
        if not live:
            break
        outs = generator.generate(prompts, role="act", max_new_tokens=cfg.rollout.max_new_tokens_act,
                                  temperature=temperature, top_p=top_p)
        for ep, out in zip(live, outs):
            _step_episode(ep, out.text, cfg)
        for ep in live:
            if not ep.live:
                ep.seconds = time.perf_counter() - ep.started
                bar.update(1)
    bar.close()
    rows = []
    for ep in episodes:
        if not ep.seconds:
            ep.seconds = time.perf_counter() - ep.started
        try:
            reward, details = ep.env.score()
        except Exception as exc:  # a scoring crash must not lose the other episodes' results
            log.warning("%s: scoring failed: %r; reward 0", ep.task_id, exc)
            reward, details = 0.0, {"score_error": repr(exc)}
        ep.env.close()
        rows.append({
            "task_id": ep.task_id, "suite": ep.suite, "repeat": ep.repeat, "reward": float(reward),
            "turns": ep.turns, "user_turns": ep.user_turns, "tool_calls": ep.tool_calls,
            "real_calls": ep.env.real_calls, "violations": ep.violations,
            "parse_errors": ep.parse_errors, "stop_reason": ep.stop_reason,
            "rehearsal_real_calls": 0, "grounding": "none", "rendering": cfg.rollout.rendering,
            "decoding": cfg.eval.decoding, "seconds": round(ep.seconds, 2),
            "details": _jsonable(details),
        })
    return rows


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def evaluate_suites(
    generator: Generator, tokenizer: Any, cfg: Config, suites: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Committed execution on the first ``cfg.eval.limit`` tasks of each suite's test split.

    Args:
        generator, tokenizer: the policy.
        cfg: run config; ``cfg.eval`` picks split, limit, repeats and decoding.
        suites: overrides ``cfg.eval.suites``.

    Returns:
        The rows of ``run_committed`` for every suite, suite by suite.
    """
    rows: list[dict[str, Any]] = []
    for suite in suites or cfg.eval.suites:
        ids = list_tasks(suite, cfg.eval.split)
        ids = ids[: cfg.eval.limit] if cfg.eval.limit else ids
        episodes = []
        for repeat in range(cfg.eval.repeats):
            for tid in ids:
                env = make_env(suite, tid)
                episodes.append(Episode(suite, tid, repeat, env, env.reset()))
        log.info("%s: %d episodes (%s split)", suite, len(episodes), cfg.eval.split)
        rows.extend(run_committed(generator, tokenizer, episodes, cfg))
    return rows


TABLE_COLUMNS = ("suite", "task_id", "reward", "turns", "tool_calls", "real_calls",
                 "parse_errors", "stop_reason", "seconds")


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the per-task rows, then one summary line per suite.

    A suite in which the policy made no tool call at all says so explicitly (the zero-shot
    SmolLM2 case: without a warm start it answers in text, and every reward is 0).
    """
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    def cell(r: dict[str, Any], c: str) -> str:
        if c == "reward":
            return f"{r[c]:.3f}"
        text = str(r[c])  # telecom ids run to 200 characters: keep the head and the tail
        return text if len(text) <= 48 else f"{text[:30]}…{text[-17:]}"

    for r in rows:
        lines.append("| " + " | ".join(cell(r, c) for c in TABLE_COLUMNS) + " |")
    lines.append("")
    for suite in dict.fromkeys(r["suite"] for r in rows):
        sub = [r for r in rows if r["suite"] == suite]
        mean = sum(r["reward"] for r in sub) / len(sub)
        calls = sum(r["tool_calls"] for r in sub)
        note = " — the policy made NO tool call (expected zero-shot; see the warm start)" \
            if calls == 0 else ""
        lines.append(f"- {suite}: pass@1 {mean:.3f} over {len(sub)} episodes, "
                     f"{calls} tool calls, {sum(r['real_calls'] for r in sub)} real executions{note}")
    return "\n".join(lines)


def write_results(run_dir: Path, rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """Write ``results.jsonl`` and ``results.md`` into ``run_dir``; return both paths."""
    jsonl = run_dir / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = run_dir / "results.md"
    md.write_text(format_table(rows) + "\n")
    return jsonl, md
