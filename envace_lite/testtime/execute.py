"""Committed execution in the real environment, with optional rehearsal and write gate.

A *committed execution* is one episode in which every ACT output is executed for real
(``Env.step``) and the benchmark's own evaluator scores the result. Without rehearsal it is the
paper's Non-TTS evaluation; with it, it is the single real run of paper §2.3: at each new user
message the policy first rehearses privately (``rehearsal.rehearse_turns``), then ACT continues
in the real adapter with the memory m_x in its context.

Committed execution is the ACT engine of training (``engine.run_turns``, the loop of
``rollout(mode="real")``) on the same token ids (docs/design.md, "Committed execution on training's
tokens"), with its own hooks (``_CommittedHooks``): before each turn, the episodes that just got a
user message rehearse together and m_x joins (``apply_rehearsal``, in ``turn_records.py``); the
first prompt, and any prompt after the env's tool list changed (BFCL miss_func), is rendered from
the messages (``act_prompt``); every call of a reply runs, through the write gate when the episode
has one (``gate.WriteGate``: a refused call is not executed, ACT gets ``prompts.GATE_REFUSAL`` as
an error observation, ``gated_calls`` counts it); a reply that fails to parse is a text reply (as
BFCL's decoder failure is), counted in ``parse_errors``; a text reply goes to ``env.end_turn``; the
env's ``done`` after a step ends the episode (``terminal_tool``). Each finished episode is scored
at once and its row written (``on_row``).

With ``rehearsal.strategy`` ``select``, ``rules`` or ``vote`` (beyond the paper,
``selection.py``), the rehearsal of a user turn inserts no memory: it chooses one of N candidate
first ACT outputs (``apply_selection``), which the engine commits verbatim (the ``preset``
hook) instead of generating one.

Usage::

    from envace_lite.testtime.execute import run_committed
    from envace_lite.testtime.episode import Episode
    from envace_lite.testtime.gate import WriteGate
    env = make_env("tau2-retail-ticket", "17")
    msgs = env.reset()
    rows = run_committed(gen, tok, [Episode(env.suite, "17", 0, env, msgs, gate=WriteGate(msgs))],
                         cfg, rehearsal="sequential", n=2)
"""
from __future__ import annotations

import json
import time
from typing import Any, ClassVar

from envace_lite import protocol
from envace_lite.protocol.prompts import act_messages
from envace_lite.protocol import prompts
from envace_lite.config import Config
from envace_lite.core.engine import ActHooks, ActState, chat_glue, next_prompt, run_turns
from envace_lite.testtime.episode import Episode, call_log
from envace_lite.llm.generation import Completion, Generator, chat_ids
from envace_lite.progress import get_logger, progress
from envace_lite.testtime.rehearsal import RehearsalExecuted, rehearse_turns
from envace_lite.testtime.candidates import SELECTING
from envace_lite.testtime.selection import STRATEGIES, TurnSelection, select_turns
from envace_lite.testtime.turn_records import apply_rehearsal, apply_selection
from envace_lite.types import DECODING, Observation, RehearsalMode, ToolCall, rehearsal_mode

log = get_logger(__name__)


def _execute(ep: Episode, calls: list[ToolCall], tools: list[dict[str, Any]]) -> list[Observation]:
    """``env.step`` the calls the gate lets through; refused ones get an error observation."""
    terminal = ep.env.terminal_tools
    reasons = [ep.gate.check(c, ep.env, tools) if ep.gate is not None and c.name not in terminal
               else None for c in calls]
    allowed = [c for c, r in zip(calls, reasons) if r is None]
    real = iter(ep.env.step(allowed) if allowed else [])
    observations = [next(real) if r is None else
                    Observation(prompts.GATE_REFUSAL.format(reason=r), error=True) for r in reasons]
    ep.gated_calls += sum(r is not None for r in reasons)
    executed = [o for o, r in zip(observations, reasons) if r is None]
    if allowed:
        ep.events.append({"kind": "step", "calls": [c.to_dict() for c in allowed],
                          "observations": [o.to_dict() for o in executed],
                          "history_len": len(ep.history)})
    if ep.gate is not None:
        ep.gate.see_observations(executed)
    return observations


