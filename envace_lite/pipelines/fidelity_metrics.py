"""The rehearsal fidelity metrics: how far ô_t agrees with the real o_t, pair by pair and in all.

``pair_metrics`` compares one rehearsed observation with the real one (exact match, JSON leaf
fields, the error flags, the claimed and real state change); ``aggregate`` and ``sliced`` sum
them up; ``error_kind`` labels each call by what could make it fail, read from the dialogue
before it, and ``error_kind_report`` / ``decisive_report`` give REHEARSE's error prediction per
kind and the recall of each drill tier's decisive field. ``pipelines/fidelity.py`` builds the
pairs and runs the audit (docs/design.md, "Our additions beyond the paper").
"""
from __future__ import annotations

import json
import re
from typing import Any

from envace_lite.types import Observation, ToolCall


SLICES = ("tool", "suite", "source", "task_success")
ERROR_KINDS = ("invalid_arguments", "missing_hash", "mis_copied", "unknown_id", "none")
"""The error kinds of ``error_kind``, in the order it tests them."""
BARE_ORDER_ID = re.compile(r"W\d{7}")
"""A tau2 retail order id written without its ``#`` (``W4284542``; the tools take ``#W4284542``
and answer ``Error: Order not found`` otherwise, tau2 ``domains/retail/tools.py``: the paper's
Fig. 7 slip)."""
MIS_COPY_EDITS = 2
"""An unseen id within this many single-character edits of a token of the dialogue (both at
least ``MIS_COPY_MIN_CHARS`` long) is mis-copied; a farther one is unknown (invented)."""
MIS_COPY_MIN_CHARS = 4
DECISIVE_FIELDS: dict[tuple[str, str], str] = {
    ("lookup", "get_order_details"): "status", ("cancel", "get_order_details"): "status",
    ("return", "get_order_details"): "status", ("two_hop", "get_order_details"): "status",
    ("two_hop", "get_user_details"): "orders",
    ("lookup", "get_reservation_details"): "cabin",
    ("change", "get_reservation_details"): "cabin",
    ("two_hop", "get_reservation_details"): "destination",
}
"""``(drill tier, tool) -> the top-level field of the real result the tier turns on``: what the
user asks for (a lookup's status or cabin, a two-hop's order list or destination) or what the
rule reads (a cancel needs ``pending``, a return ``delivered``, a change no basic economy
cabin); ``drills/spec.py`` describes the tiers."""


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------

def _json(content: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(content)
    except (ValueError, TypeError, RecursionError):
        return False, None


def fields(content: str) -> dict[str, str]:
    """Leaf fields of an observation: ``{path: JSON-encoded value}``.

    Objects give ``a.b`` paths, arrays ``a[0]``; an empty object or array is one leaf. A JSON
    scalar, or non-JSON text, is the single field ``$`` (its stripped text).
    """
    ok, value = _json(content)
    if not ok or not isinstance(value, (dict, list)):
        return {"$": content.strip() if not ok else json.dumps(value, sort_keys=True)}
    out: dict[str, str] = {}

    def walk(v: Any, path: str) -> None:
        if isinstance(v, dict) and v:
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else str(k))
        elif isinstance(v, list) and v:
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        else:
            out[path or "$"] = json.dumps(v, sort_keys=True)

    walk(value, "")
    return out


def exact_match(rehearsed: str, real: str) -> bool:
    """Equal JSON values when both sides are JSON, else equal stripped text."""
    ok_a, a = _json(rehearsed)
    ok_b, b = _json(real)
    return a == b if ok_a and ok_b else rehearsed.strip() == real.strip()


