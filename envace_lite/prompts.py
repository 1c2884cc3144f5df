"""Prompts and rendering for both roles: every string a model reads, in one place.

- ACT: the task's system text (domain policy; an excerpt under the compact rendering), then the
  tools rendered by the project in a Hermes-style block, then the call-format instructions
  (``act_system_prompt``, ``act_messages``); tool results come back as one user message of
  ``<tool_response>`` blocks (``tool_response_message``).
- REHEARSE: its own prompt, rebuilt per call (paper §2.1; docs/design.md, "Generation and
  history"): a validation-first system
  instruction, then candidate tools, grounding (``<unavailable>`` at test time), the conversation
  so far and the current call, trimmed to a token budget (``rehearse_messages``).
- Test-time rehearsal (paper §2.3; our design): FEEDBACK (an assessment plus a revision
  suggestion per imagined attempt), MEMORY (m_x, condensed from the attempts and their feedback),
  the sequential-mode context message, the memory message that the committed ACT reads, and the
  write gate's refusal (the last section of this file; used by ``rehearsal.py``).

Parsing of what the models write lives in ``protocol`` (which re-exports everything here).

Usage::

    from envace_lite import prompts
    msgs = prompts.act_messages(task.messages, task.tools, "compact", 600, history)
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from envace_lite.types import Observation, ToolCall

# ---------------------------------------------------------------------------------------------
# Prompts and tags: every string a model reads or writes, in one place
# ---------------------------------------------------------------------------------------------

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
UNAVAILABLE = "<unavailable>"
"""The grounding block at test time and when grounding is dropped (docs/design.md, "Grounding")."""

MAX_OUTPUT_CHARS = 50_000
"""Outputs longer than this are not parsed (``ErrorCode.TOO_LONG``); generation caps keep real
outputs far below it, so only a runaway reaches it."""
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

OMITTED = "[... {n} {what} omitted ...]"
"""Marker left where REHEARSE trimming removed reference examples or history messages."""


class TagMatch:
    """One tag found by ``TOOL_TAG_LIKE``, with the ``re.Match`` methods the parser uses."""

    __slots__ = ("_end", "_start", "_text")

    def __init__(self, text: str, start: int, end: int) -> None:
        self._text, self._start, self._end = text, start, end

    def group(self, index: int = 0) -> str:
        """The tag's text (only group 0 exists)."""
        if index != 0:
            raise IndexError("no such group")
        return self._text

    def start(self) -> int:
        """Where the tag starts."""
        return self._start

    def end(self) -> int:
        """Just past the tag."""
        return self._end

    def __repr__(self) -> str:
        return f"TagMatch({self._text!r}, {self._start}, {self._end})"


_SPACES = re.compile(r"\s*")  # one greedy run: no backtracking


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _word_at(text: str, i: int, word: str) -> bool:
    """``text[i:]`` starts with ``word``, ignoring case (simple case folding, like ``re.I``)."""
    return len(text) - i >= len(word) and all(
        text[i + k].casefold() == c for k, c in enumerate(word))


class _NextFinder:
    """``text.find(needle, pos)``, reusing the last answer per needle while it still holds.

    Callers whose positions mostly move forward scan each stretch of text once per needle, so
    their scans stay linear in the text.
    """

    def __init__(self, text: str) -> None:
        self.text, self.cache = text, {}

    def __call__(self, needle: str, pos: int) -> int:
        start, hit = self.cache.get(needle, (-1, -1))
        if not (0 <= start <= pos and (hit == -1 or hit >= pos)):
            start, hit = pos, self.text.find(needle, pos)
            self.cache[needle] = (start, hit)
        return hit


class _ToolTagScan:
    r"""Tool-call-like tags, in any case or spelling, found by a linear scan.

    It matches what ``<\s*/?\s*tool[_\- ]?calls?\b[^<>]*>`` (``re.IGNORECASE``) matches, with
    the ``finditer``/``search`` interface of a compiled pattern. That regex backtracks: after
    ``<`` and 40k spaces it tried every split of the spaces between its two ``\s*`` (seconds per
    output); here every character is looked at a bounded number of times.
    """

    pattern = r"<\s*/?\s*tool[_\- ]?calls?\b[^<>]*>"

    def _match_at(self, text: str, i: int, nxt: _NextFinder) -> int:
        """The end of a tag starting at the ``<`` at ``i``, or -1."""
        j = _SPACES.match(text, i + 1).end()
        if text.startswith("/", j):
            j = _SPACES.match(text, j + 1).end()
        if not _word_at(text, j, "tool"):
            return -1
        j += 4
        if j < len(text) and text[j] in "_- ":
            j += 1
        if not _word_at(text, j, "call"):
            return -1
        j += 4
        if j < len(text) and text[j].casefold() == "s" and (
                j + 1 == len(text) or not _is_word(text[j + 1])):
            j += 1
        elif j < len(text) and _is_word(text[j]):
            return -1
        close, lt = nxt(">", j), nxt("<", j)
        return close + 1 if close != -1 and (lt == -1 or close < lt) else -1

    def finditer(self, text: str) -> Iterator[TagMatch]:
        """Every tag, left to right, not overlapping."""
        nxt = _NextFinder(text)
        i = nxt("<", 0)
        while i != -1:
            end = self._match_at(text, i, nxt)
            if end != -1:
                yield TagMatch(text[i:end], i, end)
            i = nxt("<", max(end, i + 1))

    def search(self, text: str) -> TagMatch | None:
        """The first tag, or None."""
        return next(self.finditer(text), None)


