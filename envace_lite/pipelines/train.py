"""Role-wise GRPO training runs: the one entry point for notebooks, the CLI and ``scaled/``.

``train(config)`` loads the policy and the train split of ``grpo.suites``, builds a
``RoleWiseGRPOTrainer`` (``grpo.py``) with the settings of docs/design.md, "TRL integration", and
runs it. A run dir holds::

    config.json            the full config
    metrics.jsonl          one row per optimizer step (role-tagged keys, see ``step_metrics``)
    checkpoints/checkpoint-<step>/   TRL/HF checkpoint: policy, optimizer, scheduler, RNG, state
                                     (per_role: also ``rehearse_policy.safetensors``), and
                                     ``envace_checkpoint.json`` (profile, model, tokenizer)
    .envace.lock           while training writes: its pid and host (``paths.run_folder_lock``)

Resume: calling ``train`` again on the same run dir continues from the last *complete* checkpoint
(one whose ``trainer_state.json``, which HF writes last, parses), under the same settings: a
config that changes results is refused before anything is written (``check_resume_config``; a
longer ``grpo.steps`` is allowed), and a second writer is refused by the lock. Incomplete
checkpoint folders and metrics rows past that step (written before a kill landed; a torn last row
too) are removed first, so rows 1..N appear once each. The checkpoint lookup and the config check
are in ``resume.py``. SIGTERM stops gracefully: the current step finishes, a
checkpoint is written and the process exits with status 143; the log names the CLI command that
resumes it (``resume_hint``).
With the LLM judge, one probe call precedes training, and a judge that keeps failing stops the
run (``grpo.judge_mask_threshold``, ``grpo.judge_mask_steps``; ``judge.JudgeHealth``).

Usage::

    envace-lite train --profile smoke --mode shared --steps 3
    python -c "from envace_lite.pipelines.train import train; from envace_lite.config import get_config; \\
               train(get_config('smoke'))"
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from envace_lite.config import Config
from envace_lite.paths import (
    append_jsonl,
    new_run_dir,
    read_jsonl,
    run_folder_lock,
    write_checkpoint_record,
)
from envace_lite.pipelines.resume import (
    CHECKPOINTS,
    check_resume_config,
    checkpoint_step,
    last_checkpoint,
    resume_hint,
)
from envace_lite.progress import get_logger, is_rank0, progress
from envace_lite.types import ROLES

log = get_logger(__name__)

METRICS = "metrics.jsonl"
SIGTERM_EXIT = 128 + signal.SIGTERM


# ---------------------------------------------------------------------------------------------
# TRL settings (docs/design.md, "TRL integration")
# ---------------------------------------------------------------------------------------------
def per_device_batch(cfg: Config, world: int) -> int:
    """Rollouts per process and accumulation step: ``prompts_per_step × K / (world × GA)``.

    Raises:
        ValueError: ``prompts_per_step × num_generations`` does not split evenly over processes
            and gradient-accumulation steps.
    """
    g = cfg.grpo
    rollouts = g.prompts_per_step * g.num_generations
    per_device, rest = divmod(rollouts, world * g.gradient_accumulation_steps)
    if rest or per_device == 0:
        raise ValueError(f"prompts_per_step × num_generations = {rollouts} rollouts do not split "
                         f"over {world} process(es) × {g.gradient_accumulation_steps} accumulation "
                         "steps: change grpo.prompts_per_step or grpo.gradient_accumulation_steps")
    return per_device


def grpo_args(cfg: Config, output_dir: str | Path) -> Any:
    """The ``trl.GRPOConfig`` of a run: one optimizer step per ``prompts_per_step × K`` rollouts.

    Raises:
        ValueError: ``prompts_per_step × num_generations`` does not split evenly over processes
            and gradient-accumulation steps.
    """
    import torch
    from trl import GRPOConfig

    g = cfg.grpo
    per_device = per_device_batch(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    cpu = cfg.model.device == "cpu" or not torch.cuda.is_available()
    rc = cfg.rollout
    vllm = {}  # rollout.generation_backend (scaled/README.md); hf needs none of these
    if rc.generation_backend != "hf":
        vllm = {
            "use_vllm": True, "vllm_mode": rc.generation_backend.removeprefix("vllm_"),
            "vllm_server_base_url": rc.vllm_server_url,
            "vllm_gpu_memory_utilization": rc.vllm_gpu_memory_utilization,
            "vllm_max_model_length": cfg.model.context_window,
            "vllm_importance_sampling_correction": rc.vllm_importance_sampling,
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_max": rc.vllm_importance_sampling_cap,
            "max_completion_length": max(rc.max_new_tokens_act, rc.max_new_tokens_rehearse)}
    return GRPOConfig(**vllm,
        output_dir=str(output_dir), seed=cfg.run.seed, max_steps=g.steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        num_generations=g.num_generations, num_iterations=1,
        learning_rate=g.learning_rate, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0, beta=g.beta, epsilon=g.epsilon, loss_type="dapo",
        scale_rewards="none", importance_sampling_level="token", use_bias_correction_kl=False,
        temperature=cfg.rollout.temperature, disable_dropout=True,
        gradient_checkpointing=not cpu, use_cpu=cpu,
        # bf16 mixed precision on GPU for bf16 profiles (DeepSpeed's "bf16": "auto" follows it)
        bf16=not cpu and cfg.model.dtype == "bfloat16",
        # fp16 (a T4): mixed precision with a loss scaler over the fp32 LoRA adapter
        fp16=not cpu and cfg.model.dtype == "float16" and cfg.model.lora_r > 0,
        report_to="none", disable_tqdm=True, logging_steps=1, log_completions=False,
        save_strategy="steps", save_steps=g.save_every, save_total_limit=1,
        dataloader_num_workers=0,
    )


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float | None:
    return float(statistics.fmean(xs)) if xs else None


def _pstd(xs: list[float]) -> float | None:
    return float(statistics.pstdev(xs)) if xs else None


def step_metrics(record: Any) -> dict[str, Any]:
    """Role-tagged metrics of one step, from the trainer's ``StepRecord``.

    Keys: ``reward/mean|std`` (over trajectories with a valid reward; population std),
    ``<role>/baseline_mean`` (mean over tasks of μ_{x,role}), ``<role>/advantage_mean|std``,
    ``<role>/tokens`` (trained tokens), ``<role>/outputs``, ``<role>/parse_error_rate``,
    ``nonzero_adv_group_frac`` (share of trained (task, role) groups with some A ≠ 0),
    ``turns_mean`` (ACT outputs per trajectory), ``violation_rate`` (tool calls with schema or
    unknown-tool violations), ``masked_frac`` (trajectories masked by a failed judge),
    ``tool_calls`` (parsed calls), ``real_calls`` (real executions), ``rows``, ``pad_rows``,
    ``rollout_seconds``. A value that does not apply
    (e.g. REHEARSE baselines in act_only) is None.
    """
    trajs, roles, trained = record.trajs, record.roles, record.trained.tolist()
    rewards = [t.reward for t in trajs if t.reward_valid and t.reward is not None]
    out: dict[str, Any] = {"reward/mean": _mean(rewards), "reward/std": _pstd(rewards)}
    groups: dict[tuple[Any, str], list[int]] = defaultdict(list)
    for i, (task, role) in enumerate(zip(record.task_ids, roles)):
        if trained[i]:
            groups[(task, role)].append(i)
    for role in ROLES:
        idx = [i for i, r in enumerate(roles) if r == role and trained[i]]
        adv = [float(record.advantages[i]) for i in idx]
        baselines = [statistics.fmean(float(record.rewards[i]) for i in members)
                     for (_, r), members in groups.items() if r == role]
        outputs = [o for t in trajs for o in t.outputs if o.role == role]
        out |= {f"{role}/baseline_mean": _mean(baselines), f"{role}/advantage_mean": _mean(adv),
                f"{role}/advantage_std": _pstd(adv),
                f"{role}/tokens": int(sum(int(record.lengths[i]) for i in idx)),
                f"{role}/outputs": len(outputs),
                f"{role}/parse_error_rate": _mean([float(o.parse_kind == "error")
                                                   for o in outputs])}
    steps = [s for t in trajs for s in t.steps]
    nonzero = [any(abs(float(record.advantages[i])) > 0 for i in members)
               for members in groups.values()]
    return out | {
        "nonzero_adv_group_frac": _mean([float(x) for x in nonzero]),
        "turns_mean": _mean([float(sum(o.role == "act" for o in t.outputs)) for t in trajs]),
        "violation_rate": _mean([float(bool(s.call.violations)) for s in steps]),
        "masked_frac": _mean([float(not t.reward_valid) for t in trajs]),
        "tool_calls": len(steps), "real_calls": sum(t.real_calls for t in trajs),
        "rows": record.rows, "pad_rows": record.pad_rows,
        "rollout_seconds": record.rollout_seconds,
    }


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` (empty if absent; a torn last row is dropped).

    Raises:
        ValueError: a row before the last is not JSON (see ``paths.read_jsonl``).
    """
    return read_jsonl(Path(run_dir) / METRICS)


