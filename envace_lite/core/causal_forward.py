"""The trainer's bucketed CPU forward: TRL's per-token log-probs, computed in length buckets.

Speed only; the numbers are TRL's up to float rounding. A role-wise step mixes packed ACT rows
(short prompt, long completion) with REHEARSE rows (long prompt, short completion), and one
collated batch pads every row to the longest prompt plus the longest completion.
``CausalForwardMixin`` (inherited by ``grpo.RoleWiseGRPOTrainer``) overrides TRL's
``_get_per_token_logps_and_entropies`` to split each forward into length buckets
(``rows.length_buckets``), each trimmed of its all-padding columns, and, on an SDPA model, to lay
each bucket row out from column 0 (``causal_layout``) and forward it with no attention mask.
``_lm_head_on_completions_only`` lets TRL's fused LM head score only the completion positions on
CPU. See docs/design.md, "TRL integration".

Usage::

    import torch
    from envace_lite.core.causal_forward import causal_layout, causal_layout_applies

    ids = torch.tensor([[0, 5, 6, 7, 0, 0], [4, 5, 6, 7, 8, 9]])  # P = 3, C = 3
    pm, cm = (ids[:, :3] > 0).long(), (ids[:, 3:] > 0).long()
    assert causal_layout_applies(pm, cm)
    ids, labels = causal_layout(ids, 3, pm.sum(1), cm.sum(1), pad_id=0)  # rows from column 0

    trainer.causal_rows = False   # a RoleWiseGRPOTrainer: TRL's layout and mask, per bucket
    trainer.bucket_rows = False   # one forward over the whole padded batch
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from envace_lite.core.rows import length_buckets, padded_at_end_only


class CausalForwardMixin:
    """Length-bucketed per-token log-probs for a TRL ``GRPOTrainer`` subclass.

    Put it before ``GRPOTrainer`` in the bases: ``_get_per_token_logps_and_entropies`` calls
    TRL's through ``super()``. It reads the trainer's ``accelerator``, ``is_deepspeed_enabled``
    and ``processing_class``.
    """

    bucket_rows: bool = True
    """Split each policy forward into length buckets (``length_buckets``), each trimmed of the
    columns that are padding in all of its rows. A step mixes packed ACT rows (short prompt, long
    completion) with REHEARSE rows (long prompt, short completion); one collated batch pads every
    row to the longest prompt plus the longest completion. Single-process runs only: DDP and
    DeepSpeed expect one forward per backward."""
    bucket_slack: float = 0.25
    """A bucket may encode at most this share of padding on top of its real tokens."""
    causal_rows: bool = True
    """With ``bucket_rows``, on a model that uses SDPA: lay each bucket row out as its prompt and
    completion from column 0, padding only at the end, and forward it with no attention mask.
    Under causal attention no real token sees a later column, so the padding is out of reach
    without a mask. Without a mask SDPA runs its causal kernel, which skips the key blocks above
    the diagonal; with one it computes every block and masks it. False: TRL's layout
    (left-padded prompts, right-padded completions) and its padding mask, per bucket."""

    def row_buckets(self, prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
                    contiguous: bool | None = None) -> list[list[int]] | None:
        """Row indices per forward, or None for one forward over the whole (padded) batch.

        Args:
            prompt_mask: (B, P) left-padded; completion_mask: (B, C) right-padded.
            contiguous: measure widths for the ``causal_rows`` layout (default:
                ``causal_rows``).
        """
        if (not self.bucket_rows or self.accelerator.num_processes > 1
                or self.is_deepspeed_enabled):
            return None
        return length_buckets(prompt_mask.sum(1).tolist(), completion_mask.sum(1).tolist(),
                              self.bucket_slack,
                              contiguous=self.causal_rows if contiguous is None else contiguous)

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor,
                                           attention_mask: torch.Tensor, logits_to_keep: int,
                                           batch_size: int | None = None,
                                           compute_entropy: bool = False,
                                           compute_aux_loss: bool = False, **extra: Any) -> Any:
        """TRL's per-token log-probs and entropies, (B, C), computed per length bucket.

        Each bucket's rows are cut to ``[P - max prompt, P + max completion)`` (P = the prompt
        width): only columns that are padding in every row of the bucket go. With
        ``causal_rows`` (and ``causal_layout_applies``) each row instead starts at column 0
        (``_causal_bucket``). Either way the padding is kept out of attention and the real
        tokens keep their relative positions, so on a RoPE model each real token's log-prob is
        the same up to float rounding (the gradient-equality checks: 1e-5). Positions past a
        row's completion get log-prob and entropy 0; they are masked.
        """
        call = super()._get_per_token_logps_and_entropies
        kw = {"batch_size": batch_size, "compute_entropy": compute_entropy,
              "compute_aux_loss": compute_aux_loss}
        with _lm_head_on_completions_only():
            p = input_ids.shape[1] - logits_to_keep
            pm, cm = attention_mask[:, :p], attention_mask[:, p:]
            config = getattr(self.accelerator.unwrap_model(model), "config", None)  # DDP: .module
            causal = (self.causal_rows and not compute_aux_loss
                      and getattr(config, "_attn_implementation", None) == "sdpa"
                      and causal_layout_applies(pm, cm))
            buckets = None if any(v is not None for v in extra.values()) else self.row_buckets(
                pm, cm, contiguous=causal)
            if buckets is None:
                return call(model, input_ids, attention_mask, logits_to_keep, **kw, **extra)
            p_len, c_len = pm.sum(1), cm.sum(1)
            logps, entropies, aux = [], [], []
            for rows in buckets:
                idx = torch.tensor(rows, device=input_ids.device)
                if causal:
                    lp, ent = self._causal_bucket(model, input_ids[idx], p, p_len[idx],
                                                  c_len[idx], batch_size, compute_entropy)
                    keep, ax = lp.shape[1], None
                else:
                    lo, keep = p - int(p_len[idx].max()), int(c_len[idx].max())
                    lp, ent, ax = call(model, input_ids[idx, lo:p + keep],
                                       attention_mask[idx, lo:p + keep], keep, **kw)
                logps.append(torch.nn.functional.pad(lp, (0, logits_to_keep - keep)))
                if ent is not None:
                    entropies.append(torch.nn.functional.pad(ent, (0, logits_to_keep - keep)))
                if ax is not None:
                    aux.append(ax)
            order = torch.tensor([r for rows in buckets for r in rows], device=input_ids.device)
            inverse = torch.argsort(order)
            return (torch.cat(logps)[inverse],
                    torch.cat(entropies)[inverse] if entropies else None,
                    torch.stack(aux).mean() if aux else None)

    def _causal_bucket(self, model: Any, input_ids: torch.Tensor, p: int, p_len: torch.Tensor,
                       c_len: torch.Tensor, batch_size: int | None, compute_entropy: bool
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One bucket in the ``causal_rows`` layout: log-probs and entropies, (b, max c_len).

        ``input_ids`` (b, P + C) holds each row's real tokens in ``[P - p_len, P + c_len)``
        (p_len ≥ 1); ``causal_layout`` moves them to ``[0, p_len + c_len)``, and no attention
        mask is passed. The labels are the completion ids there and -100 elsewhere, so TRL's
        fused LM head scores the completion tokens only, as in TRL's own layout. Rows go through
        in chunks of ``batch_size`` (TRL's), each cut to its own longest row.
        """
        ids, labels = causal_layout(input_ids, p, p_len, c_len,
                                    self.processing_class.pad_token_id)
        keep, total = int(c_len.max()), p_len + c_len
        steps = torch.arange(keep, device=ids.device)[None, :]
        live = steps < c_len[:, None]
        size = batch_size or ids.shape[0]
        logps, entropies = [], []
        for s in range(0, ids.shape[0], size):
            width = int(total[s:s + size].max())
            with self.accelerator.autocast():
                out = model(input_ids=ids[s:s + size, :width],
                            labels=labels[s:s + size, :width], fused_lm_head=True)
            # the fused head returns (n, width - 1): entry j scores the id in column j + 1
            at = (p_len[s:s + size, None] - 1 + steps).clamp(0, width - 2)
            logps.append(out.log_probs.gather(1, at) * live[s:s + size])
            if compute_entropy:
                entropies.append(out.entropy.gather(1, at) * live[s:s + size])
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None)


