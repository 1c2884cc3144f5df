"""The state of one committed execution (``Episode``) and the log of its real calls.

``Episode`` holds what ``execute.run_committed`` runs and the counters its row reports;
``call_log`` is the row's ``real_call_log``: every call that reached the real environment, with
its arguments and observation capped at ``CALL_LOG_CHARS`` characters.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from envace_lite.testtime.gate import WriteGate
from envace_lite.testtime.rehearsal import TurnRehearsal
from envace_lite.testtime.selection import TurnSelection
from envace_lite.envs.base import Env
from envace_lite.llm.generation import Completion

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
        rehearsals: one ``TurnRehearsal`` per rehearsed user turn (strategy ``memory``).
        selections: one ``selection.TurnSelection`` per user turn (strategies ``select``,
            ``rules``, ``vote``).
        preset: the first ACT output chosen by the current user turn's selection, until the
            engine commits it (``execute._Committed.preset``).
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
    selections: list[TurnSelection] = field(default_factory=list)
    preset: Completion | None = None
    crashed_attempts: int = 0
    rejected_attempts: int = 0
    selection_errors: int = 0
    act_tokens: int = 0
    preset_tokens: int = 0
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


CALL_LOG_CHARS = 200
"""Characters kept in a row's ``realcall_log`` of each real observation, and of each argument
value's JSON."""


def logged_arguments(arguments: Any) -> dict[str, Any]:
    """A call's arguments as logged, so that one huge argument cannot swell ``results.jsonl``.

    Each value stays as it is when its JSON is at most ``CALL_LOG_CHARS`` characters, else it
    becomes ``{"_truncated": <the first CALL_LOG_CHARS characters of that JSON>}``; short values,
    such as an order id, are therefore always kept whole (``the drills report`` reads
    them). Arguments that are not an object are logged, capped the same way, under
    ``"_not_an_object"``. Values JSON cannot encode are written with ``str``.
    """
    def cap(value: Any) -> Any:
        text = json.dumps(value, ensure_ascii=False, default=str)
        return json.loads(text) if len(text) <= CALL_LOG_CHARS else {
            "_truncated": text[:CALL_LOG_CHARS]}

    if not isinstance(arguments, dict):
        return {"_not_an_object": cap(arguments)}
    return {str(k): cap(v) for k, v in arguments.items()}


def call_log(ep: Episode) -> list[dict[str, Any]]:
    """The real calls of a committed execution, in order, for error analysis.

    Returns:
        One ``{"name", "arguments", "error", "observation"}`` per call that reached the
        environment (``Episode.events``; gated calls never do): the call as parsed (arguments
        capped by ``logged_arguments``), tau2's (or the backend's) error flag, and the first
        ``CALL_LOG_CHARS`` characters of its observation.
        ``sum(c["error"] for c in log)`` is the row's ``failed_real_calls``.
    """
    return [{"name": str(c.get("name", "")),
             "arguments": logged_arguments(c.get("arguments", {})),
             "error": bool(o.get("error")),
             "observation": str(o.get("content", ""))[:CALL_LOG_CHARS]}
            for e in ep.events if e["kind"] == "step"
            for c, o in zip(e["calls"], e["observations"])]


__all__ = ["CALL_LOG_CHARS", "Episode", "call_log", "logged_arguments"]
