"""World-rehearsal rollouts: the ACT/REHEARSE alternation (paper §2.1; docs/design.md, "Generation
and history").

One policy plays two roles. ACT reads the task, the tool schemas and its token history h_t and
emits a_t: tool calls, a final answer, or a terminal pseudo-tool (telecom's ``done``: never
rehearsed, never counted; it ends the episode). REHEARSE reads its OWN prompt, rebuilt per call
(``rehearse_messages``) and writes ô_t. Then h_{t+1} = h_t ⊕ (a_t, ô_t).

- Modes: ``rehearse`` (EnvACE: ``generator`` writes ô_t); ``real`` (``env.step`` writes o_t; each
  trajectory owns a fresh env on ``Trajectory.env``; ``close_envs`` after scoring);
  ``frozen_simulator`` (``simulator``, the frozen initial policy, runs the same REHEARSE prompt).
- Turn-synchronous batching: all live ACT prompts go to ONE ``generate`` call, then all their
  REHEARSE prompts to ONE more; finished trajectories drop out. The ACT loop is the engine that
  committed execution also runs (``engine.run_turns``); training's rules are its hooks
  (``_TrainingHooks``; docs/design.md, "Committed execution on training's tokens").
- Packing: ``act_ids`` is append-only: each ACT output's sampled ids verbatim (mask 1, plus the
  template's end-of-turn id when it stopped), then glue (mask 0) derived from the tokenizer's own
  chat template (``chat_glue``): the turn's closing, a user message with the ``<tool_response>``
  blocks (or the next user turn), the generation prompt. Model output is never re-tokenized.
  Nothing is appended after the last output.
- User replay: a final answer closes the user turn; ``gated`` appends the next reference user
  message only if the turn's ``required_for_next_turn`` items pass (``rewards.judge_turn``),
  ``always`` always does; ``real`` mode asks ``env.end_turn(text)``.
- Stops (``stop_reason``): ``final_answer`` (of the last user turn), ``terminal_tool``,
  ``turn_limit``, ``context_budget`` (the next ACT prompt would exceed ``max_prompt_tokens``: stop
  before generating), ``parse_error`` (syntactic ACT failure), ``gate_closed``, ``env_done`` (real
  mode: the benchmark ended it, e.g. BFCL's step limit).
- A rehearsed error is an ordinary observation; the episode goes on (a fix of the reference:
  docs/design.md, "The reference code, and where we differ"). A REHEARSE output without a
  proper ``<execution_result>`` gives its raw text (think removed, stripped, capped at
  ``RAW_OBSERVATION_CHARS``) as the observation; the output keeps its ``error_code`` (a
  REHEARSE parse error in ``rollout_stats``) and the episode goes on.
- A REHEARSE prompt still over ``max_prompt_tokens`` after trimming is generated anyway
  (``Output.prompt_fits`` False): only what may never be cut is left (docs/design.md,
  "Generation and history").
- An exception in one trajectory's own work (parsing or recording its ACT output, building its
  REHEARSE prompt, its env step, its glue) ends THAT trajectory with ``stop_reason="error"``
  and ``Trajectory.error``, logged; the other trajectories of the batch go on, and the step
  with them (``docs/design.md``, "Reliability").

Usage::

    from envace_lite.core.rollout import rollout
    trajs = rollout(tasks, HFGenerator(model, tok), tok, cfg, k=cfg.grpo.num_generations)
    t = trajs[0]
    completion, loss_mask = t.act_ids[t.act_prompt_len:], t.act_mask[t.act_prompt_len:]
"""
from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from envace_lite import protocol
from envace_lite.protocol.prompts import act_messages
from envace_lite.protocol.rehearse_prompt import rehearse_messages
from envace_lite.protocol.tags import strip_think
from envace_lite.config import Config
from envace_lite.core.engine import (
    ActHooks,
    ActState,
    ChatGlue,
    any_rank,
    chat_glue,
    ids_with_stop,
    run_turns,
)
from envace_lite.envs import make_env
from envace_lite.envs.base import Env
from envace_lite.llm.generation import Completion, Generator, chat_ids, token_counter
from envace_lite.progress import get_logger
from envace_lite.protocol import ErrorCode
from envace_lite.core.rewards import judge_turn
from envace_lite.types import (
    ROLES,
    ROLLOUT_MODES,
    Observation,
    Output,
    Step,
    Task,
    ToolCall,
    Trajectory,
)

log = get_logger(__name__)