@contextlib.contextmanager
def _lm_head_on_completions_only() -> Any:
    """On CPU, let TRL's fused LM head score only the completion positions.

    Without Triton, trl 1.16 projects *every* position through the LM head and zeroes the prompt
    afterwards (to keep tile shapes fixed for Neuron's compiler). With Qwen3's 151k vocabulary
    and a tiny backbone that is most of a CPU step. The compact path it uses on GPUs is plain
    torch and gives the same numbers, so it is switched on for CPU devices while TRL computes.
    """
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        trl_utils._use_triton = original


def causal_layout_applies(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> bool:
    """True when a batch is in TRL's layout with no holes: every prompt row zeros then at least
    one one, every completion row ones then zeros (``causal_layout``'s assumption; docs/design.md,
    "TRL integration").

    Args:
        prompt_mask: (B, P); completion_mask: (B, C).
    """
    return (prompt_mask.shape[1] > 0 and completion_mask.shape[1] > 0
            and padded_at_end_only(prompt_mask.flip(1))
            and padded_at_end_only(completion_mask, empty_rows=True))


def causal_layout(input_ids: torch.Tensor, p: int, p_len: torch.Tensor, c_len: torch.Tensor,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of TRL's layout moved to start at column 0, and their completion labels (the
    ``causal_rows`` layout; docs/design.md, "TRL integration").

    Args:
        input_ids: (B, P + C), prompts left-padded to P, completions right-padded (no holes:
            ``causal_layout_applies``).
        p: the prompt width P.
        p_len, c_len: (B,) real prompt and completion tokens per row.
        pad_id: the id written after each row's last real token.

    Returns:
        ``ids`` (B, W), W = max(p_len + c_len): row b is its p_len[b] prompt ids, its c_len[b]
        completion ids, then ``pad_id``; ``labels`` (B, W): the completion ids at their columns,
        -100 elsewhere (the prompt and the padding are not scored).
    """
    total = p_len + c_len
    width = int(total.max())
    cols = torch.arange(width, device=input_ids.device)[None, :]
    src = ((p - p_len)[:, None] + cols).clamp(max=input_ids.shape[1] - 1)
    ids = input_ids.gather(1, src).masked_fill(cols >= total[:, None], pad_id)
    scored = (cols >= p_len[:, None]) & (cols < total[:, None])
    return ids, ids.masked_fill(~scored, -100)