def _finish(ep: Episode, cfg: Config, mode: RehearsalMode, n: int,
            strategy: str = "memory") -> dict[str, Any]:
    """Score a finished episode with its benchmark, close its env, and build its row."""
    if not ep.seconds:
        ep.seconds = time.perf_counter() - ep.started
    try:
        reward, details = ep.env.score()
    except Exception as exc:  # noqa: BLE001 (a scoring crash must not lose the other rows)
        log.warning("%s: scoring failed: %r; reward 0", ep.task_id, exc)
        reward, details = 0.0, {"score_error": repr(exc)}
    try:
        ep.env.close()
    except Exception as exc:  # noqa: BLE001 (a failing close must not lose the other rows)
        log.warning("%s: closing its env failed: %r", ep.task_id, exc)
    return {
        "task_id": ep.task_id, "suite": ep.suite, "repeat": ep.repeat, "reward": float(reward),
        "turns": ep.turns, "user_turns": ep.user_turns, "tool_calls": ep.tool_calls,
        "real_calls": ep.env.real_calls, "violations": ep.violations,
        "failed_real_calls": sum(1 for e in ep.events if e["kind"] == "step"
                                 for o in e["observations"] if o.get("error")),
        "real_call_log": call_log(ep),
        "parse_errors": ep.parse_errors, "stop_reason": ep.stop_reason,
        "rehearsal": mode, "n": n, "strategy": strategy if mode != "none" else "",
        "rehearsal_real_calls": ep.rehearsal_real_calls,
        "rehearsal_tokens": ep.rehearsal_tokens, "rehearse_outputs": ep.rehearse_outputs,
        "memory_tokens": ep.memory_tokens, "feedback_parse_errors": ep.feedback_parse_errors,
        "empty_memories": ep.empty_memories, "truncated_memories": ep.truncated_memories,
        "memories": list(ep.memories), "rehearsal_seconds": round(ep.rehearsal_seconds, 2),
        "selections": [s.to_dict() for s in ep.selections],
        "crashed_attempts": ep.crashed_attempts, "rejected_attempts": ep.rejected_attempts,
        "selection_errors": ep.selection_errors,
        "generated_tokens": ep.act_tokens - ep.preset_tokens + ep.rehearsal_tokens,
        "rehearsal_decoding": cfg.rehearsal.decoding if mode != "none" else "",
        "write_gate": ep.gate is not None, "gated_calls": ep.gated_calls, "grounding": "none",
        "rendering": cfg.rollout.rendering, "decoding": cfg.eval.decoding,
        "seconds": round(ep.seconds, 2), "error": ep.error, "details": _jsonable(details),
    }


def _end_episode(ep: Episode, where: str, exc: BaseException) -> None:
    """End one episode on an exception in its own work; its row records it."""
    ep.stop_reason, ep.error = "error", f"{where}: {type(exc).__name__}: {exc}"[:500]
    ep.events.append({"kind": "error", "error": ep.error})
    log.warning("%s (repeat %d): episode ended by an error (%s)", ep.task_id, ep.repeat, ep.error)


def _rehearse_guarded(todo: list[Episode], gen: Generator, tok: Any, cfg: Config, mode: str,
                      n: int) -> None:
    """``rehearse_turns`` on the batch, its records applied (``apply_rehearsal``); if it raises,
    episode by episode, and an episode whose own rehearsal raises ends with an error (the others
    are rehearsed as usual)."""
    try:
        records = rehearse_turns(todo, gen, tok, cfg, mode, n)
    except RehearsalExecuted:  # an invariant broke: a bug, not one episode's failure
        raise
    except Exception as exc:  # noqa: BLE001 (find the episode that failed; the rest go on)
        if len(todo) == 1:
            _end_episode(todo[0], "rehearsal", exc)
            return
        log.warning("a rehearsal batch of %d episodes failed (%r); rehearsing one by one",
                    len(todo), exc)
    else:
        for ep, rec in zip(todo, records):
            apply_rehearsal(ep, rec, cfg.rehearsal.memory_placement)
        return
    for ep in todo:
        try:
            (rec,) = rehearse_turns([ep], gen, tok, cfg, mode, n)
        except RehearsalExecuted:
            raise
        except Exception as exc:  # noqa: BLE001
            _end_episode(ep, "rehearsal", exc)
        else:
            apply_rehearsal(ep, rec, cfg.rehearsal.memory_placement)