RAW_OBSERVATION_CHARS = 2000
"""Cap of the raw text that becomes the observation when a REHEARSE output has no proper tags."""
TERMINAL_TOOLS = {"tau2-telecom": frozenset({"done"})}
"""Terminal pseudo-tools per suite, when no env is at hand (``Env.terminal_tools`` otherwise)."""


@dataclass
class _LiveTrajectory(ActState):
    """Per-trajectory state of ``rollout`` besides the record itself (the engine's ``ActState``:
    ``act_ids``, ``turns``, ``stop_reason`` and ``env`` are the trajectory's own)."""

    traj: Trajectory
    messages: list[dict[str, Any]]  # plain conversation, no system prompt (REHEARSE history)
    grounding: list[list[dict[str, Any]]] | None  # per user turn; None: dropped (``<unavailable>``)
    terminal: frozenset[str]
    user_turn: int = 0
    act_stopped: bool = True  # the last output ended on a stop token
    calls: list[ToolCall] = field(default_factory=list)  # this turn's calls to rehearse/execute
    observations: list[Observation] = field(default_factory=list)
    terminal_call: ToolCall | None = None
    pending: list[dict[str, Any]] = field(default_factory=list)  # messages for this turn's glue

    act_ids = property(lambda s: s.traj.act_ids, lambda s, v: setattr(s.traj, "act_ids", v))
    turns = property(lambda s: s.traj.turns, lambda s, v: setattr(s.traj, "turns", v))
    stop_reason = property(lambda s: s.traj.stop_reason,
                           lambda s, v: setattr(s.traj, "stop_reason", v))
    env = property(lambda s: s.traj.env)


def _grounding(s: _LiveTrajectory, rc: Any) -> list[dict[str, Any]] | None:
    """REHEARSE's grounding for this call: every user turn's gold pairs (``grounding_scope=
    "task"``) or those of the current and earlier user turns (``"seen"``)."""
    if s.grounding is None:
        return None
    turns = s.grounding if rc.grounding_scope == "task" else s.grounding[:s.user_turn + 1]
    return [g for turn in turns for g in turn]


def rehearsal_observation(text: str) -> tuple[Observation, protocol.RehearsalParse]:
    """A REHEARSE output as an observation: the parsed block, else the raw text (capped)."""
    parsed = protocol.parse_rehearsal(text)
    if parsed.ok:
        return Observation(parsed.content, error=parsed.is_error), parsed
    raw = strip_think(text or "")[0].strip()[:RAW_OBSERVATION_CHARS]
    return Observation(raw, error=protocol.is_error_content(raw)), parsed


def _end_trajectory(s: _LiveTrajectory, where: str, exc: BaseException) -> None:
    """End one trajectory on an exception in its own work, keeping what it has."""
    t = s.traj
    t.stop_reason, t.error = "error", f"{where}: {type(exc).__name__}: {exc}"[:500]
    if t.env is not None:  # an env step that raised part-way may have executed some calls
        t.real_calls = getattr(t.env, "real_calls", t.real_calls)
    s.calls, s.observations, s.terminal_call = [], [], None
    log.warning("%s #%d turn %d: trajectory ended by an error (%s)", t.task.id, t.index,
                t.turns, t.error)


