"""Test-time private rehearsal: imagined attempts, FEEDBACK and the memory m_x (paper §2.3).

The reference code has no test-time rehearsal; this is our design (docs/design.md, "Our
additions beyond the paper"; the procedure in docs/rehearsal.md). The committed
execution that follows, and the write gate, live in ``testtime/execute.py``, which calls
``rehearse_turns`` at each new user message. Per episode and user turn:

1. **Rehearse.** The rehearsing policy plays N imagined attempts from the *real history so far*.
   Future user turns are never shown: the imagined task holds only the messages seen so far.
   REHEARSE writes every observation with grounding ``<unavailable>``.
   - ``parallel``: N independent attempts, generated as one batch (``rollout(..., k=N)``); each
     then gets a FEEDBACK (assessment + revision suggestion) written by the same policy.
   - ``sequential``: attempt n's ACT prompt also holds attempts 1..n-1 with their feedback
     (``prompts.SEQUENTIAL_CONTEXT``, a user-role message after the current request).
2. **Memory.** A MEMORY prompt condenses the attempts and their feedback into m_x, within
   ``rehearsal.memory_max_tokens`` tokens. m_x joins the committed history as one user-role
   message right after the request it was rehearsed for (``prompts.memory_message``), so later
   turns still see it. The environment never sees it (the USER simulator and the checkers read
   the env's own trajectory).

**Imagined continuations reuse the rollout engine.** ``imagined_task`` turns the committed state
into a one-user-turn ``Task``: its messages are the episode's initial messages plus the real
history so far (plus, in sequential mode, the context message), its tools the env's current
schemas, its grounding empty. ``rollout(mode="rehearse")`` on it renders the committed history
as text: in the first user turn that is exactly the committed ACT prompt; in later ones it is the
re-rendered history (under Qwen3's template, without the empty think blocks that the committed
token history keeps: docs/design.md, "Committed execution on training's tokens"). A final answer
ends the attempt (the task has no next user turn). The rollout
config is copied with ``grounding_drop_p=1`` (so REHEARSE always reads ``<unavailable>``), the
rehearsal decoding and ``rehearsal.max_turns``. No env is given to the engine, so it cannot
execute anything; the env's ``real_calls`` counter is also checked before and after, and a
change raises.

**Bad input** (all counted in the episode row):
- an unparseable FEEDBACK (no ``<assessment>``/``<revision>`` tag) keeps its visible text, cut to
  ``FEEDBACK_RAW_CHARS``, as the assessment (``feedback_parse_errors``); an empty one becomes
  ``prompts.NO_FEEDBACK``;
- a MEMORY without ``<memory>`` tags uses its visible text; an empty memory inserts **no** memory
  message, so the committed prompt is exactly the no-rehearsal prompt (``empty_memories``);
- a memory over ``memory_max_tokens`` tokens is cut to its first ``memory_max_tokens`` tokens
  (``truncated_memories``).

**Options beyond the paper** (docs/rehearsal.md, "A memory closer to the ACT history"): m_x
is written by the memory writer the config chooses (``register_memory_writer``,
``chosen_memory_writer``): the paper's ``policy`` (``policy_memories``) unless a plugin's lever
chooses another (the drills study's ``study.memory_source="calls"`` builds m_x by rule from the
best attempt's own ACT outputs, ``drills/calls_memory.py``); ``rehearsal.memory_placement=
"ticket"`` appends m_x to the request's own user message instead of a message of its own
(``turn_records.apply_rehearsal``).

Usage::

    from envace_lite.testtime.execute import run_committed
    from envace_lite.testtime.episode import Episode
    env = make_env("bfcl-base", "multi_turn_base_5")
    rows = run_committed(gen, tok, [Episode("bfcl-base", env.task_id, 0, env, env.reset())], cfg,
                         rehearsal="parallel", n=2)
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace_lite.protocol.prompts import act_messages
from envace_lite.protocol import prompts
from envace_lite.config import Config
from envace_lite.llm.generation import Generator, chat_ids
from envace_lite.progress import get_logger
from envace_lite.core.rollout import rollout
from envace_lite.protocol.rehearsal_outputs import Feedback, Memory, parse_feedback, parse_memory
from envace_lite.types import DECODING, REHEARSING_MODES, Task, Trajectory

log = get_logger(__name__)
MEMORY_TAG_SLACK = 16
"""MEMORY may generate ``memory_max_tokens`` plus this many tokens (its tags)."""
MIN_ATTEMPT_CHARS = 200
"""Transcripts are halved to fit a prompt budget, down to this many characters."""


class RehearsalExecuted(RuntimeError):
    """Rehearsal made a real call: an invariant of private rehearsal broke (a bug, never a
    recoverable episode error; callers must let it through)."""



# ---------------------------------------------------------------------------------------------
# Imagined attempts through the rollout engine
# ---------------------------------------------------------------------------------------------

@dataclass
class Attempt:
    """One imagined attempt τ̃^(n) with its feedback.

    Attributes:
        index: n, 1-based.
        trajectory: the rehearse-mode rollout (``real_calls`` is 0).
        steps: per ACT output, ``(text, [imagined observation contents])``.
        feedback: f^(n) (None until written).
        feedback_tokens: tokens of the FEEDBACK output.
    """

    index: int
    trajectory: Trajectory
    steps: list[tuple[str, list[str]]]
    feedback: Feedback | None = None
    feedback_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Tokens generated for this attempt: its ACT and REHEARSE outputs and its FEEDBACK."""
        return sum(len(o.ids) for o in self.trajectory.outputs) + self.feedback_tokens

    def transcript(self, max_chars: int) -> str:
        """``prompts.render_attempt`` of this attempt."""
        return prompts.render_attempt(self.steps, self.trajectory.stop_reason, max_chars)