def pair_metrics(rehearsed: Observation, real: Observation, state_changing: bool) -> dict:
    """Per-pair numbers: ``exact``, ``matched``/``n_rehearsed``/``n_real`` fields, ``keys`` (each
    top-level scalar field of the real JSON object: did the rehearsal give it the same value?
    e.g. an order's ``status``, the hidden state a drill's rule turns on), the two error flags,
    and (state-changing calls) ``claimed_change`` and ``real_change``."""
    fr, fo = fields(rehearsed.content), fields(real.content)
    m = {"exact": exact_match(rehearsed.content, real.content),
         "matched": sum(1 for k, v in fr.items() if fo.get(k) == v),
         "keys": {k: fr.get(k) == v for k, v in fo.items()
                  if k != "$" and "." not in k and "[" not in k},
         "n_rehearsed": len(fr), "n_real": len(fo),
         "rehearsed_error": bool(rehearsed.error), "real_error": bool(real.error)}
    if state_changing:
        m["claimed_change"], m["real_change"] = not rehearsed.error, bool(real.state_changed)
    return m


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Audit metrics over per-pair records (``pair_metrics`` plus ``parse_ok``).

    Returns:
        ``{"pairs", "exact_match", "field_precision", "field_recall", "key_recall",
        "error_agreement", "confusion": {"real_error": {"rehearsed_error", "rehearsed_ok"},
        "real_ok": {...}}, "state_change": {"pairs", "agreement", "claimed_and_real",
        "claimed_not_real", "real_not_claimed", "neither"}, "parse_rate"}``; rates are None over
        zero pairs. ``key_recall`` maps each top-level key to the share of the pairs whose real
        object has it where the rehearsal gave the same value.
    """
    n = len(records)

    def rate(num: float, den: float) -> float | None:
        return num / den if den else None

    conf = {"real_error": {"rehearsed_error": 0, "rehearsed_ok": 0},
            "real_ok": {"rehearsed_error": 0, "rehearsed_ok": 0}}
    for r in records:
        conf["real_error" if r["real_error"] else "real_ok"][
            "rehearsed_error" if r["rehearsed_error"] else "rehearsed_ok"] += 1
    writes = [r for r in records if "claimed_change" in r]
    sc = {"pairs": len(writes),
          "claimed_and_real": sum(r["claimed_change"] and r["real_change"] for r in writes),
          "claimed_not_real": sum(r["claimed_change"] and not r["real_change"] for r in writes),
          "real_not_claimed": sum(r["real_change"] and not r["claimed_change"] for r in writes),
          "neither": sum(not r["claimed_change"] and not r["real_change"] for r in writes)}
    sc["agreement"] = rate(sc["claimed_and_real"] + sc["neither"], len(writes))
    return {
        "pairs": n,
        "exact_match": rate(sum(r["exact"] for r in records), n),
        "field_precision": rate(sum(r["matched"] for r in records),
                                sum(r["n_rehearsed"] for r in records)),
        "field_recall": rate(sum(r["matched"] for r in records), sum(r["n_real"] for r in records)),
        "error_agreement": rate(conf["real_error"]["rehearsed_error"]
                                + conf["real_ok"]["rehearsed_ok"], n),
        "key_recall": {k: rate(sum(r["keys"][k] for r in records if k in r.get("keys", {})),
                                sum(k in r.get("keys", {}) for r in records))
                       for k in sorted({k for r in records for k in r.get("keys", {})})},
        "confusion": conf, "state_change": sc,
        "parse_rate": rate(sum(r.get("parse_ok", False) for r in records), n),
    }


def sliced(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``aggregate`` per value of each key in ``SLICES``."""
    out: dict[str, dict[str, Any]] = {}
    for key in SLICES:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault(str(r[key]), []).append(r)
        out[key] = {v: aggregate(g) for v, g in sorted(groups.items())}
    return out


# ---------------------------------------------------------------------------------------------
# Error kinds and the decisive field
# ---------------------------------------------------------------------------------------------

