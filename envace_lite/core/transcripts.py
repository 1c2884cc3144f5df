"""Two-role warm-start transcripts from real executions, and the train-split tasks they use.

A small model never calls a tool zero-shot (SmolLM2), so every GRPO reward is 0. The warm start
(``sft.py``) plays the part that Qwen3's own tool-calling skill plays in the paper: supervised
fine-tuning on transcripts of the *training* tasks, in exactly the token formats rollouts use.
This module builds those transcripts; it needs a tokenizer at most, never a model.

Transcripts (``build_transcripts``), per training task:

- **ACT**: one packed row, as ``rollout`` builds it: the prompt ``chat_ids(act_messages(...))``,
  then each ACT output (``assistant_text`` of the gold calls, or the closing answer) followed by
  the template's end-of-turn id (loss 1), then the glue ``chat_glue(tok).after_turn(...)`` with the
  ``<tool_response>`` blocks of the **real** observations from ``task.grounding`` or the next
  scripted user turn (loss 0). Reply grouping follows the adapters' gold (``Env.gold_turns``):
  BFCL puts a user turn's calls in one reply, then says "Done."; tau2 makes one call per reply
  and ends with ``done`` (telecom) or a sentence that carries every ``communicate`` item.
- **REHEARSE**: one row per gold call: the prompt ``chat_ids(rehearse_messages(...).messages)``
  (history = the conversation up to the ACT reply holding the call, as in ``rollout``), and the
  target ``rehearsal_text(real observation)`` + end-of-turn (loss 1). Grounding is drawn per task
  as in ``rollout``: present with probability ``1 - rollout.grounding_drop_p``, else
  ``<unavailable>``.
- Gold calls whose real observation is an error (``Task.flags``) keep that error observation, and
  ``TranscriptSet.stats["gold_call_errors"]`` counts them.

Only train-split tasks are accepted (``ValueError`` otherwise). SFT and RL use disjoint halves of
the train split (``split_sft_rl``; ``training_tasks(cfg, "sft" | "rl")``, both in
``task_split.py``).

Usage::

    from envace_lite.config import get_config
    from envace_lite.core.task_split import training_tasks
    from envace_lite.core.transcripts import build_transcripts
    cfg = get_config("micro")
    ts = build_transcripts(training_tasks(cfg, "sft"), cfg)
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envace_lite.protocol.prompts import act_messages, assistant_text, tool_response_message
from envace_lite.protocol.rehearse_prompt import rehearsal_text, rehearse_messages
from envace_lite.config import Config
from envace_lite.core.task_split import require_train
from envace_lite.llm.generation import chat_ids, token_counter
from envace_lite.progress import get_logger
from envace_lite.types import Observation, Task, ToolCall

log = get_logger(__name__)

TERMINAL_CALLS = {"tau2-telecom": "done"}
"""Suites whose gold ends with a terminal pseudo-tool instead of a closing text."""


# ---------------------------------------------------------------------------------------------
# Transcripts: text level (tokenizer-free), then ids in the rollout's exact packing
# ---------------------------------------------------------------------------------------------
@dataclass
class ActTranscript:
    """The ACT side of one gold trajectory.

    Attributes:
        prompt: ``act_messages(task.messages, task.tools, ...)``: the initial ACT prompt.
        outputs: the ACT output texts, in order (loss on these).
        glue: after each output but the last, the user messages the rollout appends (the
            ``<tool_response>`` message, or the next user turn); ``len(glue) == len(outputs) - 1``.
    """

    task_id: str
    suite: str
    prompt: list[dict[str, str]]
    outputs: list[str]
    glue: list[list[dict[str, str]]]


@dataclass
class RehearseExample:
    """One REHEARSE row: its rebuilt prompt and the real observation as the target.

    Attributes:
        messages: ``rehearse_messages(...).messages`` (system, user).
        target: ``rehearsal_text(observation.content)`` (loss on this).
        call, observation: the gold call and its real observation (``Observation`` dict).
        grounding: ``gold`` or ``none`` (the prompt shows ``<unavailable>``).
    """

    task_id: str
    suite: str
    user_turn: int
    messages: list[dict[str, str]]
    target: str
    call: dict[str, Any]
    observation: dict[str, Any]
    grounding: str


@dataclass
class TranscriptSet:
    """Transcripts of a task list, with counts (``stats``) for the run summary."""

    act: list[ActTranscript] = field(default_factory=list)
    rehearse: list[RehearseExample] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)


def closing_text(task: Task, user_turn: int) -> str:
    """The text that closes a user turn, as the adapters' gold does (``Env.gold_turns``)."""
    if task.suite.startswith("bfcl-"):
        return "Done."
    info = [str(i.expected) for i in task.checklist[user_turn] if i.kind == "communicate"]
    return ("I have taken care of your request. The details you asked for: "
            + "; ".join(info) + ".") if info else "I have taken care of your request."


