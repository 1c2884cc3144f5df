"""REHEARSE's prompt: the environment role's instruction and one call's prompt, rebuilt per call
and trimmed to a token budget (paper §2.1; docs/design.md, "Generation and history").

A validation-first system instruction, then candidate tools, grounding (real results of gold
calls at training time; ``<unavailable>`` at test time and when grounding is dropped), the
conversation so far and the current call with its schema (``rehearse_messages``). Reference
examples go first when the prompt is over budget, then the oldest history messages after the
request. ``rehearsal_text`` wraps an observation as a REHEARSE output (the SFT target).

ACT's prompt and the tool rendering are in ``prompts.py``; ``protocol`` parses REHEARSE outputs.

Usage::

    from envace_lite.protocol.rehearse_prompt import rehearse_messages
    p = rehearse_messages(task.tools, None, history, call, lambda s: len(s.split()), 2048,
                          "compact")
    p.messages, p.fits
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace_lite.protocol.prompts import OMITTED, history_block, call_json, function_of, render_tools
from envace_lite.protocol.tags import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from envace_lite.types import Observation, ToolCall

UNAVAILABLE = "<unavailable>"
"""The grounding block at test time and when grounding is dropped (docs/design.md, "Grounding")."""

REHEARSE_SYSTEM = """You are the environment that executes tool calls for an AI agent. You get the \
candidate tool schemas, reference calls with their real results (or <unavailable>), the \
conversation so far and one current call. Do exactly this:

1. First validate the current call against the candidate tools:
   - the tool name must be one of the candidate tools;
   - every required argument must be present, and no unknown argument may appear when the schema \
forbids extra properties;
   - every argument must have the right type;
   - every value must be valid: allowed enum values and formats, and no identifier that the \
reference results or the conversation show not to exist.
2. If the call is invalid, return the error the real environment would return: a JSON object \
{"error": "<short reason>"} for tools that return JSON, otherwise text starting with "Error:".
3. Otherwise return the realistic result the real environment would return, consistent with the \
reference results and the conversation, with the same fields and formats; JSON when the tool \
returns JSON. If a reference call matches the current call, reuse its result.

Write only the result, wrapped in <execution_result></execution_result> tags: no explanation, no \
hints, no markdown."""
"""REHEARSE's system instruction: validation first, then the result (docs/design.md, "The reference
code, and where we differ")."""

REHEARSE_USER = """## Candidate tools
<tools>
{tools}
</tools>

## Reference calls and real results for this task
{grounding}

## Conversation so far
{history}

## Current call
{call}

Validate the current call, then write its result inside <execution_result></execution_result> \
tags."""
"""REHEARSE's user message: the four sections of the reference prompt (docs/design.md, "The
reference code, and where we differ")."""


@dataclass
class RehearsePrompt:
    """The REHEARSE prompt of one call, after trimming.

    Attributes:
        messages: ``[system, user]``, plain chat messages.
        fits: True when ``n_tokens <= budget``. When False everything trimmable was trimmed and
            the caller decides (skip the call, end the episode, or let the model truncate).
        n_tokens: ``count_tokens(system) + count_tokens(user)`` (content only, no template glue).
        grounding_dropped: reference examples removed.
        history_omitted: history messages removed.
    """

    messages: list[dict[str, str]]
    fits: bool
    n_tokens: int
    grounding_dropped: int = 0
    history_omitted: int = 0


def rehearsal_text(obs_content: str) -> str:
    """An observation wrapped as a REHEARSE output (SFT targets)."""
    return f"{RESULT_OPEN}\n{obs_content.strip()}\n{RESULT_CLOSE}"


def _as_call(c: Any) -> ToolCall:
    return c if isinstance(c, ToolCall) else ToolCall(c.get("name", ""), c.get("arguments") or {})


