"""The warm-start stage: SFT with TRL on two-role transcripts of the training tasks.

A small model never calls a tool zero-shot (SmolLM2), so every GRPO reward is 0. The warm start
plays the part that Qwen3's own tool-calling skill plays in the paper: supervised fine-tuning on
transcripts of the *training* tasks (``transcripts.py`` builds them, in exactly the token formats
rollouts use), on the SFT half of the train split; RL trains on the disjoint other half.

``sft_rows`` tokenizes them under a token budget. ``run_sft`` trains with TRL's ``SFTTrainer`` on
pre-tokenized rows (``input_ids`` + ``completion_mask``, ``completion_only_loss=True``): only role
outputs carry loss. ``warmstart`` is the whole stage: transcripts, held-out first-turn call rates
before and after, SFT, and a checkpoint that ``load_policy``/``train``/``evaluate`` accept via
``model.checkpoint``.

Usage::

    envace-lite warmstart --profile micro        # prints --set model.checkpoint=<run>/checkpoint

    # then RL on the disjoint RL half, from the warm start:
    from envace_lite.config import get_config
    from envace_lite.pipelines.resume import CHECKPOINT
    from envace_lite.pipelines.sft import warmstart
    from envace_lite.pipelines.train import train
    from envace_lite.core.task_split import training_tasks
    ws = warmstart(get_config("micro", {"run.seed": 0}))
    cfg = get_config("micro", {"run.seed": 0, "model.checkpoint": str(ws / CHECKPOINT)})
    train(cfg, tasks=training_tasks(cfg, "rl"))
"""
from __future__ import annotations

import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any, Callable

from envace_lite import protocol
from envace_lite.protocol.prompts import act_messages, function_of
from envace_lite.config import Config
from envace_lite.core.rows import padded_at_end_only
from envace_lite.llm.generation import chat_ids
from envace_lite.progress import get_logger, quiet_trainer
from envace_lite.core.transcripts import (
    RehearseExample,
    TranscriptSet,
    build_transcripts,
    encode_act,
    encode_rehearse,
)
from envace_lite.core.task_split import heldout_tasks, training_tasks
from envace_lite.pipelines.resume import CHECKPOINT, check_warmstart_folder
from envace_lite.types import Task

log = get_logger(__name__)


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
        "shortest_row": min(lengths[0] + lengths[1], default=0),
        "rows_kept": len(kept), "act_rows": sum(r["role"] == 0 for r in kept),
        "rehearse_rows": sum(r["role"] for r in kept), "tokens": total,
        "loss_tokens": sum(sum(r["completion_mask"]) for r in kept),
        "mean_tokens_act": _mean(lengths[0]), "mean_tokens_rehearse": _mean(lengths[1]),
        "max_length": max_length, "token_budget": token_budget, "act_share": act_share,
    }
    return kept, stats


