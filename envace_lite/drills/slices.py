"""The held-out slices of drills v2: the test split cut into ``validation`` (all tuning),
``confirmation`` (evaluated once, at the end, for the claims) and ``rest``.

Rule (deterministic, independent of any training run):

1. The test users are ranked by ``sha1("slice:" + user_id)``; even ranks feed the validation
   slice, odd ranks the confirmation slice. No user, order or item of one held-out slice appears
   in the other.
2. Each test drill has a class: ``read`` (lookup, two-hop), ``write`` (the rule allows the
   request), or the status of a refusal (cancel: ``delivered``, ``processed``, ``cancelled``;
   return: ``pending``, ``processed``, ``cancelled``).
3. Each slice takes, per (tier, class), the first ``q`` drills of its half in generation order,
   where ``q = min(SLICE_QUOTA[tier, class], available in either half)``: both slices have the
   same composition, every tier (two-hop included) and refusal statuses balanced within each
   tier. With the quotas below, write drills are 36 of 105 (34 %) of each slice.
4. Every other test drill is ``rest``.

Usage::

    from envace_lite.drills.slices import held_out_slices
    held_out_slices(gen)["validation"]                         # drill ids, round-robin over tiers
"""
from __future__ import annotations

import hashlib

SLICES = ("validation", "confirmation", "rest")
"""The held-out slices of a v2 test split."""

SLICE_QUOTA: dict[tuple[str, str], int] = {
    ("lookup", "read"): 24,
    ("two_hop", "read"): 12,
    ("cancel", "write"): 18, ("cancel", "delivered"): 6, ("cancel", "processed"): 6,
    ("cancel", "cancelled"): 6,
    ("return", "write"): 18, ("return", "pending"): 6, ("return", "processed"): 6,
    ("return", "cancelled"): 6,
}
"""Drills per (tier, class) in each held-out slice (fewer when a half has fewer)."""


def slice_class(drill) -> str:
    """``read``, ``write``, or the refusal's status (``communicate[0]``)."""
    if drill.write_allowed:
        return "write"
    if drill.forbidden is not None:
        return drill.communicate[0]
    return "read"


def _half(user_id: str, ranks: dict[str, int]) -> str:
    return "validation" if ranks[user_id] % 2 == 0 else "confirmation"


def held_out_slices(gen) -> dict[str, list[str]]:
    """``{"validation": ids, "confirmation": ids, "rest": ids}`` of a generation's test drills
    (see the module docstring); each list keeps the generation's round-robin order."""
    test = [d for d in gen.drills if d.split == "test"]
    users = sorted({d.user_id for d in test},
                   key=lambda u: hashlib.sha1(f"slice:{u}".encode()).hexdigest())
    ranks = {u: i for i, u in enumerate(users)}
    pools: dict[tuple[str, str, str], list[str]] = {}
    for d in test:
        pools.setdefault((_half(d.user_id, ranks), d.tier, slice_class(d)), []).append(d.id)
    chosen: set[str] = set()
    for (tier, cls), quota in SLICE_QUOTA.items():
        q = min(quota, *(len(pools.get((h, tier, cls), [])) for h in SLICES[:2]))
        for h in SLICES[:2]:
            chosen.update(pools.get((h, tier, cls), [])[:q])
    out: dict[str, list[str]] = {s: [] for s in SLICES}
    for d in test:
        out[_half(d.user_id, ranks) if d.id in chosen else "rest"].append(d.id)
    return out


__all__ = ["SLICES", "SLICE_QUOTA", "held_out_slices", "slice_class"]