def _grounding_block(examples: list[dict[str, Any]] | None, dropped: int) -> str:
    if examples is None:
        return UNAVAILABLE
    parts = []
    for ex in examples:
        obs = ex["observation"]
        content = obs.content if isinstance(obs, Observation) else str(obs.get("content", ""))
        parts.append(f"{CALL_OPEN}\n{call_json(_as_call(ex['call']))}\n{CALL_CLOSE}\n"
                     f"{rehearsal_text(content)}")
    if dropped:
        parts.append(OMITTED.format(n=dropped, what="reference examples"))
    return "\n\n".join(parts) if parts else "(no reference calls)"


def rehearse_messages(tools: list[dict[str, Any]], grounding: list[dict[str, Any]] | None,
                      history: list[dict[str, Any]], call: ToolCall,
                      count_tokens: Callable[[str], int], budget: int,
                      rendering: str) -> RehearsePrompt:
    """Build the REHEARSE prompt for one call, trimmed to ``budget`` tokens (docs/design.md,
    "Generation and history").

    Trimming order: (1) reference examples of other tools, last first; (2) reference examples of
    ``call``'s tool, last first; (3) the oldest history messages after the first one, replaced by
    a marker, so the first message (the request) and the latest ones survive. The system
    instruction, the tool list and the current call are never trimmed. If the prompt still does
    not fit, it is returned with ``fits=False``.

    Args:
        tools: candidate tool schemas (rendered with ``rendering``).
        grounding: ``[{"call": ToolCall | dict, "observation": Observation | dict}]`` from real
            executions of gold calls, or None for the literal ``<unavailable>``.
        history: the ACT conversation so far as plain messages, without the system prompt, usually
            ending with the ACT reply that holds ``call``; assistant reasoning is stripped.
        call: the call to rehearse; its full schema (when known) is shown with it.
        count_tokens: text -> token count (the tokenizer's; tests use a word count).
        budget: the token budget of system + user content.
        rendering: ``compact`` or ``full``.

    Returns:
        A ``RehearsePrompt``.
    """
    tools_block = render_tools(tools, rendering)
    schema = next((f for f in map(function_of, tools) if f.get("name") == call.name), None)
    call_block = f"{CALL_OPEN}\n{call_json(call)}\n{CALL_CLOSE}\n" + (
        f"Schema of {call.name}: {json.dumps(schema, ensure_ascii=False)}" if schema
        else f"{call.name!r} is not among the candidate tools.")
    examples = list(grounding) if grounding is not None else None
    n_sys = count_tokens(REHEARSE_SYSTEM)

    def build(kept: list[dict[str, Any]] | None, dropped: int, omit: int) -> tuple[list, int]:
        user = REHEARSE_USER.format(tools=tools_block, grounding=_grounding_block(kept, dropped),
                                    history=history_block(history, omit), call=call_block)
        msgs = [{"role": "system", "content": REHEARSE_SYSTEM}, {"role": "user", "content": user}]
        return msgs, n_sys + count_tokens(user)

    msgs, n = build(examples, 0, 0)
    kept, dropped = examples, 0
    if n > budget and examples:
        same = [i for i, ex in enumerate(examples) if _as_call(ex["call"]).name == call.name]
        order = [i for i in range(len(examples)) if i not in same][::-1] + same[::-1]
        while n > budget and dropped < len(order):
            dropped += 1
            gone = set(order[:dropped])
            kept = [ex for i, ex in enumerate(examples) if i not in gone]
            msgs, n = build(kept, dropped, 0)
    omit = 0
    if n > budget and len(history) > 2:
        # binary search for the fewest omitted messages that fit (tokens fall as omit grows)
        lo, hi = 1, len(history) - 2
        while lo < hi:
            mid = (lo + hi) // 2
            if build(kept, dropped, mid)[1] <= budget:
                hi = mid
            else:
                lo = mid + 1
        omit = lo
        msgs, n = build(kept, dropped, omit)
    return RehearsePrompt(msgs, n <= budget, n, dropped, omit)
