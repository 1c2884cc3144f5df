"""Two-role warm-start transcripts from real executions, and SFT with TRL (issue 8; DESIGN §3).

A small model never calls a tool zero-shot (SmolLM2, DESIGN §5), so every GRPO reward is 0. The
warm start plays the part that Qwen3's own tool-calling skill plays in the paper: supervised
fine-tuning on transcripts of the *training* tasks, in exactly the token formats rollouts use.

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
the train split (``split_sft_rl``). ``run_sft`` trains with TRL's ``SFTTrainer`` on pre-tokenized
rows (``input_ids`` + ``completion_mask``, ``completion_only_loss=True``): only role outputs carry
loss. ``warmstart`` is the whole stage: transcripts, held-out first-turn call rates before and
after, SFT, and a checkpoint that ``load_policy``/``train``/``evaluate`` accept via
``model.checkpoint``.

Usage::

    envace-lite warmstart --profile micro        # prints --set model.checkpoint=<run>/checkpoint

    # then RL on the disjoint RL half, from the warm start:
    from envace_lite.config import get_config
    from envace_lite.sft import CHECKPOINT, training_tasks, warmstart
    from envace_lite.train import train
    ws = warmstart(get_config("micro", {"run.seed": 0}))
    cfg = get_config("micro", {"run.seed": 0, "model.checkpoint": str(ws / CHECKPOINT)})
    train(cfg, tasks=training_tasks(cfg, "rl"))
"""
from __future__ import annotations

import copy
import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace_lite import protocol
from envace_lite.config import Config, get_config
from envace_lite.generation import chat_ids
from envace_lite.progress import get_logger
from envace_lite.types import Observation, Task, ToolCall

log = get_logger(__name__)

CHECKPOINT = "checkpoint"
"""Run-dir subfolder of the warm-start policy (a full model + tokenizer; pass it as
``model.checkpoint``)."""
TERMINAL_CALLS = {"tau2-telecom": "done"}
"""Suites whose gold ends with a terminal pseudo-tool instead of a closing text."""


# ---------------------------------------------------------------------------------------------
# Which tasks: train split only, SFT and RL halves disjoint
# ---------------------------------------------------------------------------------------------
def scenario_key(task: Task) -> str:
    """The key the SFT/RL split hashes: BFCL's entry index (shared by its four categories, which
    are the same 200 scenarios by index, DESIGN §7), else ``suite:id``."""
    if task.suite.startswith("bfcl-"):
        return "bfcl:" + task.id.rsplit("_", 1)[-1]
    return f"{task.suite}:{task.id}"


def sft_fraction(task: Task) -> float:
    """A stable number in [0, 1) per scenario: ``sha1(scenario_key) / 2**32``."""
    return int(hashlib.sha1(scenario_key(task).encode()).hexdigest()[:8], 16) / 2**32


def split_sft_rl(tasks: list[Task], sft_share: float) -> tuple[list[Task], list[Task]]:
    """Split train tasks into disjoint SFT and RL sets.

    Rule: a task goes to SFT iff ``sft_fraction(task) < sft_share``. The rule reads only the
    scenario id, so it does not depend on the order or number of tasks loaded, and one BFCL
    scenario never lands on both sides through two categories.

    Raises:
        ValueError: a task is not from the train split.
    """
    require_train(tasks)
    sft = [t for t in tasks if sft_fraction(t) < sft_share]
    rl = [t for t in tasks if sft_fraction(t) >= sft_share]
    return sft, rl


def require_train(tasks: list[Task]) -> None:
    """Raise ``ValueError`` unless every task is from the train split (evaluation uses test)."""
    bad = [f"{t.suite}/{t.id}:{t.split}" for t in tasks if t.split != "train"]
    if bad:
        raise ValueError(f"warm-start transcripts take train-split tasks only; got {bad[:5]}")