def gold_replies(task: Task, user_turn: int) -> list[list[dict[str, Any]]]:
    """Gold (call, observation) pairs grouped into ACT replies: BFCL one per turn, tau2 one each."""
    pairs = task.grounding[user_turn]
    if not pairs:
        return []
    return [pairs] if task.suite.startswith("bfcl-") else [[p] for p in pairs]


def task_transcripts(task: Task, cfg: Config, count_tokens: Any,
                     gold: bool) -> tuple[ActTranscript, list[RehearseExample]]:
    """The ACT transcript and REHEARSE examples of one task (see the module docstring).

    Args:
        task: a train-split task.
        cfg: reads ``rollout`` (rendering, policy excerpt, prompt budget).
        count_tokens: text -> token count, for REHEARSE trimming (the policy tokenizer's).
        gold: REHEARSE sees the task's grounding (else ``<unavailable>``).
    """
    rc = cfg.rollout
    prompt = act_messages(task.messages, task.tools, rc.rendering,
                          rc.compact_policy_chars, [])
    history = [{"role": m["role"], "content": m["content"]}
               for m in task.messages if m["role"] != "system"]
    flat = [g for turn in task.grounding for g in turn]
    outputs: list[str] = []
    glue: list[list[dict[str, str]]] = []
    rehearse: list[RehearseExample] = []
    for u in range(len(task.user_turns)):
        if u > 0:  # the rollout replays the next scripted user turn after a closing answer
            msgs = [{"role": "user", "content": str(m.get("content") or "")}
                    for m in task.user_turns[u]]
            glue.append(msgs)
            history += msgs
        for reply in gold_replies(task, u):
            calls = [ToolCall(p["call"]["name"], p["call"]["arguments"]) for p in reply]
            text = assistant_text(calls)
            outputs.append(text)
            history.append({"role": "assistant", "content": text})
            for call, pair in zip(calls, reply):
                rp = rehearse_messages(task.tools, flat if gold else None, history, call,
                                       count_tokens, rc.max_prompt_tokens, rc.rendering)
                obs = pair["observation"]
                rehearse.append(RehearseExample(
                    task.id, task.suite, u, rp.messages, rehearsal_text(obs["content"]),
                    pair["call"], obs, "gold" if gold else "none"))
            msg = tool_response_message([Observation(**p["observation"]) for p in reply])
            glue.append([msg])
            history.append(msg)
        last = u == len(task.user_turns) - 1
        if last and task.suite in TERMINAL_CALLS:
            outputs.append(assistant_text([ToolCall(TERMINAL_CALLS[task.suite], {})]))
        else:
            text = closing_text(task, u)
            outputs.append(text)
            history.append({"role": "assistant", "content": text})
    return ActTranscript(task.id, task.suite, prompt, outputs, glue), rehearse


