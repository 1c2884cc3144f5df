"""The text protocol of both roles: parsing ACT and REHEARSE outputs into calls and observations.

ACT writes Hermes-style calls, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and a
reply with no ``<tool_call>`` tag is the final answer of the user turn. REHEARSE writes the
observation a call would get inside ``<execution_result>...</execution_result>``.

The project renders tools into the system message itself (a Hermes block like Qwen3's) and turns
tool results into one user message of ``<tool_response>`` blocks. The model's chat template thus
only ever wraps plain system/user/assistant messages, so SmolLM2 (whose template has no tools)
and Qwen3 see the same content.

Parsing never raises on model text. Only syntactic failures are errors (``ErrorCode``). An unknown
tool or arguments that fail the tool's JSON schema still give a ``ToolCall``, with ``violations``.

The rest of the protocol has its own modules, imported from there: the tags and the scans over
model text in ``envace_lite.protocol.tags``, ACT's prompt and the tool rendering in
``envace_lite.protocol.prompts``, REHEARSE's prompt in ``envace_lite.protocol.rehearse_prompt``,
the bounded JSON decoding in ``envace_lite.protocol.json_text``.

Usage::

    from envace_lite import protocol
    p = protocol.parse_act(completion_text, task.tools)
    if p.kind == "calls": ...
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

import jsonschema

from envace_lite.protocol.json_text import (
    escape_surrogates,
    loads,
    loads_call,
    out_of_bounds,
    unfence,
)
from envace_lite.protocol.prompts import function_of
from envace_lite.protocol.tags import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_OUTPUT_CHARS,
    RESULT_CLOSE,
    RESULT_OPEN,
    TOOL_TAG_LIKE,
    strip_think,
)
from envace_lite.types import ToolCall


class ErrorCode(str, Enum):
    """The fixed enumeration of syntactic parse failures (docs/design.md, "Parsing").

    Schema problems are never here: they are ``ToolCall.violations``.
    """

    NONE = ""  # no error
    EMPTY = "empty_output"  # nothing but whitespace and closed <think> blocks
    TOO_LONG = "too_long"  # over MAX_OUTPUT_CHARS; not parsed at all
    UNCLOSED_THINK = "unclosed_think"  # a <think> never closes (the output ended while reasoning)
    MALFORMED_TAG = "malformed_tag"  # near miss: <TOOL_CALL>, <tool_calls>, <tool_call x=..>,
    #                                  <tool-call>, <Execution_Result>
    UNBALANCED_TAG = "unbalanced_tag"  # a close tag with no open one, or an open one nested
    UNCLOSED_TAG = "unclosed_tag"  # a last <tool_call> never closes and its rest is not JSON
    EMPTY_CALL = "empty_call"  # <tool_call></tool_call> with nothing inside
    BAD_JSON = "bad_json"  # not strict JSON: trailing comma, single quotes, NaN, extra text
    NOT_OBJECT = "call_not_object"  # JSON, but not one object (an array of calls, a string)
    MISSING_NAME = "missing_name"  # no "name" key, or null
    BAD_NAME = "bad_name"  # "name" is not a non-blank string
    ARGS_NOT_OBJECT = "arguments_not_object"  # "arguments" not an object, null or JSON-object str
    NO_RESULT = "no_execution_result"  # a rehearsal without an <execution_result> tag
    UNCLOSED_RESULT = "unclosed_result"  # <execution_result> never closes and its rest is not JSON
    EMPTY_RESULT = "empty_result"  # <execution_result></execution_result> with nothing inside


@dataclass
class ActParse:
    """A parsed ACT output.

    Attributes:
        kind: ``calls`` (at least one call), ``final`` (no ``<tool_call>`` tag: the answer for the
            user turn) or ``error`` (a syntactic failure; the episode ends).
        calls: the calls in order, ids ``call_0``, ``call_1``...; empty unless ``kind == "calls"``.
        text: the visible text outside ``<think>`` and call blocks, stripped (for ``error``: the
            text with think blocks removed; "" for ``TOO_LONG``).
        error_code: ``ErrorCode.NONE`` unless ``kind == "error"``.
        reason: a human-readable explanation of the error, or a note on a tolerated irregularity.
    """

    kind: Literal["calls", "final", "error"]
    calls: list[ToolCall] = field(default_factory=list)
    text: str = ""
    error_code: ErrorCode = ErrorCode.NONE
    reason: str = ""


@dataclass
class RehearsalParse:
    """A parsed REHEARSE output.

    Attributes:
        ok: True when a non-empty ``<execution_result>`` block was found.
        content: the block's content, stripped ("" when not ok).
        is_error: the content reports an error (see ``is_error_content``).
        is_json: the content is strict JSON (any JSON value).
        error_code: ``ErrorCode.NONE`` when ok.
    """

    ok: bool
    content: str = ""
    is_error: bool = False
    is_json: bool = False
    error_code: ErrorCode = ErrorCode.NONE



# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str) -> Any:
    """A cached jsonschema validator, or None for a schema that is itself invalid."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def check_call(name: str, arguments: dict[str, Any], tools: list[dict[str, Any]]) -> list[str]:
    """Human-readable problems of a call: an unknown tool, or arguments failing its JSON schema.

    A tool without ``parameters`` or with an invalid schema (the environment's fault, not the
    model's) is not checked.
    """
    fns = {f.get("name"): f for f in map(function_of, tools or [])}
    if name not in fns:
        return [f"unknown tool {name!r} (not among the {len(fns)} available tools)"]
    params = fns[name].get("parameters")
    if not isinstance(params, dict):
        return []
    try:
        validator = _validator(json.dumps(params, sort_keys=True))
        errors = [] if validator is None else sorted(
            validator.iter_errors(arguments), key=lambda e: (e.json_path, e.message))
    except Exception:  # noqa: BLE001 (a broken schema, bad regex or $ref, is not the call's fault)
        return []
    return [f"{e.json_path.replace('$', 'arguments', 1)}: {e.message}"[:200] for e in errors]


