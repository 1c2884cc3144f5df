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
append-only). ``PrefixCache`` keeps the key/value cache of recent prompts and ``HFGenerator``
prefills only the part of a prompt that no cached prompt shares, like vLLM's automatic prefix
caching (on the laptop rollout benchmark it skips most of the prefill: ``benchmarks/README.md``).

Usage::

    from envace_lite.llm.generation import HFGenerator, chat_ids
    gen = HFGenerator(model, tokenizer, seed=0)
    ids = chat_ids(tokenizer, [{"role": "user", "content": "Hi"}])
    [out] = gen.generate([ids], role="act", max_new_tokens=32, temperature=0.0, top_p=1.0)
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

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
    the REHEARSE prompt builder trims with (``protocol.rehearse_messages``)."""
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


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def _weights_fingerprint(model: Any) -> tuple[Any, ...]:
    """What a cached key/value depends on: each parameter's identity, storage, dtype, device and
    in-place version, and the PEFT adapter state (the active adapters; adapters disabled).

    Writes through ``param.data`` do not move ``_version``: call ``PrefixCache.clear`` after them.
    """
    params = tuple((id(p), p.data_ptr(), p.dtype, p.device, p._version)
                   for p in model.parameters())
    try:
        adapters = getattr(model, "active_adapters", None)
        adapters = adapters() if callable(adapters) else adapters
    except (AttributeError, ValueError):  # a model without adapters
        adapters = None
    disabled = any(getattr(m, "disable_adapters", False) for m in model.modules()
                   if hasattr(m, "lora_A"))
    return params, str(adapters), disabled


def _base_model(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (``model`` itself when it is not one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def prefix_cache_supported(model: Any) -> str:
    """Why ``model`` cannot use a ``PrefixCache`` ("" when it can).

    It can when its cache is one plain key/value tensor pair per layer (no sliding window, no
    linear attention, no ``cache_implementation`` of its own) and its weights are not sharded
    across processes (ZeRO-3 / FSDP: the extra batch-1 forwards would desynchronise the ranks'
    weight gathers).
    """
    from transformers import DynamicCache

    base = _base_model(model)
    if getattr(getattr(base, "generation_config", None), "cache_implementation", None):
        return "the model sets generation_config.cache_implementation"
    try:
        layers = DynamicCache(config=base.config).layers
    except Exception as err:  # noqa: BLE001 - any config the cache cannot read
        return f"DynamicCache cannot read its config ({err})"
    if any(type(layer).__name__ != "DynamicLayer" or getattr(layer, "is_sliding", False)
           for layer in layers):
        return "its cache has sliding-window or linear-attention layers"
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
        if is_deepspeed_zero3_enabled():
            return "DeepSpeed ZeRO-3 shards its weights"
    except ImportError:
        pass
    if any(type(m).__name__.startswith("FullyShardedDataParallel") for m in model.modules()):
        return "FSDP shards its weights"
    return ""


def cache_kwarg(model: Any) -> str:
    """The name of the key/value cache argument of ``model``'s forward and ``generate``:
    ``cache`` (transformers ≥ 5.24, where ``past_key_values`` is deprecated) or
    ``past_key_values`` (older 5.x)."""
    return "cache" if "cache" in inspect.signature(_base_model(model).forward).parameters \
        else "past_key_values"


class PrefixCache:
    """Key/value caches of recent prompts, reused for the longest prefix a new prompt shares.

    A causal model's keys and values at position i depend only on ``ids[:i + 1]`` (and on the
    position, the same here: a cached row starts at position 0), so an entry serves any prompt
    that shares its first n ids: slice it to n. This is what vLLM's automatic prefix caching does
    with blocks; here an entry is one prompt, found by a linear scan.

    An entry is ``(ids, kv)``: ``ids`` a 1-D long tensor, ``kv`` per layer ``(keys, values)`` of
    shape ``(1, kv_heads, len(ids), head_dim)``. Entries are evicted least recently used first
    beyond ``max_tokens`` cached ids; an entry that a new one extends is dropped at once (the new
    one serves every prompt the old one did).

    The entries are valid for one set of weights. ``check(model)`` empties the cache when any
    parameter was replaced or changed in place since the last check (an optimizer step bumps
    ``Tensor._version``), or when the PEFT adapter state changed.

    Args:
        max_tokens: ids kept over all entries. Memory per id: layers × 2 × kv_heads × head_dim ×
            dtype bytes (SmolLM2-135M in fp32: 46 KB; Qwen3-1.7B in bf16: 112 KB).

    Attributes:
        reused_tokens, prefilled_tokens: prompt ids served from the cache and ids prefilled,
            over the cache's life (the figures of ``benchmarks/rollout_throughput.py``).
    """

    def __init__(self, max_tokens: int = 32768) -> None:
        self.max_tokens = max_tokens
        self.entries: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.reused_tokens = self.prefilled_tokens = 0
        self._fingerprint: tuple[Any, ...] | None = None

    def clear(self) -> None:
        """Drop every entry (after weight changes ``check`` cannot see, e.g. ``param.data`` writes)."""
        self.entries.clear()
        self._fingerprint = None

    def check(self, model: Any) -> None:
        """Empty the cache if ``model``'s weights or adapter state changed since the last check."""
        fingerprint = _weights_fingerprint(model)
        if fingerprint != self._fingerprint:
            if self.entries:
                log.debug("prefix cache: weights changed, %d entries dropped", len(self.entries))
            self.entries.clear()
            self._fingerprint = fingerprint

    def lookup(self, ids: torch.Tensor) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """``(n, kv)``: the longest prefix of ``ids`` that an entry shares, and its keys/values
        sliced to n ids (``(0, [])`` when no entry shares a first id)."""
        best, best_i = 0, -1
        for i, (cached, _) in enumerate(self.entries):
            n = _common_prefix(cached, ids)
            if n > best:
                best, best_i = n, i
        if best == 0:
            return 0, []
        entry = self.entries.pop(best_i)
        self.entries.append(entry)  # most recently used last
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in entry[1]]

    def add(self, ids: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``(ids, kv)``; drop the entries it extends, then the oldest beyond the budget.

        Nothing is added when an entry already starts with ``ids`` (it serves them already, and
        ``kv`` would be a view pinning that entry's memory)."""
        kept = []
        for entry in self.entries:
            shared = _common_prefix(entry[0], ids)
            if shared == len(ids):  # the entry starts with ids (or equals them)
                return
            if shared < len(entry[0]):  # not extended by ids
                kept.append(entry)
        self.entries = kept + [(ids, kv)]
        total = sum(len(e[0]) for e in self.entries)
        while self.entries and total > self.max_tokens:
            total -= len(self.entries.pop(0)[0])


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
        compact: with the prefix cache on, decode in ``_decode`` (a row leaves the batch when it
            stops) instead of ``model.generate`` (every row decodes until the chunk's longest
            stops). ``benchmarks/micro_levers.py`` measures the two side by side.
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
        cache = (self._cached_prefill(prompts, device, width, max_new_tokens)
                 if self.prefix_cache else None)
        sample = temperature > 0
        stops = set(self.stop_ids)
        if cache is not None and self.compact:
            rows, logprobs = self._decode(input_ids.to(device), attention.to(device), cache,
                                          max_new_tokens, temperature, top_p)
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

    def _decode(self, input_ids: torch.Tensor, attention: torch.Tensor, cache: Any,
                max_new_tokens: int, temperature: float, top_p: float
                ) -> tuple[list[list[int]], list[list[float] | None]]:
        """Decode a left-padded chunk from a cache that holds all but each prompt's last id.

        The loop ``model.generate`` runs (the last prompt id, then one id per step, each row at
        its own position ``attention.sum() - 1``), with transformers' own temperature and top-p
        warpers, except that a row leaves the batch the step it emits a stop id: its keys and
        values are dropped from the cache, so no later step computes it. In ``model.generate``
        a finished row is decoded (as padding) until the chunk's longest output stops; the
        REHEARSE outputs of a drills seed decoded more such rows than real ids
        (``benchmarks/README.md``).

        Greedy rows equal ``model.generate``'s up to float rounding (the batch shrinks, so a
        kernel may sum in another order). Samples are reproducible per ``(seed, call)`` but not
        the same draws as ``model.generate``'s: only live rows draw.

        Args:
            input_ids: ``(B, W)`` left-padded prompts.
            attention: ``(B, W)`` 1 on prompt ids, 0 on padding.
            cache: a ``StaticCache`` of batch B holding positions ``0 .. W - 2``.
            max_new_tokens: ids per row at most (the stop id included).
            temperature: 0 is greedy.
            top_p: nucleus mass (sampling only).

        Returns:
            ``(ids, logprobs)`` per row: the generated ids (a stop id, if any, last) and their
            log-probs at the sampling temperature (before top-p), or None when not requested.
        """
        from transformers.generation.logits_process import (
            LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper)

        sample = temperature > 0
        warpers = LogitsProcessorList()
        if sample:
            warpers.append(TemperatureLogitsWarper(temperature))
            if top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p))
        batch, width = input_ids.shape
        stops = torch.tensor(sorted(set(self.stop_ids)), device=input_ids.device)
        mask = torch.cat([attention, attention.new_ones((batch, max_new_tokens))], dim=1)
        live = torch.arange(batch, device=input_ids.device)  # original row of each batch row
        step_ids = input_ids[:, -1:]
        position = attention.sum(1, keepdim=True) - 1  # each row's last prompt position
        kwargs = {self._cache_kwarg: cache}
        out: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float] | None] = [[] if self.return_logprobs else None
                                              for _ in range(batch)]
        for step in range(max_new_tokens):
            col = width + step  # columns seen, the new id included
            logits = self.model(
                input_ids=step_ids, attention_mask=mask[:, :col], position_ids=position + step,
                cache_position=torch.tensor([col - 1], device=input_ids.device),
                use_cache=True, **kwargs).logits[:, -1].float()
            scores = warpers(None, logits)
            if sample:
                chosen = torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
            else:
                chosen = scores.argmax(-1)
            if self.return_logprobs:
                lp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
                lp = lp.gather(-1, chosen[:, None]).squeeze(-1).tolist()
            rows = live.tolist()
            for k, (row, tok) in enumerate(zip(rows, chosen.tolist())):
                out[row].append(tok)
                if self.return_logprobs:
                    logprobs[row].append(lp[k])  # type: ignore[union-attr]
            going = ~torch.isin(chosen, stops)
            if not bool(going.any()):
                break
            if not bool(going.all()):  # drop the stopped rows from the batch and the cache
                keep = going.nonzero().squeeze(1)
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[keep], layer.values[keep]
                    layer.batch_size = len(keep)
                live, mask, chosen = live[keep], mask[keep], chosen[keep]
                position = position[keep]
            step_ids = chosen[:, None]
        return out, logprobs

    def _cached_prefill(self, prompts: list[list[int]], device: torch.device,
                        width: int, max_new_tokens: int) -> Any:
        """Keys/values of every prompt but its last id, as one cache left-padded to ``width - 1``.

        Each row reuses the longest prefix ``self.prefix_cache`` holds and prefills the rest alone
        (batch 1, no padding; only the last position's logits are computed). ``generate`` then
        sees a cache one id short of every prompt: it runs the last id and decodes. The pad
        columns hold zeros that the attention mask hides, as left-padded prefill would.

        The batch cache is a ``StaticCache`` of ``width + max_new_tokens`` positions, written in
        place: a ``DynamicCache`` concatenates, copying all rows' keys and values at every decode
        step, which made a 16-row decode step on 1,500-id prompts about 1.6x slower on CPU
        (``benchmarks/README.md``).

        Returns:
            A ``StaticCache`` of batch ``len(prompts)``, or None when a prompt has one id.
        """
        from transformers import DynamicCache, StaticCache

        assert self.prefix_cache is not None
        if min(len(p) for p in prompts) < 2:
            return None
        rows = []
        for prompt in prompts:
            ids = torch.tensor(prompt[:-1], dtype=torch.long)
            n, kv = self.prefix_cache.lookup(ids)
            if n < len(ids):
                past = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
                out = self.model(input_ids=ids[n:].unsqueeze(0).to(device), use_cache=True,
                                 logits_to_keep=1, **{self._cache_kwarg: past})
                kv = [(layer.keys, layer.values)
                      for layer in getattr(out, self._cache_kwarg).layers]
            self.prefix_cache.reused_tokens += n
            self.prefix_cache.prefilled_tokens += len(ids) - n
            self.prefix_cache.add(ids, kv)
            rows.append(kv)
        batch = StaticCache(config=_base_model(self.model).config,
                            max_cache_len=width + max_new_tokens)
        for layer, cache_layer in enumerate(batch.layers):
            k0, v0 = rows[0][layer]
            keys = k0.new_zeros((len(rows), k0.shape[1], width - 1, k0.shape[3]))
            values = v0.new_zeros((len(rows), v0.shape[1], width - 1, v0.shape[3]))
            for row, kv in enumerate(rows):
                k, v = kv[layer]
                keys[row, :, width - 1 - k.shape[2]:] = k[0]
                values[row, :, width - 1 - v.shape[2]:] = v[0]
            cache_layer.update(keys, values)  # positions 0 .. width - 2
        return batch