class EpisodeView(Protocol):
    """What rehearsal reads of a committed episode (``episode.Episode`` has it); never written.

    Attributes:
        suite, task_id: the task.
        env: the real adapter (only ``tool_schemas()`` and ``real_calls`` are read).
        messages: the episode's initial messages (system first).
        history: the real history so far (ACT replies, tool responses, user turns, memories).
        user_turns: user turns seen so far (the current one included).
    """

    suite: str
    task_id: str
    env: Any
    messages: list[dict[str, Any]]
    history: list[dict[str, Any]]
    user_turns: int


@dataclass
class TurnRehearsal:
    """The rehearsal of one user turn of one episode.

    Attributes:
        user_turn: the committed run's user turn (0-based).
        mode: ``parallel`` or ``sequential``.
        attempts: the N attempts, in order.
        memory: m_x.
        memory_output_tokens: tokens of the MEMORY output (tags included).
        real_calls: real executions during this rehearsal (always 0; checked).
        seconds: this episode's share of the batched rehearsal's wall time.
    """

    user_turn: int
    mode: str
    attempts: list[Attempt] = field(default_factory=list)
    memory: Memory | None = None
    memory_output_tokens: int = 0
    real_calls: int = 0
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """Every token generated for this rehearsal (attempts, feedback, memory)."""
        return sum(a.tokens for a in self.attempts) + self.memory_output_tokens

    @property
    def rehearse_outputs(self) -> int:
        """REHEARSE outputs over all attempts."""
        return sum(o.role == "rehearse" for a in self.attempts for o in a.trajectory.outputs)

    @property
    def feedback_parse_errors(self) -> int:
        """Attempts whose FEEDBACK had no tags (``Feedback.ok`` False)."""
        return sum(a.feedback is not None and not a.feedback.ok for a in self.attempts)


