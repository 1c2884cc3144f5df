"""The tags both roles write, and the linear scans over model text that find them.

ACT wraps each call in ``<tool_call>...</tool_call>``; REHEARSE wraps the observation it predicts
in ``<execution_result>...</execution_result>``; reasoning sits in ``<think>...</think>``. This
file holds those tags, ``TOOL_TAG_LIKE`` (anything that looks like a tool-call tag, found in
linear time: the equivalent regex backtracks), and ``strip_think`` (reasoning removed, never
editing inside a call or a result). The prompts that ask for these tags are in ``prompts.py``
(ACT, FEEDBACK, MEMORY) and ``rehearse_prompt.py`` (REHEARSE); the parsers are in ``protocol``.

Usage::

    from envace_lite.protocol.tags import TOOL_TAG_LIKE, strip_think
    strip_think("<think>plan</think>Hello")                  # ("Hello", True)
    TOOL_TAG_LIKE.search("a <TOOL_CALL> b").group()           # "<TOOL_CALL>"
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

MAX_OUTPUT_CHARS = 50_000
"""Outputs longer than this are not parsed (``ErrorCode.TOO_LONG``); generation caps keep real
outputs far below it, so only a runaway reaches it."""


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