def _decode_call(block: str, k: int,
                 tools: list[dict[str, Any]]) -> ToolCall | tuple[ErrorCode, str]:
    """One ``<tool_call>`` block to a ``ToolCall``, or ``(error_code, reason)``.

    Besides ``check_call``'s, the call's violations report (first) repeated keys, arguments
    dropped for exceeding ``MAX_ARG_DEPTH`` or ``MAX_ARG_VALUES``, and lone surrogates escaped
    as text, so that every call renders as valid UTF-8 (``call_json``).
    """
    s = unfence(block)
    if not s:
        return ErrorCode.EMPTY_CALL, f"call {k}: empty <tool_call> block"
    duplicates: list[str] = []
    try:
        obj = loads_call(s, duplicates)
    except (ValueError, RecursionError) as e:
        return ErrorCode.BAD_JSON, f"call {k}: not valid JSON ({str(e)[:120]})"
    if not isinstance(obj, dict):
        return ErrorCode.NOT_OBJECT, f"call {k}: JSON {type(obj).__name__}, expected one object"
    name = obj.get("name")
    if name is None:
        return ErrorCode.MISSING_NAME, f"call {k}: no \"name\" key"
    if not isinstance(name, str) or not name.strip():
        return ErrorCode.BAD_NAME, f"call {k}: \"name\" is not a non-blank string: {name!r}"[:200]
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if isinstance(args, str):  # OpenAI style: the arguments as a JSON string
        try:
            args = loads_call(args, duplicates)
        except (ValueError, RecursionError):
            return ErrorCode.ARGS_NOT_OBJECT, f"call {k}: \"arguments\" string is not JSON"
        if not isinstance(args, dict):
            return ErrorCode.ARGS_NOT_OBJECT, f"call {k}: \"arguments\" string is not an object"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ErrorCode.ARGS_NOT_OBJECT, f"call {k}: \"arguments\" is a {type(args).__name__}"
    violations = [f"duplicate key {d!r} in the call JSON (the last value is used)"[:200]
                  for d in dict.fromkeys(duplicates)]
    if bound := out_of_bounds(args):
        violations.append(bound)
        args = {}
    escaped: list[str] = []
    name, args = escape_surrogates(name, "name", escaped), escape_surrogates(args, "arguments",
                                                                               escaped)
    violations += [f"{where}: a lone surrogate (not valid UTF-8) was escaped as text"[:200]
                   for where in escaped]
    if not bound:
        violations += check_call(name, args, tools)
    return ToolCall(name=name, arguments=args, violations=violations, call_id=f"call_{k}")


