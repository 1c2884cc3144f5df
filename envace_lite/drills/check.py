"""The drill-side reply check of drills v2, beside tau2's evaluator (never a rewrite of it).

tau2's communicate rule passes a reply that holds each ``communicate_info`` string as a
case-insensitive substring (``tau2/evaluator/evaluator_communicate.py``: ``info.lower() in
text.lower().replace(",", "")``). A reply that lists every candidate ("pending, processed,
delivered or cancelled"), or any number that contains the amount ("125.51" holds "25.5"), passes
it. On v2 drills a scored reply must also **name exactly one value of each kind it must
communicate, and that value is the fact**:

==========  ====================================================  ===========================
kind        a value of the kind in a reply                         compared as
==========  ====================================================  ===========================
status      ``pending``, ``processed``, ``delivered``,              lower case
            ``cancelled``, ``return requested`` (whole words)
amount      a decimal number ``123.45`` (commas dropped, as tau2)  rounded to the cent
tracking    a run of exactly 12 digits                             as written
payment     ``credit_card_…``, ``paypal_…``, ``gift_card_…``        as written
==========  ====================================================  ===========================

A communicated string of no kind (v1's airline cabins, destinations, flight numbers) is left to
tau2's rule alone. The check runs on the episode's final text only (the ticket protocol has one).
``DrillEnv.score`` applies it to v2 suites; v1 suites score under tau2's rule alone.

Usage::

    from envace_lite.drills.check import check_reply
    check_reply("It is delivered. Its total was 2577.53.", ["delivered", "2577.53"])  # (True, "")
    check_reply("pending, processed, delivered or cancelled", ["delivered"])[0]          # False
"""
from __future__ import annotations

import re

STATUSES = ("pending", "processed", "delivered", "cancelled", "return requested")
"""The order statuses of tau2 retail (``return requested`` is the status a return sets)."""

_PATTERNS = {
    "status": re.compile(r"\b(" + "|".join(STATUSES) + r")\b", re.IGNORECASE),
    "amount": re.compile(r"(?<![\d.])\d+\.\d+(?!\d)"),
    "tracking": re.compile(r"(?<!\d)\d{12}(?!\d)"),
    "payment": re.compile(r"\b(?:credit_card|paypal|gift_card)_\d+\b"),
}


def fact_kind(value: str) -> str | None:
    """The kind of a communicated string (``status``, ``amount``, ``tracking``, ``payment``), or
    ``None`` when it has none (tau2's substring rule alone judges it)."""
    v = value.strip()
    for kind in ("status", "amount", "tracking", "payment"):
        m = _PATTERNS[kind].fullmatch(v)
        if m:
            return kind
    return None


def _norm(kind: str, value: str) -> str:
    return f"{float(value):.2f}" if kind == "amount" else value.lower()


def named_values(text: str, kind: str) -> set[str]:
    """The distinct values of ``kind`` that ``text`` names, normalised (amounts to the cent,
    statuses lower case). ``KeyError`` for an unknown kind."""
    flat = text.replace(",", "")
    return {_norm(kind, m.group(0)) for m in _PATTERNS[kind].finditer(flat)}


def check_reply(text: str, communicate: list[str]) -> tuple[bool, str]:
    """The drill-side check of a final reply against a v2 drill's ``communicate`` facts.

    Returns:
        ``(passed, reason)``; ``reason`` names the first kind whose values in the reply are not
        exactly the fact's (``""`` when passed).
    """
    wanted: dict[str, set[str]] = {}
    for value in communicate:
        kind = fact_kind(value)
        if kind is not None:
            wanted.setdefault(kind, set()).add(_norm(kind, value.strip()))
    for kind, facts in wanted.items():
        named = named_values(text or "", kind)
        if named != facts:
            return False, f"{kind}: the reply names {sorted(named)}, the fact is {sorted(facts)}"
    return True, ""


__all__ = ["STATUSES", "check_reply", "fact_kind", "named_values"]
