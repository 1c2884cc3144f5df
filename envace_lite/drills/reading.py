"""Does a policy read its world? The per-episode reading measures of a drills evaluation.

A drills-v2 success needs three copies from the text: the ticket's (or an observation's) id into
the call, the write after the read, and the fact out of the observation into the reply
(``docs/drills.md``). ``reading_metrics`` splits an evaluation's rows into those steps, so that a
warm-start lever is measured on each of them and not only on success:

- **success**, overall, per tier and per class (read: ``lookup``/``two_hop``; write: the rule
  allows the write; refusal: it forbids it);
- **correct ids**: real calls that carry an ``order_id`` whose value is one of the drill's gold
  order ids (exact string, ``#`` included), over all real calls that carry one;
- **fact exact**: episodes whose reply passes the drill-side check (``drills.check.check_reply``:
  exactly one value of each communicated kind, and it is the fact), whatever the DB;
- **writes made** (real calls to a write tool) and **writes right** (equal to the gold write,
  name and arguments), and the write drills passed;
- **two-hop steps**: for each of a two-hop drill's three gold calls (find the user by name and
  zip or by e-mail, read the user, read the order), the two-hop episodes whose real calls include
  it exactly (name and arguments), so that the chain's first broken link shows;
- **errors**: episodes that ended in an error (``tables.is_error``: an exception, or a scoring
  crash) are counted on their own and left out of every rate, never scored 0.

Usage::

    from envace_lite.drills.reading import reading_metrics, read_rows
    reading_metrics(read_rows("runs/eval/drills__s0__.../results.jsonl"))
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from envace_lite.drills.spec import Drill
from envace_lite.drills.suite import get_drill
from envace_lite.pipelines.tables import is_error

WRITE_TOOLS = frozenset({"cancel_pending_order", "return_delivered_order_items"})
"""The retail drills' write tools (``spec.TIER_TOOLS``)."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an evaluation's ``results.jsonl``; a line that is not JSON (a torn write) is
    skipped, with one printed line naming it.

    Raises:
        FileNotFoundError: no such file.
    """
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            print(f"{path}:{n}: not a JSON row (a torn write?), skipped")
    return rows


def drill_class(drill: Drill) -> str:
    """``read``, ``write`` (the rule allows the write) or ``refusal`` (it forbids one)."""
    if drill.write_allowed:
        return "write"
    return "refusal" if drill.forbidden is not None else "read"


def _order_ids(drill: Drill) -> set[str]:
    return {str(c["arguments"]["order_id"]) for c in drill.gold
            if "order_id" in c.get("arguments", {})}


def _rate(num: int, den: int) -> dict[str, Any]:
    return {"n": num, "of": den, "rate": round(num / den, 4) if den else None}


def reading_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The reading measures of one evaluation (see the module docstring).

    Args:
        rows: ``results.jsonl`` rows of ``envace-lite eval`` on a drills suite (each with
            ``suite``, ``task_id``, ``reward``, ``real_call_log``, ``details.drill_check`` and
            ``error``).

    Returns:
        ``{"episodes", "errors", "success", "per_tier", "per_class", "correct_ids",
        "correct_ids_per_tier", "fact_exact", "writes_made", "writes_right",
        "write_drills_passed", "two_hop_steps", "real_calls", "failed_real_calls"}`` (calls
        from each row's ``real_call_log``); a rate is ``{"n", "of", "rate"}`` (``rate`` None
        when ``of`` is 0); ``two_hop_steps`` holds one rate per gold call, [] without two-hop
        drills. Crashed episodes count in ``errors`` only.

    Raises:
        KeyError: a row names a drill that its suite does not hold.
    """
    ok = [r for r in rows if not is_error(r)]
    tiers, classes = Counter(), Counter()
    tier_pass, class_pass = Counter(), Counter()
    ids_ok, ids_all = Counter(), Counter()
    fact = made = right = failed = calls = 0
    hops, hop_drills = Counter(), 0
    for r in ok:
        drill = get_drill(r["suite"], r["task_id"])
        passed = float(r.get("reward") or 0.0) >= 1.0
        cls = drill_class(drill)
        tiers[drill.tier] += 1
        classes[cls] += 1
        tier_pass[drill.tier] += passed
        class_pass[cls] += passed
        check = (r.get("details") or {}).get("drill_check") or {}
        fact += bool(check.get("passed"))
        gold_ids = _order_ids(drill)
        if drill.tier == "two_hop":
            hop_drills += 1
            made_calls = [(c.get("name"), c.get("arguments"))
                          for c in r.get("real_call_log") or []]
            for k, g in enumerate(drill.gold):
                hops[k] += (g["name"], g["arguments"]) in made_calls
        gold_writes = [c for c in drill.gold if c["name"] in WRITE_TOOLS]
        for call in r.get("real_call_log") or []:
            calls += 1
            failed += bool(call.get("error"))
            args = call.get("arguments") or {}
            if isinstance(args, dict) and "order_id" in args:
                ids_all[drill.tier] += 1
                ids_ok[drill.tier] += str(args["order_id"]) in gold_ids
            if call.get("name") in WRITE_TOOLS:
                made += 1
                right += any(call["name"] == g["name"] and args == g["arguments"]
                             for g in gold_writes)
    n = len(ok)
    return {
        "episodes": len(rows), "errors": len(rows) - n,
        "success": _rate(sum(tier_pass.values()), n),
        "per_tier": {t: _rate(tier_pass[t], tiers[t]) for t in sorted(tiers)},
        "per_class": {c: _rate(class_pass[c], classes[c]) for c in sorted(classes)},
        "correct_ids": _rate(sum(ids_ok.values()), sum(ids_all.values())),
        "correct_ids_per_tier": {t: _rate(ids_ok[t], ids_all[t]) for t in sorted(ids_all)},
        "fact_exact": _rate(fact, n),
        "writes_made": made, "writes_right": right,
        "write_drills_passed": _rate(class_pass["write"], classes["write"]),
        "two_hop_steps": [_rate(hops[k], hop_drills) for k in range(3)] if hop_drills else [],
        "real_calls": calls, "failed_real_calls": failed,
    }


__all__ = ["WRITE_TOOLS", "drill_class", "read_rows", "reading_metrics"]
