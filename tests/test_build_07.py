"""Notebook 07's ``build`` cells against ``envace_lite.pipelines.fidelity``, on pairs scored by hand.

The ``build`` cells of ``notebooks/07_fidelity_audit.ipynb`` are extracted and executed in order,
in a namespace that holds what the notebook's setup gives them: ``candidates`` (label, pair key,
the rehearsed ô_t as an ``Observation``) and ``real`` (pair key -> the real o_t). Their results
(``exact``, ``leaves``, ``counts``, ``confusion``, ``overall_by_hand``) are compared with values
written out by hand below and with ``fidelity_metrics.fields``, ``pair_metrics`` and ``aggregate`` within
1e-6 (the audit's definitions: the module docstring of ``envace_lite/pipelines/fidelity.py``). One test runs
the notebook's own setup on the Fig. 7 drill of ``tau2-retail-drills``, where the real o_t of the
call without '#' is tau2's ``Error: Order not found``.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest
from test_notebooks import exec_build_cells, load, run_cells, tagged

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.pipelines.fidelity_metrics import aggregate, fields, pair_metrics
from envace_lite.types import Observation

NOTEBOOK = NOTEBOOKS_DIR / "07_fidelity_audit.ipynb"

ORDER = {"order_id": "#W1", "status": "processed",
         "items": [{"name": "Lamp", "item_id": "1"}], "payment_history": []}
REAL = {"bare": Observation("Error: Order not found", error=True),
        "gold": Observation(json.dumps(ORDER))}  # 5 leaves; payment_history [] is one leaf


def run_build_cells(candidates, real) -> dict:
    ns = {"candidates": candidates, "real": real, "pd": pd, "json": json,
          "display": lambda *a, **k: None}
    return exec_build_cells(NOTEBOOK, ns, at_least=5)


def fig7_candidates():
    wrong = {k: v for k, v in ORDER.items() if k != "payment_history"}
    wrong["status"] = "delivered"
    return [
        ("fig7", "bare", Observation("Error: Order not found", error=True)),
        ("optimistic", "bare", Observation('{"order_id": "W1", "status": "pending"}')),
        ("reordered", "gold", Observation(json.dumps(ORDER, indent=2, sort_keys=True))),
        ("wrong status, a field missing", "gold", Observation(json.dumps(wrong))),
        ("lazy", "gold", Observation("{}")),
    ]


# label -> (exact, matched, rehearsed leaves, real leaves), by hand
PER_PAIR = {
    "fig7": (True, 1, 1, 1),  # the same text: one leaf "$" each
    "optimistic": (False, 0, 2, 1),  # order_id, status vs the real "$"
    "reordered": (True, 5, 5, 5),  # equal JSON values
    "wrong status, a field missing": (False, 3, 4, 5),  # order_id, items[0].name, items[0].item_id
    "lazy": (False, 0, 1, 5),  # "$" = "{}" is no real leaf
}


def test_build_cells_match_hand_computed_fidelity_and_the_package():
    cands = fig7_candidates()
    ns = run_build_cells(cands, REAL)
    for label, key, o_hat in cands:
        exact, matched, n_reh, n_real = PER_PAIR[label]
        assert ns["exact"][label] is exact, label
        assert ns["counts"][label] == {"matched": matched, "n_rehearsed": n_reh, "n_real": n_real}
        m = pair_metrics(o_hat, REAL[key], False)
        assert (m["exact"], m["matched"], m["n_rehearsed"], m["n_real"]) == PER_PAIR[label]
        assert ns["leaves"](o_hat.content) == fields(o_hat.content)
    # (real error, ô error): fig7 (T, T); optimistic (T, F); the three gold ones (F, F)
    assert ns["confusion"] == {(True, True): 1, (True, False): 1, (False, True): 0,
                               (False, False): 3}
    want = {"pairs": 5, "exact_match": 2 / 5, "field_precision": 9 / 13, "field_recall": 9 / 17,
            "error_agreement": 4 / 5}
    assert ns["overall_by_hand"] == pytest.approx(want, abs=1e-6)
    pkg = aggregate([pair_metrics(o, REAL[k], False) for _, k, o in cands])
    assert {k: pkg[k] for k in want} == pytest.approx(want, abs=1e-6)


def test_build_leaves_of_nested_and_odd_values():
    ns = run_build_cells(fig7_candidates(), REAL)
    leaves = ns["leaves"]
    assert leaves('{"a": {"b": [1, {"c": null}]}, "d": {}}') == {
        "a.b[0]": "1", "a.b[1].c": "null", "d": "{}"}
    assert leaves("[]") == {"$": "[]"}
    assert leaves(" 42 ") == {"$": "42"}  # a JSON scalar: its JSON text
    assert leaves(' "ok" ') == {"$": '"ok"'}
    assert leaves("  Error: x \n") == {"$": "Error: x"}  # not JSON: the stripped text
    for text in ('{"a": {"b": [1, {"c": null}]}, "d": {}}', "[]", " 42 ", "Error: x", "{}",
                 '{"k": [[], [1]]}'):
        assert leaves(text) == fields(text)


def test_build_exact_match_edge_cases():
    """JSON values compare as Python values (42 == 42.0); text compares stripped, case-sensitive."""
    real = {"n": Observation("42"), "t": Observation("Error: Order not found", error=True)}
    cands = [("float", "n", Observation("42.0")), ("spaces", "t", Observation(
        "  Error: Order not found\n", error=True)), ("case", "t", Observation(
            "error: order not found", error=True))]
    ns = run_build_cells(cands, real)
    assert ns["exact"] == {"float": True, "spaces": True, "case": False}
    # "42.0" and "42" are equal values but different leaves ($ = "42.0" vs "42")
    assert ns["counts"]["float"] == {"matched": 0, "n_rehearsed": 1, "n_real": 1}
    assert ns["counts"]["spaces"]["matched"] == 1 and ns["counts"]["case"]["matched"] == 0
    for label, key, o in cands:
        m = pair_metrics(o, real[key], False)
        assert m["exact"] == ns["exact"][label] and m["matched"] == ns["counts"][label]["matched"]


def test_state_change_agreement_by_hand():
    """The part of pair_metrics the notebook's read-only pairs leave empty: a rehearsal that reports
    no error claims the write happened; agreement = (claimed and real + neither) / writes."""
    cases = [(False, True), (False, False), (True, True), (True, False)]  # (ô error, real change)
    records = [pair_metrics(Observation("x", error=e), Observation("y", state_changed=c), True)
               for e, c in cases]
    sc = aggregate(records)["state_change"]
    assert sc == {"pairs": 4, "claimed_and_real": 1, "claimed_not_real": 1, "real_not_claimed": 1,
                  "neither": 1, "agreement": 0.5}
    assert aggregate([pair_metrics(Observation("x"), Observation("y"), False)])[
        "state_change"]["agreement"] is None


def test_the_notebook_setup_on_the_fig7_drill(tmp_path):
    """The notebook's setup cell, then its build cells, on the real Fig. 7 drill (smoke profile)."""
    from envace_lite.config import get_config

    nb = load(NOTEBOOK)
    [setup] = [c for c in nb.cells if c.cell_type == "code" and "REHEARSALS = [" in c.source]
    ns = {"cfg": get_config("smoke"), "seed": 0, "profile": "smoke",
          "drill_suite": "tau2-retail-drills", "drill_task": "", "display": lambda *a, **k: None}
    run_cells([setup.source] + [c.source for c in tagged(nb, "build")], ns)
    assert ns["drill_id"].startswith("lookup:")
    labels = [label for label, _, _ in ns["candidates"]]
    assert len(set(labels)) == len(labels) == 7  # the build keys its results by label
    assert ns["real"]["bare"].content == "Error: Order not found" and ns["real"]["bare"].error
    order = json.loads(ns["real"]["gold"].content)
    assert "#" + ns["bare_call"].arguments["order_id"] == order["order_id"]
    ex = ns["exact"]
    assert ex["Fig. 7: predicts the error"] and ex["the real JSON, keys re-ordered"]
    assert not ex["lazy: {}"] and not ex["optimistic: invents the order"]
    n_real = len(fields(ns["real"]["gold"].content))
    wrong = ns["counts"]["wrong status, payment_history missing"]
    n_pay = len([k for k in fields(ns["real"]["gold"].content) if k.startswith("payment_history")])
    assert wrong == {"matched": n_real - n_pay - 1, "n_rehearsed": n_real - n_pay,
                     "n_real": n_real}  # every leaf but the status and payment_history
    records = [pair_metrics(o, ns["real"][k], False) for _, k, o in ns["candidates"]]
    pkg = aggregate(records)
    assert {k: pkg[k] for k in ns["overall_by_hand"]} == pytest.approx(ns["overall_by_hand"],
                                                                        abs=1e-6)


def test_build_cells_come_before_the_package_functions():
    cells = [c for c in load(NOTEBOOK).cells if c.cell_type == "code"]
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in cells]
    built = [k for k, t in enumerate(tags) if "build" in t]
    first = next(k for k, c in enumerate(cells) if "pair_metrics(" in c.source)
    assert "build-check" in tags[first] and sum(k < first for k in built) >= 4
    first_audit = next(k for k, c in enumerate(cells) if "audit((" in c.source)
    assert first_audit > first
    assert (len(built) + sum("build-check" in t for t in tags)) / len(cells) >= 0.25

