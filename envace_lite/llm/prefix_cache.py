"""The HF generator's prefix cache and the compact decoding that runs on it (speed only).

Prompts share long prefixes: every trajectory of a suite starts with the same system prompt and
tool schemas, and a trajectory's next ACT prompt extends its last one (the history is
append-only). ``PrefixCache`` keeps the key/value cache of recent prompts; ``cached_prefill``
prefills only the part of each prompt that no cached prompt shares, like vLLM's automatic prefix
caching (on the laptop rollout benchmark it skips most of the prefill: ``benchmarks/README.md``),
and hands the rows over as one left-padded ``StaticCache``. ``compact_decode`` decodes a chunk
from that cache with a row leaving the batch on the step it stops, where ``model.generate``
decodes it as padding until the chunk's longest output stops. ``generation.HFGenerator`` calls
them (its ``prefix_cache`` and ``compact`` arguments); docs/design.md, "Generation and history".

Usage::

    from envace_lite.llm.prefix_cache import (
        PrefixCache, cache_kwarg, cached_prefill, compact_decode)

    cache = PrefixCache(max_tokens=32768)      # or HFGenerator(model, tok, prefix_cache=32768)
    cache.check(model)                         # empties it if the weights changed
    arg = cache_kwarg(model)
    kv = cached_prefill(model, cache, prompts, device, width, 64, arg)  # (B, W) left-padded
    ids, logprobs = compact_decode(model, input_ids, attention, kv, 64, 0.0, 1.0,
                                   stop_ids=[2], return_logprobs=False, cache_arg=arg)
"""
from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


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



def cached_prefill(model: Any, prefix_cache: PrefixCache, prompts: list[list[int]],
                   device: torch.device, width: int, max_new_tokens: int, cache_arg: str) -> Any:
    """Keys/values of every prompt but its last id, as one cache left-padded to ``width - 1``.

    Each row reuses the longest prefix ``prefix_cache`` holds and prefills the rest alone
    (batch 1, no padding; only the last position's logits are computed), then goes into
    ``prefix_cache``. ``generate`` then sees a cache one id short of every prompt: it runs the
    last id and decodes. The pad columns hold zeros that the attention mask hides, as left-padded
    prefill would.

    The batch cache is a ``StaticCache`` of ``width + max_new_tokens`` positions, written in
    place: a ``DynamicCache`` concatenates, copying all rows' keys and values at every decode
    step, which made a 16-row decode step on 1,500-id prompts about 1.6x slower on CPU
    (``benchmarks/README.md``).

    Args:
        model: the causal LM (plain or PEFT), in eval mode, under ``torch.inference_mode``.
        prefix_cache: the cache to read and extend (its ``reused_tokens`` / ``prefilled_tokens``
            count the ids).
        prompts: the chunk's prompt ids, each at most ``width`` long.
        device: the model's device.
        width: the chunk's left-padded width (its longest prompt).
        max_new_tokens: decode positions to reserve after ``width``.
        cache_arg: the model's cache argument name (``cache_kwarg``).

    Returns:
        A ``StaticCache`` of batch ``len(prompts)``, or None when a prompt has one id.
    """
    from transformers import DynamicCache, StaticCache

    if min(len(p) for p in prompts) < 2:
        return None
    rows = []
    for prompt in prompts:
        ids = torch.tensor(prompt[:-1], dtype=torch.long)
        n, kv = prefix_cache.lookup(ids)
        if n < len(ids):
            past = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
            out = model(input_ids=ids[n:].unsqueeze(0).to(device), use_cache=True,
                        logits_to_keep=1, **{cache_arg: past})
            kv = [(layer.keys, layer.values) for layer in getattr(out, cache_arg).layers]
        prefix_cache.reused_tokens += n
        prefix_cache.prefilled_tokens += len(ids) - n
        prefix_cache.add(ids, kv)
        rows.append(kv)
    batch = StaticCache(config=_base_model(model).config, max_cache_len=width + max_new_tokens)
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


def compact_decode(model: Any, input_ids: torch.Tensor, attention: torch.Tensor, cache: Any,
                   max_new_tokens: int, temperature: float, top_p: float, stop_ids: list[int],
                   return_logprobs: bool, cache_arg: str
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
        model: the causal LM (plain or PEFT), in eval mode, under ``torch.inference_mode``.
        input_ids: ``(B, W)`` left-padded prompts.
        attention: ``(B, W)`` 1 on prompt ids, 0 on padding.
        cache: a ``StaticCache`` of batch B holding positions ``0 .. W - 2``
            (``cached_prefill``); its rows are dropped in place as they stop.
        max_new_tokens: ids per row at most (the stop id included).
        temperature: 0 is greedy.
        top_p: nucleus mass (sampling only).
        stop_ids: ids that end a row.
        return_logprobs: also return each id's log-prob.
        cache_arg: the model's cache argument name (``cache_kwarg``).

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
    stops = torch.tensor(sorted(set(stop_ids)), device=input_ids.device)
    mask = torch.cat([attention, attention.new_ones((batch, max_new_tokens))], dim=1)
    live = torch.arange(batch, device=input_ids.device)  # original row of each batch row
    step_ids = input_ids[:, -1:]
    position = attention.sum(1, keepdim=True) - 1  # each row's last prompt position
    kwargs = {cache_arg: cache}
    out: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float] | None] = [[] if return_logprobs else None for _ in range(batch)]
    for step in range(max_new_tokens):
        col = width + step  # columns seen, the new id included
        logits = model(
            input_ids=step_ids, attention_mask=mask[:, :col], position_ids=position + step,
            cache_position=torch.tensor([col - 1], device=input_ids.device),
            use_cache=True, **kwargs).logits[:, -1].float()
        scores = warpers(None, logits)
        if sample:
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
        else:
            chosen = scores.argmax(-1)
        if return_logprobs:
            lp = torch.log_softmax(logits / (temperature if sample else 1.0), dim=-1)
            lp = lp.gather(-1, chosen[:, None]).squeeze(-1).tolist()
        rows = live.tolist()
        for k, (row, tok) in enumerate(zip(rows, chosen.tolist())):
            out[row].append(tok)
            if return_logprobs:
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