def memory_transcript(act: ActTranscript, task: Task) -> ActTranscript | None:
    """A copy of ``act`` whose request carries the rule-built rehearsal memory of its own calls
    (``warmstart.memory_share``; beyond the paper).

    The memory is what the drills study's calls memory writes at test time
    (``drills/calls_memory.py``) when the gold's calls of the first user turn are the best
    attempt: ``prompts.CALLS_MEMORY_HEADER``, then the ACT outputs of that turn
    whose gold observations are not errors (terminal calls make no step, so they never appear).
    It is appended to the last user message of the prompt inside ``prompts.memory_message``, as
    ``turn_records.apply_rehearsal(..., "ticket")`` appends it. Unlike the test-time memory it is
    not cut to ``rehearsal.memory_max_tokens`` (a gold turn's calls are short).

    Args:
        act: the task's ACT transcript (``task_transcripts``).
        task: the task (its first user turn's gold replies).

    Returns:
        The new transcript (the same outputs and glue), or None when the first user turn has no
        call whose observation is not an error (nothing to remember).
    """
    from envace_lite.protocol import prompts

    replies = gold_replies(task, 0)
    calls = [act.outputs[k].strip() for k, reply in enumerate(replies)
             if k < len(act.outputs) and not any(p["observation"].get("error") for p in reply)]
    if not calls:
        return None
    memory = prompts.memory_message("\n".join([prompts.CALLS_MEMORY_HEADER, *calls]))["content"]
    prompt = copy.deepcopy(act.prompt)
    last = max(i for i, m in enumerate(prompt) if m["role"] == "user")
    prompt[last]["content"] = f"{prompt[last]['content']}\n\n{memory}"
    return ActTranscript(act.task_id, act.suite, prompt, list(act.outputs),
                         copy.deepcopy(act.glue))


def approx_tokens(text: str) -> int:
    """A tokenizer-free count (chars / 3) for trimming before a tokenizer exists."""
    return len(text) // 3 + 1


ExtraTaskRows = Callable[[Task, Config, Any, bool], list[RehearseExample]]
"""``rows(task, cfg, count_tokens, gold) -> rows``: extra REHEARSE rows of one warm-start task,
made beside its own (``gold``: its grounding draw), by a plugin's lever that reads its own
setting in ``cfg`` ([] when the lever is off)."""

EXTRA_TASK_ROWS: dict[str, ExtraTaskRows] = {}
"""Extra REHEARSE row builders of the warm start's tasks, by name (the name is the count's key
in ``TranscriptSet.stats``), in registration order (a plugin registers them on import)."""


def register_extra_task_rows(name: str, rows: ExtraTaskRows) -> None:
    """Register ``rows``: ``build_transcripts`` calls it on every task and puts what it returns
    after the gold's own REHEARSE rows, counted under ``stats[name]``."""
    EXTRA_TASK_ROWS[name] = rows


def extra_task_rows(cfg: Config) -> dict[str, ExtraTaskRows]:
    """The registered extra row builders, a plugin whose config group ``cfg`` sets loaded first
    (``plugins.load_plugins_for``): none for a config of the paper, unless a plugin was loaded
    for another reason (its builders then return [])."""
    from envace_lite.plugins import load_plugins_for

    load_plugins_for(cfg)
    return dict(EXTRA_TASK_ROWS)


