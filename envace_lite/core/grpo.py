# Long by design: one TRL trainer subclass; its overrides (rows, baselines, loss) share state.
"""Role-wise GRPO (paper §2.2) on TRL: the GRPOTrainer that trains packed rows (``rows.py``).

One policy plays ACT and REHEARSE. Every output y_{i,m} of trajectory i (an ACT turn or a REHEARSE
call) gets its trajectory's reward R_i (after the per-output empty penalty), and its advantage is
R_i minus the mean reward of the outputs of the *same role* for the *same task*. Both roles then
update one set of weights (``mode="shared"``). The objective itself, as tensors
(``flatten_outputs``, ``rolewise_advantages``, ``loss_weights``, ``rolewise_grpo_loss``), is
``envace_lite/core/advantages.py``; this module is how TRL computes it on padded rows.

Where this departs from the paper (each a decision of docs/design.md, "Reward and trainer
semantics"): (1) an empty output gets R_i − |p|, as the reference code does; (5) REHEARSE reads
the task's gold (call, observation) pairs as grounding in most training trajectories; (6)
``act_only`` keeps the output-weighted role-wise baseline unless ``grpo.act_only_baseline`` says
"trajectories"; and one optimizer step per rollout batch, so Eq. 6's ratio is 1 and its clip idle.

How the trainer realises it in trl 1.16 (docs/design.md, "TRL integration"):

* ``_generate_and_score_completions`` is overridden. It runs the world-rehearsal rollout on the
  batch's tasks, scores it, and emits **rows**: one packed ACT row per trajectory (the whole caller
  transcript; observations and template glue are kept as context but out of the loss) and one row per
  REHEARSE call with its own prompt. Padding rows (weight 0) make the row count a multiple of
  ``steps_per_generation`` (TRL's ``split_tensor_dict`` drops remainder rows) and equal across ranks.
* Advantages are per token, shape (B, T): each token carries its output's advantage.
* The aggregation rides in TRL's ``tool_mask``, which ``_compute_loss`` multiplies into the loss
  mask: it holds per-token **weights**, not just 0/1. ``token_mean`` uses 1 on trained tokens, so
  the ``dapo`` loss is the plain token mean. ``output_mean`` (default) uses T/(M·L_o) for a token of
  output o (T trained tokens in the step, M trained outputs, L_o the output's length); under ``dapo``
  (÷T) the loss becomes the mean over outputs of each output's token mean. This is the same scaling
  as scaling each output's advantage by T/(M·L_o), but it also applies to the KL term, so the whole
  per-token loss is averaged per output exactly (GRPO's 1/G Σ 1/|o| Σ_t form).
* One optimizer step per generation batch (``num_iterations=1``, ``steps_per_generation`` = gradient
  accumulation), so the importance ratio is exactly 1: no old log-probs are computed, and TRL uses
  ``per_token_logps.detach()`` in their place.

Modes (paper Fig. 3): ``shared``; ``per_role`` (a second policy copy trains only on REHEARSE rows,
with its own gradient clipping and Adam state, sharing the rollout and the step); ``act_only``
(ACT rows only, observations from the frozen initial policy); ``act_only_real`` (ACT rows only,
observations from the real environment).

Two mixins keep plumbing out of this file: ``causal_forward.CausalForwardMixin``, the forward in
length buckets (speed only, same numbers), and ``per_role_policy.PerRolePolicyMixin``, the second
policy's optimizer group, clipping and checkpoint file.

Usage::

    envace-lite train --profile smoke --mode shared --steps 3      # through envace_lite.pipelines.train

    from envace_lite.config import get_config
    from envace_lite.pipelines.train import train
    run_dir = train(get_config("smoke", {"grpo.mode": "per_role"}))
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, pad, use_adapter

from envace_lite.core.advantages import (
    flatten_outputs,
    loss_weights,
    output_trajectories,
    rolewise_advantages,
    trajectory_advantages,
)
from envace_lite.config import Config
from envace_lite.core.causal_forward import CausalForwardMixin
from envace_lite.core.per_role_policy import PerRolePolicyMixin
from envace_lite.progress import get_logger
from envace_lite.core.rows import (
    Rows,
    build_rows,
    collate_rows,
    output_lengths,
)
from envace_lite.types import ROLES, TRAIN_MODES, RolloutMode, TrainMode, Trajectory

log = get_logger(__name__)

ROLLOUT_MODE: dict[TrainMode, RolloutMode] = {
    "shared": "rehearse", "per_role": "rehearse", "act_only": "frozen_simulator",
    "act_only_real": "real"}
"""The rollout engine's mode for each training mode (its keys are ``types.TRAIN_MODES``)."""


