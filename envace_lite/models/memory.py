"""A memory plan for one GPU: what a role-wise GRPO step of a Qwen3 policy with LoRA holds.

Four terms, each computed from the model's shape and the run's caps (no GPU needed):

* **weights**: every parameter of the base model in its dtype (2 bytes in bf16/fp16);
* **adapter and optimizer state**: the LoRA parameters in fp32 (4 bytes), their fp32 gradients
  (4) and AdamW's two fp32 moments (8): 16 bytes per adapter parameter;
* **KV cache** while sampling: ``2 × layers × kv_heads × head_dim × dtype bytes`` per token, for
  ``max_prompt_tokens + max_new_tokens`` tokens per sequence, **twice** (a copy of the batch's
  cache exists during the prompt pass), plus one layer's prefill activations, and the sampler's
  prefix cache (``rollout.prefix_cache_tokens`` ids of keys and values, kept between calls);
* **training activations** of one trajectory, with gradient checkpointing: the input of every
  decoder layer per token (``layers × hidden × dtype bytes``), one layer's recomputed activations
  for the longest row (``(3h + 2·q + 2·kv + 4·intermediate) × dtype bytes`` per token, the saved
  tensors of attention and a SwiGLU MLP), and the completion logits (the LM head runs on
  completion positions only: bf16 logits, their temperature-scaled copy and the log-softmax kept
  for the backward, ``3 × vocab × dtype bytes`` per completion token).

A trajectory is planned at its worst case under the caps: one packed ACT row of at most
``max_prompt_tokens + max_new_tokens`` tokens (an ACT prompt over ``max_prompt_tokens`` ends the
episode) whose completion part is everything after the first prompt, plus one REHEARSE row of at
most the same length per tool call, each with at most ``max_new_tokens`` completion tokens.

From these, ``plan`` chooses the **gradient accumulation** (the smallest divisor of the step's
trajectories whose micro-batch fits) and the **generation batch size** (the largest divisor of
the step's rollouts whose sampling fits), in ``budget × GPU memory`` (default 0.9: the CUDA
context, allocator fragmentation and the reference forward's transient tensors take the rest).
These are estimates: ``docs/before-the-workshop.md`` marks every figure as computed or measured.

Usage::

    from envace_lite.models.memory import QWEN3, plan
    p = plan(QWEN3["Qwen/Qwen3-1.7B"], gpu_gib=80, prompt_tokens=4386, tool_calls=10)
    p["gradient_accumulation_steps"], p["generation_batch_size"]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3


@dataclass(frozen=True)
class Shape:
    """A dense decoder's sizes (a Hugging Face ``config.json``'s names)."""

    hidden: int
    """``hidden_size``."""
    intermediate: int
    """``intermediate_size`` (SwiGLU MLP: gate, up and down projections)."""
    layers: int
    """``num_hidden_layers``."""
    heads: int
    """``num_attention_heads``."""
    kv_heads: int
    """``num_key_value_heads``."""
    head_dim: int
    """``head_dim``."""
    vocab: int
    """``vocab_size`` (tied input and output embeddings count once)."""

    def proj(self, name: str) -> tuple[int, int]:
        """``(in, out)`` features of an attention or MLP projection (``q_proj`` … ``down_proj``).

        Raises:
            KeyError: a name that is no projection of the decoder layer.
        """
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, \
            self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}[name]

    def parameters(self) -> int:
        """Parameters of the model: the tied embedding, the 7 projections and 4 norms per layer
        (``input_layernorm``, ``post_attention_layernorm``, ``q_norm``, ``k_norm``), the final
        norm. Qwen3-1.7B: 1,720,574,976 (its model card: 1.7B, 1.4B without the embedding)."""
        per_layer = sum(a * b for a, b in map(self.proj, (
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))
        per_layer += 2 * self.hidden + 2 * self.head_dim
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden


QWEN3: dict[str, Shape] = {
    "Qwen/Qwen3-0.6B": Shape(1024, 3072, 28, 16, 8, 128, 151936),
    "Qwen/Qwen3-1.7B": Shape(2048, 6144, 28, 16, 8, 128, 151936),
    "Qwen/Qwen3-8B": Shape(4096, 12288, 36, 32, 8, 128, 151936),
}
"""The Qwen3 dense models of the paper and the workshop, from their hub ``config.json``."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of a ``model.dtype``."""