def trim_metrics(run_dir: str | Path, last_step: int) -> int:
    """Keep one row per step 1..``last_step`` (the last written wins); return how many remain."""
    rows = {r["step"]: r for r in read_metrics(run_dir) if r["step"] <= last_step}
    path = Path(run_dir) / METRICS
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))
    tmp.replace(path)
    return len(rows)


class _StepLog(TrainerCallback):
    """Appends one metrics row per optimizer step and drives the progress bar (rank 0)."""

    def __init__(self, run_dir: Path, bar: Any) -> None:
        self.path, self.bar, self.trainer = run_dir / METRICS, bar, None
        self.started = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        row: dict[str, Any] = {"step": state.global_step}
        row |= step_metrics(self.trainer.last_record)
        row |= {key: logs.get(key) for key in ("loss", "grad_norm", "learning_rate", "kl",
                                                "entropy", "clip_ratio/region_mean")}
        for role, norm in self.trainer.role_grad_norms.items():
            row[f"{role}/grad_norm"] = norm
        row["seconds"] = time.perf_counter() - self.started
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in row.items()}
        append_jsonl(self.path, row)
        self.bar.update(1)
        self.bar.set_postfix(reward=row["reward/mean"], refresh=False)


class _RecordCheckpoint(TrainerCallback):
    """Writes ``paths.CHECKPOINT_RECORD`` (profile, model, tokenizer) into each checkpoint."""

    def __init__(self, cfg: Config, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_checkpoint_record(folder, self.cfg, self.tokenizer)


class _JudgeHealthStop(TrainerCallback):
    """Ends training, with a checkpoint, once the judge failed on too many trajectories for
    ``grpo.judge_mask_steps`` steps in a row (``judge.JudgeHealth``). The masked share is
    summed over ranks, so that every rank stops at the same step."""

    def __init__(self, health: Any) -> None:
        self.health, self.trainer, self.error = health, None, None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        record = getattr(self.trainer, "last_record", None)
        if record is None:
            return control
        import torch

        local = [float(not t.reward_valid) for t in record.trajs]
        masked, total = self.trainer._global_sum(torch.tensor([sum(local), len(local)]))
        self.error = self.health.update(state.global_step, masked / max(total, 1.0))
        if self.error:
            log.error("%s", self.error)
            control.should_save = True
            control.should_training_stop = True
        return control


class _StopOnRequest(TrainerCallback):
    """Ends training after the current step, with a checkpoint, once ``requested`` is set."""

    def __init__(self) -> None:
        self.requested = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


@contextlib.contextmanager
def _sigterm_stops(stopper: _StopOnRequest) -> Iterator[None]:
    """While training, SIGTERM asks for a graceful stop; a second SIGTERM kills as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        log.warning("SIGTERM: finishing the current step, checkpointing, then exiting")
        stopper.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------
def load_train_tasks(cfg: Config) -> list[Any]:
    """The RL tasks: the train split of every suite in ``grpo.suites`` less the warm-start (SFT)
    share (``task_split.training_tasks(cfg, "rl")``; ``warmstart.sft_share=0`` keeps every
    task), so SFT and RL never train on the same task."""
    from envace_lite.core.task_split import training_tasks

    tasks = training_tasks(cfg, "rl")
    if not tasks:
        raise ValueError(f"grpo.suites={cfg.grpo.suites} has no train tasks")
    return tasks


def train(config: Config, run_dir: str | Path | None = None, resume: bool = True, *,
          generator: Any = None, tasks: list[Any] | None = None) -> Path:
    """Train the policy with role-wise GRPO and return the run dir.

    Under ``torchrun`` every rank calls it with the same ``run_dir``; metrics rows are rank 0's
    (its share of the step's rollouts; the loss and ``grad_norm`` are global).

    Args:
        config: the finalized ``Config`` (the entry point resolves it once).
        run_dir: where to write; a new ``runs/train/<profile>__s<seed>__<time>/`` when None
            (pass one explicitly under ``torchrun``).
        resume: continue from the run dir's last complete checkpoint, if any. False refuses a run
            dir that already holds checkpoints.
        generator: replaces the policy's generator in rollouts (e.g. a ``ScriptedGenerator``);
            the loss is still computed on the policy.
        tasks: training tasks (default: the train split of ``grpo.suites``).

    Returns:
        The run dir. Its last ``checkpoints/checkpoint-<steps>`` holds the trained policy.

    The run dir is locked while training writes into it (``paths.run_folder_lock``, rank 0);
    resuming it under a config that changes results is refused before anything is written
    (``check_resume_config``); each checkpoint records its profile, model and tokenizer
    (``paths.write_checkpoint_record``).

    Raises:
        FileExistsError: ``resume=False`` on a run dir with checkpoints.
        ConfigError: ``prompts_per_step × num_generations`` does not split over processes and
            accumulation steps (before any run dir or model); ``run_dir`` was trained under
            another config (``check_resume_config``); another live process holds its lock.
        JudgeUnavailable: ``grpo.judge="llm"`` and the probe call to ``judge_url`` failed
            (before any run dir or model); or the judge failed on over
            ``grpo.judge_mask_threshold`` of the trajectories for ``grpo.judge_mask_steps`` steps
            in a row (the run stops with a checkpoint and can be resumed).
        SystemExit: status 143 after a graceful SIGTERM stop (the run can be resumed).
    """
    from envace_lite.core.judge import probe_judge

    cfg = config
    g = cfg.grpo
    try:  # settings that only fail inside TRL: checked before any run dir or model
        per_device_batch(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as e:
        from envace_lite.config import ConfigError

        raise ConfigError(str(e)) from None
    if run_dir is not None:  # a resume under other settings: refused before anything is written
        check_resume_config(run_dir, cfg)
    if g.judge == "llm":  # one probe call: a dead judge would mask every trajectory
        probe_judge(g.judge_url, g.judge_model)
        log.info("the LLM judge at %s answers", g.judge_url)
    try:
        if run_dir is None:
            run_dir = new_run_dir("train", cfg.profile, cfg.run.seed, cfg.run.runs_root)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only runs folder, a file in the way
        from envace_lite.config import ConfigError

        where = run_dir or f"under {os.environ.get('ENVACE_RUNS') or cfg.run.runs_root}"
        raise ConfigError(f"cannot create the run folder {where}: {e.strerror or e}") from None
    # under torchrun every rank gets here with the same run_dir: rank 0 holds the lock
    with run_folder_lock(run_dir, "train") if is_rank0() else contextlib.nullcontext():
        return _train(cfg, run_dir, resume, generator, tasks)


def _train(cfg: Config, run_dir: Path, resume: bool, generator: Any,
           tasks: list[Any] | None) -> Path:
    """``train``'s work, after its checks (and under the folder's lock on rank 0)."""
    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.models.load import load_policy
    from envace_lite.core.judge import JudgeHealth, JudgeUnavailable

    g = cfg.grpo
    last = last_checkpoint(run_dir, clean=resume and is_rank0())
    if last is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds {last.name}: pass resume=True to "
                              "continue it, or a fresh run_dir")
    done = checkpoint_step(last) if last is not None else 0
    if is_rank0():  # under torchrun every rank gets here with the same run_dir
        trim_metrics(run_dir, done)
        # check_resume_config let through only fields that may change; written whole, so that
        # another rank checking it never reads half a file
        tmp = run_dir / "config.json.tmp"
        tmp.write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        tmp.replace(run_dir / "config.json")
    if done >= cfg.grpo.steps:
        log.info("%s is complete (%d/%d steps)", run_dir, done, cfg.grpo.steps)
        return run_dir

    model, tokenizer = load_policy(cfg, train=True)
    bar = progress(total=cfg.grpo.steps, initial=done, enabled=cfg.run.progress,
                   desc=f"train {cfg.grpo.mode}", unit="step")
    step_log, stopper = _StepLog(run_dir, bar), _StopOnRequest()
    health = _JudgeHealthStop(JudgeHealth(
        g.judge_mask_threshold, g.judge_mask_steps,
        g.judge_url if g.judge == "llm" else "the rule judge"))
    trainer = RoleWiseGRPOTrainer(
        model, tokenizer, tasks if tasks is not None else load_train_tasks(cfg), cfg,
        grpo_args(cfg, run_dir / CHECKPOINTS), generator=generator,
        callbacks=[step_log, stopper, health, _RecordCheckpoint(cfg, tokenizer)])
    step_log.trainer = health.trainer = trainer
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # rows go to metrics.jsonl, not stdout
    log.info("training %s for %d steps (%s) in %s", cfg.grpo.mode, cfg.grpo.steps,
             f"resuming at step {done}" if done else "fresh", run_dir)
    try:
        with _sigterm_stops(stopper):
            trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    finally:
        bar.close()
    if health.error:
        raise JudgeUnavailable(f"{health.error} (stopped at step {trainer.state.global_step}, "
                               f"checkpoint kept: {resume_hint(cfg, run_dir)})")
    if stopper.requested:
        log.warning("stopped at step %d by SIGTERM; resume with: %s", trainer.state.global_step,
                    resume_hint(cfg, run_dir))
        raise SystemExit(SIGTERM_EXIT)
    return run_dir
