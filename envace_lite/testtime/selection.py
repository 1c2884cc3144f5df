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
2. **Scores** (``candidates.Candidate``), on the attempt's *first* ACT output, the one that may
   be committed: REHEARSE's ``prediction`` on its calls (``ok``, ``none`` or ``error``), the
   imagined errors of later calls, the cheap checks (identifier values never seen in the
   episode, schema problems) and ``agreement`` with the other candidates (``candidates.py``).
3. **Choice** (``candidates.selection_key``; the smallest key wins, ties go to the earliest
   attempt): ``select`` ranks by prediction, then checks, later errors and agreement; ``rules``
   by checks, then agreement; ``vote`` by agreement alone (a majority vote).
4. **Commit.** The chosen candidate's first ACT output is committed verbatim (its sampled ids,
   ``TurnSelection.preset``), then the episode goes on as usual. With no usable candidate (every
   attempt crashed or produced nothing), the committed ACT generates as without rehearsal.

**Forms.** ``parallel``: the N candidates of every episode in one batch. ``sequential``: one
candidate at a time, stopping early at the first *accepted* one (``candidates.accepted``:
``select``: a prediction of ``ok`` and no failed check; ``rules``: no failed check; ``vote``: a
signature held by more than N/2 candidates, which no later candidate can outvote); when none is
accepted after N, the choice is the same key over all N. Sequential candidates read the same
prompt as parallel ones (no context of earlier attempts: that is what the memory mode's
sequential form does).

**Safety.** No env is given to the rollout engine, the env's ``real_calls`` is checked before and
after (a change raises ``RehearsalExecuted``). An attempt that raises, or whose trajectory ended
on an error, is logged and skipped (``Candidate.crashed``), never chosen.

Usage::

    from envace_lite.testtime.episode import Episode
    from envace_lite.testtime.execute import run_committed
    cfg.rehearsal.strategy = "select"
    rows = run_committed(gen, tok, episodes, cfg, rehearsal="parallel", n=2)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace_lite.config import Config
from envace_lite.testtime.candidates import (
    SELECTING,
    Candidate,
    accepted,
    choose,
    score_attempt,
    score_output,
    seen_text,
)
from envace_lite.core.engine import chat_glue, ids_with_stop
from envace_lite.testtime.rehearsal import EpisodeView, RehearsalExecuted, imagined_task, rehearsal_config
from envace_lite.core.rollout import rollout
from envace_lite.llm.generation import Completion, Generator
from envace_lite.progress import get_logger
from envace_lite.types import REHEARSING_MODES, Output, Trajectory


log = get_logger(__name__)

STRATEGIES = ("memory", "select", "rules", "vote")
"""``rehearsal.strategy``: how a rehearsal reaches the committed run. ``memory``: the paper's m_x
(``rehearsal.rehearse_turns``); ``select``: rehearse, then commit the best attempt's first ACT
output; ``rules``: the same checks without REHEARSE; ``vote``: a majority vote without REHEARSE."""


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
    (``turn_records.apply_selection`` sets the preset output and adds the counters).

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
    "STRATEGIES",
    "TurnSelection",
    "as_completion",
    "select_turns",
]
