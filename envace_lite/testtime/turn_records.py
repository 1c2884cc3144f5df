"""A user turn's rehearsal record applied to its committed episode.

Rehearsal returns records and changes nothing (``rehearsal.rehearse_turns``,
``selection.select_turns``); the committed execution applies each one here, before the episode's
next ACT turn. A ``rehearsal.TurnRehearsal`` inserts the memory m_x into the context (paper §2.3;
``apply_rehearsal``), a ``selection.TurnSelection`` makes the chosen first ACT output the
episode's preset (beyond the paper; ``apply_selection``). Either way the record is kept on the
episode and its counts join the episode's counters, the keys of its row.

Usage::

    from envace_lite.testtime.turn_records import apply_rehearsal
    (rec,) = rehearse_turns([ep], gen, tok, cfg, "parallel", 2)
    apply_rehearsal(ep, rec, cfg.rehearsal.memory_placement)
"""
from __future__ import annotations

from typing import Any

from envace_lite.protocol import prompts
from envace_lite.testtime.episode import Episode
from envace_lite.testtime.rehearsal import TurnRehearsal
from envace_lite.testtime.selection import TurnSelection


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


def apply_selection(ep: Episode, rec: TurnSelection) -> None:
    """Apply one user turn's selection (``selection.select_turns``) to its episode: the chosen
    first ACT output becomes the episode's ``preset`` (committed verbatim at its next ACT turn;
    None: ACT generates as usual), the record is kept and its counts join the row's counters.
    Nothing joins the history: the committed prompt is exactly the no-rehearsal prompt."""
    ep.selections.append(rec)
    ep.preset = rec.preset
    ep.rehearsal_real_calls += rec.real_calls
    ep.rehearsal_tokens += rec.tokens
    ep.rehearse_outputs += rec.rehearse_outputs
    ep.rehearsal_seconds += rec.seconds
    ep.crashed_attempts += rec.crashed
    ep.rejected_attempts += rec.rejected
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


__all__ = [
    "apply_rehearsal",
    "apply_selection",
]
