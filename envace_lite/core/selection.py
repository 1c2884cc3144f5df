"""Rehearse, then select: N imagined attempts, a verdict on each, one committed call (beyond the
paper; docs/rehearsal.md, "Rehearse, then select").

The paper's §2.3 condenses the attempts into a memory m_x that the committed ACT reads. A small
policy may not read a memory at all, and nothing in the memory stops an imagined error from
reaching the real call. The paper's outlook names the alternative: rehearse first, then filter
with a lightweight verifier. Here, at each new user message of a committed execution:

1. **Candidates.** ``select``: N imagined attempts at the committed ACT prompt, with no memory
   in context (``rehearsal.imagined_task``; the acting policy plays ACT, the rehearsing policy
   plays REHEARSE with grounding ``<unavailable>``). ``rules`` and ``vote``: N first ACT outputs
   sampled from the committed ACT prompt itself, and nothing rehearsed.
2. **Scores** (``Candidate``), on the attempt's *first* ACT output, the one that may be
   committed:
   - ``prediction``: what REHEARSE imagined for its calls: ``error`` when a parsed REHEARSE output
     reports an error (the attempt is rejected), ``ok`` when every call got a parsed, non-error
     one, else ``none`` (no prediction: a text reply, or a REHEARSE output that did not parse;
     never counted as success);
   - ``later_errors``: imagined errors on the attempt's later calls;
   - the cheap checks: ``unseen_ids`` (identifier arguments, ``gate.identifiers``, whose value
     occurs in no user message and no real non-error observation of the episode, ``id_seen``) and
     ``invalid`` (the call's schema problems, ``ToolCall.violations``, or an output that does
     not parse);
   - ``agreement``: how many other candidates have the same ``signature`` (the same calls, name
     and arguments, or a text reply).
3. **Choice** (``selection_key``; the smallest key wins, so ties go to the earliest attempt):

   =========  ==========================================================================
   strategy   key (smaller is better)
   =========  ==========================================================================
   ``select`` prediction (ok < none < error), check failures, later imagined errors,
              −agreement, index
   ``rules``  check failures, −agreement, index
   ``vote``   −agreement, index (a majority vote over the first outputs)
   =========  ==========================================================================

4. **Commit.** The chosen candidate's first ACT output is committed verbatim (its sampled ids,
   ``TurnSelection.preset``), then the episode goes on as usual. With no usable candidate (every
   attempt crashed or produced nothing), the committed ACT generates as without rehearsal.

**Forms.** ``parallel``: the N candidates of every episode in one batch. ``sequential``: one
candidate at a time, stopping early at the first *accepted* one (``accepted``: ``select``: a
prediction of ``ok`` and no failed check; ``rules``: no failed check; ``vote``: a signature
held by more than N/2 candidates, which no later candidate can outvote); when none is accepted
after N, the choice is the same key over all N. Sequential candidates read the same prompt as
parallel ones (no context of earlier attempts: that is what the memory mode's sequential form
does).

**Safety.** No env is given to the rollout engine, the env's ``real_calls`` is checked before and
after (a change raises ``RehearsalExecuted``). An attempt that raises, or whose trajectory ended
on an error, is logged and skipped (``Candidate.crashed``), never chosen.

Usage::

    from envace_lite.core.episode import Episode
    from envace_lite.core.execute import run_committed
    cfg.rehearsal.strategy = "select"
    rows = run_committed(gen, tok, episodes, cfg, rehearsal="parallel", n=2)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from envace_lite import protocol
from envace_lite.config import Config
from envace_lite.core.engine import chat_glue, ids_with_stop
from envace_lite.core.gate import identifiers
from envace_lite.core.rehearsal import EpisodeView, RehearsalExecuted, imagined_task, rehearsal_config
from envace_lite.core.rollout import rollout
from envace_lite.llm.generation import Completion, Generator
from envace_lite.progress import get_logger
from envace_lite.types import REHEARSING_MODES, Output, Trajectory


log = get_logger(__name__)

STRATEGIES = ("memory", "select", "rules", "vote")
"""``rehearsal.strategy``: how a rehearsal reaches the committed run. ``memory``: the paper's m_x
(``rehearsal.rehearse_turns``); ``select``: rehearse, then commit the best attempt's first ACT
output; ``rules``: the same checks without REHEARSE; ``vote``: a majority vote without REHEARSE."""
SELECTING = ("select", "rules", "vote")
"""The strategies of this module."""
PREDICTION_RANK = {"ok": 0, "none": 1, "error": 2}
"""The order of REHEARSE's verdicts in ``selection_key`` (an imagined error is worst)."""
TEXT_REPLY = "(text reply)"
"""The signature of every final text reply (they agree with each other)."""


# ---------------------------------------------------------------------------------------------
# Candidates and their scores
# ---------------------------------------------------------------------------------------------

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
    return protocol.strip_think(text or "")[0].strip()


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


# ---------------------------------------------------------------------------------------------
# One user turn of every live episode
# ---------------------------------------------------------------------------------------------

