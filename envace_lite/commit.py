"""Committed execution in the real environment, with optional rehearsal and write gate.

A *committed execution* is one episode in which every ACT output is executed for real
(``Env.step``) and the benchmark's own evaluator scores the result. Without rehearsal it is the
paper's Non-TTS evaluation; with it, it is the single real run of paper §2.3: at each new user
message the policy first rehearses privately (``rehearsal.rehearse_turns``), then ACT continues
in the real adapter with the memory m_x in its context.

Each ACT prompt extends the episode's ACT token history exactly as training's ``rollout`` packs
it: the sampled ids verbatim, then the template glue of the messages that joined since
(``act_prompt``; docs/design.md, "Committed execution on training's tokens").

Episodes of all tasks advance **turn-synchronously**: the episodes that just got a user message
rehearse together (one batch per rehearsal step), then the ACT prompts of every live episode go to
the generator in one batch (batched generation is about 8x faster on CPU, docs/design.md, "Machine
facts"), and each reply is parsed and executed:

- tool calls → ``env.step`` → one user-role ``<tool_response>`` message joins the history;
- a text reply (or a reply that fails to parse, as BFCL's decoder failure does) → ``env.end_turn``;
  the next scripted user message joins the history, or the episode ends;
- it also ends on the turn limit, the context budget, or a terminal tool (telecom ``done``).

**Write gate** (optional; docs/design.md, "Our additions beyond the paper"): a state-changing call
is refused when it fails its tool's JSON schema, or when one of its identifier arguments
(``IDENTIFIER_KEY``) has a value that does not occur verbatim in a user message or a real non-error
observation of this episode (never the memory: imagined ids are exactly what the gate stops). The
calls of one reply are judged against what was seen before that reply. A refused call is not
executed; ACT gets
``prompts.GATE_REFUSAL`` as an error observation, and ``gated_calls`` counts it.

Usage::

    from envace_lite.commit import Episode, WriteGate, run_committed
    env = make_env("tau2-retail-ticket", "17")
    msgs = env.reset()
    rows = run_committed(gen, tok, [Episode(env.suite, "17", 0, env, msgs, gate=WriteGate(msgs))],
                         cfg, rehearsal="sequential", n=2)
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from envace_lite import prompts, protocol
from envace_lite.config import Config
from envace_lite.envs import Env
from envace_lite.generation import Generator, chat_ids
from envace_lite.progress import get_logger, progress
from envace_lite.rehearsal import RehearsalExecuted, TurnRehearsal, rehearse_turns
from envace_lite.rollout import chat_glue, ids_with_stop
from envace_lite.types import DECODING, Observation, RehearsalMode, ToolCall, rehearsal_mode

log = get_logger(__name__)

IDENTIFIER_KEY = re.compile(r"(?:^|_)(?:id|ids|token|number|symbol)$|[a-z0-9](?:Id|Ids|ID|Token)$")
"""Argument names (at any nesting level) whose values the write gate treats as identifiers of
existing records: ``order_id``, ``item_ids``, ``receiver_id``, ``access_token``,
``flight_number``, ``symbol``, ``userId``. Names that may create something new (``file_name``,
``dir_name``, ``destination``) are not identifiers: a new name is, by nature, unseen."""


# ---------------------------------------------------------------------------------------------
# The write gate (docs/design.md, "Our additions beyond the paper")
# ---------------------------------------------------------------------------------------------

def identifiers(arguments: Any, key: str = "") -> list[tuple[str, str]]:
    """``(argument name, value)`` for every identifier value in ``arguments``.

    A value is an identifier when its nearest key matches ``IDENTIFIER_KEY``; strings (non-blank)
    and integers count, inside lists and nested objects too. Booleans, floats and nulls never do.
    """
    out: list[tuple[str, str]] = []
    if isinstance(arguments, dict):
        for k, v in arguments.items():
            out += identifiers(v, str(k))
    elif isinstance(arguments, list):
        for v in arguments:
            out += identifiers(v, key)
    elif key and IDENTIFIER_KEY.search(key):
        if isinstance(arguments, str) and arguments.strip():
            out.append((key, arguments.strip()))
        elif isinstance(arguments, int) and not isinstance(arguments, bool):
            out.append((key, str(arguments)))
    return out


class WriteGate:
    """Refuses hallucinated or malformed writes during committed execution (docs/design.md,
    "Our additions beyond the paper").

    Args:
        messages: the episode's initial messages (their user messages are seen).
    """

    def __init__(self, messages: list[dict[str, Any]] = ()) -> None:
        self._seen: list[str] = []
        self.see_messages(messages)

    def see_messages(self, messages: list[dict[str, Any]]) -> None:
        """Record the user messages among ``messages``."""
        self._seen += [str(m.get("content") or "") for m in messages if m.get("role") == "user"]

    def see_observations(self, observations: list[Observation]) -> None:
        """Record real observations; error observations are not sources of identifiers."""
        self._seen += [o.content for o in observations if not o.error]

    def check(self, call: ToolCall, env: Env, tools: list[dict[str, Any]]) -> str | None:
        """Why ``call`` is refused, or None when it may run.

        Only state-changing calls (``env.is_state_changing``) are judged: a schema failure
        (``protocol.check_call`` against ``tools``), then each identifier value must occur
        verbatim in a user message or a real non-error observation seen so far.
        """
        if not env.is_state_changing(call.name):
            return None
        problems = protocol.check_call(call.name, call.arguments, tools)
        if problems:
            return f"{call.name} fails its schema ({problems[0]})"
        seen = "\n".join(self._seen)
        for key, value in identifiers(call.arguments):
            if value not in seen:
                return (f"{call.name}: {key}={value!r} never appeared in a user message or a real "
                        "tool result of this conversation")
        return None


# ---------------------------------------------------------------------------------------------
# Committed execution
# ---------------------------------------------------------------------------------------------

@dataclass
class Episode:
    """One live committed execution in a real env (the state of ``run_committed``).

    Attributes:
        suite, task_id, repeat: what is run.
        env: the real adapter, already ``reset``.
        messages: ``env.reset()``'s messages (system first); with
            ``rehearsal.memory_placement="ticket"``, a copy whose request also holds m_x.
        history: later messages: ACT replies, tool responses, user turns, memory messages.
        gate: a ``WriteGate`` when the gate is on.
        events: what reached the env, for replays (fidelity audit): ``{"kind": "step", "calls",
            "observations", "history_len"}`` (``history_len``: the history length right after
            the ACT reply) and ``{"kind": "end_turn", "text"}``.
        rehearsals: one ``TurnRehearsal`` per rehearsed user turn.
        memories: m_x text per rehearsed user turn ("" when empty).
        act_ids: the ACT token history as training packs it (``rollout``): the last ACT prompt
            and the ids sampled from it, verbatim (``act_prompt``).
        act_stopped: the last ACT output ended on a stop token.
        act_history_len: ``len(history)`` right after the last ACT reply; the messages after it
            join ``act_ids`` as template glue.
        act_tools: the tool schemas the prompt was rendered with.
        error: set when an exception in this episode's own work (its prompt, its rehearsal, its
            env step) ended it (``stop_reason="error"``); "" otherwise.
        The counters are the row's keys (``run_committed``).
    """

    suite: str
    task_id: str
    repeat: int
    env: Env
    messages: list[dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    gate: WriteGate | None = None
    turns: int = 0
    user_turns: int = 1
    tool_calls: int = 0
    violations: int = 0
    parse_errors: int = 0
    gated_calls: int = 0
    stop_reason: str = ""
    needs_rehearsal: bool = True
    rehearsals: list[TurnRehearsal] = field(default_factory=list)
    memories: list[str] = field(default_factory=list)
    rehearsal_real_calls: int = 0
    rehearsal_tokens: int = 0
    rehearse_outputs: int = 0
    memory_tokens: int = 0
    feedback_parse_errors: int = 0
    empty_memories: int = 0
    truncated_memories: int = 0
    rehearsal_seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    act_ids: list[int] = field(default_factory=list)
    act_stopped: bool = True
    act_history_len: int = 0
    act_tools: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    error: str = ""

    @property
    def live(self) -> bool:
        return not self.stop_reason


def apply_rehearsal(ep: Episode, rec: TurnRehearsal, placement: str = "message") -> None:
    """Apply one user turn's rehearsal record to its episode (``rehearsal.rehearse_turns``).

    Inserts m_x (nothing when the memory is empty, so the committed prompt is then exactly the
    no-rehearsal prompt), keeps the record, and adds its counts to the episode's counters (the
    row's keys).

    Args:
        placement: ``message``: m_x joins the history as one user-role memory message (paper
            §2.3). ``ticket`` (beyond the paper, ``rehearsal.memory_placement``): the memory
            message's text is appended, after a blank line, to the request it was rehearsed
            for: the last user message of the history, or of the initial messages when the
            history holds none. The message is replaced by a copy, so the task's own messages
            are never changed.

    Raises:
        ValueError: an unknown ``placement``.
    """
    if placement not in ("message", "ticket"):
        raise ValueError(f"memory placement {placement!r}: use 'message' or 'ticket'")
    mem = rec.memory
    ep.rehearsals.append(rec)
    ep.rehearsal_real_calls += rec.real_calls
    ep.rehearsal_tokens += rec.tokens
    ep.rehearse_outputs += rec.rehearse_outputs
    ep.rehearsal_seconds += rec.seconds
    ep.feedback_parse_errors += rec.feedback_parse_errors
    ep.memory_tokens += mem.tokens
    ep.empty_memories += int(mem.empty)
    ep.truncated_memories += int(mem.truncated)
    ep.memories.append(mem.text)
    if not mem.empty:
        message = prompts.memory_message(mem.text)
        if placement == "message" or not _append_to_request(ep, message["content"]):
            ep.history.append(message)
    ep.needs_rehearsal = False


def _append_to_request(ep: Episode, text: str) -> bool:
    """Append ``text`` to the request just received, on a copy of the message and its list.

    The request is the last user message that is not a ``<tool_response>``, among the messages
    no ACT prompt holds yet: before the first ACT output, the history and then the initial
    messages; after it, the history since the last ACT reply (``act_history_len``), since the
    earlier ones are already in ``act_ids``. False (the caller appends a memory message instead)
    when there is no such message.
    """
    def find(msgs: list[dict[str, Any]], start: int) -> int | None:
        for i in range(len(msgs) - 1, start - 1, -1):
            content = msgs[i].get("content")
            if (msgs[i].get("role") == "user" and isinstance(content, str)
                    and not content.lstrip().startswith("<tool_response>")):
                return i
        return None

    owners = ([("history", 0), ("messages", 0)] if not ep.act_ids
              else [("history", ep.act_history_len)])
    for owner, start in owners:
        msgs = getattr(ep, owner)
        i = find(msgs, start)
        if i is not None:
            new = list(msgs)
            new[i] = {**msgs[i], "content": f"{msgs[i]['content']}\n\n{text}"}
            setattr(ep, owner, new)
            return True
    return False


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


def _step_episode(ep: Episode, text: str, cfg: Config) -> None:
    """Apply one ACT output to a live episode (execute calls or close the user turn)."""
    tools = ep.env.tool_schemas()
    parsed = protocol.parse_act(text, tools)
    ep.turns += 1
    ep.history.append({"role": "assistant", "content": text})
    ep.act_history_len = len(ep.history)
    if parsed.kind == "calls":
        ep.tool_calls += sum(c.name not in ep.env.terminal_tools for c in parsed.calls)
        ep.violations += sum(1 for c in parsed.calls if c.violations)
        observations = _execute(ep, parsed.calls, tools)
        if ep.env.done:
            ep.stop_reason = "terminal_tool"
            return
        ep.history.append(protocol.tool_response_message(observations))
    else:
        if parsed.kind == "error":
            ep.parse_errors += 1
            log.info("%s: parse error %s (%s); treated as a text reply",
                     ep.task_id, parsed.error_code.value, parsed.reason)
        reply = text if parsed.kind == "error" else parsed.text
        ep.events.append({"kind": "end_turn", "text": reply})
        nxt = ep.env.end_turn(reply)
        if nxt is None:
            ep.stop_reason = "final_answer"
            return
        ep.user_turns += 1
        ep.history.extend(nxt)
        ep.needs_rehearsal = True
        if ep.gate is not None:
            ep.gate.see_messages(nxt)
    if ep.turns >= cfg.eval.max_turns:
        ep.stop_reason = "turn_limit"


def _finish(ep: Episode, cfg: Config, mode: RehearsalMode, n: int) -> dict[str, Any]:
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
        "parse_errors": ep.parse_errors, "stop_reason": ep.stop_reason,
        "rehearsal": mode, "n": n, "rehearsal_real_calls": ep.rehearsal_real_calls,
        "rehearsal_tokens": ep.rehearsal_tokens, "rehearse_outputs": ep.rehearse_outputs,
        "memory_tokens": ep.memory_tokens, "feedback_parse_errors": ep.feedback_parse_errors,
        "empty_memories": ep.empty_memories, "truncated_memories": ep.truncated_memories,
        "memories": list(ep.memories), "rehearsal_seconds": round(ep.rehearsal_seconds, 2),
        "rehearsal_decoding": cfg.rehearsal.decoding if mode != "none" else "",
        "write_gate": ep.gate is not None, "gated_calls": ep.gated_calls, "grounding": "none",
        "rendering": cfg.rollout.rendering, "decoding": cfg.eval.decoding,
        "seconds": round(ep.seconds, 2), "error": ep.error, "details": _jsonable(details),
    }


def _fail(ep: Episode, where: str, exc: BaseException) -> None:
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
            _fail(todo[0], "rehearsal", exc)
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
            _fail(ep, "rehearsal", exc)
        else:
            apply_rehearsal(ep, rec, cfg.rehearsal.memory_placement)


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
    tools = ep.env.tool_schemas()
    if not ep.act_ids or tools != ep.act_tools:
        ep.act_tools = tools
        return chat_ids(tokenizer, protocol.act_messages(
            ep.messages, tools, cfg.rollout.rendering, cfg.rollout.compact_policy_chars,
            ep.history))
    glue = chat_glue(tokenizer)
    pending = ep.history[ep.act_history_len:]
    return ep.act_ids + tokenizer.encode(glue.after_turn(ep.act_stopped, pending),
                                         add_special_tokens=False)


def run_committed(generator: Generator, tokenizer: Any, episodes: list[Episode], cfg: Config, *,
                  rehearsal: RehearsalMode | None = "none", n: int | None = None,
                  rehearsal_generator: Generator | None = None,
                  rehearsal_tokenizer: Any = None,
                  on_row: Any = None) -> list[dict[str, Any]]:
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
        on_row: called with each row as soon as its episode is scored (e.g. to append it to
            ``results.jsonl``).

    Returns:
        One row per episode, in the order of ``episodes``: ``task_id, suite, repeat, reward,
        turns, user_turns, tool_calls, real_calls, violations, parse_errors, stop_reason,
        rehearsal, n, rehearsal_real_calls (0), rehearsal_tokens, rehearse_outputs,
        memory_tokens, feedback_parse_errors, empty_memories, truncated_memories, memories,
        rehearsal_seconds, rehearsal_decoding, write_gate, gated_calls, grounding ("none"),
        rendering, decoding, seconds, error, details``. An exception in one episode's own work
        (its ACT prompt, its rehearsal, its env step) ends that episode with
        ``stop_reason="error"`` and ``error`` set; its row is written, the others go on.

    Raises:
        ValueError: ``rehearsal`` is not a ``types.RehearsalMode`` (nor None).
    """
    mode = rehearsal_mode(rehearsal)
    n = (cfg.rehearsal.n if n is None else n) if mode != "none" else 0
    rgen = rehearsal_generator or generator
    rtok = rehearsal_tokenizer if rehearsal_tokenizer is not None else tokenizer
    temperature, top_p = DECODING[cfg.eval.decoding]
    budget = cfg.rollout.max_prompt_tokens
    rows: dict[int, dict[str, Any]] = {}
    bar = progress(total=len(episodes), desc=f"episodes ({mode})", enabled=cfg.run.progress)

    def finish(i: int, ep: Episode) -> None:
        rows[i] = _finish(ep, cfg, mode, n)
        bar.update(1)
        if on_row is not None:
            on_row(rows[i])

    while True:
        if mode != "none":
            todo = [ep for ep in episodes if ep.live and ep.needs_rehearsal]
            if todo:
                _rehearse_guarded(todo, rgen, rtok, cfg, mode, n)
                for i, ep in enumerate(episodes):
                    if ep.stop_reason == "error" and i not in rows:
                        finish(i, ep)
        live, prompt_ids = [], []
        for i, ep in enumerate(episodes):
            if not ep.live:
                continue
            try:
                ids = act_prompt(ep, tokenizer, cfg)
            except Exception as exc:  # noqa: BLE001 (this episode ends; the batch goes on)
                _fail(ep, "act prompt", exc)
                finish(i, ep)
                continue
            if len(ids) > budget:
                ep.stop_reason = "context_budget"
                log.info("%s: prompt of %d tokens is over the budget of %d; episode ends",
                         ep.task_id, len(ids), budget)
                finish(i, ep)
                continue
            live.append((i, ep))
            prompt_ids.append(ids)
        if not live:
            break
        outs = generator.generate(prompt_ids, role="act",
                                  max_new_tokens=cfg.rollout.max_new_tokens_act,
                                  temperature=temperature, top_p=top_p)
        glue = chat_glue(tokenizer)
        for (i, ep), prompt, out in zip(live, prompt_ids, outs):
            try:
                sampled = ids_with_stop(out, glue)
                ep.act_ids, ep.act_stopped = prompt + sampled, len(sampled) > len(out.ids)
                _step_episode(ep, out.text, cfg)
            except Exception as exc:  # noqa: BLE001 (this episode ends; the batch goes on)
                _fail(ep, "act output", exc)
            if not ep.live:
                finish(i, ep)
    bar.close()
    for i, ep in enumerate(episodes):  # episodes that were already over when passed in
        if i not in rows:
            finish(i, ep)
    return [rows[i] for i in range(len(episodes))]


__all__ = [
    "IDENTIFIER_KEY",
    "Episode",
    "WriteGate",
    "act_prompt",
    "apply_rehearsal",
    "identifiers",
    "run_committed",
]