def _select_guarded(todo: list[Episode], gen: Generator, tok: Any, cfg: Config, mode: str,
                    n: int, strategy: str, rehearse_gen: Generator | None) -> None:
    """``selection.select_turns`` on the batch, its records applied (``apply_selection``); if it
    raises, episode by episode, and an episode whose own selection raises commits without a
    preset (ACT generates as without rehearsal; ``selection_errors`` counts it)."""
    def run(eps: list[Episode]) -> list[TurnSelection]:
        return select_turns(eps, gen, tok, cfg, mode, n, strategy,
                            act_prompt=lambda ep: _peek_prompt(ep, tok, cfg),
                            rehearse_generator=rehearse_gen)

    try:
        records = run(todo)
    except RehearsalExecuted:
        raise
    except Exception as exc:  # noqa: BLE001 (find the episode that failed; the rest go on)
        log.warning("a selection batch of %d episodes failed (%r); one by one", len(todo), exc)
    else:
        for ep, rec in zip(todo, records):
            apply_selection(ep, rec)
        return
    for ep in todo:
        try:
            (rec,) = run([ep])
        except RehearsalExecuted:
            raise
        except Exception as exc:  # noqa: BLE001
            ep.selection_errors += 1
            ep.needs_rehearsal, ep.preset = False, None
            log.warning("%s: selection failed (%s: %s); the committed ACT generates", ep.task_id,
                        type(exc).__name__, exc)
        else:
            apply_selection(ep, rec)


def _peek_prompt(ep: Episode, tokenizer: Any, cfg: Config) -> list[int]:
    """``act_prompt`` without its one side effect (the tools it records for the next render)."""
    tools = ep.act_tools
    try:
        return act_prompt(ep, tokenizer, cfg)
    finally:
        ep.act_tools = tools


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def act_prompt(ep: Episode, tokenizer: Any, cfg: Config) -> list[int]:
    """The episode's next ACT prompt, on the token ids training uses (docs/design.md, "Committed
    execution on training's tokens").

    The first prompt is rendered from the messages (with whatever joined the history before the
    first ACT output, e.g. the memory m_x). Later prompts are the ACT history ``ep.act_ids`` (the
    last prompt plus its sampled ids, verbatim) extended by the template glue of the messages
    that joined since (tool responses, user turns, m_x), exactly as ``rollout`` packs a
    trajectory. Re-rendering the whole history instead would differ from training's tokens:
    Qwen3's template drops the empty ``<think></think>`` of earlier assistant turns, and the
    sampled ids need not be what the text re-encodes to.

    One exception: when the env's tool list changed since the last rendering (BFCL miss_func
    adds a held-out function at its turn), the prompt is rendered again from the messages, so
    that ACT sees the new tool.

    Returns:
        The prompt ids, shape (P,).
    """
    return next_prompt(_EpisodeSlot(0, ep), _CommittedHooks(tokenizer, cfg), tokenizer,
                       chat_glue(tokenizer))


class _EpisodeSlot(ActState):
    """The engine's view of one episode (``engine.ActState``); ``index``: its place in the run."""

    def __init__(self, index: int, ep: Episode) -> None:
        self.index, self.ep = index, ep
        self.calls, self.observations, self.terminal_call = [], [], None
        self.tools: list[dict[str, Any]] = []

    act_ids = property(lambda s: s.ep.act_ids, lambda s, v: setattr(s.ep, "act_ids", v))
    act_stopped = property(lambda s: s.ep.act_stopped,
                           lambda s, v: setattr(s.ep, "act_stopped", v))
    turns = property(lambda s: s.ep.turns, lambda s, v: setattr(s.ep, "turns", v))
    stop_reason = property(lambda s: s.ep.stop_reason,
                           lambda s, v: setattr(s.ep, "stop_reason", v))
    env = property(lambda s: s.ep.env)


