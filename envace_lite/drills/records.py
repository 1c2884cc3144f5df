"""Compact records: a fixed, shorter rendering of tau2's retail records (beyond the paper).

What it changes with respect to the paper: the observations a drill's tools return are shown
with one fixed rule per record kind instead of tau2's full JSON; the drills and their scoring
are unchanged. A lever of the drills study (``docs/drills.md``, "Compact records"): a 4M-parameter
policy copies a fact out of an order record less often the longer the record is.

The rule, by record kind (never by question; keys in tau2's order, ``json.dumps`` spacing):

- every record: keys whose value is ``null`` are dropped, at every depth;
- an order (``get_order_details``, and the order a write returns): ``user_id``, ``address`` and
  each item's ``product_id`` and ``options`` are dropped;
- a user (``get_user_details``): ``address``, ``email`` and ``payment_methods`` are dropped.

Anything else (an id string, an error text, a record of another shape) is returned unchanged.
It is applied alike in every place an observation flows: the SFT transcripts and the REHEARSE
targets and grounding (through ``suite_tasks``, from the drill's observations), and the real
environment's responses in training and evaluation (``DrillEnv.step``). The suite that uses it,
``tau2-retail-drills-v2-compact``, has v2's drills, slices and checks, so every result row names
the rendering through its suite.

Usage::

    from envace_lite.drills.records import compact_record
    compact_record('{"order_id": "#W1", "user_id": "u", "status": "pending", "x": null}')
    # '{"order_id": "#W1", "status": "pending"}'
"""
from __future__ import annotations

import json
from typing import Any

ORDER_DROPS = ("user_id", "address")
ITEM_DROPS = ("product_id", "options")
USER_DROPS = ("address", "email", "payment_methods")

COMPACT_SUITES: dict[str, str] = {"tau2-retail-drills-v2-compact": "tau2-retail-drills-v2"}
"""A compact-records suite -> the suite whose drills it renders."""


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def compact_value(record: Any) -> Any:
    """The rule of the module docstring on a parsed record (a new object; the input is kept)."""
    if not isinstance(record, dict):
        return record
    out = _no_nulls(record)
    if "order_id" in out and "items" in out:
        out = {k: v for k, v in out.items() if k not in ORDER_DROPS}
        out["items"] = [{k: v for k, v in item.items() if k not in ITEM_DROPS}
                        if isinstance(item, dict) else item for item in out["items"]]
    elif "user_id" in out and "orders" in out:
        out = {k: v for k, v in out.items() if k not in USER_DROPS}
    return out


def compact_record(content: str) -> str:
    """``content`` rendered by the rule when it is a JSON record, else unchanged.

    Args:
        content: a tool's response text, as tau2 returns it.

    Returns:
        The compact JSON text (``json.dumps`` with its default spacing), or ``content`` itself
        for text that is not a JSON object (an id, an error message).
    """
    try:
        record = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return content
    if not isinstance(record, dict):
        return content
    return json.dumps(compact_value(record))


__all__ = ["COMPACT_SUITES", "ITEM_DROPS", "ORDER_DROPS", "USER_DROPS", "compact_record",
           "compact_value"]