def parse_act(text: str, tools: list[dict[str, Any]],
              max_chars: int = MAX_OUTPUT_CHARS) -> ActParse:
    """Parse one ACT output. Never raises on model text.

    Decisions (docs/design.md, "Parsing"): think blocks are removed first (``strip_think``); an
    unclosed ``<think>`` is ``UNCLOSED_THINK``, since calls written while reasoning do not count.
    Tags must be exactly ``<tool_call>``/``</tool_call>``; near misses are ``MALFORMED_TAG``, not
    final text. One failed block makes the whole reply an error (as in the reference code). Inside a block,
    one surrounding code fence is tolerated; ``"parameters"`` is accepted for ``"arguments"``, a
    JSON string of arguments is decoded (OpenAI style), missing or null arguments mean ``{}``, and
    other keys are ignored. Violations, not errors: a repeated key (the last value wins),
    arguments beyond ``MAX_ARG_DEPTH`` or ``MAX_ARG_VALUES`` (dropped: the call gets ``{}``), a
    lone surrogate (escaped as ``\\udXXX`` text). A JSON array of calls is ``NOT_OBJECT``: the
    format is one object per tag. A last ``<tool_call>`` that never closes is accepted when its
    rest is a complete JSON value (a stop string ate the close tag), else ``UNCLOSED_TAG``.
    Duplicate calls are kept. Bare JSON without tags is a final answer. Think-stripping never
    edits inside a call (``strip_think``), and the tag scan is linear in the text.

    Args:
        text: the decoded completion.
        tools: the OpenAI-format tool schemas of the task, for ``violations``.
        max_chars: outputs longer than this are ``TOO_LONG``.

    Returns:
        An ``ActParse``.
    """
    text = text if isinstance(text, str) else ""
    if len(text) > max_chars:
        return ActParse("error", [], "", ErrorCode.TOO_LONG, f"{len(text)} chars > {max_chars}")
    visible, closed = strip_think(text)
    if not closed:
        return ActParse("error", [], visible.strip(), ErrorCode.UNCLOSED_THINK,
                        "a <think> block never closes")
    if not visible.strip():
        why = "only reasoning, no answer" if text.strip() else "empty output"
        return ActParse("error", [], "", ErrorCode.EMPTY, why)
    tags = list(TOOL_TAG_LIKE.finditer(visible))
    if not tags:
        return ActParse("final", [], visible.strip())

    def fail(code: ErrorCode, reason: str) -> ActParse:
        return ActParse("error", [], visible.strip(), code, reason)

    for m in tags:
        if m.group(0) not in (CALL_OPEN, CALL_CLOSE):
            return fail(ErrorCode.MALFORMED_TAG, f"malformed tag {m.group(0)[:40]!r}")
    outside, blocks, note, pos, i = [], [], "", 0, 0
    while i < len(tags):
        op = tags[i]
        if op.group(0) == CALL_CLOSE:
            return fail(ErrorCode.UNBALANCED_TAG, "</tool_call> without an opening <tool_call>")
        outside.append(visible[pos:op.start()])
        if i + 1 == len(tags):  # the last block never closes
            rest = visible[op.end():]
            try:
                loads(unfence(rest))
            except (ValueError, RecursionError):
                return fail(ErrorCode.UNCLOSED_TAG, "the last <tool_call> never closes")
            blocks.append(rest)
            note, pos = "accepted an unclosed last <tool_call> holding complete JSON", len(visible)
            break
        cl = tags[i + 1]
        if cl.group(0) == CALL_OPEN:
            return fail(ErrorCode.UNBALANCED_TAG, "<tool_call> opened inside an unfinished block")
        blocks.append(visible[op.end():cl.start()])
        pos, i = cl.end(), i + 2
    outside.append(visible[pos:])
    calls = []
    for k, block in enumerate(blocks):
        res = _decode_call(block, k, tools)
        if isinstance(res, tuple):
            return fail(*res)
        calls.append(res)
    text_out = "\n".join(p.strip() for p in outside if p.strip())
    return ActParse("calls", calls, text_out, ErrorCode.NONE, note)