TOOL_TAG_LIKE = _ToolTagScan()
"""Anything that looks like a tool-call tag, in any case or spelling (used to refuse text that
would be mistaken for a call). A linear scan with the ``finditer``/``search`` of a pattern."""

_KEPT_BLOCKS = {CALL_OPEN: CALL_CLOSE, RESULT_OPEN: RESULT_CLOSE}
"""Blocks that think-stripping never edits (open tag: close tag): their JSON may hold
``</think>`` in a string."""
_STRIP_TAGS = (THINK_OPEN, THINK_CLOSE, *_KEPT_BLOCKS)


def _is_complete_json(s: str) -> bool:
    try:
        json.loads(s)
    except (ValueError, RecursionError):
        return False
    return True


def strip_think(text: str) -> tuple[str, bool]:
    """Remove reasoning from an output, never editing inside a tool call or execution result.

    Rules, scanning left to right: (1) a ``</think>`` before any ``<think>`` closes reasoning
    whose opening tag was in the prompt (templates that prefill ``<think>``), so everything up to
    it is dropped; (2) every ``<think>...</think>`` block is dropped (tags inside it do not
    count); (3) leftover stray ``</think>`` tags are deleted; (4) an unclosed ``<think>`` keeps
    only the text before it and reports False. Outside reasoning, a ``<tool_call>`` block closed
    before the next ``<tool_call>`` (likewise ``<execution_result>``), or a last unclosed one
    whose rest is complete JSON, is kept verbatim: think tags inside it are its content (a JSON
    string may hold ``"</think>"``).

    Returns:
        ``(visible_text, closed)``; ``closed`` is False when a ``<think>`` never closes.
    """
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return text, True
    nxt, out, pos, seen_think = _NextFinder(text), [], 0, False
    while True:
        hits = [(nxt(t, pos), t) for t in _STRIP_TAGS]
        i, tag = min(((h, t) for h, t in hits if h != -1), default=(-1, ""))
        if i == -1:
            out.append(text[pos:])
            return "".join(out), True
        if tag == THINK_OPEN:
            out.append(text[pos:i])
            j = nxt(THINK_CLOSE, i + len(THINK_OPEN))
            if j == -1:
                return "".join(out), False
            pos, seen_think = j + len(THINK_CLOSE), True
        elif tag == THINK_CLOSE:
            if seen_think:
                out.append(text[pos:i])  # rule 3: a stray close
            else:
                out = []  # rule 1: the first think tag closes prefilled reasoning
            pos, seen_think = i + len(THINK_CLOSE), True
        else:
            close = _KEPT_BLOCKS[tag]
            body = i + len(tag)
            j, again = nxt(close, body), nxt(tag, body)
            if j != -1 and (again == -1 or j < again):
                end = j + len(close)
            elif j == again == -1 and _is_complete_json(text[body:].strip()):
                end = len(text)
            else:
                end = body  # a lone open tag: the parser reports it
            out.append(text[pos:end])
            pos = end


def function_of(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` part of an OpenAI tool schema (bare function dicts are accepted too)."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else {}
    return fn if isinstance(fn, dict) else {}


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



# ---------------------------------------------------------------------------------------------
# Rendering: ACT
# ---------------------------------------------------------------------------------------------

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
        tools: the tool schemas shown (the compact subset is chosen upstream, in ``data.py``).
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
# Rendering: REHEARSE
# ---------------------------------------------------------------------------------------------

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


def _history_line(m: dict[str, Any]) -> str:
    role, content = m.get("role", "user"), str(m.get("content") or "")
    if role == "assistant":  # the environment never sees the agent's reasoning
        content = strip_think(content)[0]
    is_tool = role == "tool" or content.lstrip().startswith("<tool_response>")
    label = "Tool" if is_tool else role.title()
    return f"{label}: {content.strip()}"


def _history_block(history: list[dict[str, Any]], omit: int) -> str:
    if not history:
        return "(empty)"
    lines = [_history_line(m) for m in history]
    if omit:
        lines = lines[:1] + [OMITTED.format(n=omit, what="messages")] + lines[1 + omit:]
    return "\n".join(lines)


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
                                    history=_history_block(history, omit), call=call_block)
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
        stop_reason: why the attempt ended (``rollout.Trajectory.stop_reason``).
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
                                history=_history_block(history, omit), index=index,
                                attempt=attempt)
    return [{"role": "system", "content": system or FEEDBACK_SYSTEM},
            {"role": "user", "content": user}]


def memory_messages(history: list[dict[str, Any]], attempts: list[tuple[str, str]],
                    max_tokens: int, system: str = "", omit: int = 0) -> list[dict[str, str]]:
    """The MEMORY prompt: the real conversation, then every attempt with its feedback.

    ``system`` replaces ``MEMORY_SYSTEM`` when not "" (a ``{max_tokens}`` field is filled in).
    """
    sys_text = (system or MEMORY_SYSTEM).replace("{max_tokens}", str(max_tokens))
    user = MEMORY_USER.format(history=_history_block(history, omit),
                              attempts=attempts_block(attempts))
    return [{"role": "system", "content": sys_text}, {"role": "user", "content": user}]


def sequential_context_message(attempts: list[tuple[str, str]]) -> dict[str, str]:
    """Sequential mode: attempts 1..n-1 with their feedback, as one user message."""
    return {"role": "user", "content": SEQUENTIAL_CONTEXT.format(attempts=attempts_block(attempts))}


def memory_message(memory: str) -> dict[str, str]:
    """m_x as the user-role message that the committed ACT reads."""
    return {"role": "user", "content": MEMORY_MESSAGE.format(memory=memory.strip())}
