"""The calls memory replaces the policy-written m_x (paper §2.3) with one built by rule from the
best imagined attempt's own ACT outputs (``study.memory_source="calls"``; beyond the paper).

A small policy that never trained on the MEMORY prompt writes fragments, so this memory is made
of text the policy itself wrote in its ACT history (docs/rehearsal.md, "A memory closer to the
ACT history"). ``drills/__init__.py`` registers ``write_calls_memories`` as the memory source
``calls`` with ``testtime.rehearsal.register_memory_writer``; test-time rehearsal uses it for a
config with ``study.memory_source="calls"`` (``rehearsal.chosen_memory_writer``).

Usage::

    from envace_lite.drills.calls_memory import calls_memory
    memory = calls_memory(record.attempts, tokenizer, cfg.rehearsal.memory_max_tokens)
"""
from __future__ import annotations

from typing import Any

from envace_lite.config import Config
from envace_lite.llm.generation import Generator
from envace_lite.protocol import prompts
from envace_lite.protocol.rehearsal_outputs import Memory, parse_memory
from envace_lite.testtime.rehearsal import Attempt, EpisodeView, TurnRehearsal

MEMORY_SOURCE = "calls"
"""The memory source this lever registers (``study.memory_source``)."""


def calls_memory(attempts: list[Attempt], tokenizer: Any, max_tokens: int) -> Memory:
    """m_x built by rule from the attempts' own ACT outputs (``study.memory_source="calls"``).

    Beyond the paper (§2.3 has the policy write m_x from a MEMORY prompt): a small policy that
    never trained on the MEMORY prompt writes fragments, so this memory is made of text the
    policy itself wrote in its ACT history. An ACT output *worked* when it made at least one call
    and no imagined observation of its calls is an error. The best attempt is the one with the
    most working outputs, then the fewest imagined errors, then the earliest. Its working outputs
    are kept verbatim, one per line, after ``prompts.CALLS_MEMORY_HEADER``; final answers are
    left out (their facts are imagined). Over ``max_tokens``, whole lines are dropped from the
    end; a single line still over it is cut (``Memory.truncated``).

    Args:
        attempts: the N attempts of one user turn (N >= 0).
        tokenizer: counts (and cuts) the memory's tokens.
        max_tokens: the memory's token budget (``rehearsal.memory_max_tokens``).

    Returns:
        The ``Memory``; empty (so no memory is inserted) when no attempt has a working output.
    """
    def working(a: Attempt) -> list[str]:
        by_turn: dict[int, list[bool]] = {}
        for st in a.trajectory.steps:
            by_turn.setdefault(st.turn, []).append(st.observation.error)
        acts = [o for o in a.trajectory.outputs if o.role == "act"]
        return [acts[turn].text.strip() for turn, errs in sorted(by_turn.items())
                if turn < len(acts) and not any(errs) and acts[turn].text.strip()]

    ranked = [(-len(w), sum(st.observation.error for st in a.trajectory.steps), a.index, w)
              for a in attempts for w in [working(a)]]
    lines = min(ranked)[3] if ranked else []
    if not lines:
        return Memory("", "", 0, parsed=True, empty=True)

    def count(ls: list[str]) -> int:
        return len(tokenizer.encode("\n".join([prompts.CALLS_MEMORY_HEADER, *ls]),
                                    add_special_tokens=False))

    kept = list(lines)
    while len(kept) > 1 and count(kept) > max_tokens:
        kept.pop()
    text = "\n".join([prompts.CALLS_MEMORY_HEADER, *kept])
    mem = parse_memory(f"{prompts.MEMORY_OPEN}{text}{prompts.MEMORY_CLOSE}", tokenizer, max_tokens)
    mem.truncated = mem.truncated or len(kept) < len(lines)
    return mem


def write_calls_memories(episodes: list[EpisodeView], recs: list[TurnRehearsal],
                         gen: Generator, tokenizer: Any, cfg: Config,
                         sampling: tuple[float, float]) -> None:
    """The memory writer ``calls`` (``rehearsal.MemoryWriter``): each record's m_x is
    ``calls_memory`` of its attempts within ``rehearsal.memory_max_tokens``; no MEMORY prompt is
    generated (``memory_output_tokens`` 0)."""
    for rec in recs:
        rec.memory, rec.memory_output_tokens = (
            calls_memory(rec.attempts, tokenizer, cfg.rehearsal.memory_max_tokens), 0)


def chosen(cfg: Config) -> bool:
    """Whether ``cfg`` asks for the calls memory (``study.memory_source="calls"``)."""
    return cfg.study.memory_source == MEMORY_SOURCE


__all__ = ["MEMORY_SOURCE", "calls_memory", "chosen", "write_calls_memories"]