def truncate_user_turns(task: Task, n: int) -> Task:
    """A copy of ``task`` that keeps its first ``n`` reference user turns (``n <= 0``: all)."""
    if n <= 0 or len(task.user_turns) <= n:
        return task
    t = copy.copy(task)
    t.user_turns, t.checklist = task.user_turns[:n], task.checklist[:n]
    t.grounding, t.gold_calls = task.grounding[:n], task.gold_calls[:n]
    t.flags = [f for f in task.flags if not f.startswith("gold_call_error:")
               or int(f.split(":")[1]) < n]
    return t


def training_tasks(cfg: Config, purpose: str) -> list[Task]:
    """The warm-start (``sft``) or RL (``rl``) tasks of ``cfg``: the train split of
    ``grpo.suites``, split by ``split_sft_rl(warmstart.sft_share)``, each cut to
    ``warmstart.max_user_turns``. RL on a warm-started policy must use ``training_tasks(cfg,
    "rl")`` (``train(cfg, tasks=...)``) so that no SFT task is trained on twice, unless
    ``warmstart.rl_overlap`` asks RL to take every train task (SFT tasks included)."""
    from envace_lite.data import load_tasks

    if purpose not in ("sft", "rl"):
        raise ValueError(f"purpose={purpose!r}: use 'sft' or 'rl'")
    tasks = [t for s in cfg.grpo.suites for t in load_tasks(s, "train", cfg.rollout.rendering)]
    sft, rl = split_sft_rl(tasks, cfg.warmstart.sft_share)
    if purpose == "rl" and cfg.warmstart.rl_overlap:
        rl = tasks
    return [truncate_user_turns(t, cfg.warmstart.max_user_turns)
            for t in (sft if purpose == "sft" else rl)]


def heldout_tasks(cfg: Config, limit: int) -> list[Task]:
    """Test-split tasks of ``grpo.suites``, round-robin over suites, for first-turn checks."""
    from envace_lite.data import load_tasks

    per = [load_tasks(s, "test", cfg.rollout.rendering) for s in cfg.grpo.suites]
    mixed = [t for group in zip(*per) for t in group] if len(per) > 1 else per[0]
    return mixed[:limit]


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


def _replies(task: Task, user_turn: int) -> list[list[dict[str, Any]]]:
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
    prompt = protocol.act_messages(task.messages, task.tools, rc.rendering,
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
        for reply in _replies(task, u):
            calls = [ToolCall(p["call"]["name"], p["call"]["arguments"]) for p in reply]
            text = protocol.assistant_text(calls)
            outputs.append(text)
            history.append({"role": "assistant", "content": text})
            for call, pair in zip(calls, reply):
                rp = protocol.rehearse_messages(task.tools, flat if gold else None, history, call,
                                                count_tokens, rc.max_prompt_tokens, rc.rendering)
                obs = pair["observation"]
                rehearse.append(RehearseExample(
                    task.id, task.suite, u, rp.messages, protocol.rehearsal_text(obs["content"]),
                    pair["call"], obs, "gold" if gold else "none"))
            msg = protocol.tool_response_message([Observation(**p["observation"]) for p in reply])
            glue.append([msg])
            history.append(msg)
        last = u == len(task.user_turns) - 1
        if last and task.suite in TERMINAL_CALLS:
            outputs.append(protocol.assistant_text([ToolCall(TERMINAL_CALLS[task.suite], {})]))
        else:
            text = closing_text(task, u)
            outputs.append(text)
            history.append({"role": "assistant", "content": text})
    return ActTranscript(task.id, task.suite, prompt, outputs, glue), rehearse


def approx_tokens(text: str) -> int:
    """A tokenizer-free count (chars / 3) for trimming before a tokenizer exists."""
    return len(text) // 3 + 1


def build_transcripts(tasks: list[Task], cfg: Config, tokenizer: Any = None,
                      seed: int | None = None) -> TranscriptSet:
    """Transcripts of ``tasks``, with grounding drawn per task like ``rollout`` draws it.

    Args:
        tasks: train-split tasks (``ValueError`` otherwise).
        cfg: reads ``rollout`` and ``run.seed``.
        tokenizer: counts REHEARSE prompt tokens for trimming; ``approx_tokens`` when None.
        seed: seeds the grounding drop (``random.Random(seed)``, one draw per task, in order);
            ``cfg.run.seed`` when None.
    """
    require_train(tasks)
    rng = random.Random(cfg.run.seed if seed is None else seed)
    if tokenizer is None:
        count = approx_tokens
    else:
        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))
    out = TranscriptSet()
    for task in tasks:
        gold = rng.random() >= cfg.rollout.grounding_drop_p
        act, rehearse = task_transcripts(task, cfg, count, gold)
        out.act.append(act)
        out.rehearse.extend(rehearse)
    out.stats = {
        "tasks": len(tasks),
        "act_outputs": sum(len(a.outputs) for a in out.act),
        "rehearse_examples": len(out.rehearse),
        "rehearse_grounding_gold": sum(r.grounding == "gold" for r in out.rehearse),
        "gold_call_errors": sum(bool(r.observation.get("error")) for r in out.rehearse),
        "flagged_gold_calls": sum(f.startswith("gold_call_error:") for t in tasks for f in t.flags),
        "suites": sorted({t.suite for t in tasks}),
    }
    return out