def check_rows(stats: dict[str, Any]) -> None:
    """Refuse a warm start with no row to train on, in one line (TRL's ``SFTTrainer`` would stop
    on an empty dataset with a bare ``StopIteration``).

    Args:
        stats: the second value of ``sft_rows``.

    Raises:
        ConfigError: every row is longer than ``warmstart.max_length`` (naming the shortest row's
            length), or the token budget admits none, or there were no transcripts.
    """
    from envace_lite.config import ConfigError

    if stats["rows_kept"]:
        return
    if not stats["rows_built"]:
        raise ConfigError("the warm start built no transcript rows: check warmstart.sft_share "
                          "and grpo.suites")
    if stats["rows_too_long"] == stats["rows_built"]:
        raise ConfigError(f"warmstart.max_length={stats['max_length']}: all "
                          f"{stats['rows_built']} SFT rows are longer (the shortest has "
                          f"{stats['shortest_row']} tokens); set warmstart.max_length >= "
                          f"{stats['shortest_row']} (rows are skipped, never truncated)")
    raise ConfigError(f"warmstart.token_budget={stats['token_budget']}: no SFT row fits it; raise "
                      "it, or set 0 for no budget")


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
    from envace_lite.llm.generation import HFGenerator

    rc = cfg.rollout
    prompts = [chat_ids(tokenizer, act_messages(
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
        names = {function_of(x).get("name") for x in t.tools}
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
@contextlib.contextmanager
def causal_attention(model: Any) -> Any:
    """While inside, the backbone of ``model`` drops an attention mask that pads rows at the end.

    Under causal attention a real token never sees a later column, so padding after a row's last
    real token is out of reach without a mask (its labels are -100, so it is not scored). With no
    mask, SDPA runs its causal kernel, which skips the key blocks above the diagonal; with one it
    computes them and masks them. Positions are the same (``arange`` from column 0 either way).
    A mask with padding anywhere else (``rows.padded_at_end_only``), or one passed
    positionally, is passed on. The trainer still sees the mask in its batch (TRL counts tokens
    with it); only the backbone's forward goes without it. A model that does not use SDPA
    (flash attention skips padding only with a mask) is left alone. See docs/design.md, "TRL
    integration".

    Args:
        model: a causal LM (PEFT-wrapped or not) whose ``base_model`` is its backbone.

    Raises:
        ValueError: the model has no separate backbone module (its ``base_model`` is itself).
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = inner.base_model
    if backbone is inner:
        raise ValueError(f"{type(inner).__name__} has no backbone module (base_model_prefix "
                         f"{inner.base_model_prefix!r}): causal_attention needs one")
    if getattr(inner.config, "_attn_implementation", None) != "sdpa":
        yield
        return

    def drop(_module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and padded_at_end_only(mask):
            kwargs = {**kwargs, "attention_mask": None}
        return args, kwargs

    handle = backbone.register_forward_pre_hook(drop, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def run_sft(model: Any, tokenizer: Any, rows: list[dict[str, list[int]]], cfg: Config,
            out_dir: Path, causal: bool = True) -> dict[str, Any]:
    """Train on ``rows`` with ``trl.SFTTrainer`` (loss on ``completion_mask`` tokens only).

    Args:
        model: the policy in train mode (PEFT-wrapped for LoRA, else trained in full).
        tokenizer: its tokenizer (padding id).
        rows: from ``sft_rows``.
        cfg: reads ``warmstart`` (epochs, lr, batch size, max length) and ``run``.
        out_dir: the trainer's scratch folder (no intermediate checkpoints are written).
        causal: batches padded at the end only go through the backbone without an attention
            mask (``causal_attention``); False keeps TRL's mask.

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
    # mixed precision on GPU follows the weights: bf16, or fp16 with a loss scaler when the
    # trained parameters are the fp32 LoRA adapter (a T4 has no bf16)
    fp16 = not cpu and cfg.model.dtype == "float16" and cfg.model.lora_r > 0
    args = SFTConfig(
        output_dir=str(out_dir), num_train_epochs=w.epochs, max_steps=w.max_steps or -1,
        per_device_train_batch_size=w.batch_size, learning_rate=w.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=w.warmup_steps, weight_decay=0.0,
        max_length=w.max_length, completion_only_loss=True, packing=False,
        logging_steps=max(1, w.logging_steps), save_strategy="no", report_to="none",
        seed=cfg.run.seed, use_cpu=cpu, fp16=fp16,
        bf16=not cpu and (w.bf16 or cfg.model.dtype == "bfloat16"),
        gradient_checkpointing=not cpu, disable_tqdm=not cfg.run.progress,
        dataloader_num_workers=0, train_sampling_strategy="group_by_length",
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    quiet_trainer(trainer, progress_bar=cfg.run.progress)  # loss rows go to metrics.jsonl
    start = time.perf_counter()
    with causal_attention(model) if causal else contextlib.nullcontext():
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


ExtraTasks = Callable[[list[Task], Config], list[Task]]
"""``build(sft_tasks, cfg) -> tasks`` whose ACT transcripts join the warm start's rows."""

EXTRA_SFT_TASKS: dict[str, ExtraTasks] = {}
"""Extra warm-start task builders, by name (a plugin's study levers; each returns [] when its
lever is off)."""


def register_extra_sft_tasks(name: str, build: ExtraTasks) -> None:
    """Register ``build``: its tasks' ACT transcripts join every warm start's rows (their
    REHEARSE rows and error rows are not made: the tasks are never executed)."""
    EXTRA_SFT_TASKS[name] = build


def extra_act_transcripts(tasks: list[Task], cfg: Config, tokenizer: Any) -> TranscriptSet:
    """The ACT transcripts of every registered extra builder's tasks for ``tasks`` (a plugin
    whose config group ``cfg`` sets loaded first, ``plugins.load_plugins_for``)."""
    import copy as _copy

    from envace_lite.plugins import load_plugins_for

    load_plugins_for(cfg)
    extra = [t for build in EXTRA_SFT_TASKS.values() for t in build(tasks, cfg)]
    if not extra:
        return TranscriptSet()
    plain = _copy.deepcopy(cfg)  # no executed error rows, no memory rows for tasks never run
    plain.study.error_rows, plain.warmstart.memory_share = False, 0.0
    ts = build_transcripts(extra, plain, tokenizer)
    return TranscriptSet(act=ts.act, stats={"tasks": len(extra), "act": len(ts.act)})


ExtraRehearseTasks = Callable[[Config], list[Task]]
"""``draw(cfg) -> tasks``: train tasks outside the SFT split whose REHEARSE rows join the warm
start ([] when the plugin's lever is off; it reads its own setting in ``cfg``)."""

ExtraRehearseRows = Callable[[list[Task], Config, Any], list[RehearseExample]]
"""``rows(tasks, cfg, tokenizer) -> rows``: the REHEARSE rows of the drawn tasks."""

EXTRA_REHEARSE_TASKS: dict[str, tuple[ExtraRehearseTasks, ExtraRehearseRows]] = {}
"""Extra warm-start REHEARSE rows of other train tasks, by name (the key of their stats in the
warm start's ``summary.json``), in registration order (a plugin's study levers)."""


def register_extra_rehearse_tasks(name: str, draw: ExtraRehearseTasks,
                                  rows: ExtraRehearseRows) -> None:
    """Register ``draw`` and ``rows``: every warm start adds ``rows(draw(cfg), cfg, tokenizer)``
    after its budgeted rows (outside ``warmstart.token_budget``; no ACT rows), and the fidelity
    audit's grounded upper bound passes over the drawn tasks (``extra_rehearse_tasks``)."""
    EXTRA_REHEARSE_TASKS[name] = (draw, rows)


def extra_rehearse_tasks(cfg: Config) -> dict[str, list[Task]]:
    """``{name: drawn tasks}`` of every registered extra REHEARSE row source, a plugin whose
    config group ``cfg`` sets loaded first (``plugins.load_plugins_for``); {} for a config of
    the paper.

    Raises:
        ConfigError: a source's draw refuses ``cfg`` (e.g. more tasks than the RL split has).
    """
    from envace_lite.plugins import load_plugins_for

    load_plugins_for(cfg)
    return {name: draw(cfg) for name, (draw, _) in EXTRA_REHEARSE_TASKS.items()}


def warmstart(config: Config, run_dir: str | Path | None = None,
              measure: bool = True) -> Path:
    """The warm-start stage: transcripts → (rates before) → SFT → checkpoint → (rates after).

    Writes ``config.json``, ``summary.json`` (transcript counts, row/token stats, the
    stats of each extra REHEARSE row source that drew tasks (``extra_rehearse_tasks``: the
    drills study's ``world_rows``), SFT loss,
    held-out first-turn call rates before and after) and ``metrics.jsonl`` (SFT loss rows) into
    ``runs/warmstart/<profile>__s<seed>__<time>/``, and the policy into ``checkpoint/`` (with
``paths.CHECKPOINT_RECORD``: its profile, model and tokenizer). With
    ``model.checkpoint`` set, SFT starts from that policy (a warm start continued; its tokenizer
    comes with it). The folder is locked while the warm start writes (``paths.run_folder_lock``);
    a folder of another command's run or another config is refused, a finished warm start of
    the same config is kept as it is, an unfinished one is started again
    (``check_warmstart_folder``).

    Args:
        config: the finalized ``Config`` (the entry point resolves it once).
        run_dir: where to write (a new run dir when None).
        measure: run the held-out first-turn check (``warmstart.eval_first_turns`` tasks).

    Returns:
        The run dir; ``run_dir / "checkpoint"`` is the value for ``model.checkpoint``.
    """
    from envace_lite.paths import new_run_dir, run_folder_lock

    cfg = config
    if run_dir and check_warmstart_folder(run_dir, cfg):
        log.info("%s holds this warm start, finished: kept as it is", run_dir)
        return Path(run_dir)
    run_dir = Path(run_dir) if run_dir else new_run_dir("warmstart", cfg.profile, cfg.run.seed,
                                                        cfg.run.runs_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_folder_lock(run_dir, "warmstart"):
        if check_warmstart_folder(run_dir, cfg):  # finished by another writer meanwhile
            return run_dir
        return _warmstart(cfg, run_dir, measure)


def _warmstart(cfg: Config, run_dir: Path, measure: bool) -> Path:
    """``warmstart``'s body, under the folder's lock."""
    from envace_lite.models.load import load_policy
    from envace_lite.paths import write_checkpoint_record

    if (run_dir / "summary.json").exists() or (run_dir / "metrics.jsonl").exists():
        log.warning("%s: an unfinished warm start of this config; starting its SFT again",
                    run_dir)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    cfg.save(run_dir)
    start, summary = time.perf_counter(), {"profile": cfg.profile, "seed": cfg.run.seed}
    tasks = training_tasks(cfg, "sft")
    if not tasks:
        raise ValueError(f"profile {cfg.profile!r} has no warm-start tasks (warmstart.sft_share="
                         f"{cfg.warmstart.sft_share}): set warmstart.sft_share, e.g. 0.5")
    drawn = extra_rehearse_tasks(cfg)  # before any model loads: a count out of range fails now
    model, tok = load_policy(cfg, train=True)  # micro: builds/loads the tokenizer from these
    ts = build_transcripts(tasks, cfg, tok)
    extra = extra_act_transcripts(tasks, cfg, tok)  # beyond the paper: a plugin's ACT rows
    if extra.act:
        ts.act += extra.act
        ts.stats["extra_act"] = extra.stats
    w = cfg.warmstart
    rows, row_stats = sft_rows(ts, tok, w.max_length, w.token_budget, cfg.run.seed, w.act_share)
    check_rows(row_stats)
    summary.update(transcripts=ts.stats, rows=row_stats,
                   rl_tasks=len(training_tasks(cfg, "rl")))
    for name, others in drawn.items():  # beyond the paper: a plugin's rows, after the gold's
        if not others:
            continue
        more = EXTRA_REHEARSE_TASKS[name][1](others, cfg, tok)
        extra, extra_stats = sft_rows(TranscriptSet(rehearse=more), tok,
                                      w.max_length, 0, cfg.run.seed)
        rows += extra
        summary[name] = {"tasks": len(others), **extra_stats}
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
    write_checkpoint_record(run_dir / CHECKPOINT, cfg, tok)  # its profile, model and tokenizer
    summary["seconds"] = round(time.perf_counter() - start, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    log.info("warm start %s: %d rows, %d tokens, loss %s -> %s, %.0f s; checkpoint %s",
             cfg.profile, len(rows), sum(len(r["input_ids"]) for r in rows),
             summary["sft"]["loss_first"],
             summary["sft"]["loss_last"], summary["seconds"], run_dir / CHECKPOINT)
    return run_dir


__all__ = ["EXTRA_REHEARSE_TASKS", "EXTRA_SFT_TASKS",
           "extra_act_transcripts", "extra_rehearse_tasks", "register_extra_rehearse_tasks",
           "register_extra_sft_tasks", "causal_attention", "check_rows",
           "first_turn_call_rates",
           "run_sft", "save_checkpoint",
           "sft_rows", "warmstart"]
