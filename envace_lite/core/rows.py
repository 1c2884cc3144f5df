"""Training rows: packed ACT transcripts and REHEARSE calls, padded into TRL's batch tensors.

The role-wise trainer (``grpo.py``) trains rows, not outputs. ``build_rows`` makes one packed ACT
row per trajectory (the whole caller transcript: observations and template glue stay as context,
out of the loss) and one row per REHEARSE call with its own prompt; ``owner`` maps every
completion token to the output it belongs to. ``collate_rows`` pads them into the tensors TRL's
loss reads, with each token's advantage and loss weight (``advantages.loss_weights``).
``length_buckets`` groups rows into forwards that waste little padding. See docs/design.md,
"The role-wise GRPO objective" and "TRL integration".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from trl.trainer.utils import pad

from envace_lite.types import ROLES, Trajectory


@dataclass
class Rows:
    """Unpadded training rows. ``owner[b][t]`` is the flat output index (``flatten_outputs``
    order) of completion token t of row b, or -1 for a token kept only as context."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    owner: list[list[int]] = field(default_factory=list)
    role: list[int] = field(default_factory=list)
    """0 for ACT rows, 1 for REHEARSE rows (``ROLES`` index)."""

    def add(self, prompt: list[int], completion: list[int], owner: list[int], role: str) -> None:
        self.prompt_ids.append(list(prompt))
        self.completion_ids.append(list(completion))
        self.owner.append(owner)
        self.role.append(ROLES.index(role))

    def trained_only(self, trained: torch.Tensor) -> Rows:
        """The rows that own at least one trained output (a masked trajectory costs nothing)."""
        keep = [b for b, owner in enumerate(self.owner) if any(k >= 0 and trained[k] for k in owner)]
        return Rows([self.prompt_ids[b] for b in keep], [self.completion_ids[b] for b in keep],
                    [self.owner[b] for b in keep], [self.role[b] for b in keep])


def build_rows(trajs: Sequence[Trajectory], layout: str = "packed",
               roles: Sequence[str] = ROLES) -> Rows:
    """Rows for the roles in ``roles``.

    ``packed``: one ACT row per trajectory, prompt ``act_ids[:act_prompt_len]``, completion the rest
    of the transcript, each ACT-sampled token owned by its output; plus one row per REHEARSE output.
    ``per_output``: one row per output, prompt ``Output.prompt_ids`` (the reference layout, which
    re-encodes the history once per turn).

    Raises:
        ValueError: the packed transcript does not hold every ACT output verbatim, in order.
    """
    if layout not in ("packed", "per_output"):
        raise ValueError(f"layout={layout!r}: use 'packed' or 'per_output'")
    rows, base = Rows(), 0
    for i, traj in enumerate(trajs):
        flat = list(range(base, base + len(traj.outputs)))
        base += len(traj.outputs)
        acts = [(k, o) for k, o in zip(flat, traj.outputs) if o.role == "act"]
        if "act" in roles and layout == "packed" and acts:
            start = traj.act_prompt_len
            completion, owner = traj.act_ids[start:], [-1] * (len(traj.act_ids) - start)
            for (k, out), (lo, hi) in zip(acts, _act_spans(traj, i), strict=True):
                if traj.act_ids[lo:hi] != out.ids or not all(traj.act_mask[lo:hi]):
                    raise ValueError(f"trajectory {i} ({traj.task.id}): ACT output {k} is not "
                                     "verbatim (and masked 1) in act_ids at its span")
                owner[lo - start:hi - start] = [k] * (hi - lo)
            if sum(m for m in traj.act_mask[start:]) != sum(len(o.ids) for _, o in acts):
                raise ValueError(f"trajectory {i} ({traj.task.id}): act_mask marks tokens that "
                                 "no ACT output owns")
            rows.add(traj.act_ids[:start], completion, owner, "act")
        for k, out in zip(flat, traj.outputs):
            packed_act = out.role == "act" and layout == "packed"
            if out.role in roles and not packed_act and out.ids:
                rows.add(out.prompt_ids, out.ids, [k] * len(out.ids), out.role)
    return rows


def _act_spans(traj: Trajectory, i: int) -> list[tuple[int, int]]:
    """Each ACT output's ``[start, end)`` in ``act_ids``: ``traj.act_spans``, or found by walking
    ``act_mask`` when a hand-made trajectory leaves it empty."""
    acts = [o for o in traj.outputs if o.role == "act"]
    if traj.act_spans:
        return list(traj.act_spans)
    spans, j = [], traj.act_prompt_len
    for out in acts:
        while j < len(traj.act_mask) and not traj.act_mask[j]:
            j += 1
        spans.append((j, j + len(out.ids)))
        j += len(out.ids)
    if j > len(traj.act_ids):
        raise ValueError(f"trajectory {i} ({traj.task.id}): act_ids ends inside an ACT output")
    return spans