def encode_act(tr: ActTranscript, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, completion_mask)`` of an ACT transcript, packed exactly as ``rollout`` packs
    a trajectory that always stopped on the end-of-turn token. Shapes: (T,), (T,)."""
    from envace_lite.rollout import chat_glue

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
    from envace_lite.rollout import chat_glue

    eot = chat_glue(tokenizer).eot_id
    prompt = chat_ids(tokenizer, ex.messages)
    target = tokenizer.encode(ex.target, add_special_tokens=False) + ([eot] if eot is not None else [])
    return prompt + target, [0] * len(prompt) + [1] * len(target)


# ---------------------------------------------------------------------------------------------
# Rows under a token budget, and held-out first-turn call rates
# ---------------------------------------------------------------------------------------------
def sft_rows(ts: TranscriptSet, tokenizer: Any, max_length: int, token_budget: int,
             seed: int, act_share: float = 0.5) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tokenized rows under a token budget.

    Subset rule: rows longer than ``max_length`` are skipped and counted (never truncated: a cut
    row would teach outputs without their end). Each role's rows are shuffled with
    ``random.Random(seed)``; ACT rows are taken in that order while their total stays within
    ``act_share * token_budget``, then REHEARSE rows while the grand total stays within
    ``token_budget`` (so ACT's unused share passes to REHEARSE). ``token_budget`` 0 keeps all.

    Returns:
        ``(rows, stats)``; each row ``{"input_ids", "completion_mask", "role"}`` (role 0 = ACT,
        1 = REHEARSE), ACT rows first.
    """
    built = [[dict(zip(("input_ids", "completion_mask"), encode_act(a, tokenizer)), role=0)
              for a in ts.act],
             [dict(zip(("input_ids", "completion_mask"), encode_rehearse(r, tokenizer)), role=1)
              for r in ts.rehearse]]
    rng, kept, total = random.Random(seed), [], 0
    for role, rows in enumerate(built):
        fit = [r for r in rows if len(r["input_ids"]) <= max_length]
        rng.shuffle(fit)
        cap = token_budget * (act_share if role == 0 else 1.0)
        for r in fit:
            if token_budget and total + len(r["input_ids"]) > cap:
                continue
            kept.append(r)
            total += len(r["input_ids"])
    lengths = [[len(r["input_ids"]) for r in rows] for rows in built]
    stats = {
        "rows_built": len(lengths[0]) + len(lengths[1]),
        "rows_too_long": sum(n > max_length for n in lengths[0] + lengths[1]),
        "rows_kept": len(kept), "act_rows": sum(r["role"] == 0 for r in kept),
        "rehearse_rows": sum(r["role"] for r in kept), "tokens": total,
        "loss_tokens": sum(sum(r["completion_mask"]) for r in kept),
        "mean_tokens_act": _mean(lengths[0]), "mean_tokens_rehearse": _mean(lengths[1]),
        "max_length": max_length, "token_budget": token_budget, "act_share": act_share,
    }
    return kept, stats


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def first_turn_call_rates(model: Any, tokenizer: Any, tasks: list[Task], cfg: Config,
                          max_new_tokens: int | None = None) -> dict[str, Any]:
    """Greedy ACT on the first turn of each task; shares of replies that are tool calls.

    Returns:
        ``{"n", "parseable", "tool_exists", "args_valid", "first_tool_right"}`` as shares of
        ``n``: ``parseable``: ``parse_act`` gives ``calls``; ``tool_exists``: and every called
        tool is one of the task's tools; ``args_valid``: and no call has ``violations`` (the JSON
        schema validates); ``first_tool_right``: the first call names the task's first gold tool.
        Plus ``calls`` (parsed calls in all), ``calls_valid`` (their share without violations)
        and ``samples`` (the first three replies).
    """
    from envace_lite.generation import HFGenerator

    rc = cfg.rollout
    prompts = [chat_ids(tokenizer, protocol.act_messages(
        t.messages, t.tools, rc.rendering, rc.compact_policy_chars, [])) for t in tasks]
    outs = HFGenerator(model, tokenizer, seed=cfg.run.seed, batch_size=8).generate(
        prompts, role="act", max_new_tokens=max_new_tokens or rc.max_new_tokens_act,
        temperature=0.0, top_p=1.0)
    counts = {"parseable": 0, "tool_exists": 0, "args_valid": 0, "first_tool_right": 0}
    calls = valid = 0
    for t, out in zip(tasks, outs):
        p = protocol.parse_act(out.text, t.tools)
        if p.kind != "calls":
            continue
        calls, valid = calls + len(p.calls), valid + sum(not c.violations for c in p.calls)
        names = {protocol.function_of(x).get("name") for x in t.tools}
        gold = [c["name"] for turn in t.gold_calls for c in turn]
        counts["parseable"] += 1
        counts["tool_exists"] += all(c.name in names for c in p.calls)
        counts["args_valid"] += all(not c.violations for c in p.calls)
        counts["first_tool_right"] += bool(gold) and p.calls[0].name == gold[0]
    n = max(1, len(tasks))
    return {"n": len(tasks), **{k: v / n for k, v in counts.items()}, "calls": calls,
            "calls_valid": valid / calls if calls else 0.0,
            "samples": [o.text[:300] for o in outs[:3]]}


