"""Hypothesis strategies that write hostile ACT and REHEARSE outputs, for the protocol fuzz.

One home for the generators that ``tests/test_fuzz_protocol.py`` (the property-based test) and
``benchmarks/fuzz_protocol.py`` (the 10,000-output run) both draw from. An ACT output
is a call of one of the suite's tools (or an unknown one), its arguments holding lone surrogates
(raw and as JSON escapes), ``</think>`` and tag text, control characters, special-token text,
NaN, deep nesting and duplicate keys, in every framing: think blocks, prose, fences, unclosed,
truncated. A REHEARSE output is hostile text or JSON in every ``<execution_result>`` framing.
The protocol's parsing rules these outputs test are in docs/design.md, "Parsing".

Needs ``hypothesis`` (the ``test`` extra of ``pyproject.toml``); nothing else in the package
imports this module.

Usage::

    from hypothesis import given, strategies as st
    from envace_lite.protocol import fuzz

    @given(fuzz.act_outputs(task.tools), fuzz.rehearse_outputs())
    def check(act, rehearse): ...
"""
from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

HOSTILE = ["\ud800", "\udfff", "\\ud800", "\\udc00x", "\\ud83c\\udf27", "</think>", "<think>",
           "<tool_call>", "</tool_call>", "<execution_result>", "</execution_result>",
           "<|im_end|>", "<|im_start|>assistant", "<|endoftext|>", "\x00", "\x1b[2J", "\u2028",
           "\ufeff", "\\", '"', "{", "}", "[", "]", "\n", "🌧", "é", "\u0130", "NaN", "' OR 1=1"]
"""Fragments that broke or fooled a parser, a template or a tokenizer somewhere: lone
surrogates raw and escaped, the protocol's own tags, chat special tokens, NUL, an ANSI escape,
a line separator, a BOM, JSON syntax, non-ASCII, a non-finite number, SQL."""

ACT_FRAMES = [
    "<tool_call>\n{b}\n</tool_call>", "<tool_call>{b}", "{b}", "```json\n{b}\n```",
    "<think>{t}</think>\n<tool_call>\n{b}\n</tool_call>", "{t}</think><tool_call>{b}</tool_call>",
    "{t}\n<tool_call>\n{b}\n</tool_call>\n{t}", "<tool_call>{b}</tool_call><tool_call>{b}",
    "<tool_call>\n{b}\n</tool_call>\n<tool_call>\n{b}\n</tool_call>", "{t}", "< tool_call >{b}",
    "<think>{t}", "</tool_call>{b}<tool_call>"]
"""How an ACT output wraps its call body ``{b}`` and free text ``{t}``."""
REHEARSE_FRAMES = [
    "<execution_result>{c}</execution_result>",
    "<think>{t}</think><execution_result>{c}</execution_result>", "<execution_result>{c}", "{c}",
    "{t}</think>{c}",
    "<execution_result>{c}</execution_result><execution_result>{c}</execution_result>",
    "<tool_call>{c}</tool_call>"]
"""How a REHEARSE output wraps its content ``{c}`` and free text ``{t}``."""


def decoded(text: str) -> str:
    """What a tokenizer's ``decode`` could return for ``text``: no lone surrogate survives.

    A model's output is decoded from token ids, so it is always valid UTF-8; a raw fuzz string
    may hold lone surrogates, which this replaces by U+FFFD (as a byte-level decode would).
    """
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


hostile_text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12)),
                        max_size=5).map("".join)
"""Up to five pieces, each a ``HOSTILE`` fragment or up to 12 arbitrary characters."""
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), hostile_text)
json_values = st.recursive(scalars, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(hostile_text, c, max_size=4)), max_leaves=16)
"""JSON-like values (NaN and infinities included, which strict JSON forbids)."""


@st.composite
def act_outputs(draw: st.DrawFn, tools: list[dict[str, Any]]) -> str:
    """One hostile ACT output for these OpenAI-format tool schemas.

    One in ten calls nests 30 to 600 lists deep (past ``json_text.MAX_ARG_DEPTH``); a quarter of
    them pass the arguments as a JSON string; one in five repeats ``"name"``; one in five is
    cut at a random character (a token cap).
    """
    fns = [t["function"] for t in tools]
    fn = draw(st.sampled_from(fns))
    params = list((fn.get("parameters") or {}).get("properties", {}))
    name = draw(st.one_of(st.just(fn["name"]), hostile_text, st.sampled_from(
        [f["name"] for f in fns])))
    keys = st.one_of(st.sampled_from(params), hostile_text) if params else hostile_text
    args = draw(st.dictionaries(keys, json_values, max_size=5))
    if draw(st.integers(0, 9)) == 0:  # deep nesting, past the depth bound
        deep: object = 1
        for _ in range(draw(st.integers(30, 600))):
            deep = [deep]
        args["x"] = deep
    as_string = draw(st.booleans()) and draw(st.booleans())
    call = {"name": name, "arguments": json.dumps(args) if as_string else args}
    body = json.dumps(call, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0:  # a duplicate key, json's last-wins
        body = body.replace('{"name": ', '{"name": "rm", "name": ', 1)
    if draw(st.integers(0, 4)) == 0:  # torn by the token cap
        body = body[: draw(st.integers(0, len(body)))]
    frame = draw(st.sampled_from(ACT_FRAMES))
    return frame.format(b=body, t=draw(hostile_text))


@st.composite
def rehearse_outputs(draw: st.DrawFn) -> str:
    """One hostile REHEARSE output: hostile text or a JSON value, in a ``REHEARSE_FRAMES``
    framing."""
    content = draw(st.one_of(hostile_text, json_values.map(
        lambda v: json.dumps(v, ensure_ascii=False))))
    frame = draw(st.sampled_from(REHEARSE_FRAMES))
    return frame.format(c=content, t=draw(hostile_text))


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting in ``text``, brackets inside strings counted too (a cheap
    proxy for how deep a parser must go; ``"[[]"`` is 2, ``"]["`` is 1).

    Source: a plain scan; used to rank the worst fuzz outputs.
    """
    depth = best = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return best


def encodable(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 as it stands (False: it holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
