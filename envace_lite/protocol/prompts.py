"""The prompts the acting policy reads: ACT's system prompt and messages, with the tools rendered
by the project, and the test-time rehearsal prompts (FEEDBACK, MEMORY).

- ACT: the task's system text (domain policy; an excerpt under the compact rendering), then the
  tools rendered by the project in a Hermes-style block, then the call-format instructions
  (``act_system_prompt``, ``act_messages``); tool results come back as one user message of
  ``<tool_response>`` blocks (``tool_response_message``).
- Test-time rehearsal (paper §2.3; our design): FEEDBACK (an assessment plus a revision
  suggestion per imagined attempt), MEMORY (m_x, condensed from the attempts and their feedback),
  the sequential-mode context message, the memory message that the committed ACT reads, and the
  write gate's refusal (the last section of this file; used by ``rehearsal.py``).

REHEARSE's own prompt, rebuilt per call and trimmed to a token budget, is in
``rehearse_prompt.py``; the tags and the scans over model text in ``tags.py``. Parsing of what the
models write lives in ``protocol``.

Usage::

    from envace_lite.protocol import prompts
    msgs = prompts.act_messages(task.messages, task.tools, "compact", 600, history)
"""
from __future__ import annotations

import json
import re
from typing import Any

from envace_lite.protocol.tags import (
    CALL_CLOSE,
    CALL_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_TAG_LIKE,
    strip_think,
)
from envace_lite.types import Observation, ToolCall

# ---------------------------------------------------------------------------------------------
# ACT: the tool block, the call format, and its rendering
# ---------------------------------------------------------------------------------------------

COMPACT_DESC_CHARS = 100
"""Compact rendering: cap of a tool's one-line description."""

ACT_TOOLS_PROMPT = """# Tools

You may call one or more functions to help with the user's request.

The available functions are listed within <tools></tools> XML tags:
<tools>
{tools}
</tools>{legend}

For each function call, return a JSON object with the function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>
You may make several calls in one reply, one <tool_call> block each. When no call is needed, \
answer the user in plain text, without any <tool_call> tag."""
"""The tool block and call format of the ACT system prompt, after Qwen3's Hermes block (notes
§2.1), plus the rule that a reply without a call is the final answer."""

COMPACT_LEGEND = (
    "\nEach line above reads name(param: type, optional_param?: type) - description; "
    "parameters marked ? are optional."
)
"""Compact rendering only: how to read a signature line."""

POLICY_TRUNCATED = "\n[... policy truncated ...]"
"""Appended to the compact policy excerpt."""


