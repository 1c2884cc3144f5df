"""vLLM generation in training: TRL's vLLM engine or server client behind our ``Generator``.

``rollout.generation_backend`` picks who samples the rollouts of ``train()``:

* ``hf``: the policy's own ``generate`` (``generation.HFGenerator``); the default everywhere.
* ``vllm_server``: a ``vllm serve`` process on dedicated GPUs (``scaled/launch.py vllm-server``).
  TRL's ``VLLMClient`` talks to it and pushes the new weights over NCCL once per step
  (``VLLMGeneration.sync_weights``). Generation is a **collective**: every rank's prompts are
  gathered, rank 0 posts them all in one request, and the completions are broadcast back. A
  multi-turn rollout therefore makes the same number of calls per turn on every rank
  (``rollout.sync_generate_calls``, forced on by ``Config.finalize``), and a rank with nothing
  left to generate calls with an empty batch. Unlike TRL's own ``VLLMGeneration.generate``, the
  ranks may send different numbers of prompts: the slices are cut from the gathered counts.
* ``vllm_colocate``: one in-process engine per rank (TRL's colocate mode); no collective.

vLLM samples from its own kernels, so its log-probabilities differ slightly from the trainer's.
With ``rollout.vllm_importance_sampling`` each trained token's loss is multiplied by the truncated
ratio min(π_train/π_vLLM, cap) (``importance_weights``), the correction TRL applies to its own
vLLM rollouts. With ``hf`` the samples come from the trained weights themselves: there is nothing
to correct.

Weight sync uses vLLM's NCCL weight-transfer engine, which needs CUDA: on a CPU machine the
server mode cannot receive new weights at all (TRL raises ``NotImplementedError`` in
``init_communicator``). Everything else here runs on CPU and is tested there.

Usage (inside ``RoleWiseGRPOTrainer`` when ``use_vllm``)::

    gen = VLLMGenerator(trainer.vllm_generation, tokenizer)
    [out] = gen.generate([prompt_ids], role="act", max_new_tokens=64, temperature=1.0, top_p=1.0)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from envace_lite.llm.generation import Completion, stop_ids

IS_MODES = ("token_truncate", "token_mask")
"""Importance-sampling modes. TRL's ``sequence_*`` modes are not offered: a packed ACT row holds
many outputs, so a row-level ratio would mix them."""


class VLLMGenerator:
    """The ``Generator`` protocol over TRL's ``VLLMGeneration`` (server or colocate mode).

    Args:
        vllm_generation: ``trainer.vllm_generation`` (``trl.generation.vllm_generation``); only its
            ``mode``, ``vllm_client`` (server, rank 0), ``accelerator`` and, for colocate,
            ``generate`` and sampling attributes are used.
        tokenizer: decodes ``Completion.text`` and supplies the stop ids.
        model: for the stop ids of its generation config (optional).

    Attributes:
        calls: ``generate`` calls made (empty ones included).
    """

    def __init__(self, vllm_generation: Any, tokenizer: Any, model: Any = None) -> None:
        self.vg, self.tokenizer = vllm_generation, tokenizer
        self.stop_ids = set(stop_ids(model, tokenizer))
        self.calls = 0

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Completion]:
        """Complete ``prompts`` (possibly none); see ``generation.Generator``."""
        self.calls += 1
        if self.vg.mode == "server":
            ids, logprobs = self._server(prompts, max_new_tokens, temperature, top_p)
        else:
            ids, logprobs = self._colocate(prompts, max_new_tokens, temperature, top_p)
        return [self._completion(i, lp) for i, lp in zip(ids, logprobs, strict=True)]

    # ---- server mode: a collective with per-rank counts -------------------------------------
    def _server(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float) -> tuple[list[list[int]], list[Any]]:
        from accelerate.utils import broadcast_object_list, gather_object

        acc = self.vg.accelerator
        counts = gather_object([len(prompts)])
        everything = gather_object([list(p) for p in prompts])
        payload: Any = None
        if acc.is_main_process:
            out = {"completion_ids": [], "logprobs": None}
            if everything:
                out = self.vg.vllm_client.generate(
                    prompts=everything, n=1, temperature=temperature, top_p=top_p, top_k=0,
                    min_p=0.0, repetition_penalty=1.0, max_tokens=max_new_tokens, logprobs=0)
            payload = (out["completion_ids"], out["logprobs"])
        box = [payload]
        broadcast_object_list(box, from_process=0)
        completion_ids, logprobs = box[0]
        return rank_slice(completion_ids, logprobs, counts, acc.process_index)

    # ---- colocate mode: this rank's own engine ----------------------------------------------
    def _colocate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                  top_p: float) -> tuple[list[list[int]], list[Any]]:
        if not prompts and getattr(self.vg, "tensor_parallel_size", 1) == 1:
            return [], []
        vg = self.vg
        saved = (vg.max_completion_length, vg.temperature, vg.top_p)
        vg.max_completion_length, vg.temperature, vg.top_p = max_new_tokens, temperature, top_p
        try:
            _, completion_ids, logprobs, _ = vg.generate([list(p) for p in prompts], None, 1)
        finally:
            vg.max_completion_length, vg.temperature, vg.top_p = saved
        return list(completion_ids), list(logprobs) if logprobs is not None else [None] * len(prompts)

    def _completion(self, ids: Sequence[int], logprobs: Any) -> Completion:
        ids = [int(i) for i in ids]
        kept, reason = len(ids), "length"
        for k, tok in enumerate(ids):
            if tok in self.stop_ids:
                kept, reason = k, "stop"
                break
        lps = None
        if logprobs is not None:  # (L, 1): the sampled token's logprob first
            lps = [float(x[0]) if isinstance(x, (list, tuple)) else float(x) for x in logprobs]
            lps = lps[:kept]
        return Completion(ids=ids[:kept], text=self.tokenizer.decode(ids[:kept]), logprobs=lps,
                          finish_reason=reason)


def rank_slice(completion_ids: list[Any], logprobs: list[Any] | None, counts: Sequence[int],
               rank: int) -> tuple[list[Any], list[Any]]:
    """This rank's share of completions gathered in rank order, from every rank's prompt count.

    Args:
        completion_ids: one entry per prompt of every rank, rank 0's first.
        logprobs: the same length, or None (no logprobs: None per completion).
        counts: prompts per rank, in rank order (``gather_object([len(prompts)])``).
        rank: this process's index.

    Raises:
        ValueError: the counts do not add up to the completions.
    """
    if sum(counts) != len(completion_ids):
        raise ValueError(f"{len(completion_ids)} completions for {sum(counts)} gathered prompts "
                         f"(per rank {list(counts)})")
    start = sum(counts[:rank])
    part = slice(start, start + counts[rank])
    lps = logprobs[part] if logprobs is not None else [None] * counts[rank]
    return list(completion_ids[part]), list(lps)


def row_sampling_logps(owner: torch.Tensor, logprobs: Sequence[Sequence[float] | None]
                       ) -> torch.Tensor:
    """The sampler's log-probability of every completion token of the rows, NaN where unknown.

    ==========  ======  ================================================================
    argument    shape   meaning
    ==========  ======  ================================================================
    owner       (B, C)  flat output index of each completion token (-1: context/padding)
    logprobs    N       per output, the sampler's logprob of each sampled id, or None
    returns     (B, C)  float32; token j of output k gets ``logprobs[k][j]``; NaN elsewhere
    ==========  ======  ================================================================

    The tokens of output k appear in its row in sampling order, so the j-th token owned by k is
    its j-th sampled id. The stop token that the rollout appends has no sampler logprob (NaN).
    """
    out = torch.full(owner.shape, math.nan, dtype=torch.float32)
    for b in range(owner.shape[0]):
        seen: dict[int, int] = {}
        for t, k in enumerate(owner[b].tolist()):
            if k < 0:
                continue
            j = seen.get(k, 0)
            seen[k] = j + 1
            lp = logprobs[k]
            if lp is not None and j < len(lp):
                out[b, t] = float(lp[j])
    return out


def importance_weights(train_logps: torch.Tensor, sampling_logps: torch.Tensor,
                       cap: float = 3.0, mode: str = "token_truncate") -> torch.Tensor:
    """Per-token importance weights π_train/π_sampler for off-policy vLLM samples.

    Args:
        train_logps: (B, C) log-probs of the sampled tokens under the trained weights (no grad).
        sampling_logps: (B, C) the sampler's log-probs; NaN where unknown (weight 1).
        cap: ``token_truncate``: min(ratio, cap) (truncated IS); ``token_mask``: ratios above cap
            get weight 0.
        mode: ``token_truncate`` or ``token_mask``.

    Returns:
        (B, C) float weights, to multiply into the per-token loss.
    """
    if mode not in IS_MODES:
        raise ValueError(f"importance sampling mode={mode!r}: use one of {IS_MODES}")
    diff = torch.nan_to_num(train_logps.float() - sampling_logps.float().to(train_logps.device),
                            nan=0.0)
    ratio = torch.exp(diff)
    if mode == "token_truncate":
        return torch.clamp(ratio, max=cap)
    return ratio.masked_fill(ratio > cap, 0.0)


__all__ = ["IS_MODES", "VLLMGenerator", "importance_weights", "rank_slice", "row_sampling_logps"]
