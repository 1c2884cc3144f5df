"""The candidates of rehearse-then-select: one attempt's first ACT output, its scores, and the
key that chooses among them (beyond the paper; docs/rehearsal.md, "Rehearse, then select").
``selection.select_turns`` makes the candidates; this module only judges them.

**Scores** (``Candidate``), on the attempt's *first* ACT output, the one that may be committed:

- ``prediction``: what REHEARSE imagined for its calls: ``error`` when a parsed REHEARSE output
  reports an error (the attempt is rejected), ``ok`` when every call got a parsed, non-error
  one, else ``none`` (no prediction: a text reply, or a REHEARSE output that did not parse;
  never counted as success);
- ``later_errors``: imagined errors on the attempt's later calls;
- the cheap checks: ``unseen_ids`` (identifier arguments, ``gate.identifiers``, whose value
  occurs in no user message and no real non-error observation of the episode, ``id_seen``) and
  ``invalid`` (the call's schema problems, ``ToolCall.violations``, or an output that does not
  parse);
- ``agreement``: how many other candidates have the same ``signature`` (the same calls, name
  and arguments, or a text reply).

**Choice** (``selection_key``; the smallest key wins, so ties go to the earliest attempt):

=========  ==========================================================================
strategy   key (smaller is better)
=========  ==========================================================================
``select`` prediction (ok < none < error), check failures, later imagined errors,
           −agreement, index
``rules``  check failures, −agreement, index
``vote``   −agreement, index (a majority vote over the first outputs)
=========  ==========================================================================

**When a sequential selection stops** (``accepted``: at the first candidate that passes):
``select``: a prediction of ``ok`` and no failed check; ``rules``: no failed check; ``vote``: a
signature held by more than N/2 candidates, which no later candidate can outvote.

Usage::

    from envace_lite.testtime.candidates import choose, score_attempt, seen_text
    scored = [score_attempt(j + 1, traj, tools, seen_text(ep)) for j, traj in enumerate(trajs)]
    best = choose(scored, "select")
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envace_lite import protocol
from envace_lite.protocol.tags import strip_think
from envace_lite.testtime.gate import identifiers
from envace_lite.testtime.rehearsal import EpisodeView
from envace_lite.types import Output, Trajectory

SELECTING = ("select", "rules", "vote")
"""The strategies that choose among candidates (``selection_key``)."""
PREDICTION_RANK = {"ok": 0, "none": 1, "error": 2}
"""The order of REHEARSE's verdicts in ``selection_key`` (an imagined error is worst)."""
TEXT_REPLY = "(text reply)"
"""The signature of every final text reply (they agree with each other)."""


@dataclass
class Candidate:
    """One attempt's first ACT output with its scores (see the module docstring).

    Attributes:
        index: n, 1-based, in the order the attempts were made.
        output: the first ACT output (its ``ids`` include the stop token when it stopped), None
            when the attempt produced none (crashed, or its prompt was over budget).
        kind: ``calls`` | ``final`` | ``error`` (``protocol.parse_act``); "" without an output.
        signature: the calls as canonical JSON, ``TEXT_REPLY``, or the unparseable text.
        prediction: ``ok`` | ``none`` | ``error`` (``select`` only; ``none`` otherwise).
        imagined_errors: parsed REHEARSE outputs reporting an error on the first output's calls.
        unpredicted: first-output calls whose REHEARSE output did not parse.
        later_errors: imagined errors on the attempt's later calls.
        unseen_ids: ``"name=value"`` of each identifier argument never seen in the episode.
        invalid: schema problems of the calls, or the parse error of the output.
        agreement: other candidates with the same signature.
        crashed: the exception (or trajectory error) that ended the attempt; "" otherwise.
        tokens: tokens generated for this candidate (ACT and REHEARSE outputs).
    """

    index: int
    output: Output | None = None
    kind: str = ""
    signature: str = ""
    prediction: str = "none"
    imagined_errors: int = 0
    unpredicted: int = 0
    later_errors: int = 0
    unseen_ids: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    agreement: int = 0
    crashed: str = ""
    tokens: int = 0

    @property
    def usable(self) -> bool:
        """It has a first output and did not crash."""
        return self.output is not None and not self.crashed

    @property
    def check_failures(self) -> int:
        """Failed cheap checks: unseen identifiers plus invalid calls (or a parse error)."""
        return len(self.unseen_ids) + len(self.invalid)

    def to_dict(self) -> dict[str, Any]:
        """The row's record of this candidate (the output's text capped at 300 characters)."""
        return {"index": self.index, "kind": self.kind, "signature": self.signature[:300],
                "prediction": self.prediction, "imagined_errors": self.imagined_errors,
                "unpredicted": self.unpredicted, "later_errors": self.later_errors,
                "unseen_ids": list(self.unseen_ids), "invalid": list(self.invalid),
                "agreement": self.agreement, "crashed": self.crashed, "tokens": self.tokens,
                "text": (self.output.text if self.output is not None else "")[:300]}


def seen_text(ep: EpisodeView) -> str:
    """What identifiers may be copied from: the episode's user messages (not tool responses)
    and its real non-error observations (``Episode.events``), joined by newlines. As the write
    gate reads it (``gate.WriteGate``), but without the gate's incremental state."""
    texts = [str(m.get("content") or "") for m in ep.messages + ep.history
             if m.get("role") == "user"
             and not str(m.get("content") or "").lstrip().startswith("<tool_response>")]
    for ev in getattr(ep, "events", []):
        if ev.get("kind") == "step":
            texts += [str(o.get("content", "")) for o in ev["observations"] if not o.get("error")]
    return "\n".join(texts)