def function_of(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` part of an OpenAI tool schema (bare function dicts are accepted too)."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else {}
    return fn if isinstance(fn, dict) else {}


def _check_rendering(rendering: str) -> None:
    if rendering not in ("compact", "full"):
        raise ValueError(f"rendering={rendering!r}: use 'compact' or 'full' (RolloutConfig)")


def _type_str(schema: Any) -> str:
    """A short type for a parameter schema: ``string``, ``string[]``, ``"a"|"b"``, ``int|null``."""
    if not isinstance(schema, dict):
        return "any"
    enum = schema.get("enum")
    if isinstance(enum, list) and 0 < len(enum) <= 6:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in enum)
    t = schema.get("type")
    if isinstance(t, list):
        return "|".join(map(str, t))
    if t == "array":
        items = schema.get("items")
        return _type_str(items) + "[]" if isinstance(items, dict) else "array"
    if t:
        return str(t)
    alts = schema.get("anyOf") or schema.get("oneOf")
    return "|".join(_type_str(a) for a in alts) if isinstance(alts, list) else "any"


def _first_sentence(desc: str) -> str:
    """The first sentence (or line) of a description, capped at ``COMPACT_DESC_CHARS``."""
    s = " ".join(str(desc or "").strip().split("\n", 1)[0].split())
    m = re.search(r"[.!?](\s|$)", s)
    s = s[: m.start() + 1] if m else s
    return s if len(s) <= COMPACT_DESC_CHARS else s[: COMPACT_DESC_CHARS - 3].rstrip() + "..."


def compact_signature(tool: dict[str, Any]) -> str:
    """One line: ``name(param: type, opt?: type) - first sentence of the description``."""
    fn = function_of(tool)
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or [])
    args = ", ".join(f"{p}{'' if p in required else '?'}: {_type_str(s)}" for p, s in props.items())
    desc = _first_sentence(fn.get("description", ""))
    return f"{fn.get('name', '?')}({args})" + (f" - {desc}" if desc else "")


def render_tools(tools: list[dict[str, Any]], rendering: str) -> str:
    """The lines inside ``<tools>``: full JSON schemas (``full``) or signatures (``compact``).

    Deterministic: tools in the given order, one line each (``full`` is ``json.dumps`` of each
    schema as given, as Qwen3's template does; docs/design.md, "Machine facts": compact task
    rendering).
    """
    _check_rendering(rendering)
    if rendering == "full":
        return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return "\n".join(compact_signature(t) for t in tools)


def policy_excerpt(policy: str, policy_chars: int) -> str:
    """The first ``policy_chars`` characters of a policy, cut at whitespace, with a marker."""
    policy = policy.strip()
    if policy_chars <= 0:
        return ""
    if len(policy) <= policy_chars:
        return policy
    head = policy[:policy_chars]
    cut = max(head.rfind(" "), head.rfind("\n"))
    head = head[:cut] if cut > policy_chars // 2 else head
    return head.rstrip() + POLICY_TRUNCATED


def act_system_prompt(task_system: str, tools: list[dict[str, Any]], rendering: str,
                      policy_chars: int) -> str:
    """The ACT system message: the task's system text (the domain policy), then the tool block.

    ``compact`` keeps a ``policy_chars`` excerpt of the policy; ``full`` keeps all of it.
    """
    _check_rendering(rendering)
    full = rendering == "full"
    policy = task_system.strip() if full else policy_excerpt(task_system, policy_chars)
    block = ACT_TOOLS_PROMPT.format(legend="" if full else COMPACT_LEGEND,
                                    tools=render_tools(tools, rendering))
    return f"{policy}\n\n{block}" if policy else block


def call_json(call: ToolCall) -> str:
    """The JSON body of a call inside ``<tool_call>`` tags."""
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


def assistant_text(calls: list[ToolCall], text: str = "") -> str:
    """The canonical text of an ACT output: ``text``, then one ``<tool_call>`` block per call.

    ``parse_act(assistant_text(calls, text))`` gives back the names, arguments and stripped text.

    Raises:
        ValueError: if ``text`` holds a tag that would break that round trip.
    """
    if TOOL_TAG_LIKE.search(text) or THINK_OPEN in text or THINK_CLOSE in text:
        raise ValueError("assistant_text: text must not contain <tool_call> or <think> tags")
    parts = [text.strip()] if text.strip() else []
    parts += [f"{CALL_OPEN}\n{call_json(c)}\n{CALL_CLOSE}" for c in calls]
    return "\n".join(parts)


def tool_response_message(observations: list[Observation]) -> dict[str, str]:
    """One user message with a ``<tool_response>`` block per observation, in call order.

    This is how Qwen3's template shows tool results; doing it ourselves gives every template the
    same text.
    """
    if not observations:
        raise ValueError("tool_response_message needs at least one observation")
    body = "\n".join(f"<tool_response>\n{o.content}\n</tool_response>" for o in observations)
    return {"role": "user", "content": body}


def act_messages(task_messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 rendering: str, policy_chars: int,
                 history: list[dict[str, Any]] | None = None) -> list[dict[str, str]]:
    """The ACT prompt messages: system (``act_system_prompt``), the task's other messages, history.

    Args:
        task_messages: ``Task.messages``; its system messages are joined into the policy text.
        tools: the tool schemas shown (the compact subset is chosen upstream, in ``envs/tasks.py``).
        rendering: ``compact`` or ``full``.
        policy_chars: compact only: characters of policy kept.
        history: later messages (assistant replies, tool responses, user turns), in order.
    """
    system = "\n\n".join(m["content"] for m in task_messages if m["role"] == "system")
    rest = [m for m in task_messages if m["role"] != "system"] + list(history or [])
    for m in rest:
        if m["role"] not in ("user", "assistant") or m.get("tool_calls"):
            raise ValueError(
                f"act_messages takes plain user/assistant messages, got {m['role']!r}: render "
                "calls with assistant_text and results with tool_response_message")
    sys_msg = {"role": "system",
               "content": act_system_prompt(system, tools, rendering, policy_chars)}
    return [sys_msg] + [{"role": m["role"], "content": m["content"]} for m in rest]


# ---------------------------------------------------------------------------------------------
# The conversation so far, as REHEARSE, FEEDBACK and MEMORY read it
# ---------------------------------------------------------------------------------------------

OMITTED = "[... {n} {what} omitted ...]"
"""Marker left where REHEARSE trimming removed reference examples or history messages."""


def _history_line(m: dict[str, Any]) -> str:
    role, content = m.get("role", "user"), str(m.get("content") or "")
    if role == "assistant":  # the environment never sees the agent's reasoning
        content = strip_think(content)[0]
    is_tool = role == "tool" or content.lstrip().startswith("<tool_response>")
    label = "Tool" if is_tool else role.title()
    return f"{label}: {content.strip()}"


def history_block(history: list[dict[str, Any]], omit: int) -> str:
    """The dialogue so far as text, one line per message; ``omit`` > 0 replaces messages 1 to
    ``omit`` with ``OMITTED`` (the first message stays). "(empty)" for no history."""
    if not history:
        return "(empty)"
    lines = [_history_line(m) for m in history]
    if omit:
        lines = lines[:1] + [OMITTED.format(n=omit, what="messages")] + lines[1 + omit:]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Test-time private rehearsal: FEEDBACK and MEMORY (paper §2.3; used by rehearsal.py)
# ---------------------------------------------------------------------------------------------
# Our design: the reference code has no test-time rehearsal. Every text the policy reads during
# rehearsal is here. FEEDBACK_SYSTEM and MEMORY_SYSTEM can be replaced per run through
# ``RehearsalConfig.feedback_system`` / ``memory_system`` ("" keeps these defaults).

ASSESSMENT_OPEN, ASSESSMENT_CLOSE = "<assessment>", "</assessment>"
REVISION_OPEN, REVISION_CLOSE = "<revision>", "</revision>"
MEMORY_OPEN, MEMORY_CLOSE = "<memory>", "</memory>"

FEEDBACK_SYSTEM = """You review one private rehearsal of an AI agent that uses tools. In the \
rehearsal the agent tried to handle the user's current request, but nothing was executed: every \
tool result was imagined by the agent itself and may be wrong. Judge the attempt against the \
conversation and the tools:
- did it do what the user asked, with the right tools and arguments, in a sensible order?
- did it use an identifier or value that the conversation never gave?
- did it rely on an imagined result that looks implausible?
Answer in exactly this format, one or two sentences each:
<assessment>what went right and what went wrong</assessment>
<revision>what to do differently in the real execution</revision>"""
"""FEEDBACK's system instruction: f^(n) is an assessment plus a revision suggestion (paper §2.3)."""

FEEDBACK_USER = """## Tools
{tools}

## Conversation so far (real)
{history}

## Rehearsed attempt {index} (imagined results)
{attempt}

Assess the attempt, then suggest a revision, in the format given."""
"""FEEDBACK's user message: the tools, the real conversation, one imagined attempt."""

MEMORY_SYSTEM = """You write the rehearsal memory of an AI agent that uses tools. Before acting \
for real on the user's current request, the agent rehearsed it privately: each attempt below used \
imagined tool results, and each has a feedback. Condense them into short notes that the agent \
reads during its one real execution:
- the plan (which tools, in which order, with which arguments) that best serves the request;
- the mistakes to avoid, taken from the feedback;
- which values must come from real tool results rather than from the rehearsal.
Never present an imagined result as a fact. Use at most {max_tokens} tokens. Write only:
<memory>your notes</memory>"""
"""MEMORY's system instruction; ``{max_tokens}`` is ``RehearsalConfig.memory_max_tokens``."""

MEMORY_USER = """## Conversation so far (real)
{history}

{attempts}

Write the rehearsal memory."""
"""MEMORY's user message: the real conversation, then every attempt with its feedback."""

ATTEMPT_BLOCK = """### Attempt {index} (imagined results)
{transcript}

### Feedback on attempt {index}
{feedback}"""
"""One attempt with its feedback, as MEMORY and later sequential attempts read it."""

SEQUENTIAL_CONTEXT = """[Private rehearsal of the current request: your earlier attempts and their \
feedback. Nothing in them was executed and their tool results were imagined. Learn from the \
feedback and avoid its mistakes.]

{attempts}"""
"""Sequential mode: the user-role message after the current request in attempt n's ACT prompt."""

CALLS_MEMORY_HEADER = "Calls that worked in rehearsal:"
"""The first line of the rule-built memory (``drills.calls_memory.calls_memory``,
``study.memory_source="calls"``; beyond the paper)."""

MEMORY_MESSAGE = """[Private rehearsal memory, written by you before acting for real. Its tool \
results were imagined; trust only real tool results.]
<memory>
{memory}
</memory>"""
"""The user-role message that carries m_x into the committed ACT prompt, right after the user
message it was rehearsed for (it stays in the history: the history is append-only)."""

GATE_REFUSAL = "Error: refused by the write gate: {reason}. Nothing was executed."
"""The error observation ACT gets for a state-changing call that the write gate refused
(docs/design.md, "Our additions beyond the paper"): a schema failure, or an identifier never seen in
a user message or a real observation of this episode."""

NO_FEEDBACK = "(no feedback)"
"""Stands in for an empty FEEDBACK output."""
CUT = "[... {n} characters cut ...]"
"""Marker left where a rehearsal transcript was cut to fit a prompt budget."""


def _cut(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` within about ``max_chars`` characters."""
    if len(text) <= max_chars:
        return text
    head = max(0, max_chars * 2 // 3)
    tail = max(0, max_chars - head)
    return text[:head] + CUT.format(n=len(text) - head - tail) + (text[-tail:] if tail else "")


def render_attempt(steps: list[tuple[str, list[str]]], stop_reason: str,
                   max_chars: int = 4000) -> str:
    """An imagined attempt as text: each ACT output, then its imagined results.

    Args:
        steps: per ACT output, ``(its text, [imagined observation contents])``.
        stop_reason: why the attempt ended (``types.Trajectory.stop_reason``).
        max_chars: the whole transcript is cut (head and tail kept) to about this many characters.
    """
    lines = []
    for text, results in steps:
        lines.append(f"Assistant: {strip_think(text)[0].strip() or '(empty)'}")
        lines += [f"Result (imagined): {r.strip()}" for r in results]
    if not lines:
        lines.append("(no output: the prompt did not fit the context budget)")
    lines.append(f"(attempt ended: {stop_reason or 'unknown'})")
    return _cut("\n".join(lines), max_chars)


def render_feedback(assessment: str, revision: str) -> str:
    """A feedback f^(n) as text for MEMORY and later sequential attempts."""
    if not assessment.strip() and not revision.strip():
        return NO_FEEDBACK
    return f"Assessment: {assessment.strip()}\nRevision: {revision.strip()}"


def attempts_block(attempts: list[tuple[str, str]]) -> str:
    """``[(transcript, feedback text)]`` (1-based numbering) as ``ATTEMPT_BLOCK``s."""
    return "\n\n".join(ATTEMPT_BLOCK.format(index=i, transcript=t, feedback=f)
                       for i, (t, f) in enumerate(attempts, 1))


def feedback_messages(tools: list[dict[str, Any]], rendering: str,
                      history: list[dict[str, Any]], attempt: str, index: int,
                      system: str = "", omit: int = 0) -> list[dict[str, str]]:
    """The FEEDBACK prompt for attempt ``index`` (1-based).

    Args:
        tools: the tool schemas visible at this point of the real episode.
        rendering: ``compact`` or ``full``.
        history: the real conversation so far (plain messages, no system prompt).
        attempt: ``render_attempt`` of the attempt.
        system: replaces ``FEEDBACK_SYSTEM`` when not "".
        omit: history messages after the first one replaced by a marker (budget trimming).
    """
    user = FEEDBACK_USER.format(tools=render_tools(tools, rendering),
                                history=history_block(history, omit), index=index,
                                attempt=attempt)
    return [{"role": "system", "content": system or FEEDBACK_SYSTEM},
            {"role": "user", "content": user}]


def memory_messages(history: list[dict[str, Any]], attempts: list[tuple[str, str]],
                    max_tokens: int, system: str = "", omit: int = 0) -> list[dict[str, str]]:
    """The MEMORY prompt: the real conversation, then every attempt with its feedback.

    ``system`` replaces ``MEMORY_SYSTEM`` when not "" (a ``{max_tokens}`` field is filled in).
    """
    sys_text = (system or MEMORY_SYSTEM).replace("{max_tokens}", str(max_tokens))
    user = MEMORY_USER.format(history=history_block(history, omit),
                              attempts=attempts_block(attempts))
    return [{"role": "system", "content": sys_text}, {"role": "user", "content": user}]


def sequential_context_message(attempts: list[tuple[str, str]]) -> dict[str, str]:
    """Sequential mode: attempts 1..n-1 with their feedback, as one user message."""
    return {"role": "user", "content": SEQUENTIAL_CONTEXT.format(attempts=attempts_block(attempts))}


def memory_message(memory: str) -> dict[str, str]:
    """m_x as the user-role message that the committed ACT reads."""
    return {"role": "user", "content": MEMORY_MESSAGE.format(memory=memory.strip())}