def length_buckets(prompt_lens: Sequence[int], completion_lens: Sequence[int],
                   slack: float = 0.25, contiguous: bool = False) -> list[list[int]]:
    """Group rows into forwards that waste little padding.

    A bucket's width is its longest prompt plus its longest completion (prompts are left-padded
    and completions right-padded around one boundary), or with ``contiguous`` its longest row
    (prompt and completion together from column 0, padding at the end: the trainer's
    ``causal_rows`` layout). A bucket encodes ``rows × width`` tokens. Rows are sorted by real
    length (prompt + completion) and added greedily while the bucket's encoded tokens stay within
    ``(1 + slack)`` × its real tokens.

    Args:
        prompt_lens, completion_lens: (B,) real tokens per row.
        slack: padding allowed on top of the real tokens, as a share.
        contiguous: measure a bucket's width as its longest row.

    Returns:
        Row indices per bucket, each bucket in ascending length; every row exactly once.
    """
    order = sorted(range(len(prompt_lens)),
                   key=lambda i: (prompt_lens[i] + completion_lens[i], prompt_lens[i], i))
    buckets: list[list[int]] = []
    rows: list[int] = []
    mp = mc = real = 0
    for i in order:
        p, c = int(prompt_lens[i]), int(completion_lens[i])
        wp, wc = max(mp, p), max(mc, c)
        width = p + c if contiguous else wp + wc  # sorted by p + c: the new row is the longest
        if rows and (len(rows) + 1) * width > (1 + slack) * (real + p + c):
            buckets.append(rows)
            rows, real, wp, wc = [], 0, p, c
        rows.append(i)
        mp, mc, real = wp, wc, real + p + c
    if rows:
        buckets.append(rows)
    return buckets


def padded_at_end_only(mask: torch.Tensor, empty_rows: bool = False) -> bool:
    """True when every row of ``mask`` (B, L), L ≥ 1, is ones then zeros: padding after the last
    real token only, none before it or between real tokens.

    Args:
        mask: (B, L) of 0/1.
        empty_rows: accept rows of zeros only (else each row needs at least one one).
    """
    return ((empty_rows or bool(mask[:, 0].all()))
            and bool((mask[:, 1:] <= mask[:, :-1]).all()))


def output_lengths(rows: Rows, n_outputs: int) -> torch.Tensor:
    """Trained tokens per output, shape (N,) long."""
    lengths = torch.zeros(n_outputs, dtype=torch.long)
    for owner in rows.owner:
        for k in owner:
            if k >= 0:
                lengths[k] += 1
    return lengths


def collate_rows(rows: Rows, advantages: torch.Tensor, weights: torch.Tensor, pad_id: int,
                 n_rows: int | None = None) -> dict[str, torch.Tensor]:
    """Pad rows into TRL's batch tensors; append zero-weight padding rows up to ``n_rows``.

    ==================  ======  ======================================================
    key                 shape   meaning
    ==================  ======  ======================================================
    prompt_ids/_mask    (B, P)  left-padded prompts
    completion_ids      (B, C)  right-padded completions
    completion_mask     (B, C)  1 on real tokens (attention)
    advantages          (B, C)  the owning output's advantage, 0 elsewhere
    tool_mask           (B, C)  loss weight w_o of the owning output, 0 elsewhere
    row_role            (B,)    0 ACT, 1 REHEARSE, -1 padding
    ==================  ======  ======================================================

    A padding row is one pad token of prompt and one of completion, attended (a fully masked row
    would give NaN log-probs, and 0·NaN is NaN) with weight 0.
    """
    n_pad = max(0, (n_rows or 0) - len(rows.role))
    prompts = [torch.tensor(p) for p in rows.prompt_ids] + [torch.tensor([pad_id])] * n_pad
    comps = [torch.tensor(c) for c in rows.completion_ids] + [torch.tensor([pad_id])] * n_pad
    owners = [torch.tensor(o, dtype=torch.long) for o in rows.owner]
    owners += [torch.tensor([-1])] * n_pad
    owner = pad(owners, padding_value=-1, padding_side="right")
    a_ext = torch.cat([advantages.float(), torch.zeros(1)])  # index -1 → 0
    w_ext = torch.cat([weights.float(), torch.zeros(1)])
    return {
        "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
        "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0,
                           padding_side="left"),
        "completion_ids": pad(comps, padding_value=pad_id, padding_side="right"),
        "completion_mask": pad([torch.ones_like(c) for c in comps], padding_value=0,
                               padding_side="right"),
        "advantages": a_ext[owner],
        "tool_mask": w_ext[owner],
        "row_role": torch.tensor(rows.role + [-1] * n_pad, dtype=torch.long),
    }


__all__ = ["Rows", "build_rows", "collate_rows", "length_buckets", "output_lengths",
           "padded_at_end_only"]
