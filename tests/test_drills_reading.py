"""``drills/reading.py``: the reading measures of a drills evaluation, counted by hand on real
drills-v2 validation drills (their gold calls as ``drills show`` prints them)."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from envace_lite.cli.main import app
from envace_lite.drills.reading import read_rows, reading_metrics

V2 = "tau2-retail-drills-v2"


def _row(task_id, reward, calls, fact_ok, error=""):
    return {"suite": V2, "task_id": task_id, "reward": reward, "error": error,
            "split": "validation",
            "real_call_log": calls, "details": {"drill_check": {"passed": fact_ok}}}


def _call(name, error=False, **arguments):
    return {"name": name, "arguments": arguments, "error": error}


ROWS = [
    # a cancel write drill passed: the read and the gold write, both with the right id
    _row("cancel:W2818151", 1.0, [_call("get_order_details", order_id="#W2818151"),
                                  _call("cancel_pending_order", order_id="#W2818151",
                                        reason="ordered by mistake")], True),
    # a return write drill failed: right read, a write with permuted digits (made, not right)
    _row("return:W6174054", 0.0, [_call("get_order_details", order_id="#W6174054"),
                                  _call("return_delivered_order_items", error=True,
                                        order_id="#W6174045", item_ids=["8590708195"],
                                        payment_method_id="gift_card_6566420")], False),
    # a lookup: first the id without '#' (an error), then the right one; the fact is right
    _row("lookup:W2307204", 1.0, [_call("get_order_details", error=True, order_id="W2307204"),
                                  _call("get_order_details", order_id="#W2307204")], True),
    # a cancel refusal: the read, no write, the fact named but the reply fails elsewhere
    _row("cancel:W7736708", 0.0, [_call("get_order_details", order_id="#W7736708")], True),
    # a two-hop drill: the user found by name and zip, then read with a mis-copied id; the
    # order never read (gold: omar_silva_9907, #W6151519)
    _row("two_hop:omar_silva_9907", 0.0, [
        _call("find_user_id_by_name_zip", first_name="Omar", last_name="Silva", zip="98141"),
        _call("get_user_details", error=True, user_id="omar_silva_9097")], False),
    # a crashed episode: counted apart, in no rate
    _row("two_hop:omar_silva_9907", None, [], False, error="RuntimeError: boom"),
]


def test_reading_metrics_by_hand():
    m = reading_metrics(ROWS)
    assert m["episodes"] == 6 and m["errors"] == 1
    assert m["success"] == {"n": 2, "of": 5, "rate": 0.4}
    assert m["per_tier"] == {"cancel": {"n": 1, "of": 2, "rate": 0.5},
                             "lookup": {"n": 1, "of": 1, "rate": 1.0},
                             "return": {"n": 0, "of": 1, "rate": 0.0},
                             "two_hop": {"n": 0, "of": 1, "rate": 0.0}}
    # the two-hop chain: its first gold call made, the second and third not
    assert m["two_hop_steps"] == [{"n": 1, "of": 1, "rate": 1.0}, {"n": 0, "of": 1, "rate": 0.0},
                                  {"n": 0, "of": 1, "rate": 0.0}]
    assert m["per_class"] == {"read": {"n": 1, "of": 2, "rate": 0.5},
                              "refusal": {"n": 0, "of": 1, "rate": 0.0},
                              "write": {"n": 1, "of": 2, "rate": 0.5}}
    # 7 real calls carry an order_id; wrong: the '#'-less lookup and the permuted return write
    assert m["correct_ids"] == {"n": 5, "of": 7, "rate": round(5 / 7, 4)}
    assert m["correct_ids_per_tier"]["return"] == {"n": 1, "of": 2, "rate": 0.5}
    assert m["fact_exact"] == {"n": 3, "of": 5, "rate": 0.6}
    assert (m["writes_made"], m["writes_right"]) == (2, 1)
    assert m["write_drills_passed"] == {"n": 1, "of": 2, "rate": 0.5}
    assert (m["real_calls"], m["failed_real_calls"]) == (9, 3)


def test_reading_metrics_of_no_rows():
    m = reading_metrics([])
    assert m["success"] == {"n": 0, "of": 0, "rate": None} and m["per_tier"] == {}


def test_drills_reading_command_writes_the_record(tmp_path):
    ev, ws = tmp_path / "eval", tmp_path / "ws"
    ev.mkdir(), ws.mkdir()
    (ev / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + '{"torn')
    (ws / "summary.json").write_text(json.dumps({
        "seconds": 12.5, "rows": {"act_rows": 3, "rehearse_rows": 1, "tokens": 900},
        "sft": {"steps": 7, "loss_first": 4.0, "loss_last": 1.0}}))
    (ws / "config.json").write_text(json.dumps({"warmstart": {"sft_share": 0.5},
                                                "model": {"checkpoint": ""}, "run": {"seed": 2}}))
    out = tmp_path / "tuning" / "lever.json"
    res = CliRunner().invoke(app, ["drills", "reading", "--eval", str(ev), "--warmstart", str(ws),
                                   "--name", "lever", "--load", "1.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "not a JSON row" in res.output  # the torn last line: one line, skipped
    assert "lever: success 2/5 (40.0 %)" in res.output and "errors 1" in res.output
    assert "two-hop steps 1/1, 0/1, 0/1" in res.output
    rec = json.loads(out.read_text())
    assert rec["split"] == "validation" and rec["suite"] == V2 and rec["load_at_start"] == 1.5
    assert (rec["episodes"], rec["successes"], rec["success"], rec["errors"]) == (5, 2, 0.4, 1)
    assert (rec["real_calls"], rec["failed_real_calls"], rec["write_successes"]) == (9, 3, 1)
    assert rec["reading"]["writes_made"] == 2
    assert (rec["seed"], rec["eval_seed"]) == (2, 0)  # the policy's seed, then the evaluation's
    assert rec["warmstart"]["steps"] == 7 and rec["warmstart"]["rows"]["act_rows"] == 3
    assert rec["warmstart"]["config"] == {"sft_share": 0.5}
    assert len(read_rows(ev / "results.jsonl")) == 6
    res = CliRunner().invoke(app, ["drills", "reading", "--eval", str(tmp_path / "absent")])
    assert res.exit_code == 2 and "the folder is absent" in res.output