class _CommittedHooks(ActHooks):
    """The engine's rules in committed execution (``engine.ActHooks``).

    ``before_act``: the live episodes that just got a user message rehearse (``rehearse``, when
    given). ``render``: the first prompt, and any prompt after the env's tool list changed, is
    rendered from the messages (``act_prompt``). Calls are parsed against the env's current tools
    and all run, through the write gate when the episode has one (``_execute``); the env's
    ``done`` after a step is ``terminal_tool``. A parse error is a text reply (counted in ``parse_errors``); a text reply
    goes to ``env.end_turn``. ``stopped``: ``finish`` (score the episode, write its row).
    """

    stages: ClassVar[dict[str, str]] = {
        "prompt": "act prompt", "output": "act output", "step": "act output",
        "observations": "act output"}

    def __init__(self, tokenizer: Any, cfg: Config, rehearse: Any = None,
                 finish: Any = None) -> None:
        self.tokenizer, self.cfg, self.rehearse, self.finish = tokenizer, cfg, rehearse, finish

    def before_act(self, live: list[_EpisodeSlot]) -> None:
        todo = [x for x in live if x.ep.needs_rehearsal]
        if self.rehearse is None or not todo:
            return
        self.rehearse([x.ep for x in todo])
        for x in todo:
            if x.ep.stop_reason == "error":
                self.stopped(x)

    def preset(self, x: _EpisodeSlot) -> Completion | None:
        out, x.ep.preset = x.ep.preset, None
        if out is not None:
            x.ep.preset_tokens += len(out.ids)
        return out

    def render(self, x: _EpisodeSlot) -> list[int] | None:
        ep, rc = x.ep, self.cfg.rollout
        tools = ep.env.tool_schemas()
        if ep.act_ids and tools == ep.act_tools:
            return None
        ep.act_tools = tools
        return chat_ids(self.tokenizer, act_messages(
            ep.messages, tools, rc.rendering, rc.compact_policy_chars, ep.history))

    def pending(self, x: _EpisodeSlot) -> list[dict[str, Any]]:
        return x.ep.history[x.ep.act_history_len:]

    def join(self, x: _EpisodeSlot, messages: list[dict[str, Any]]) -> None:
        x.ep.history.extend(messages)

    def tools(self, x: _EpisodeSlot) -> list[dict[str, Any]]:
        x.tools = x.ep.env.tool_schemas()
        return x.tools

    def on_output(self, x: _EpisodeSlot, prompt: list[int], out: Any, ids: list[int],
                  parsed: protocol.ActParse) -> None:
        x.ep.history.append({"role": "assistant", "content": out.text})
        x.ep.act_history_len = len(x.ep.history)
        x.ep.act_tokens += len(out.ids)

    def parse_error(self, x: _EpisodeSlot, text: str, parsed: protocol.ActParse, turn: int) -> str:
        x.ep.parse_errors += 1
        log.info("%s: parse error %s (%s); treated as a text reply",
                 x.ep.task_id, parsed.error_code.value, parsed.reason)
        return text

    def user_turn(self, x: _EpisodeSlot, text: str) -> list[dict[str, Any]] | None:
        ep = x.ep
        ep.events.append({"kind": "end_turn", "text": text})
        nxt = ep.env.end_turn(text)
        if nxt is None:
            return None
        ep.user_turns += 1
        ep.needs_rehearsal = True
        if ep.gate is not None:
            ep.gate.see_messages(nxt)
        return nxt

    def route_calls(self, x: _EpisodeSlot, calls: list[ToolCall], turn: int) -> None:
        ep = x.ep
        ep.tool_calls += sum(c.name not in ep.env.terminal_tools for c in calls)
        ep.violations += sum(1 for c in calls if c.violations)
        x.calls = list(calls)

    def execute(self, x: _EpisodeSlot) -> None:
        x.observations = _execute(x.ep, x.calls, x.tools)

    def step_stop(self, x: _EpisodeSlot) -> str:
        return "terminal_tool" if x.ep.env.done else ""

    def stopped(self, x: _EpisodeSlot) -> None:
        if x.ep.stop_reason == "context_budget":
            log.info("%s: its ACT prompt is over the budget of %d tokens; episode ends",
                     x.ep.task_id, self.cfg.rollout.max_prompt_tokens)
        if self.finish is not None:
            self.finish(x.index, x.ep)

    def fail(self, x: _EpisodeSlot, where: str, exc: BaseException) -> None:
        _end_episode(x.ep, where, exc)