# ---------------------------------------------------------------------------------------------
# Generators for the roles
# ---------------------------------------------------------------------------------------------
class RoleRoutedGenerator:
    """A ``Generator`` that sends each role's prompts to its own generator (per_role, act_only)."""

    def __init__(self, by_role: dict[str, Any]) -> None:
        self.by_role = by_role

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Any]:
        return self.by_role[role].generate(prompts, role, max_new_tokens, temperature, top_p)


class _InContext:
    """A generator run inside a context (e.g. the LoRA adapter disabled: the frozen initial policy)."""

    def __init__(self, gen: Any, context: Callable[[], Any]) -> None:
        self.gen, self.context = gen, context

    def generate(self, *args: Any, **kwargs: Any) -> list[Any]:
        with self.context():
            return self.gen.generate(*args, **kwargs)


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    """What one generation step produced, kept for metrics (``train.step_metrics``)."""

    trajs: list[Trajectory]
    rewards: torch.Tensor
    task_ids: list[tuple[str, str]]
    roles: list[str]
    valid: torch.Tensor
    trained: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    rows: int
    pad_rows: int
    rollout_seconds: float


class RoleWiseGRPOTrainer(CausalForwardMixin, PerRolePolicyMixin, GRPOTrainer):
    """TRL's GRPOTrainer on role-wise rows (see the module docstring).

    Args:
        model: the policy (plain or PEFT), as ``load.load_policy(cfg, train=True)`` returns it.
        tokenizer: its tokenizer.
        tasks: the training tasks; the dataset rows are their indices, repeated K times by TRL's
            ``RepeatSampler``.
        cfg: the run config (``grpo``, ``rollout`` and ``run`` groups are read).
        args: a ``trl.GRPOConfig`` (``train.grpo_args`` builds the one of docs/design.md,
            "TRL integration").
        generator: replaces every policy-driven generator (e.g. a ``ScriptedGenerator`` in tests).
        rollout_fn: ``(tasks, k, step) -> scored trajectories`` replacing rollout and scoring.
        callbacks: extra ``TrainerCallback`` s.
    """

    row_layout: str = "packed"
    """How each batch's outputs become rows (``rows.build_rows``): ``packed``, one ACT row per
    trajectory (what training uses), or ``per_output``, one row per output (the baseline that
    ``benchmarks/train_step.py`` times through this same code)."""

    def __init__(self, model: Any, tokenizer: Any, tasks: Sequence[Any], cfg: Config, args: Any, *,
                 generator: Any = None, rollout_fn: Callable | None = None,
                 callbacks: list[Any] | None = None) -> None:
        from datasets import Dataset

        g = cfg.grpo
        if g.mode not in TRAIN_MODES:
            raise ValueError(f"grpo.mode={g.mode!r}: expected one of {TRAIN_MODES}")
        if g.mode == "per_role" and cfg.rollout.generation_backend != "hf":
            raise ValueError("grpo.mode='per_role' trains two policies, and a vLLM backend serves "
                             "one: use rollout.generation_backend='hf'")
        self.cfg, self.tasks, self.mode = cfg, list(tasks), g.mode
        self.trained_roles = ("act",) if g.mode.startswith("act_only") else ROLES
        self._generator_override, self._rollout_fn = generator, rollout_fn
        self.last_record: StepRecord | None = None
        self.role_grad_norms: dict[str, float] = {}
        peft = _is_peft(model)
        needs_frozen = g.beta != 0.0 or g.mode == "act_only"
        if peft and needs_frozen and _adapter_trained(model):
            # a warm-start adapter: the frozen initial policy is a copy of it, not the bare base
            model.add_adapter("ref", model.peft_config["default"])
            for name, param in model.named_parameters():
                if ".ref." in name:
                    param.data.copy_(model.get_parameter(name.replace(".ref.", ".default.")))
            model.set_adapter("default")
        # Copies are taken before TRL patches the policy's forward (a patched forward would be
        # deep-copied still bound to the original model).
        self.rehearse_model = copy.deepcopy(model) if g.mode == "per_role" else None
        self.frozen_model = None
        if needs_frozen and not peft:
            self.frozen_model = copy.deepcopy(model).eval().requires_grad_(False)
        if args.per_device_train_batch_size * args.steps_per_generation % g.num_generations:
            raise ValueError("each process's generation batch must hold whole groups of "
                             f"num_generations={g.num_generations} rollouts")
        dataset = Dataset.from_dict({"prompt": [f"{t.suite}/{t.id}" for t in self.tasks],
                                     "task_index": list(range(len(self.tasks)))})
        beta, args.beta = args.beta, 0.0  # keep TRL from rebuilding a ref model from the hub path
        try:
            super().__init__(model=model, reward_funcs=[_rewards_come_from_rollouts], args=args,
                             train_dataset=dataset, processing_class=tokenizer,
                             callbacks=callbacks)
        finally:
            args.beta = beta
        self.beta = beta
        if self.is_deepspeed_enabled and self.rehearse_model is not None:
            raise ValueError("grpo.mode='per_role' trains a second policy, which DeepSpeed (one "
                             "engine per accelerator) cannot wrap: run per_role under DDP "
                             "(scaled/accelerate/ddp_8gpu.yaml; with LoRA for 8B, "
                             "scaled/overrides/per_role.yaml)")
        for extra in (self.rehearse_model, self.frozen_model):
            if extra is not None:
                extra.to(self.args.device)
                add_fused_lm_head(extra.get_base_model() if _is_peft(extra) else extra,
                                  temperature=self.temperature, outputs=("log_probs", "entropy"))
        if self.frozen_model is not None and self.is_deepspeed_enabled:
            # as TRL does for its ref model: sharded like the policy under ZeRO-3 (an inference
            # engine; TRL's fused LM head gathers its weight from the shards)
            from trl.models import prepare_deepspeed

            self.frozen_model = prepare_deepspeed(self.frozen_model, self.accelerator)
        if self.rehearse_model is not None:
            if self.args.gradient_checkpointing:  # as HF's Trainer does for the policy
                self.rehearse_model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
                if _is_peft(self.rehearse_model):
                    self.rehearse_model.enable_input_require_grads()
            self.rehearse_model = self.accelerator.prepare_model(self.rehearse_model)

    # ---- rollout ----------------------------------------------------------------------------
    def _frozen_context(self) -> Any:
        """The frozen initial policy: the LoRA adapter disabled (or the warm-start "ref" copy)."""
        model = self.accelerator.unwrap_model(self.model)
        if not _is_peft(model):
            return contextlib.nullcontext()
        return use_adapter(model, "ref" if "ref" in model.peft_config else None)

    def _step_seed(self, step: int) -> int:
        """The seed of step ``step``'s sampling, rollout and reward control: ``run.seed * 100_003
        + step``, so that a resumed step samples as it would have."""
        return self.cfg.run.seed * 100_003 + step

    def _generators(self, step: int, batch: int) -> tuple[Any, Any]:
        """``(generator, simulator)`` for this step's rollout."""
        from envace_lite.llm.generation import HFGenerator

        if self._generator_override is not None:
            return self._generator_override, self._generator_override
        seed = self._step_seed(step)
        batch = min(batch, self.cfg.rollout.generation_batch_size or batch)  # rows per generate

        def hf(model: Any) -> Any:
            return HFGenerator(self.accelerator.unwrap_model(model), self.processing_class,
                               seed=seed, batch_size=max(1, batch),
                               prefix_cache=self.cfg.rollout.prefix_cache_tokens)

        policy = hf(self.model)
        if self.use_vllm:  # rollout.generation_backend: vllm_server / vllm_colocate
            from envace_lite.llm.vllm_generation import VLLMGenerator

            if self._last_loaded_step != self.state.global_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            policy = VLLMGenerator(self.vllm_generation, self.processing_class,
                                   self.accelerator.unwrap_model(self.model))
        if self.mode == "per_role":
            return RoleRoutedGenerator({"act": policy, "rehearse": hf(self.rehearse_model)}), None
        if self.mode == "act_only":
            if self.frozen_model is not None:
                return policy, hf(self.frozen_model)
            # LoRA: the adapter switched off; on HF generation unless the policy's backend is HF
            # (config.finalize refuses a vLLM backend here unless frozen_simulator_backend='hf')
            sampler = hf(self.model) if self.cfg.grpo.frozen_simulator_backend == "hf" else policy
            return policy, _InContext(sampler, self._frozen_context)
        return policy, None

    def _generation_weights(self) -> Any:
        """Under DeepSpeed ZeRO-3 with HF generation, the policy's full weights for the rollout.

        ``generate`` on sharded weights gathers each layer in every forward pass: a collective
        that hangs when ranks generate different numbers of tokens or calls. TRL's
        ``unwrap_model_for_generation`` gathers them once (``ds3_gather_for_generation``, on by
        default; 2 bytes/parameter per GPU in bf16) so that generation is local to each rank.
        """
        if not self.is_deepspeed_enabled or self.use_vllm:
            return contextlib.nullcontext()
        from trl.models import unwrap_model_for_generation

        return unwrap_model_for_generation(
            self.model_wrapped, self.accelerator,
            gather_deepspeed3_params=self.args.ds3_gather_for_generation)

    def _rollout(self, tasks: list[Any], k: int, step: int) -> list[Trajectory]:
        if self._rollout_fn is not None:
            return self._rollout_fn(tasks, k, step)
        from envace_lite.core.rollout import close_envs, rollout

        with self._generation_weights():
            generator, simulator = self._generators(step, len(tasks) * k)
            trajs = rollout(tasks, generator, self.processing_class, self.cfg, k=k,
                            mode=ROLLOUT_MODE[self.mode], simulator=simulator,
                            seed=self._step_seed(step))
        self._score(trajs, step)
        close_envs(trajs)
        return trajs

    def _score(self, trajs: list[Trajectory], step: int) -> None:
        """Judge each trajectory's task reward in place, then apply the reward controls the
        config asks for.

        The checklist judge runs in every mode, so that the paper's Fig. 3 ablations share one
        reward. A control run (beyond the paper; none for the paper's configs) then rewrites the
        judged rewards: each control a plugin registered that this config chooses
        (``rewards.chosen_reward_controls``; the drills study's ``study.reward_control="shuffle"``
        permutes them inside each task's group, ``drills/reward_control.py``), seeded by
        ``_step_seed(step)``, the rollout's seed, and the count moved is logged.
        """
        from envace_lite.core.judge import LLMJudge
        from envace_lite.core.rewards import chosen_reward_controls, score_trajectories

        g = self.cfg.grpo
        judge = "rule" if g.judge == "rule" else LLMJudge(g.judge_url, g.judge_model)
        score_trajectories(trajs, judge=judge)
        for name, control in chosen_reward_controls(self.cfg):  # a control run
            changed = control(trajs, self._step_seed(step))
            log.info("step %d: reward control %r moved %d of %d trajectory rewards",
                     step, name, changed, len(trajs))

    # ---- rows, advantages, weights (the override) -------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        g, k, device = self.cfg.grpo, self.num_generations, self.accelerator.device
        index = [int(x["task_index"]) for x in inputs]
        firsts = index[::k]
        if index != [i for i in firsts for _ in range(k)]:
            raise RuntimeError(f"the generation batch is not in groups of {k} repeats: {index}")
        start = time.perf_counter()
        trajs = self._rollout([self.tasks[i] for i in firsts], k, self.state.global_step)
        rollout_seconds = time.perf_counter() - start

        # Eq. 4-5: each output y_{i,m} gets R_i; A_{i,m} = R_i − μ_{x,r}, one baseline per (x, r)
        rewards, task_ids, roles, valid = flatten_outputs(trajs, g.empty_output_penalty)
        role_ix = torch.tensor([ROLES.index(r) for r in roles], dtype=torch.long)
        trained = valid & torch.tensor([r in self.trained_roles for r in roles], dtype=torch.bool)
        if self.mode.startswith("act_only") and g.act_only_baseline == "trajectories":
            adv = trajectory_advantages(rewards, *output_trajectories(trajs), task_ids, trained,
                                        singleton=g.singleton_baseline, scale_std=g.scale_std)
        else:
            adv = rolewise_advantages(rewards, task_ids, roles, trained,
                                      singleton=g.singleton_baseline, scale_std=g.scale_std)
        rows = build_rows(trajs, self.row_layout, self.trained_roles).trained_only(trained)
        lengths = output_lengths(rows, len(roles))

        # Eq. 6: the per-token weights of the aggregation, carried into TRL's loss by tool_mask.
        # Per-role normalisation in per_role (two independent objectives); global otherwise.
        groups = [(r, role_ix == ROLES.index(r)) for r in ROLES] if self.mode == "per_role" \
            else [("all", torch.ones_like(trained))]
        weights, totals = torch.zeros(len(roles)), {}
        for name, sel in groups:
            live = trained & sel & (lengths > 0)
            t, m = self._global_sum(torch.stack([lengths[live].sum(), live.sum()]).float())
            weights += loss_weights(lengths, trained & sel, g.aggregation, t, m)
            totals[name] = t
        n_rows = self._padded_rows(len(rows.role))
        batch = collate_rows(rows, adv, weights, self.processing_class.pad_token_id, n_rows)
        batch = {key: val.to(device) for key, val in batch.items()}
        batch["num_items_in_batch"] = torch.tensor(totals.get("all", 0.0), device=device)
        for name in ROLES:
            batch[f"num_items_{name}"] = torch.tensor(totals.get(name, 0.0), device=device)
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self._ref_logps(batch)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            batch["importance_sampling_ratio"] = self._vllm_is_ratio(batch, rows, trajs)
        self.last_record = StepRecord(trajs, rewards, task_ids, roles, valid, trained, adv,
                                      lengths, len(rows.role), n_rows - len(rows.role),
                                      rollout_seconds)
        return batch

    def _global_sum(self, x: torch.Tensor) -> list[float]:
        return self.accelerator.reduce(x.to(self.accelerator.device), reduction="sum").tolist()

    def _padded_rows(self, n: int) -> int:
        """Rows after padding: the cross-rank maximum, rounded up to ``steps_per_generation``."""
        spg = self.args.steps_per_generation
        most = int(self.accelerator.gather(torch.tensor([n], device=self.accelerator.device)).max())
        return max(spg, math.ceil(most / spg) * spg)

    @torch.no_grad()
    def _vllm_is_ratio(self, batch: dict[str, torch.Tensor], rows: Rows,
                       trajs: list[Trajectory]) -> torch.Tensor:
        """Truncated per-token π_train/π_vLLM (``vllm_generation.importance_weights``), (B, C)."""
        from envace_lite.llm.vllm_generation import importance_weights, row_sampling_logps

        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep, size = batch["completion_ids"].shape[1], self.args.per_device_train_batch_size
        train = self._get_per_token_logps_and_entropies(self.model, ids, attention, keep,
                                                        batch_size=size)[0]
        owners = [torch.tensor(o, dtype=torch.long) for o in rows.owner]
        owners += [torch.tensor([-1])] * (ids.shape[0] - len(owners))
        owner = pad(owners, padding_value=-1, padding_side="right")
        sampled = row_sampling_logps(owner, [o.logprobs for t in trajs for o in t.outputs])
        return importance_weights(train, sampled, self.vllm_importance_sampling_clip_max,
                                  self.vllm_importance_sampling_mode)

    @torch.no_grad()
    def _ref_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token log-probs of the reference (frozen initial) policy, shape (B, C)."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep, size = batch["completion_ids"].shape[1], self.args.per_device_train_batch_size
        if self.frozen_model is not None:
            return self._get_per_token_logps_and_entropies(self.frozen_model, ids, attention, keep,
                                                           batch_size=size)[0]
        with self._frozen_context():
            return self._get_per_token_logps_and_entropies(self.model, ids, attention, keep,
                                                           batch_size=size)[0]

    # ---- loss: per_role sends each role's rows to its own policy ----------------------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if self.mode != "per_role":
            return super()._compute_loss(model, inputs)
        loss = 0.0
        rows = inputs["row_role"].shape[0]
        for r, role in enumerate(ROLES):
            sel = inputs["row_role"] == r
            empty = not bool(sel.any())
            if empty:  # keep every rank's forward/backward collectives aligned: a zero-weight row
                sel = torch.zeros_like(sel)
                sel[0] = True
            sub = {key: (val[sel] if isinstance(val, torch.Tensor) and val.dim() > 0
                         and val.shape[0] == rows else val) for key, val in inputs.items()}
            if empty:
                sub["tool_mask"] = torch.zeros_like(sub["tool_mask"])
            sub["num_items_in_batch"] = inputs[f"num_items_{role}"]
            loss = loss + super()._compute_loss(model if role == "act" else self.rehearse_model, sub)
        return loss


def _adapter_trained(model: Any) -> bool:
    """True when a PEFT model's LoRA B matrices are not all zero (a loaded, trained adapter)."""
    return any(bool(p.detach().abs().sum() > 0) for n, p in model.named_parameters()
               if "lora_B" in n)


def _rewards_come_from_rollouts(*args: Any, **kwargs: Any) -> list[float]:
    """Placeholder for TRL's required ``reward_funcs``; rewards come from ``rewards.py``."""
    raise RuntimeError("RoleWiseGRPOTrainer scores trajectories itself; this is never called")