def _guarded(s: _LiveTrajectory, where: str, fn: Callable[..., Any], *args: Any) -> None:
    if s.traj.stop_reason == "error":
        return
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 (one trajectory's failure never ends the batch)
        _end_trajectory(s, where, exc)


def rollout(tasks: list[Task], generator: Generator, tokenizer: Any, cfg: Config, *, k: int,
            mode: str = "rehearse", simulator: Generator | None = None,
            env_factory: Callable[[Task], Env] | None = None, seed: int = 0) -> list[Trajectory]:
    """Roll out ``k`` trajectories per task, turn-synchronously (see the module docstring).

    Args:
        tasks: the tasks x.
        generator: the policy; plays ACT, and REHEARSE in ``rehearse`` mode.
        tokenizer: the policy's tokenizer (chat template, glue, REHEARSE token counts).
        cfg: a ``Config``; reads ``cfg.rollout`` (rendering, budgets, sampling, replay, drop p).
        k: rollouts per task.
        mode: ``rehearse`` | ``real`` | ``frozen_simulator``.
        simulator: ``frozen_simulator`` mode: the generator that writes the observations.
        env_factory: ``task -> Env``; ``real`` mode defaults to ``make_env(task.suite, task.id)``.
            In ``rehearse`` mode a given env is reset and kept, but never stepped.
        seed: seeds the per-trajectory grounding drop (``random.Random(seed)``).

    Returns:
        ``len(tasks) * k`` trajectories, task-major (task 0 rollouts 0..k-1, then task 1 ...).
    """
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"mode={mode!r}: use one of {ROLLOUT_MODES}")
    if mode == "frozen_simulator" and simulator is None:
        raise ValueError("mode='frozen_simulator' needs simulator= (the frozen initial policy)")
    if mode == "real" and env_factory is None:
        env_factory = lambda task: make_env(task.suite, task.id)
    rc, rng, started = cfg.rollout, random.Random(seed), time.time()
    lives: list[_LiveTrajectory] = []
    for task in tasks:
        try:
            prompt, failed = chat_ids(tokenizer, act_messages(
                task.messages, task.tools, rc.rendering, rc.compact_policy_chars, [])), ""
        except Exception as exc:  # noqa: BLE001 (this task's trajectories end; the rest run)
            prompt, failed = [], f"act prompt: {type(exc).__name__}: {exc}"[:500]
            log.warning("%s: its ACT prompt failed, %d trajectories end (%s)", task.id, k, failed)
        plain = [{"role": m["role"], "content": m["content"]}
                 for m in task.messages if m["role"] != "system"]
        for i in range(k):
            gold = rng.random() >= rc.grounding_drop_p and mode != "real"
            env = env_factory(task) if env_factory is not None else None
            if env is not None:
                env.reset()
            t = Trajectory(task, i, act_ids=list(prompt), act_mask=[0] * len(prompt),
                           act_prompt_len=len(prompt), final_texts=[""], mode=mode,
                           grounding="gold" if gold else "none", env=env)
            if failed:
                t.stop_reason, t.error = "error", failed
            elif len(prompt) > rc.max_prompt_tokens:
                t.stop_reason = "context_budget"
            terminal = env.terminal_tools if env is not None else TERMINAL_TOOLS.get(
                task.suite, frozenset())
            lives.append(_LiveTrajectory(t, list(plain), task.grounding if gold else None,
                               frozenset(terminal)))

    run_turns(lives, generator, tokenizer, _TrainingHooks(cfg, mode, generator, simulator, tokenizer),
              max_new_tokens=rc.max_new_tokens_act, temperature=rc.temperature, top_p=rc.top_p,
              max_prompt_tokens=rc.max_prompt_tokens, max_turns=rc.max_turns)
    stats = rollout_stats([s.traj for s in lives])
    log.info("rollout %s: %d trajectories in %.1f s; stops %s; parse errors act %d/%d, rehearse "
             "%d/%d", mode, len(lives), time.time() - started,
             {k: v for k, v in stats.items() if k.startswith("stop/")},
             stats["act/parse_errors"], stats["act/outputs"], stats["rehearse/parse_errors"],
             stats["rehearse/outputs"])
    return [s.traj for s in lives]