def build_transcripts(tasks: list[Task], cfg: Config, tokenizer: Any = None,
                      seed: int | None = None) -> TranscriptSet:
    """Transcripts of ``tasks``, with grounding drawn per task like ``rollout`` draws it.

    Args:
        tasks: train-split tasks (``ValueError`` otherwise).
        cfg: reads ``rollout``, ``run.seed`` and the options beyond the paper:
            ``warmstart.memory_share`` (memory transcripts, ``memory_transcript``) and whatever
            the registered extra row builders read (``extra_task_rows``; the drills study's
            error rows, ``drills/error_rows.py``, run real calls in a fresh environment).
            ``stats`` counts the gold's rows (``act_outputs`` and ``rehearse_examples`` leave
            the extra rows out) and the extras apart (``memory_transcripts``, and one count per
            registered builder under its name, e.g. ``slip_rows``, ``id_error_rows``).
        tokenizer: counts REHEARSE prompt tokens for trimming; ``approx_tokens`` when None.
        seed: seeds the grounding drop (``random.Random(seed)``, one draw per task, in order);
            ``cfg.run.seed`` when None.
    """
    require_train(tasks)
    rng = random.Random(cfg.run.seed if seed is None else seed)
    count = approx_tokens if tokenizer is None else token_counter(tokenizer)
    out = TranscriptSet()
    w = cfg.warmstart
    memory_rng = random.Random(f"memory:{cfg.run.seed if seed is None else seed}")
    memories, gold_act = 0, []
    builders = extra_task_rows(cfg)
    extras: dict[str, list[RehearseExample]] = {name: [] for name in builders}
    for task in tasks:
        gold = rng.random() >= cfg.rollout.grounding_drop_p
        act, rehearse = task_transcripts(task, cfg, count, gold)
        out.act.append(act)
        gold_act.append(act)
        out.rehearse.extend(rehearse)
        if w.memory_share and memory_rng.random() < w.memory_share:
            extra = memory_transcript(act, task)
            if extra is not None:  # right after its task's own transcript
                out.act.append(extra)
                memories += 1
        for name, rows in builders.items():  # a plugin's levers (beyond the paper)
            extras[name].extend(rows(task, cfg, count, gold))
    out.stats = {
        "tasks": len(tasks),
        "act_outputs": sum(len(a.outputs) for a in gold_act),
        "rehearse_examples": len(out.rehearse),
        "rehearse_grounding_gold": sum(r.grounding == "gold" for r in out.rehearse),
        "gold_call_errors": sum(bool(r.observation.get("error")) for r in out.rehearse),
        "flagged_gold_calls": sum(f.startswith("gold_call_error:") for t in tasks for f in t.flags),
        "suites": sorted({t.suite for t in tasks}),
        "memory_transcripts": memories, **{name: len(rows) for name, rows in extras.items()},
    }
    for rows in extras.values():  # after the counts, which are the gold's own
        out.rehearse.extend(rows)
    return out


def encode_act(tr: ActTranscript, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, completion_mask)`` of an ACT transcript, packed exactly as ``rollout`` packs
    a trajectory that always stopped on the end-of-turn token. Shapes: (T,), (T,)."""
    from envace_lite.core.engine import chat_glue

    g = chat_glue(tokenizer)
    ids = chat_ids(tokenizer, tr.prompt)
    mask = [0] * len(ids)
    for k, text in enumerate(tr.outputs):
        out = tokenizer.encode(text, add_special_tokens=False) + (
            [g.eot_id] if g.eot_id is not None else [])
        ids, mask = ids + out, mask + [1] * len(out)
        if k < len(tr.glue):
            glue = tokenizer.encode(g.after_turn(True, tr.glue[k]), add_special_tokens=False)
            ids, mask = ids + glue, mask + [0] * len(glue)
    return ids, mask


def encode_rehearse(ex: RehearseExample, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, completion_mask)`` of a REHEARSE row: prompt (0), target + eot (1)."""
    from envace_lite.core.engine import chat_glue

    eot = chat_glue(tokenizer).eot_id
    prompt = chat_ids(tokenizer, ex.messages)
    target = tokenizer.encode(ex.target, add_special_tokens=False) + ([eot] if eot is not None else [])
    return prompt + target, [0] * len(prompt) + [1] * len(target)


__all__ = [
    "EXTRA_TASK_ROWS", "TERMINAL_CALLS", "ActTranscript", "ExtraTaskRows", "RehearseExample",
    "TranscriptSet", "approx_tokens", "build_transcripts", "closing_text", "encode_act", "encode_rehearse", "extra_task_rows",
    "gold_replies", "register_extra_task_rows", "task_transcripts",
]