# ---------------------------------------------------------------------------------------------
# SFT with TRL, and the warm-start stage
# ---------------------------------------------------------------------------------------------
def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, list[int]]], cfg: Config,
            out_dir: Path) -> dict[str, Any]:
    """Train on ``rows`` with ``trl.SFTTrainer`` (loss on ``completion_mask`` tokens only).

    Args:
        model: the policy in train mode (PEFT-wrapped for LoRA, else trained in full).
        tokenizer: its tokenizer (padding id).
        rows: from ``sft_rows``.
        cfg: reads ``warmstart`` (epochs, lr, batch size, max length) and ``run``.
        out_dir: the trainer's scratch folder (no intermediate checkpoints are written).

    Returns:
        ``{"steps", "seconds", "loss_first", "loss_last", "log"}``; ``log`` holds the trainer's
        loss rows.
    """
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    w = cfg.warmstart
    data = Dataset.from_list([{k: r[k] for k in ("input_ids", "completion_mask")} for r in rows])
    cpu = cfg.model.device == "cpu" or not torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=w.epochs, max_steps=w.max_steps or -1,
        per_device_train_batch_size=w.batch_size, learning_rate=w.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=w.warmup_steps, weight_decay=0.0,
        max_length=w.max_length, completion_only_loss=True, packing=False,
        logging_steps=max(1, w.logging_steps), save_strategy="no", report_to="none",
        seed=cfg.run.seed, use_cpu=cpu, bf16=w.bf16 and not cpu, disable_tqdm=not cfg.run.progress,
        dataloader_num_workers=0, train_sampling_strategy="group_by_length",
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    start = time.perf_counter()
    trainer.train()
    losses = [r for r in trainer.state.log_history if "loss" in r]
    return {"steps": trainer.state.global_step, "seconds": time.perf_counter() - start,
            "loss_first": losses[0]["loss"] if losses else None,
            "loss_last": losses[-1]["loss"] if losses else None, "log": losses}