class _TrainingHooks(ActHooks):
    """The engine's rules in training (``engine.ActHooks``): the task's tools; calls get
    ``call_<turn>_<k>`` ids and the first terminal call ends the reply; a parse error stops the
    trajectory; user turns are replayed (``_close_user_turn``); real mode steps the env, the other
    modes rehearse every call of the turn in one batch (``_rehearse``)."""

    stages: ClassVar[dict[str, str]] = {
        "prompt": "glue", "output": "act output", "step": "env step",
        "observations": "observations"}

    def __init__(self, cfg: Config, mode: str, generator: Generator, simulator: Generator | None,
                 tokenizer: Any) -> None:
        self.cfg, self.mode, self.tokenizer = cfg, mode, tokenizer
        self.sync = cfg.rollout.sync_generate_calls  # finished ranks keep turning (any_rank)
        self.rehearser = simulator if mode == "frozen_simulator" else generator

    def keep_turning(self, acting: bool) -> bool:
        return any_rank(acting) if self.sync else acting

    def pending(self, s: _LiveTrajectory) -> list[dict[str, Any]]:
        return s.pending

    def join(self, s: _LiveTrajectory, messages: list[dict[str, Any]]) -> None:
        s.pending.extend(messages)
        s.messages.extend(messages)

    def tools(self, s: _LiveTrajectory) -> list[dict[str, Any]]:
        return s.traj.task.tools

    def on_output(self, s: _LiveTrajectory, prompt: list[int], out: Completion, ids: list[int],
                  parsed: protocol.ActParse) -> None:
        """Record the output (``Output``), its span and mask: 0 for the glue, 1 for its ids."""
        t = s.traj
        t.outputs.append(Output(
            "act", t.turns, prompt, ids, out.text, logprobs=out.logprobs,
            parse_kind=parsed.kind, error_code=parsed.error_code.value,
            empty=parsed.error_code == ErrorCode.EMPTY, finish_reason=out.finish_reason,
            user_turn=s.user_turn))
        t.act_spans.append((len(prompt), len(prompt) + len(ids)))
        t.act_mask += [0] * (len(prompt) - len(t.act_mask)) + [1] * len(ids)
        s.messages.append({"role": "assistant", "content": out.text})
        s.pending = []

    def parse_error(self, s: _LiveTrajectory, text: str, parsed: protocol.ActParse,
                    turn: int) -> str | None:
        s.traj.stop_reason = "parse_error"
        log.debug("%s #%d turn %d: ACT parse error %s (%s): %r", s.traj.task.id, s.traj.index,
                  turn, parsed.error_code.value, parsed.reason, text[:120])
        return None

    def user_turn(self, s: _LiveTrajectory, text: str) -> list[dict[str, Any]] | None:
        return _close_user_turn(s, text, self.cfg)

    def route_calls(self, s: _LiveTrajectory, calls: list[ToolCall], turn: int) -> None:
        for j, call in enumerate(calls):
            call.call_id = f"call_{turn}_{j}"
            if call.name in s.terminal:
                s.terminal_call = call
                break
            s.calls.append(call)

    def observe(self, acting: list[_LiveTrajectory]) -> None:
        if self.mode == "real":  # act_only_real: the real o_t
            super().observe(acting)
        else:  # REHEARSE: ô_t, from the policy (or the frozen initial one: act_only)
            frozen = self.mode == "frozen_simulator"
            _rehearse(acting, self.rehearser, self.tokenizer, self.cfg,
                      "frozen_simulator" if frozen else "rehearsed", always_call=self.sync)

    def execute(self, s: _LiveTrajectory) -> None:
        """Real mode: ``env.step`` the calls (and the terminal call, which it never counts)."""
        t = s.traj
        batch = s.calls + ([s.terminal_call] if s.terminal_call is not None else [])
        s.observations = list(t.env.step(batch))[:len(s.calls)]
        t.real_calls = t.env.real_calls
        for call, obs in zip(s.calls, s.observations):
            t.steps.append(Step(t.turns - 1, s.user_turn, call, obs, "real"))

    def step_stop(self, s: _LiveTrajectory) -> str:
        if s.terminal_call is not None:
            return "terminal_tool"
        if s.traj.env is not None and s.traj.env.done and self.mode == "real":
            return "env_done"
        return ""

    def fail(self, s: _LiveTrajectory, where: str, exc: BaseException) -> None:
        _end_trajectory(s, where, exc)


def _close_user_turn(s: _LiveTrajectory, text: str, cfg: Any) -> list[dict[str, Any]] | None:
    """A final answer: the next user turn's messages (real: ``env.end_turn``; else the reference
    turn, gated or always), or None when the trajectory ends (``gate_closed`` set here)."""
    t, u = s.traj, s.user_turn
    t.final_texts[u] = text
    if t.mode == "real":
        nxt = t.env.end_turn(text)
        if nxt is None:
            return None
    else:
        if u + 1 >= len(t.task.user_turns):
            return None
        if cfg.rollout.user_replay == "gated":
            items = t.task.checklist[u] if u < len(t.task.checklist) else []
            verdicts = judge_turn(items, [st for st in t.steps if st.user_turn == u], text, True)
            if not all(v for it, v in zip(items, verdicts) if it.required_for_next_turn):
                t.stop_reason = "gate_closed"
                return None
        nxt = t.task.user_turns[u + 1]
    s.user_turn += 1
    t.user_turns_reached += 1
    t.final_texts.append("")
    return [{"role": "user", "content": str(m.get("content") or "")} for m in nxt]