def run_committed(generator: Generator, tokenizer: Any, episodes: list[Episode], cfg: Config, *,
                  rehearsal: RehearsalMode | None = "none", n: int | None = None,
                  rehearsal_generator: Generator | None = None,
                  rehearsal_tokenizer: Any = None,
                  on_row: Any = None, strategy: str | None = None) -> list[dict[str, Any]]:
    """Run ``episodes`` to the end, turn-synchronously, rehearsing each user turn first.

    Each step: the live episodes that just got a user message rehearse (one batch), then every
    live episode's ACT prompt goes to ``generator`` in one batch, and each reply is executed.

    Args:
        generator, tokenizer: the acting policy.
        episodes: fresh episodes (``Episode(suite, task_id, repeat, env, env.reset())``).
        cfg: the run config (rendering, budgets, ``eval`` decoding and turn limit, ``rehearsal``).
        rehearsal: ``"none"`` (plain committed execution), ``parallel`` or ``sequential``
            (``types.RehearsalMode``); None is taken as ``"none"`` (``types.rehearsal_mode``).
        n: N (default ``cfg.rehearsal.n``).
        rehearsal_generator, rehearsal_tokenizer: the rehearsing policy (default: the acting one).
            Strategy ``memory``: it plays every role of the rehearsal. ``select``: it plays
            REHEARSE only (the acting policy writes the attempts' ACT outputs) and reads prompts
            built with ``tokenizer``. ``rules`` and ``vote`` never use it.
        strategy: ``rehearsal.strategy`` (default ``cfg.rehearsal.strategy``): ``memory`` (m_x,
            paper §2.3), ``select``, ``rules`` or ``vote`` (``selection.py``).
        on_row: called with each row as soon as its episode is scored (e.g. to append it to
            ``results.jsonl``).

    Returns:
        One row per episode, in the order of ``episodes``: ``task_id, suite, repeat, reward,
        turns, user_turns, tool_calls, real_calls, violations, failed_real_calls,
        real_call_log (``episode.call_log``), parse_errors, stop_reason,
        rehearsal, n, rehearsal_real_calls (0), rehearsal_tokens, rehearse_outputs,
        memory_tokens, feedback_parse_errors, empty_memories, truncated_memories, memories,
        rehearsal_seconds, rehearsal_decoding, write_gate, gated_calls, grounding ("none"),
        rendering, decoding, seconds, error, details``. An exception in one episode's own work
        (its ACT prompt, its rehearsal, its env step) ends that episode with
        ``stop_reason="error"`` and ``error`` set; its row is written, the others go on.

    Raises:
        ValueError: ``rehearsal`` is not a ``types.RehearsalMode`` (nor None), or ``strategy``
            is not one of ``selection.STRATEGIES``.
    """
    mode = rehearsal_mode(rehearsal)
    strategy = cfg.rehearsal.strategy if strategy is None else strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"rehearsal strategy {strategy!r}: use one of {STRATEGIES}")
    n = (cfg.rehearsal.n if n is None else n) if mode != "none" else 0
    rgen = rehearsal_generator or generator
    rtok = rehearsal_tokenizer if rehearsal_tokenizer is not None else tokenizer
    temperature, top_p = DECODING[cfg.eval.decoding]
    rows: dict[int, dict[str, Any]] = {}
    bar = progress(total=len(episodes), desc=f"episodes ({mode})", enabled=cfg.run.progress)

    def finish(i: int, ep: Episode) -> None:
        rows[i] = _finish(ep, cfg, mode, n, strategy)
        bar.update(1)
        if on_row is not None:
            on_row(rows[i])

    def rehearse(todo: list[Episode]) -> None:
        if strategy in SELECTING:
            _select_guarded(todo, generator, tokenizer, cfg, mode, n, strategy,
                            rehearsal_generator)
        else:
            _rehearse_guarded(todo, rgen, rtok, cfg, mode, n)

    hooks = _CommittedHooks(tokenizer, cfg, rehearse if mode != "none" else None, finish)
    run_turns([_EpisodeSlot(i, ep) for i, ep in enumerate(episodes)], generator, tokenizer, hooks,
              max_new_tokens=cfg.rollout.max_new_tokens_act, temperature=temperature,
              top_p=top_p, max_prompt_tokens=cfg.rollout.max_prompt_tokens,
              max_turns=cfg.eval.max_turns)
    bar.close()
    for i, ep in enumerate(episodes):  # episodes that were already over when passed in
        if i not in rows:
            finish(i, ep)
    return [rows[i] for i in range(len(episodes))]


__all__ = [
    "act_prompt",
    "run_committed",
]