def save_checkpoint(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Save a full model + tokenizer. A LoRA model is merged first, so that RL's own adapter
    stacks on the warm-started weights and "adapter disabled" means the warm-start policy."""
    if hasattr(model, "merge_and_unload"):
        model.save_pretrained(folder.parent / "adapter")  # the small adapter, for inspection
        model = model.merge_and_unload()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def warmstart(config: Config | str, run_dir: str | Path | None = None,
              measure: bool = True) -> Path:
    """The warm-start stage: transcripts → (rates before) → SFT → checkpoint → (rates after).

    Writes ``config.json``, ``summary.json`` (transcript counts, row/token stats, SFT loss,
    held-out first-turn call rates before and after) and ``metrics.jsonl`` (SFT loss rows) into
    ``runs/warmstart/<profile>__s<seed>__<time>/``, and the policy into ``checkpoint/``.

    Args:
        config: a finalized ``Config`` or a profile name.
        run_dir: where to write (a new run dir when None).
        measure: run the held-out first-turn check (``warmstart.eval_first_turns`` tasks).

    Returns:
        The run dir; ``run_dir / "checkpoint"`` is the value for ``model.checkpoint``.
    """
    from envace_lite.models import load_policy
    from envace_lite.paths import new_run_dir

    cfg = get_config(config) if isinstance(config, str) else config
    run_dir = Path(run_dir) if run_dir else new_run_dir("warmstart", cfg.profile, cfg.run.seed,
                                                        cfg.run.runs_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir)
    start, summary = time.perf_counter(), {"profile": cfg.profile, "seed": cfg.run.seed}
    tasks = training_tasks(cfg, "sft")
    if not tasks:
        raise ValueError(f"profile {cfg.profile!r} has no warm-start tasks (warmstart.sft_share="
                         f"{cfg.warmstart.sft_share}): set warmstart.sft_share, e.g. 0.5")
    model, tok = load_policy(cfg, train=True)  # micro: builds/loads the tokenizer from these
    ts = build_transcripts(tasks, cfg, tok)
    w = cfg.warmstart
    rows, row_stats = sft_rows(ts, tok, w.max_length, w.token_budget, cfg.run.seed, w.act_share)
    summary.update(transcripts=ts.stats, rows=row_stats,
                   rl_tasks=len(training_tasks(cfg, "rl")))
    heldout = heldout_tasks(cfg, cfg.warmstart.eval_first_turns) if measure else []
    if heldout:
        summary["first_turn_before"] = first_turn_call_rates(model, tok, heldout, cfg)
    summary["sft"] = run_sft(model, tok, rows, cfg, run_dir / "trainer")
    with (run_dir / "metrics.jsonl").open("w") as f:
        for r in summary["sft"].pop("log"):
            f.write(json.dumps({"sft/" + k: v for k, v in r.items()}) + "\n")
    if heldout:
        summary["first_turn_after"] = first_turn_call_rates(model, tok, heldout, cfg)
    save_checkpoint(model, tok, run_dir / CHECKPOINT)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    log.info("warm start %s: %d rows, %d tokens, loss %s -> %s, %.0f s; checkpoint %s",
             cfg.profile, row_stats["rows_kept"], row_stats["tokens"], summary["sft"]["loss_first"],
             summary["sft"]["loss_last"], summary["seconds"], run_dir / CHECKPOINT)
    return run_dir


__all__ = [
    "CHECKPOINT", "ActTranscript", "RehearseExample", "TranscriptSet", "build_transcripts",
    "closing_text", "encode_act", "encode_rehearse", "first_turn_call_rates", "heldout_tasks",
    "require_train", "run_sft", "save_checkpoint", "sft_rows", "split_sft_rl", "task_transcripts",
    "training_tasks", "truncate_user_turns", "warmstart",
]