def _rehearse(acting: list[_LiveTrajectory], gen: Generator, tokenizer: Any, cfg: Any,
              source: str, always_call: bool = False) -> None:
    """One REHEARSE generate call for every call of every acting trajectory, in order.

    With ``always_call`` the call is made even with nothing to rehearse (an empty batch), so
    that every rank makes the same calls (``rollout.sync_generate_calls``)."""
    rc = cfg.rollout
    jobs = [(s, j, c) for s in acting for j, c in enumerate(s.calls)]
    if not jobs:
        if always_call:
            gen.generate([], role="rehearse", max_new_tokens=rc.max_new_tokens_rehearse,
                         temperature=rc.temperature, top_p=rc.top_p)
        return

    count = token_counter(tokenizer)
    built = []
    for s, j, call in jobs:
        if s.traj.stop_reason == "error":  # an earlier call of this trajectory failed
            continue
        try:
            rp = rehearse_messages(s.traj.task.tools, _grounding(s, rc), s.messages,
                                   call, count, rc.max_prompt_tokens, rc.rendering)
            built.append(((s, j, call), chat_ids(tokenizer, rp.messages), rp.fits))
        except Exception as exc:  # noqa: BLE001 (this trajectory ends; the batch goes on)
            _end_trajectory(s, f"rehearse prompt of call {j}", exc)
    built = [b for b in built if b[0][0].traj.stop_reason != "error"]
    kept, prompts, fits = [b[0] for b in built], [b[1] for b in built], [b[2] for b in built]
    # REHEARSE: ô_t ~ π(· | h_t, a_t), one batched call for every call of the turn
    outs = gen.generate(prompts, role="rehearse", max_new_tokens=rc.max_new_tokens_rehearse,
                        temperature=rc.temperature, top_p=rc.top_p) \
        if prompts or always_call else []
    glue = chat_glue(tokenizer)
    for (s, j, call), prompt, fit, out in zip(kept, prompts, fits, outs):
        _guarded(s, f"rehearse output of call {j}", _record_rehearsal, s, j, call, prompt, fit,
                 out, glue, source)


def _record_rehearsal(s: _LiveTrajectory, j: int, call: Any, prompt: list[int], fit: bool,
                      out: Completion, glue: ChatGlue, source: str) -> None:
    """Record one REHEARSE output as an ``Output`` and its observation as a ``Step``."""
    t = s.traj
    obs, parsed = rehearsal_observation(out.text)
    t.outputs.append(Output(
        "rehearse", t.turns - 1, prompt, ids_with_stop(out, glue), out.text, call_index=j,
        logprobs=out.logprobs, parse_kind="ok" if parsed.ok else "error",
        error_code=parsed.error_code.value, empty=parsed.error_code == ErrorCode.EMPTY,
        finish_reason=out.finish_reason, user_turn=s.user_turn,
        source="frozen_simulator" if source == "frozen_simulator" else "policy",
        prompt_fits=fit))
    if not parsed.ok:
        log.debug("%s #%d turn %d call %d: REHEARSE parse error %s; raw text used: %r",
                  t.task.id, t.index, t.turns - 1, j, parsed.error_code.value, out.text[:120])
    if not fit:
        log.debug("%s #%d: REHEARSE prompt over budget after trimming; generated anyway",
                  t.task.id, t.index)
    s.observations.append(obs)
    t.steps.append(Step(t.turns - 1, s.user_turn, call, obs, source))


# ---------------------------------------------------------------------------------------------
# Bookkeeping
# ---------------------------------------------------------------------------------------------

def rollout_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """Role-tagged counts and rates for ``metrics.jsonl`` (policy outputs only).

    Keys: ``{act,rehearse}/{outputs,tokens,parse_errors,parse_error_rate,empty}``,
    ``rehearse/over_budget``, ``act/calls``, ``act/violation_rate``, ``rollout/turns_mean``,
    ``rollout/real_calls``, ``stop/<reason>`` (counts).
    """
    out: dict[str, float] = {}
    for role in ROLES:
        outs = [o for t in trajs for o in t.outputs if o.role == role and o.source == "policy"]
        errors = sum(o.parse_kind == "error" for o in outs)
        out.update({f"{role}/outputs": len(outs), f"{role}/tokens": sum(len(o.ids) for o in outs),
                    f"{role}/parse_errors": errors, f"{role}/empty": sum(o.empty for o in outs),
                    f"{role}/parse_error_rate": errors / len(outs) if outs else 0.0})
    out["rehearse/over_budget"] = sum(not o.prompt_fits for t in trajs for o in t.outputs)
    calls = [s.call for t in trajs for s in t.steps]
    out["act/calls"] = len(calls)
    out["act/violation_rate"] = sum(bool(c.violations) for c in calls) / max(1, len(calls))
    out["rollout/turns_mean"] = sum(t.turns for t in trajs) / len(trajs) if trajs else 0.0
    out["rollout/real_calls"] = sum(t.real_calls for t in trajs)
    out.update({f"stop/{r}": n for r, n in sorted(Counter(t.stop_reason for t in trajs).items())})
    return out


def close_envs(trajs: list[Trajectory]) -> None:
    """Close and drop the envs kept by ``real``-mode trajectories (after verifiable scoring)."""
    for t in trajs:
        if t.env is not None:
            t.env.close()
            t.env = None


__all__ = [
    "close_envs",
    "rehearsal_observation",
    "rollout",
    "rollout_stats",
]