def id_seen(value: str, seen: str) -> bool:
    """Whether an identifier value occurs in ``seen``: verbatim, or without a leading ``#``
    (tau2 writes order ids as ``#W1234567``; a user who writes ``W1234567`` gave the id, and
    adding the ``#`` is the fix of the paper's Fig. 7 slip, not an invention)."""
    return value in seen or (value.startswith("#") and len(value) > 1 and value[1:] in seen)


def unseen_ids(arguments: Any, seen: str) -> list[str]:
    """``"name=value"`` for each identifier value (``gate.identifiers``) that ``id_seen`` does
    not find in ``seen``."""
    return [f"{k}={v}" for k, v in identifiers(arguments) if not id_seen(v, seen)]


def signature(parsed: protocol.ActParse, text: str) -> str:
    """What ``vote`` counts: the calls' names and arguments as canonical JSON (call ids left
    out), ``TEXT_REPLY`` for a final text, the stripped text for an unparseable output."""
    if parsed.kind == "calls":
        return json.dumps([[c.name, c.arguments] for c in parsed.calls], sort_keys=True,
                          ensure_ascii=False, default=str)
    if parsed.kind == "final":
        return TEXT_REPLY
    return strip_think(text or "")[0].strip()


def score_output(c: Candidate, out: Output, tools: list[dict[str, Any]], seen: str,
                 terminal: frozenset[str] = frozenset()) -> None:
    """Set ``c``'s output, kind, signature and cheap checks from its first ACT output."""
    parsed = protocol.parse_act(out.text, tools)
    c.output, c.kind, c.signature = out, parsed.kind, signature(parsed, out.text)
    if parsed.kind == "error":
        c.invalid = [f"parse error: {parsed.error_code.value}"]
        return
    for call in parsed.calls:
        if call.name in terminal:
            continue
        c.invalid += [f"{call.name}: {v}" for v in call.violations]
        c.unseen_ids += unseen_ids(call.arguments, seen)


def score_attempt(index: int, traj: Trajectory, tools: list[dict[str, Any]], seen: str,
                  terminal: frozenset[str] = frozenset()) -> Candidate:
    """A ``Candidate`` from one imagined attempt (a rehearse-mode trajectory).

    The first ACT output's calls are judged by the REHEARSE outputs of turn 0 (``prediction``);
    a REHEARSE output that did not parse is no prediction (``unpredicted``), never a success.
    """
    c = Candidate(index, tokens=sum(len(o.ids) for o in traj.outputs))
    if traj.stop_reason == "error":
        c.crashed = traj.error or "error"
        return c
    acts = [o for o in traj.outputs if o.role == "act"]
    if not acts:
        return c
    score_output(c, acts[0], tools, seen, terminal)
    first = [o for o in traj.outputs if o.role == "rehearse" and o.turn == 0]
    c.unpredicted = sum(o.parse_kind != "ok" for o in first)
    steps = [s for s in traj.steps if s.turn == 0]
    c.imagined_errors = sum(o.parse_kind == "ok" and s.observation.error
                            for o, s in zip(first, steps))
    c.later_errors = sum(s.observation.error for s in traj.steps if s.turn > 0)
    if c.imagined_errors:
        c.prediction = "error"
    elif c.kind == "calls" and first and not c.unpredicted:
        c.prediction = "ok"
    return c


def count_agreement(candidates: list[Candidate]) -> None:
    """Set each usable candidate's ``agreement``: the other usable ones with its signature."""
    usable = [c for c in candidates if c.usable]
    for c in usable:
        c.agreement = sum(o.signature == c.signature for o in usable) - 1


def selection_key(c: Candidate, strategy: str) -> tuple:
    """The sort key of ``strategy`` (the module docstring's table); smaller is better.

    Raises:
        ValueError: ``strategy`` is not one of ``SELECTING``.
    """
    if strategy == "select":
        return (PREDICTION_RANK[c.prediction], c.check_failures, c.later_errors, -c.agreement,
                c.index)
    if strategy == "rules":
        return (c.check_failures, -c.agreement, c.index)
    if strategy == "vote":
        return (-c.agreement, c.index)
    raise ValueError(f"selection strategy {strategy!r}: use one of {SELECTING}")


def choose(candidates: list[Candidate], strategy: str) -> Candidate | None:
    """The usable candidate with the smallest ``selection_key`` (agreement counted first), or
    None when no candidate is usable."""
    count_agreement(candidates)
    usable = [c for c in candidates if c.usable]
    return min(usable, key=lambda c: selection_key(c, strategy)) if usable else None


def accepted(candidates: list[Candidate], strategy: str, n: int) -> bool:
    """Whether a sequential selection may stop before its N-th candidate (module docstring)."""
    usable = [c for c in candidates if c.usable]
    if strategy == "select":
        return any(c.prediction == "ok" and not c.check_failures for c in usable)
    if strategy == "rules":
        return any(not c.check_failures for c in usable)
    count_agreement(candidates)
    return any(2 * (c.agreement + 1) > n for c in usable)

__all__ = [
    "PREDICTION_RANK",
    "SELECTING",
    "TEXT_REPLY",
    "Candidate",
    "accepted",
    "choose",
    "count_agreement",
    "id_seen",
    "score_attempt",
    "score_output",
    "seen_text",
    "selection_key",
    "signature",
    "unseen_ids",
]