@dataclass
class TurnSelection:
    """The selection of one user turn of one episode.

    Attributes:
        user_turn: the committed run's user turn (0-based).
        mode: ``parallel`` or ``sequential``; strategy: one of ``SELECTING``.
        candidates: every candidate made, in order (crashed ones included).
        chosen: the chosen candidate's index (0: none usable, the committed ACT generates).
        preset: the chosen first ACT output as the engine commits it (ids without the stop
            token that ``engine.ids_with_stop`` adds back), None when nothing was chosen.
        rehearse_outputs: REHEARSE outputs over all candidates.
        real_calls: real executions during the selection (always 0; checked).
        seconds: this episode's share of the batched selection's wall time.
    """

    user_turn: int
    mode: str
    strategy: str
    candidates: list[Candidate] = field(default_factory=list)
    chosen: int = 0
    preset: Completion | None = None
    rehearse_outputs: int = 0
    real_calls: int = 0
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens generated for the candidates (ACT and REHEARSE outputs)."""
        return sum(c.tokens for c in self.candidates)

    @property
    def crashed(self) -> int:
        """Candidates whose attempt crashed (logged and skipped)."""
        return sum(bool(c.crashed) for c in self.candidates)

    @property
    def rejected(self) -> int:
        """Candidates REHEARSE rejected (an imagined error on the first output's calls)."""
        return sum(c.prediction == "error" for c in self.candidates)

    def to_dict(self) -> dict[str, Any]:
        """The row's record of this selection."""
        return {"user_turn": self.user_turn, "mode": self.mode, "strategy": self.strategy,
                "chosen": self.chosen, "candidates": [c.to_dict() for c in self.candidates]}


def as_completion(out: Output, tokenizer: Any) -> Completion:
    """An ACT ``Output`` as the ``Completion`` the engine would have received: its ids without
    the end-of-turn id that ``engine.ids_with_stop`` appended, so that committing it rebuilds
    exactly ``out.ids``."""
    glue = chat_glue(tokenizer)
    stop = out.finish_reason == "stop" and glue.eot_id is not None and out.ids \
        and out.ids[-1] == glue.eot_id
    return Completion(ids=list(out.ids[:-1] if stop else out.ids), text=out.text,
                      logprobs=None, finish_reason=out.finish_reason)


def _crash(where: str, exc: BaseException) -> str:
    return f"{where}: {type(exc).__name__}: {exc}"[:500]


def _imagined(tasks: list[Any], gen: Generator, tok: Any, rcfg: Config, k: int,
              simulator: Generator | None) -> list[list[Trajectory | str]]:
    """``k`` imagined attempts per task (one ``rollout`` batch); when the batch raises, attempt
    by attempt, and an attempt that raises becomes its error text (logged, skipped)."""
    mode = "rehearse" if simulator is None else "frozen_simulator"

    def run(ts: list[Any], kk: int) -> list[Trajectory]:
        return rollout(ts, gen, tok, rcfg, k=kk, mode=mode, simulator=simulator)

    try:
        trajs = run(tasks, k)
        return [list(trajs[i * k:(i + 1) * k]) for i in range(len(tasks))]
    except RehearsalExecuted:
        raise
    except Exception as exc:  # noqa: BLE001 (find the attempts that fail; the rest go on)
        log.warning("a batch of %d imagined attempts failed (%r); attempt by attempt",
                    len(tasks) * k, exc)
    out: list[list[Trajectory | str]] = []
    for task in tasks:
        row: list[Trajectory | str] = []
        for j in range(k):
            try:
                row.append(run([task], 1)[0])
            except RehearsalExecuted:
                raise
            except Exception as exc:  # noqa: BLE001
                row.append(_crash("imagined attempt", exc))
                log.warning("%s: imagined attempt %d crashed and is skipped (%s)", task.id,
                            j + 1, row[-1])
        out.append(row)
    return out


def _sampled(prompts: list[list[int]], gen: Generator, tok: Any, cfg: Config, k: int,
             sampling: tuple[float, float]) -> list[list[Output | str]]:
    """``k`` first ACT outputs sampled from each prompt (one generate call; when it raises,
    output by output, and one that raises becomes its error text)."""
    glue = chat_glue(tok)

    def gen_(ps: list[list[int]]) -> list[Output]:
        outs = gen.generate(ps, role="act", max_new_tokens=cfg.rollout.max_new_tokens_act,
                            temperature=sampling[0], top_p=sampling[1])
        return [Output("act", 0, list(p), ids_with_stop(o, glue), o.text,
                       finish_reason=o.finish_reason) for p, o in zip(ps, outs)]

    try:
        made = gen_([p for p in prompts for _ in range(k)])
        return [list(made[i * k:(i + 1) * k]) for i in range(len(prompts))]
    except Exception as exc:  # noqa: BLE001
        log.warning("a batch of %d sampled first calls failed (%r); one by one",
                    len(prompts) * k, exc)
    out: list[list[Output | str]] = []
    for p in prompts:
        row: list[Output | str] = []
        for j in range(k):
            try:
                row.append(gen_([p])[0])
            except Exception as exc:  # noqa: BLE001
                row.append(_crash("sampled first call", exc))
                log.warning("sampled first call %d crashed and is skipped (%s)", j + 1, row[-1])
        out.append(row)
    return out


def select_turns(episodes: list[EpisodeView], generator: Generator, tokenizer: Any, cfg: Config,
                 mode: str, n: int, strategy: str, *, act_prompt: Any,
                 rehearse_generator: Generator | None = None) -> list[TurnSelection]:
    """Select the first committed ACT output of the current user turn of every episode.

    Reads the episodes and changes nothing in them: the caller applies each record
    (``execute.apply_selection`` sets the preset output and adds the counters).

    Args:
        episodes: live episodes that just received a new user message.
        generator, tokenizer: the acting policy (it writes every ACT output of the candidates).
        cfg: the run config (``cfg.rehearsal`` decoding and ``max_turns``, ``cfg.rollout``
            budgets).
        mode: ``parallel`` or ``sequential`` (the module docstring's forms).
        n: N, candidates per user turn (>= 1).
        strategy: ``select``, ``rules`` or ``vote``.
        act_prompt: ``episode -> ids``: the episode's next committed ACT prompt (``rules`` and
            ``vote`` sample from it).
        rehearse_generator: ``select``: who plays REHEARSE (None: the acting policy). It reads
            prompts built with ``tokenizer``, so it must share it (a warm start or the base of
            the same model does).

    Returns:
        One ``TurnSelection`` per episode, in order.

    Raises:
        ValueError: an unknown ``mode`` or ``strategy``, or ``n < 1``.
        RehearsalExecuted: an env's ``real_calls`` changed during selection (a bug).
    """
    if mode not in REHEARSING_MODES:
        raise ValueError(f"rehearsal mode {mode!r}: use one of {REHEARSING_MODES}")
    if strategy not in SELECTING:
        raise ValueError(f"selection strategy {strategy!r}: use one of {SELECTING}")
    if n < 1:
        raise ValueError(f"n={n}: selection needs at least one candidate")
    started, before = time.perf_counter(), [ep.env.real_calls for ep in episodes]
    rcfg = rehearsal_config(cfg)
    sampling = (rcfg.rollout.temperature, rcfg.rollout.top_p)
    recs = [TurnSelection(ep.user_turns - 1, mode, strategy) for ep in episodes]
    seen = [seen_text(ep) for ep in episodes]
    tools = [ep.env.tool_schemas() for ep in episodes]
    terminal = [frozenset(getattr(ep.env, "terminal_tools", ())) for ep in episodes]
    simulator = None if rehearse_generator is generator else rehearse_generator
    prompts = [] if strategy == "select" else [act_prompt(ep) for ep in episodes]
    rounds = [n] if mode == "parallel" else [1] * n
    for k in rounds:
        todo = [i for i, rec in enumerate(recs)
                if mode == "parallel" or not accepted(rec.candidates, strategy, n)]
        if not todo:
            break
        if strategy == "select":
            tasks = [imagined_task(episodes[i], cfg.rollout.rendering) for i in todo]
            made = _imagined(tasks, generator, tokenizer, rcfg, k, simulator)
        else:
            made = _sampled([prompts[i] for i in todo], generator, tokenizer, cfg, k, sampling)
        for i, row in zip(todo, made):
            rec = recs[i]
            for item in row:
                c = Candidate(len(rec.candidates) + 1)
                if isinstance(item, str):
                    c.crashed = item
                elif isinstance(item, Trajectory):
                    c = score_attempt(c.index, item, tools[i], seen[i], terminal[i])
                    rec.rehearse_outputs += sum(o.role == "rehearse" for o in item.outputs)
                    rec.real_calls += item.real_calls
                    if c.crashed:
                        log.warning("%s: imagined attempt %d ended on an error and is skipped "
                                    "(%s)", episodes[i].task_id, c.index, c.crashed)
                else:
                    c.tokens = len(item.ids)
                    score_output(c, item, tools[i], seen[i], terminal[i])
                rec.candidates.append(c)
    seconds = time.perf_counter() - started
    for ep, rec, b in zip(episodes, recs, before):
        rec.real_calls += ep.env.real_calls - b
        if rec.real_calls:
            raise RehearsalExecuted(f"{ep.task_id}: selection made {rec.real_calls} real "
                                    "call(s); rehearsal must never execute (this is a bug)")
        best = choose(rec.candidates, strategy)
        if best is not None:
            rec.chosen, rec.preset = best.index, as_completion(best.output, tokenizer)
        else:
            log.warning("%s: no usable candidate in user turn %d; the committed ACT generates",
                        ep.task_id, rec.user_turn)
        rec.seconds = seconds / len(episodes)
    return recs


__all__ = [
    "PREDICTION_RANK",
    "SELECTING",
    "STRATEGIES",
    "TEXT_REPLY",
    "Candidate",
    "TurnSelection",
    "accepted",
    "as_completion",
    "choose",
    "id_seen",
    "count_agreement",
    "score_attempt",
    "score_output",
    "seen_text",
    "select_turns",
    "selection_key",
    "signature",
    "unseen_ids",
]
