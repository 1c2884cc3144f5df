"""Generation behind one protocol: HF ``generate``, and a scripted fake (docs/design.md, "Generation
and history").

Prompts and completions are token ids. The ACT history is an append-only list of ids (the sampled
ids verbatim plus template glue), so nothing here re-tokenizes model output: ``Completion.ids`` are
exactly the sampled ids, without padding and without the stop token, and ``Completion.text`` is
derived from them.

Batching matters about 8x on CPU (docs/design.md, "Machine facts"), so ``HFGenerator`` takes the
whole turn's prompts at once, left-pads them and calls ``model.generate`` once per ``batch_size``
chunk.

Prompts share long prefixes: every trajectory of a suite starts with the same system prompt and
tool schemas, and a trajectory's next ACT prompt extends its last one (the history is
append-only). With its prefix cache on, ``HFGenerator`` prefills only the part of a prompt that
no cached prompt shares and decodes on that cache itself (``prefix_cache.py``: ``PrefixCache``,
``cached_prefill``, ``compact_decode``).

Usage::

    from envace_lite.llm.generation import HFGenerator, chat_ids
    gen = HFGenerator(model, tokenizer, seed=0)
    ids = chat_ids(tokenizer, [{"role": "user", "content": "Hi"}])
    [out] = gen.generate([ids], role="act", max_new_tokens=32, temperature=0.0, top_p=1.0)
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from envace_lite.llm.prefix_cache import (
    PrefixCache,
    cache_kwarg,
    cached_prefill,
    compact_decode,
    prefix_cache_supported,
)

log = logging.getLogger(__name__)


@dataclass
class Completion:
    """One generated output.

    Attributes:
        ids: the sampled token ids, verbatim; padding and the final stop token removed.
        text: ``ids`` decoded (special tokens kept unless the generator was told otherwise).
        logprobs: per-token log-probabilities of ``ids`` at the sampling temperature (before
            top-p), one per id; None when not requested.
        finish_reason: ``"stop"`` (a stop token ended it) or ``"length"`` (``max_new_tokens``).
    """

    ids: list[int]
    text: str
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@runtime_checkable
class Generator(Protocol):
    """What the rollout engine needs: token-id prompts in, one ``Completion`` per prompt out."""

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Completion]:
        """Complete every prompt; ``temperature == 0`` means greedy. Order is preserved."""
        ...


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
             tools: list[dict[str, Any]] | None = None, **template_kwargs: Any) -> list[int]:
    """Render ``messages`` with the tokenizer's chat template and return the ids as a list.

    For templates that know ``enable_thinking`` (Qwen3's), it is set to False unless given: the
    generation prompt then ends in an empty ``<think>\\n\\n</think>\\n\\n`` block and the model
    answers directly. Runs stay compact and the ACT output is the call, not a reasoning trace.

    Args:
        tokenizer: a tokenizer with a chat template.
        messages: ``[{"role": ..., "content": ...}, ...]`` (``tool_calls`` as the template expects).
        add_generation_prompt: end with the assistant header (for generation).
        tools: OpenAI-style tool schemas, rendered by templates that support them.
        **template_kwargs: extra template variables.

    Returns:
        The token ids, a plain ``list[int]`` (transformers 5 returns a ``BatchEncoding``).
    """
    template = tokenizer.chat_template or ""
    if "enable_thinking" in template:
        template_kwargs.setdefault("enable_thinking", False)
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                        add_generation_prompt=add_generation_prompt,
                                        **template_kwargs)
    if hasattr(out, "keys"):  # BatchEncoding / dict
        out = out["input_ids"]
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    if out and isinstance(out[0], list):  # a batch of one
        (out,) = out
    return [int(i) for i in out]


def token_counter(tokenizer: Any) -> Callable[[str], int]:
    """``text -> number of tokens`` under ``tokenizer`` (no special tokens added): the counter
    the REHEARSE prompt builder trims with (``protocol.rehearse_prompt.rehearse_messages``)."""
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))
    return count


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """Ids that end a completion: the tokenizer's eos, ``<|im_end|>`` and the model's eos ids."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else list(eos or []))
    return sorted(i for i in ids if i is not None)


def cut_at_stop(gen: list[int], stops: set[int]) -> tuple[list[int], str, int]:
    """Cut a generated row at its first stop id: ``(ids, finish_reason, kept)``."""
    for k, tok in enumerate(gen):
        if tok in stops:
            return gen[:k], "stop", k
    return gen, "length", len(gen)


class HFGenerator:
    """Batched, left-padded ``model.generate`` on token-id prompts.

    Sampling is reproducible: each ``generate`` call seeds a private RNG from ``(seed, call
    number)``, so a fresh generator with the same seed replays the same samples for the same
    calls. Greedy decoding of a padded batch equals one-at-a-time greedy decoding.

    Args:
        model: a causal LM (plain or PEFT); it is put in eval mode during the call and restored.
        tokenizer: supplies the pad id, the stop ids and decoding.
        seed: base seed of the sampling RNG.
        batch_size: prompts per ``model.generate`` call (memory vs speed).
        return_logprobs: also return per-token log-probabilities. This keeps the logits of every
            step (``batch_size × max_new_tokens × vocab`` floats) until the chunk ends.
        skip_special_tokens: passed to ``tokenizer.decode`` for ``Completion.text``. False keeps
            the text a faithful rendering of ``ids``.
        prefix_cache: ids of ``PrefixCache`` kept across calls (0: off, every prompt is prefilled
            whole inside ``model.generate``). On, each prompt's uncached part is prefilled alone
            (no padding) and the rows' keys/values go to ``generate`` as one left-padded cache.
            Greedy outputs match the uncached ones up to float rounding of a different kernel
            order (tests/test_models.py checks them equal on a tiny fp32 model; in bf16 a near
            tie can flip). It stays off where ``prefix_cache_supported`` says why (logged). Call
            ``prefix_cache.clear()`` after writing weights through ``param.data``.
        compact: with the prefix cache on, decode in ``prefix_cache.compact_decode`` (a row
            leaves the batch when it stops) instead of ``model.generate`` (every row decodes
            until the chunk's longest stops). ``benchmarks/micro_levers.py`` measures the two
            side by side.
    """

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0, batch_size: int = 16,
                 return_logprobs: bool = False, skip_special_tokens: bool = False,
                 prefix_cache: int = 32768, compact: bool = True) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.seed, self.batch_size, self.compact = seed, batch_size, compact
        self.return_logprobs, self.skip_special_tokens = return_logprobs, skip_special_tokens
        self.stop_ids = stop_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.calls = 0
        self.decode_padding = 0  # rows decoded after they stopped (``model.generate`` only)
        self.prefix_cache = None
        self._cache_kwarg = cache_kwarg(model)  # fixed per model: not looked up per call
        if prefix_cache > 0:
            why = prefix_cache_supported(model)
            if why:
                log.info("prefix cache off for %s: %s", type(model).__name__, why)
            else:
                self.prefix_cache = PrefixCache(prefix_cache)

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Completion]:
        """Complete ``prompts``; see ``Generator.generate``. ``role`` only labels the call."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token (a chat header)")
        self.calls += 1
        # longest first, so that each chunk pads little; results go back in the caller's order
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        device = next(self.model.parameters()).device
        devices = [device] if device.type == "cuda" else []
        was_training = self.model.training
        self.model.eval()
        try:
            if self.prefix_cache is not None:
                self.prefix_cache.check(self.model)
            with torch.random.fork_rng(devices=devices), torch.inference_mode():
                torch.manual_seed(self.seed * 1_000_003 + self.calls)
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start:start + self.batch_size]
                    outs = self._generate_chunk([prompts[i] for i in chunk], device,
                                                max_new_tokens, temperature, top_p)
                    for i, out in zip(chunk, outs):
                        results[i] = out
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _generate_chunk(self, prompts: list[list[int]], device: torch.device, max_new_tokens: int,
                        temperature: float, top_p: float) -> list[Completion]:
        # ---- left padding: every prompt ends at the same column ---------------------------------
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            input_ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[row, width - len(p):] = 1
        cache = (cached_prefill(self.model, self.prefix_cache, prompts, device, width,
                                max_new_tokens, self._cache_kwarg)
                 if self.prefix_cache else None)
        sample = temperature > 0
        stops = set(self.stop_ids)
        if cache is not None and self.compact:
            rows, logprobs = compact_decode(self.model, input_ids.to(device), attention.to(device),
                                            cache, max_new_tokens, temperature, top_p,
                                            self.stop_ids, self.return_logprobs, self._cache_kwarg)
            return [self._completion(ids, stops, lp) for ids, lp in zip(rows, logprobs)]
        # Every decoding knob is set explicitly: unset ones would be filled from the model's own
        # generation config (Qwen3's hub defaults sample with top_k=20).
        knobs = {"do_sample": sample, "temperature": temperature if sample else 1.0,
                 "top_p": top_p if sample else 1.0, "top_k": 0 if sample else 50, "min_p": None,
                 "repetition_penalty": 1.0}
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
            return_dict_in_generate=True, output_logits=self.return_logprobs, **knobs,
            # a static cache is written in place; generate must not torch.compile for it
            **({self._cache_kwarg: cache, "disable_compile": True} if cache is not None else {}),
        )
        gen = out.sequences[:, width:].tolist()
        logprobs: list[list[float] | None] = [None] * len(gen)
        if self.return_logprobs:
            # (B, T, V) raw logits → log-softmax at the sampling temperature → the sampled ids
            logits = torch.stack(out.logits, dim=1).float()
            logits = logits / (temperature if sample else 1.0)
            chosen = out.sequences[:, width:width + logits.shape[1]].unsqueeze(-1)
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist()
        # rows stay in HF's batch until the chunk's longest output stops
        width_out = len(gen[0])
        self.decode_padding += sum(width_out - min(len(cut_at_stop(ids, stops)[0]) + 1, width_out)
                                   for ids in gen)
        return [self._completion(ids, stops, lp) for ids, lp in zip(gen, logprobs)]

    def _completion(self, ids: list[int], stops: set[int], logprobs: list[float] | None
                    ) -> Completion:
        """A ``Completion`` of one generated row (cut at its first stop id)."""
        ids, reason, kept = cut_at_stop(ids, stops)
        return Completion(
            ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens),
            logprobs=None if logprobs is None else logprobs[:kept], finish_reason=reason)
