"""The FEEDBACK and MEMORY outputs of private rehearsal (paper §2.3), parsed; never raising.

``parse_feedback`` reads f^(n), an assessment and a revision of one imagined attempt (an output
without the tags keeps ``FEEDBACK_RAW_CHARS`` of its visible text as the assessment);
``parse_memory`` reads m_x and enforces its token budget. The tags are in ``protocol.prompts``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envace_lite.protocol.tags import strip_think
from envace_lite.protocol import prompts

FEEDBACK_RAW_CHARS = 1000
"""An unparseable FEEDBACK keeps this many characters of its visible text."""


@dataclass
class Feedback:
    """f^(n): the parsed FEEDBACK output of one attempt.

    Attributes:
        raw: the generated text.
        assessment, revision: the tagged parts ("" when missing).
        ok: both-or-either tag found; False for an empty or untagged output.
        error: "" | ``empty`` | ``no_tags``.
    """

    raw: str
    assessment: str = ""
    revision: str = ""
    ok: bool = True
    error: str = ""

    @property
    def text(self) -> str:
        """The feedback as MEMORY and later sequential attempts read it."""
        return prompts.render_feedback(self.assessment, self.revision)


@dataclass
class Memory:
    """m_x for one user turn.

    Attributes:
        text: the memory content ("" when empty), at most ``memory_max_tokens`` tokens.
        raw: the generated text.
        tokens: tokens of ``text``.
        parsed: a ``<memory>`` tag was found.
        empty: nothing usable; no memory message is inserted.
        truncated: cut to ``memory_max_tokens`` tokens.
    """

    text: str
    raw: str = ""
    tokens: int = 0
    parsed: bool = True
    empty: bool = False
    truncated: bool = False



def _tagged(text: str, open_tag: str, close_tag: str) -> str | None:
    """The content of the first ``open_tag`` block (an unclosed block runs to the end)."""
    i = text.find(open_tag)
    if i == -1:
        return None
    j = text.find(close_tag, i + len(open_tag))
    return (text[i + len(open_tag):] if j == -1 else text[i + len(open_tag):j]).strip()


def parse_feedback(text: str) -> Feedback:
    """Parse a FEEDBACK output; never raises (see the module docstring for bad input)."""
    visible = strip_think(text or "")[0].strip()
    if not visible:
        return Feedback(text or "", ok=False, error="empty")
    a = _tagged(visible, prompts.ASSESSMENT_OPEN, prompts.ASSESSMENT_CLOSE)
    r = _tagged(visible, prompts.REVISION_OPEN, prompts.REVISION_CLOSE)
    if a is None and r is None:
        return Feedback(text, visible[:FEEDBACK_RAW_CHARS], "", ok=False, error="no_tags")
    return Feedback(text, a or "", r or "")


def parse_memory(text: str, tokenizer: Any, max_tokens: int) -> Memory:
    """Parse a MEMORY output and enforce the token budget; never raises."""
    visible = strip_think(text or "")[0]
    content = _tagged(visible, prompts.MEMORY_OPEN, prompts.MEMORY_CLOSE)
    parsed = content is not None
    content = (visible if content is None else content).replace(prompts.MEMORY_CLOSE, "").strip()
    if not content:
        return Memory("", text or "", 0, parsed, empty=True)
    ids = tokenizer.encode(content, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return Memory(content, text, len(ids), parsed)
    keep = max_tokens
    while True:  # re-encoding a decoded prefix can merge differently: make sure it fits
        cut = tokenizer.decode(ids[:keep]).strip()
        n = len(tokenizer.encode(cut, add_special_tokens=False))
        if n <= max_tokens or keep == 0:
            break
        keep -= 1
    return Memory(cut, text, n, parsed, empty=not cut, truncated=True)


__all__ = ["FEEDBACK_RAW_CHARS", "Feedback", "Memory", "parse_feedback", "parse_memory"]