def imagined_task(ep: EpisodeView, rendering: str, context: dict[str, str] | None = None) -> Task:
    """The committed state of ``ep`` as a one-user-turn ``Task`` for ``rollout``.

    Messages: the episode's initial messages, the real history so far (earlier memory messages
    included) and, in sequential mode, ``context``. No checklist, no grounding, no gold.
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in ep.messages + ep.history]
    if context is not None:
        messages.append(dict(context))
    last_user = [m for m in ep.messages + ep.history if m["role"] == "user"][-1:]
    return Task(id=f"{ep.task_id}#rehearsal", suite=ep.suite, split="test", messages=messages,
                tools=ep.env.tool_schemas(), user_turns=[last_user], checklist=[[]],
                grounding=[[]], gold_calls=[[]], rendering=rendering)


def rehearsal_config(cfg: Config) -> Config:
    """A copy of ``cfg`` whose rollout settings are those of imagined attempts."""
    if cfg.rehearsal.decoding not in DECODING:
        raise ValueError(f"rehearsal.decoding={cfg.rehearsal.decoding!r}: use {sorted(DECODING)}")
    c = copy.deepcopy(cfg)
    c.rollout.grounding_drop_p = 1.0  # REHEARSE reads <unavailable> (docs/design.md, "Grounding")
    c.rollout.temperature, c.rollout.top_p = DECODING[cfg.rehearsal.decoding]
    c.rollout.max_turns = max(1, min(cfg.rehearsal.max_turns, cfg.eval.max_turns))
    c.rollout.user_replay = "always"
    return c


def _attempt(index: int, t: Trajectory) -> Attempt:
    steps = [(o.text, []) for o in t.outputs if o.role == "act"]
    for st in t.steps:
        steps[st.turn][1].append(st.observation.content)
    return Attempt(index, t, steps)


def _fit(build: Any, tokenizer: Any, budget: int, chars: int, n_history: int) -> list[int]:
    """Token ids of ``build(chars, omit)``, halving ``chars`` then omitting history to fit.

    Trimming order: the attempt transcripts (halved down to ``MIN_ATTEMPT_CHARS``), then the
    oldest history messages after the first one. A prompt that still does not fit is returned as
    it is (generated anyway, as ``rollout`` does with REHEARSE prompts)."""
    omit = 0
    while True:
        ids = chat_ids(tokenizer, build(chars, omit))
        if len(ids) <= budget:
            return ids
        if chars > MIN_ATTEMPT_CHARS:
            chars = max(MIN_ATTEMPT_CHARS, chars // 2)
        elif omit < n_history - 2:
            omit = min(n_history - 2, max(1, 2 * omit))
        else:
            log.debug("rehearsal prompt of %d tokens stays over %d; generated anyway",
                      len(ids), budget)
            return ids


def _plain(ep: EpisodeView) -> list[dict[str, str]]:
    """The real conversation so far without the system prompt (as REHEARSE reads it)."""
    return [{"role": m["role"], "content": m["content"]}
            for m in ep.messages + ep.history if m["role"] != "system"]


def _write_feedback(items: list[tuple[EpisodeView, Attempt]], gen: Generator, tokenizer: Any,
                    cfg: Config, sampling: tuple[float, float]) -> None:
    """One FEEDBACK generate call for every attempt in ``items``."""
    if not items:
        return
    rc, budget = cfg.rehearsal, cfg.rollout.max_prompt_tokens
    prompt_ids = []
    for ep, a in items:
        history = _plain(ep)
        for tools in (ep.env.tool_schemas(), []):  # the tool list goes last, when nothing else fits
            ids = _fit(
                lambda chars, omit, a=a, history=history, tools=tools: prompts.feedback_messages(
                    tools, cfg.rollout.rendering, history, a.transcript(chars), a.index,
                    rc.feedback_system, omit),
                tokenizer, budget, rc.attempt_chars, len(history))
            if len(ids) <= budget:
                break
        prompt_ids.append(ids)
    outs = gen.generate(prompt_ids, role="feedback", max_new_tokens=rc.max_new_tokens_feedback,
                        temperature=sampling[0], top_p=sampling[1])
    for (ep, a), out in zip(items, outs):
        a.feedback, a.feedback_tokens = parse_feedback(out.text), len(out.ids)


def _blocks(attempts: list[Attempt], chars: int) -> list[tuple[str, str]]:
    return [(a.transcript(chars), a.feedback.text if a.feedback else prompts.NO_FEEDBACK)
            for a in attempts]


def rehearse_turns(episodes: list[EpisodeView], gen: Generator, tokenizer: Any, cfg: Config,
                   mode: str, n: int) -> list[TurnRehearsal]:
    """Rehearse the current user turn of every episode, batched across episodes.

    Reads the episodes and changes nothing in them: the caller applies each record
    (``turn_records.apply_rehearsal`` inserts m_x, unless empty, where
    ``rehearsal.memory_placement`` says, and adds the counters).

    Args:
        episodes: live episodes that just received a new user message.
        gen, tokenizer: the rehearsing policy (it may differ from the acting one).
        cfg: the run config (``cfg.rehearsal``, ``cfg.rollout`` budgets, ``cfg.eval.max_turns``).
        mode: ``parallel`` or ``sequential``.
        n: N, attempts per user turn (>= 1).

    Returns:
        One ``TurnRehearsal`` per episode, in order.

    Raises:
        RuntimeError: an env's ``real_calls`` changed during rehearsal (a bug: never expected).
    """
    if mode not in REHEARSING_MODES:
        raise ValueError(f"rehearsal mode {mode!r}: use one of {REHEARSING_MODES}")
    if n < 1:
        raise ValueError(f"n={n}: rehearsal needs at least one attempt")
    started, before = time.perf_counter(), [ep.env.real_calls for ep in episodes]
    rcfg = rehearsal_config(cfg)
    sampling = (rcfg.rollout.temperature, rcfg.rollout.top_p)
    recs = [TurnRehearsal(ep.user_turns - 1, mode) for ep in episodes]
    rendering = cfg.rollout.rendering
    if mode == "parallel":  # private rehearsal (§2.3): N imagined attempts, no real call
        # REHEARSE: ô_t, inside N imagined rollouts; h_{t+1} = h_t ⊕ (a_t, ô_t)
        trajs = rollout([imagined_task(ep, rendering) for ep in episodes], gen, tokenizer, rcfg,
                        k=n, mode="rehearse")
        for i, rec in enumerate(recs):
            rec.attempts = [_attempt(j + 1, trajs[i * n + j]) for j in range(n)]
        _write_feedback([(ep, a) for ep, rec in zip(episodes, recs) for a in rec.attempts],
                        gen, tokenizer, cfg, sampling)  # FEEDBACK f
    else:
        for j in range(n):
            tasks = []
            for ep, rec in zip(episodes, recs):
                if not rec.attempts:
                    tasks.append(imagined_task(ep, rendering))
                    continue
                chars = _fit_context_chars(ep, rec.attempts, tokenizer, cfg)
                tasks.append(imagined_task(
                    ep, rendering, prompts.sequential_context_message(_blocks(rec.attempts, chars))))
            # REHEARSE: ô_t, attempt j+1 sees attempts 1..j; h_{t+1} = h_t ⊕ (a_t, ô_t)
            trajs = rollout(tasks, gen, tokenizer, rcfg, k=1, mode="rehearse")
            for rec, t in zip(recs, trajs):
                rec.attempts.append(_attempt(j + 1, t))
            _write_feedback([(ep, rec.attempts[-1]) for ep, rec in zip(episodes, recs)],
                            gen, tokenizer, cfg, sampling)  # FEEDBACK f
    _write_memories(episodes, recs, gen, tokenizer, cfg, sampling)  # the memory m_x
    seconds = time.perf_counter() - started
    for ep, rec, b in zip(episodes, recs, before):
        rec.real_calls = (ep.env.real_calls - b) + sum(a.trajectory.real_calls
                                                       for a in rec.attempts)
        if rec.real_calls:
            raise RehearsalExecuted(f"{ep.task_id}: rehearsal made {rec.real_calls} real call(s); "
                               "rehearsal must never execute (this is a bug)")
        rec.seconds = seconds / len(episodes)
    return recs


def _fit_context_chars(ep: EpisodeView, attempts: list[Attempt], tokenizer: Any,
                       cfg: Config) -> int:
    """The transcript cap at which attempt n's ACT prompt (with the context) fits the budget."""
    chars, budget = cfg.rehearsal.attempt_chars, cfg.rollout.max_prompt_tokens
    while True:
        task = imagined_task(ep, cfg.rollout.rendering,
                             prompts.sequential_context_message(_blocks(attempts, chars)))
        ids = chat_ids(tokenizer, act_messages(
            task.messages, task.tools, cfg.rollout.rendering, cfg.rollout.compact_policy_chars))
        if len(ids) <= budget or chars <= MIN_ATTEMPT_CHARS:
            return chars
        chars = max(MIN_ATTEMPT_CHARS, chars // 2)


MemoryWriter = Callable[[list[EpisodeView], list[TurnRehearsal], Generator, Any, Config,
                         tuple[float, float]], None]
"""``write(episodes, recs, gen, tokenizer, cfg, sampling)``: sets ``rec.memory`` (m_x) and
``rec.memory_output_tokens`` of every record, one per episode, after its attempts and feedback
(``sampling``: the rehearsal's temperature and top-p)."""

MemoryChoice = Callable[[Config], bool]
"""``chosen(cfg) -> bool``: whether a run config asks for a registered memory writer (the plugin
that registers the writer reads its own setting)."""

PAPER_MEMORY_SOURCE = "policy"
"""The memory source of the paper (§2.3): the policy writes m_x from the MEMORY prompt."""

_MEMORY_WRITERS: dict[str, MemoryWriter] = {}
_MEMORY_CHOICES: dict[str, MemoryChoice] = {}


def register_memory_writer(name: str, write: MemoryWriter,
                           chosen: MemoryChoice | None = None) -> None:
    """Serve the memory source ``name`` with ``write`` (``policy``, the paper's, is registered
    here; a plugin registers its own on import, ``plugins.py``). ``chosen(cfg)`` says whether a
    run config asks for it instead of the paper's (``chosen_memory_writer``); without it the
    writer is served by name only (``memory_writer``)."""
    _MEMORY_WRITERS[name] = write
    if chosen is not None:
        _MEMORY_CHOICES[name] = chosen


def memory_writer(name: str) -> MemoryWriter:
    """The writer registered for the memory source ``name``, loading the plugins first when it
    is not registered yet.

    Raises:
        KeyError: a name that neither this module nor a plugin registers.
    """
    if name not in _MEMORY_WRITERS:
        from envace_lite.plugins import load_plugins

        load_plugins()
    if name not in _MEMORY_WRITERS:
        raise KeyError(f"unknown memory source {name!r}: choose one of {sorted(_MEMORY_WRITERS)}")
    return _MEMORY_WRITERS[name]


def chosen_memory_writer(cfg: Config) -> tuple[str, MemoryWriter]:
    """``(name, writer)`` of the memory source ``cfg`` asks for: the first registered writer
    whose ``chosen(cfg)`` holds, else the paper's ``policy``. A plugin whose config group ``cfg``
    sets is loaded first (``plugins.load_plugins_for``)."""
    from envace_lite.plugins import load_plugins_for

    load_plugins_for(cfg)
    name = next((n for n, chosen in _MEMORY_CHOICES.items() if chosen(cfg)),
                PAPER_MEMORY_SOURCE)
    return name, _MEMORY_WRITERS[name]


def _write_memories(episodes: list[EpisodeView], recs: list[TurnRehearsal], gen: Generator,
                    tokenizer: Any, cfg: Config, sampling: tuple[float, float]) -> None:
    """Sets ``rec.memory`` with the memory writer ``cfg`` asks for (``chosen_memory_writer``):
    the paper's ``policy_memories`` unless a plugin's lever chooses another."""
    chosen_memory_writer(cfg)[1](episodes, recs, gen, tokenizer, cfg, sampling)


def policy_memories(episodes: list[EpisodeView], recs: list[TurnRehearsal], gen: Generator,
                    tokenizer: Any, cfg: Config, sampling: tuple[float, float]) -> None:
    """The paper's m_x (§2.3, memory source ``policy``): one MEMORY generate call for every
    episode, parsed and cut to ``rehearsal.memory_max_tokens`` (``parse_memory``)."""
    rc, budget = cfg.rehearsal, cfg.rollout.max_prompt_tokens
    prompt_ids = []
    for ep, rec in zip(episodes, recs):
        history = _plain(ep)
        prompt_ids.append(_fit(
            lambda chars, omit, rec=rec, history=history: prompts.memory_messages(
                history, _blocks(rec.attempts, chars), rc.memory_max_tokens, rc.memory_system,
                omit),
            tokenizer, budget, rc.attempt_chars, len(history)))
    outs = gen.generate(prompt_ids, role="memory",
                        max_new_tokens=rc.memory_max_tokens + MEMORY_TAG_SLACK,
                        temperature=sampling[0], top_p=sampling[1])
    for rec, out in zip(recs, outs):
        rec.memory = parse_memory(out.text, tokenizer, rc.memory_max_tokens)
        rec.memory_output_tokens = len(out.ids)


register_memory_writer(PAPER_MEMORY_SOURCE, policy_memories)


__all__ = [
    "Attempt",
    "EpisodeView",
    "MemoryChoice",
    "MemoryWriter",
    "PAPER_MEMORY_SOURCE",
    "RehearsalExecuted",
    "TurnRehearsal",
    "chosen_memory_writer",
    "imagined_task",
    "memory_writer",
    "policy_memories",
    "register_memory_writer",
    "rehearsal_config",
    "rehearse_turns",
]