def lora_parameters(shape: Shape, r: int, targets: list[str] | tuple[str, ...]) -> int:
    """LoRA parameters: ``r × (in + out)`` per targeted projection and layer (0 when r = 0)."""
    return shape.layers * sum(r * sum(shape.proj(t)) for t in targets) if r > 0 else 0


def kv_bytes_per_token(shape: Shape, dtype_bytes: int = 2) -> int:
    """Bytes of keys and values per token: ``2 × layers × kv_heads × head_dim × bytes``
    (Qwen3-1.7B in bf16: 114,688)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def layer_activation_bytes_per_token(shape: Shape, dtype_bytes: int = 2) -> int:
    """Saved activations of one decoder layer per token (attention with a fused kernel, SwiGLU):
    the two norms' inputs and the attention output (3h), q and its output (2q), k and v (2kv),
    gate, up, their activation and product (4i)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return (3 * shape.hidden + 2 * q + 2 * kv + 4 * shape.intermediate) * dtype_bytes


def trajectory_activation_bytes(shape: Shape, *, dtype_bytes: int, prompt_tokens: int,
                                tool_calls: int, max_prompt_tokens: int,
                                max_new_tokens: int) -> dict[str, int]:
    """Training activations of one worst-case trajectory, with gradient checkpointing.

    Args:
        prompt_tokens: tokens of the task's first ACT prompt h_0 (measured per suite).
        tool_calls: REHEARSE rows of the trajectory (one per tool call).
        max_prompt_tokens, max_new_tokens: the rollout caps (``rollout.max_prompt_tokens``,
            the larger of ``max_new_tokens_act`` and ``max_new_tokens_rehearse``).

    Returns:
        ``{"tokens", "completion_tokens", "checkpoints", "recompute", "logits", "total"}`` in
        tokens and bytes.
    """
    row = max_prompt_tokens + max_new_tokens
    rows = 1 + tool_calls
    completion = max(0, row - prompt_tokens) + tool_calls * max_new_tokens
    checkpoints = rows * row * shape.layers * shape.hidden * dtype_bytes
    recompute = row * layer_activation_bytes_per_token(shape, dtype_bytes)
    logits = completion * shape.vocab * 3 * dtype_bytes
    return {"tokens": rows * row, "completion_tokens": completion, "checkpoints": checkpoints,
            "recompute": recompute, "logits": logits,
            "total": checkpoints + recompute + logits}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(shape: Shape, *, gpu_gib: float, prompt_tokens: int, tool_calls: int,
         dtype: str = "bfloat16", lora_r: int = 64,
         lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
         max_prompt_tokens: int = 12000, max_new_tokens: int = 1024,
         trajectories_per_step: int = 32, prefix_cache_tokens: int = 32768,
         budget: float = 0.9) -> dict[str, Any]:
    """The memory plan of one role-wise GRPO step on one GPU (the module docstring's terms).

    Args:
        shape: the model (``QWEN3[name]``).
        gpu_gib: the card's memory in GiB (a T4: 15, an A100: 40 or 80, an H100: 80).
        prompt_tokens, tool_calls: the suite's first ACT prompt and REHEARSE rows per trajectory.
        dtype: ``model.dtype`` of the frozen base weights.
        lora_r, lora_targets: the adapter (``model.lora_r``, ``model.lora_target_modules``).
        max_prompt_tokens, max_new_tokens: the rollout caps.
        trajectories_per_step: ``grpo.prompts_per_step × grpo.num_generations``.
        prefix_cache_tokens: ids the sampler's prefix cache keeps (``rollout.prefix_cache_tokens``).
        budget: the share of the card a plan may fill.

    Returns:
        GiB per term (``weights``, ``adapter_optimizer``, ``kv_cache_per_sequence``,
        ``generation_per_sequence``, ``activations_per_trajectory`` and its parts), the chosen
        ``gradient_accumulation_steps`` and ``generation_batch_size`` (0 when not even one
        trajectory or sequence fits), and ``fits``.

    Raises:
        KeyError: an unknown ``dtype`` or LoRA target.
    """
    b = DTYPE_BYTES[dtype]
    weights = shape.parameters() * b
    adapter = lora_parameters(shape, lora_r, lora_targets) * 16
    if lora_r == 0:  # full fine-tuning: fp32 grads and AdamW moments for every parameter
        adapter = shape.parameters() * 12
    static = weights + adapter
    room = budget * gpu_gib * GIB - static
    seq = max_prompt_tokens + max_new_tokens
    kv = kv_bytes_per_token(shape, b) * seq
    gen = 2 * kv + seq * shape.intermediate * 3 * b  # cache, its prefix copy, prefill MLP
    act = trajectory_activation_bytes(shape, dtype_bytes=b, prompt_tokens=prompt_tokens,
                                      tool_calls=tool_calls, max_prompt_tokens=max_prompt_tokens,
                                      max_new_tokens=max_new_tokens)
    ga = next((d for d in _divisors(trajectories_per_step)
               if trajectories_per_step // d * act["total"] <= room), 0)
    prefix = prefix_cache_tokens * kv_bytes_per_token(shape, b)
    gen_batch = max((d for d in _divisors(trajectories_per_step) if prefix + d * gen <= room),
                    default=0)
    g = lambda x: round(x / GIB, 2)  # noqa: E731
    return {
        "parameters": shape.parameters(), "lora_parameters": lora_parameters(
            shape, lora_r, lora_targets), "gpu_gib": gpu_gib, "budget": budget,
        "weights": g(weights), "adapter_optimizer": g(adapter),
        "kv_cache_per_sequence": g(kv), "generation_per_sequence": g(gen),
        "activations_per_trajectory": g(act["total"]), "checkpoints": g(act["checkpoints"]),
        "logits": g(act["logits"]), "recompute": g(act["recompute"]),
        "trajectory_tokens": act["tokens"], "completion_tokens": act["completion_tokens"],
        "gradient_accumulation_steps": ga, "generation_batch_size": gen_batch,
        "peak_train": g(static + (trajectories_per_step // ga * act["total"] if ga else 0)),
        "prefix_cache": g(prefix), "peak_generation": g(static + prefix + gen_batch * gen),
        "fits": bool(ga and gen_batch),
    }


__all__ = ["DTYPE_BYTES", "GIB", "QWEN3", "Shape", "kv_bytes_per_token",
           "layer_activation_bytes_per_token", "lora_parameters", "plan",
           "trajectory_activation_bytes"]


SUITE_ROWS: dict[str, dict[str, int]] = {
    "bfcl-base": {"full": 4386, "compact": 881, "calls": 10},
    "tau2-telecom": {"full": 9918, "compact": 1229, "calls": 12},
}
"""Measured with the Qwen3 tokenizer on the first 40 train tasks of each suite: the mean tokens of
the first ACT prompt h_0 under each rendering, and the most gold tool calls of one task (the
REHEARSE rows of a trajectory that makes the gold calls)."""

SETTINGS: tuple[dict[str, Any], ...] = (
    {"setting": "gpu", "card": "H100 / A100 80 GB", "gpu_gib": 80, "model": "Qwen/Qwen3-1.7B",
     "dtype": "bfloat16", "lora_r": 64, "rendering": "full", "max_prompt_tokens": 12000,
     "max_new_tokens": 1024, "trajectories_per_step": 32, "max_turns": 30,
     "prefix_cache_tokens": 32768},
    {"setting": "gpu", "card": "A100 40 GB", "gpu_gib": 40, "model": "Qwen/Qwen3-1.7B",
     "dtype": "bfloat16", "lora_r": 64, "rendering": "full", "max_prompt_tokens": 12000,
     "max_new_tokens": 1024, "trajectories_per_step": 32, "max_turns": 30,
     "prefix_cache_tokens": 32768},
    {"setting": "gpu, model.name=Qwen/Qwen3-0.6B", "card": "A100 40 GB", "gpu_gib": 40,
     "model": "Qwen/Qwen3-0.6B", "dtype": "bfloat16", "lora_r": 64, "rendering": "full",
     "max_prompt_tokens": 12000, "max_new_tokens": 1024, "trajectories_per_step": 32, "max_turns": 30,
     "prefix_cache_tokens": 32768},
    {"setting": "colab", "card": "T4 16 GB", "gpu_gib": 15, "model": "Qwen/Qwen3-0.6B",
     "dtype": "float16", "lora_r": 32, "rendering": "compact", "max_prompt_tokens": 4096,
     "max_new_tokens": 256, "trajectories_per_step": 8, "max_turns": 8,
     "prefix_cache_tokens": 8192},
    {"setting": "colab, model.name=Qwen/Qwen3-1.7B", "card": "T4 16 GB", "gpu_gib": 15,
     "model": "Qwen/Qwen3-1.7B", "dtype": "float16", "lora_r": 32, "rendering": "compact",
     "max_prompt_tokens": 4096, "max_new_tokens": 256, "trajectories_per_step": 8, "max_turns": 8,
     "prefix_cache_tokens": 8192},
)
"""The settings of the plan table: the ``gpu`` and ``colab`` profiles and their documented
``--set model.name=...`` variants (a T4 reports 15 GiB of usable memory)."""


def setting_plan(setting: dict[str, Any], suite: str) -> dict[str, Any]:
    """``plan`` of one entry of ``SETTINGS`` on one suite of ``SUITE_ROWS``: the suite's gold
    calls, at most ``max_turns`` of them, are the trajectory's REHEARSE rows."""
    rows = SUITE_ROWS[suite]
    keys = ("dtype", "lora_r", "max_prompt_tokens", "max_new_tokens", "trajectories_per_step",
            "prefix_cache_tokens")
    return plan(QWEN3[setting["model"]], gpu_gib=setting["gpu_gib"],
                prompt_tokens=rows[setting["rendering"]],
                tool_calls=min(rows["calls"], setting["max_turns"]),
                **{k: setting[k] for k in keys})


def plan_table() -> str:
    """The memory plan of every ``SETTINGS`` entry on both suites, as a markdown table (GiB;
    the table of ``docs/before-the-workshop.md``)."""
    head = ("| setting | card | model, dtype, LoRA r | suite, rendering | caps (prompt / new, "
            "calls) | weights | adapter + AdamW | KV cache per sequence | activations per "
            "trajectory (of it: checkpoints, logits) | accumulation | generation batch | planned "
            "peak: train / sampling |")
    lines = [head, "|" + "---|" * 12]
    for s in SETTINGS:
        for suite in SUITE_ROWS:
            p = setting_plan(s, suite)
            ga = p["gradient_accumulation_steps"] or "does not fit"
            train = f"{p['peak_train']:.1f}" if p["gradient_accumulation_steps"] else "-"
            lines.append(
                f"| `{s['setting']}` | {s['card']} | {s['model'].split('/')[1]}, {s['dtype']}, "
                f"{s['lora_r']} | {suite}, {s['rendering']} | {s['max_prompt_tokens']} / "
                f"{s['max_new_tokens']}, {min(SUITE_ROWS[suite]['calls'], s['max_turns'])} | {p['weights']:.2f} | "
                f"{p['adapter_optimizer']:.2f} | {p['kv_cache_per_sequence']:.2f} | "
                f"{p['activations_per_trajectory']:.2f} ({p['checkpoints']:.2f}, "
                f"{p['logits']:.2f}) | {ga} | {p['generation_batch_size']} | "
                f"{train} / {p['peak_generation']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(plan_table())