def edit_distance(a: str, b: str) -> int:
    """The Levenshtein distance (single-character insertions, deletions, substitutions)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def error_kind(call: ToolCall, seen: str) -> str:
    """What could make ``call`` fail, read from the dialogue before it (one of ``ERROR_KINDS``).

    In order: ``invalid_arguments`` (the call's schema problems, ``ToolCall.violations``);
    ``missing_hash`` (an identifier value, ``gate.identifiers``, that is a bare tau2 order id,
    ``BARE_ORDER_ID``, or whose ``#``-prefixed form occurs in ``seen``); ``mis_copied`` (an
    identifier value that ``candidates.id_seen`` does not find in ``seen`` but within
    ``MIS_COPY_EDITS`` edits of one of its tokens, a leading ``#`` left out on both sides);
    ``unknown_id`` (absent and farther:
    invented); else ``none``. The kind describes the
    call, not its outcome: a call of any kind may succeed or fail for real.

    Args:
        call: the call a_t.
        seen: the text it may copy from: the user messages and tool responses before it.
    """
    from envace_lite.testtime.gate import identifiers
    from envace_lite.testtime.candidates import id_seen

    if call.violations:
        return "invalid_arguments"
    ids = [v for _, v in identifiers(call.arguments)]
    if any(BARE_ORDER_ID.fullmatch(v) or (not v.startswith("#") and f"#{v}" in seen)
           for v in ids):
        return "missing_hash"
    unseen = [v for v in ids if not id_seen(v, seen)]
    if not unseen:
        return "none"
    tokens = {t.lstrip("#") for t in re.findall(r"[#\w.@-]+", seen)}
    tokens = {t for t in tokens if len(t) >= MIS_COPY_MIN_CHARS}
    if any(len(v.lstrip("#")) >= MIS_COPY_MIN_CHARS and any(
            abs(len(t) - len(v.lstrip("#"))) <= MIS_COPY_EDITS
            and edit_distance(v.lstrip("#"), t) <= MIS_COPY_EDITS for t in tokens)
           for v in unseen):
        return "mis_copied"
    return "unknown_id"


def seen_before(history: list[dict[str, str]]) -> str:
    """The user-role messages of h_t (requests and tool responses) before its last ACT reply."""
    return "\n".join(str(m.get("content") or "") for m in history[:-1] if m["role"] == "user")


def drill_tier(suite: str, task_id: str) -> str:
    """A drill's tier (``"cancel:W2611340"`` -> ``cancel``); "" outside the drill suites."""
    return task_id.split(":", 1)[0] if "drills" in suite and ":" in task_id else ""


def decisive_match(rehearsed: str, real: str, name: str) -> bool | None:
    """Whether the rehearsal gave the real result's top-level field ``name`` the same JSON
    value; None when the real result is no JSON object with that field (nothing to recall)."""
    ok_b, b = _json(real)
    if not ok_b or not isinstance(b, dict) or name not in b:
        return None
    ok_a, a = _json(rehearsed)
    return bool(ok_a and isinstance(a, dict) and name in a and a[name] == b[name])


def error_kind_report(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """REHEARSE's error prediction per error kind (``record``'s ``kind`` and ``prediction``).

    Returns:
        ``{kind: {"calls", "real_errors", "caught", "recall", "missed_no_prediction",
        "real_ok", "false_errors", "false_error_rate", "ok_no_prediction"}}`` for each kind
        present and ``"all"``: ``recall = caught / real_errors`` (caught: a parsed REHEARSE
        output reporting an error on a call that failed for real) and ``false_error_rate =
        false_errors / real_ok``; a REHEARSE output that did not parse counts in neither
        numerator (it is no prediction) but in the denominators. Rates are None over zero calls.
    """
    def one(rs: list[dict[str, Any]]) -> dict[str, Any]:
        err = [r for r in rs if r["real_error"]]
        ok = [r for r in rs if not r["real_error"]]
        caught = sum(r["prediction"] == "error" for r in err)
        false = sum(r["prediction"] == "error" for r in ok)
        return {"calls": len(rs), "real_errors": len(err), "caught": caught,
                "recall": caught / len(err) if err else None,
                "missed_no_prediction": sum(r["prediction"] == "none" for r in err),
                "real_ok": len(ok), "false_errors": false,
                "false_error_rate": false / len(ok) if ok else None,
                "ok_no_prediction": sum(r["prediction"] == "none" for r in ok)}

    out = {k: one([r for r in records if r["kind"] == k]) for k in ERROR_KINDS
           if any(r["kind"] == k for r in records)}
    out["all"] = one(records)
    return out


def decisive_report(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per drill tier: ``{"fields", "pairs", "recalled", "recall"}`` over the records whose real
    result holds the tier's decisive field (``record``'s ``decisive``); tiers without such a
    record are left out (empty outside the drills)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("decisive") is None:
            continue
        t = out.setdefault(r["tier"], {"fields": [], "pairs": 0, "recalled": 0, "recall": None})
        if r["decisive_field"] not in t["fields"]:
            t["fields"].append(r["decisive_field"])
        t["pairs"] += 1
        t["recalled"] += int(r["decisive"])
    for t in out.values():
        t["recall"] = t["recalled"] / t["pairs"]
    return dict(sorted(out.items()))


def prediction_report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``error_kind_report`` and ``decisive_report`` per source (``gold``, ``policy``)."""
    return {src: {"error_kinds": error_kind_report(rs), "decisive_fields": decisive_report(rs)}
            for src in sorted({r["source"] for r in records})
            for rs in [[r for r in records if r["source"] == src]]}


__all__ = [
    "BARE_ORDER_ID",
    "DECISIVE_FIELDS",
    "ERROR_KINDS",
    "MIS_COPY_EDITS",
    "MIS_COPY_MIN_CHARS",
    "SLICES",
    "aggregate",
    "decisive_match",
    "decisive_report",
    "drill_tier",
    "edit_distance",
    "error_kind",
    "error_kind_report",
    "exact_match",
    "fields",
    "pair_metrics",
    "prediction_report",
    "seen_before",
    "sliced",
]