_ERROR_TEXT = re.compile(r"^(?:error|exception|traceback)\b", re.IGNORECASE)
ERROR_KEYS = ("error", "error_tool_call", "error_message")
"""Top-level JSON keys whose non-empty value marks an error result."""


def is_error_content(content: str) -> bool:
    """Whether an observation text reports an error.

    Rule: a JSON object with a key in ``ERROR_KEYS`` whose value is not null, false or empty; a
    JSON string, or non-JSON text, that starts (after whitespace) with the word "Error",
    "Exception" or "Traceback", any case (tau2's ``"Error: ..."``, BFCL's ``"Error during
    execution: ..."``). Arrays, numbers and other objects are never errors.
    """
    try:
        value = loads(content)
    except (ValueError, RecursionError):
        value = content
    if isinstance(value, dict):
        return any(value.get(k) not in (None, False, "", {}, []) for k in ERROR_KEYS)
    return isinstance(value, str) and bool(_ERROR_TEXT.match(value.strip()))


def parse_rehearsal(text: str, max_chars: int = MAX_OUTPUT_CHARS) -> RehearsalParse:
    """Parse one REHEARSE output. Never raises on model text.

    Think blocks are removed as in ``parse_act``. The first ``<execution_result>`` block wins and
    text outside it is ignored; one code fence inside it is stripped. A block that never closes is
    accepted when its rest is a complete JSON value. Non-JSON content is valid (many tools return
    text); ``is_json`` tells.

    Returns:
        A ``RehearsalParse``; ``ok=False`` with an ``ErrorCode`` on a syntactic failure.
    """
    text = text if isinstance(text, str) else ""
    if len(text) > max_chars:
        return RehearsalParse(False, error_code=ErrorCode.TOO_LONG)
    visible, closed = strip_think(text)
    if not closed:
        return RehearsalParse(False, error_code=ErrorCode.UNCLOSED_THINK)
    if not visible.strip():
        return RehearsalParse(False, error_code=ErrorCode.EMPTY)
    i = visible.find(RESULT_OPEN)
    if i == -1:
        near = "<execution_result" in visible.lower() or "</execution_result" in visible.lower()
        code = ErrorCode.MALFORMED_TAG if near else ErrorCode.NO_RESULT
        return RehearsalParse(False, error_code=code)
    start = i + len(RESULT_OPEN)
    j = visible.find(RESULT_CLOSE, start)
    inner = visible[start:] if j == -1 else visible[start:j]
    if RESULT_OPEN in inner:
        return RehearsalParse(False, error_code=ErrorCode.UNBALANCED_TAG)
    content = unfence(inner)
    try:
        loads(content)
        is_json = True
    except (ValueError, RecursionError):
        is_json = False
    if j == -1 and not is_json:
        return RehearsalParse(False, error_code=ErrorCode.UNCLOSED_RESULT)
    if not content:
        return RehearsalParse(False, error_code=ErrorCode.EMPTY_RESULT)
    return RehearsalParse(True, content, is_error_content(content), is_json)
