"""The rehearsal fidelity audit: metrics on hand-computed cases, replays at the same state, and
the audit on held-out pairs across tau2 and BFCL with scripted policies."""
from __future__ import annotations

import json

import pytest

from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.envs import make_env
from envace_lite.pipelines.fidelity import (
    UPPER_BOUND_LABEL,
    audit,
    collect_pairs,
    gold_events,
    rehearse_pairs,
    replay,
)
from envace_lite.pipelines.fidelity_metrics import aggregate, exact_match, fields, pair_metrics
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import qwen3_tokenizer
from envace_lite.types import Observation


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def cfg_():
    return get_config("smoke", {"eval.max_turns": 20, "rollout.max_new_tokens_act": 1024,
                                "rollout.max_new_tokens_rehearse": 512})


# ---------------------------------------------------------------------------------------------
# Metrics, by hand
# ---------------------------------------------------------------------------------------------

def test_fields_and_exact_match():
    assert fields('{"a": 1, "b": {"c": [1, "x"]}, "d": [], "e": null}') == {
        "a": "1", "b.c[0]": "1", "b.c[1]": '"x"', "d": "[]", "e": "null"}
    assert fields("Error: no such order") == {"$": "Error: no such order"}
    assert fields('"done"') == {"$": '"done"'} and fields("[]") == {"$": "[]"}
    assert exact_match('{"a": 1, "b": 2}', '{"b": 2, "a": 1}')
    assert exact_match("  ok \n", "ok") and not exact_match('{"a": 1}', '{"a": 2}')
    assert not exact_match("ok", '"ok"')  # text vs a JSON string


def test_pair_metrics_and_aggregate_by_hand():
    obs = Observation
    records = [
        # 1: exact; 2 of 2 fields; both ok; a write that changed state and was claimed
        pair_metrics(obs('{"id": 1, "s": "a"}'), obs('{"s": "a", "id": 1}', state_changed=True),
                     True),
        # 2: 1 of 3 rehearsed fields right, 1 of 2 real; rehearsal ok, real ok; a read
        pair_metrics(obs('{"id": 1, "s": "b", "x": 0}'), obs('{"id": 1, "s": "a"}'), False),
        # 3: real error, rehearsal says ok; a write that did not change state but was claimed
        pair_metrics(obs('{"id": 2}'), obs("Error: bad id", error=True), True),
        # 4: both errors, different text; a write neither claimed nor done
        pair_metrics(obs("Error: x", error=True), obs("Error: y", error=True), True),
    ]
    for r, ok in zip(records, (True, True, True, False)):
        r["parse_ok"] = ok
    m = aggregate(records)
    assert m["pairs"] == 4 and m["exact_match"] == 0.25
    # matched 2 + 1 + 0 + 0 = 3; rehearsed fields 2 + 3 + 1 + 1 = 7; real 2 + 2 + 1 + 1 = 6
    assert m["field_precision"] == pytest.approx(3 / 7) and m["field_recall"] == 0.5
    # top-level keys of the real objects (pairs 1 and 2; the errors are not objects): id right
    # in both, s right in pair 1 only
    assert records[1]["keys"] == {"id": True, "s": False} and records[2]["keys"] == {}
    assert m["key_recall"] == {"id": 1.0, "s": 0.5}
    assert m["confusion"] == {"real_error": {"rehearsed_error": 1, "rehearsed_ok": 1},
                              "real_ok": {"rehearsed_error": 0, "rehearsed_ok": 2}}
    assert m["error_agreement"] == 0.75 and m["parse_rate"] == 0.75
    assert m["state_change"] == {"pairs": 3, "claimed_and_real": 1, "claimed_not_real": 1,
                                 "real_not_claimed": 0, "neither": 1,
                                 "agreement": pytest.approx(2 / 3)}
    empty = aggregate([])
    assert empty["exact_match"] is None and empty["state_change"]["agreement"] is None


# ---------------------------------------------------------------------------------------------
# Replays reach the same state; the audit on held-out pairs
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suite", ["tau2-telecom", "bfcl-base"])
def test_gold_replay_reproduces_the_grounding(suite):
    """o_t from a fresh-env replay equals the real result cached as the task's grounding."""
    task = load_tasks(suite, "test", limit=1)[0]
    env = make_env(suite, task.id)
    events = gold_events(env)
    env.close()
    pairs, reward, _ = replay(suite, task.id, events, "gold")
    flat = [g for turn in task.grounding for g in turn]
    assert reward == 1.0 and len(pairs) == len(flat) > 0
    for p, g in zip(pairs, flat):
        assert p.call.name == g["call"]["name"] and p.real.content == g["observation"]["content"]
        assert p.history[-1]["role"] == "assistant" and p.task_success
        assert "<tool_call>" in p.history[-1]["content"]


def _gold_script(suite, tid):
    env = make_env(suite, tid)
    script = [x for t in env.gold_turns()
              for x in [assistant_text(s) for s in t.steps] + ["Done."]]
    env.close()
    return script


def test_audit_on_held_out_pairs_across_tau2_and_bfcl(tok, tmp_path):
    suites = ["tau2-telecom", "bfcl-base"]
    # ACT replays the gold calls of the first test task of each suite (the policy source);
    # REHEARSE always claims success with an empty object
    acts = {s: iter(_gold_script(s, load_tasks(s, "test", limit=1)[0].id)) for s in suites}

    def fn(role, prompt):
        if role == "rehearse":
            return rehearsal_text("{}")
        text = tok.decode(prompt)
        suite = "bfcl-base" if "GorillaFileSystem" in text or "analysis_report" in text \
            else "tau2-telecom"
        return next(acts[suite], "Done.")

    gen = ScriptedGenerator(fn, tok)
    report = audit((gen, tok), suites, cfg_(), limit=1, out=tmp_path)
    held = report["held_out"]
    n = held["overall"]["pairs"]
    assert n >= 20
    assert set(held["slices"]["suite"]) == set(suites)
    assert set(held["slices"]["source"]) == {"gold", "policy"}
    assert report["replay_mismatches"] == 0
    # the policy replayed the gold calls: as many policy pairs as gold pairs, all successful
    src = held["slices"]["source"]
    assert src["gold"]["pairs"] == src["policy"]["pairs"] == n // 2
    assert set(held["slices"]["task_success"]) == {"success"}
    # every metric is there and agrees with the per-pair records
    assert aggregate(report["records"]) == held["overall"]
    assert held["overall"]["exact_match"] == sum(
        r["real"].strip() == "{}" for r in report["records"]) / n
    conf = held["overall"]["confusion"]
    assert conf["real_error"]["rehearsed_error"] == conf["real_ok"]["rehearsed_error"] == 0
    sc = held["overall"]["state_change"]
    assert sc["pairs"] > 0 and sc["real_not_claimed"] == sc["neither"] == 0
    ub = report["grounded_upper_bound"]
    assert ub["label"] == UPPER_BOUND_LABEL and ub["grounding"] == "gold"
    assert ub["overall"]["pairs"] > 0
    saved = json.loads((tmp_path / "fidelity.json").read_text())
    assert saved["held_out"]["overall"] == held["overall"]
    assert not (tmp_path / "fidelity.png").exists()  # the caller draws it (the CLI test)


def test_oracle_rehearsal_scores_exact(tok):
    """A REHEARSE that writes the real o_t scores 1.0 on exact match and field P/R."""
    pairs, _ = collect_pairs(["bfcl-base"], "test", 1, ("gold",))
    gen = ScriptedGenerator({"rehearse": [rehearsal_text(p.real.content)
                                          for p in pairs]}, tok)
    rehearse_pairs(pairs, gen, tok, cfg_())
    m = aggregate([{**p.metrics, "parse_ok": p.parse_ok} for p in pairs])
    assert (m["exact_match"], m["field_precision"], m["field_recall"], m["parse_rate"]) == (
        1.0, 1.0, 1.0, 1.0)
    # REHEARSE saw <unavailable>, never the grounding (held-out pairs)
    (_, prompts), = gen.calls
    assert all("<unavailable>" in tok.decode(p) for p in prompts)


def test_upper_bound_passes_over_the_tasks_of_the_warm_starts_world_rows():
    """``exclude`` skips ids before the first ``limit``; the grounding still rides along."""
    from envace_lite.envs import list_tasks
    from envace_lite.drills.world_rows import world_tasks

    suite = "tau2-retail-drills"
    ids = list_tasks(suite, "train")
    pairs, _ = collect_pairs([suite], "train", 2, ("gold",), grounded=True,
                             exclude=frozenset(ids[:3]))
    assert [p.task_id for p in pairs][0] == ids[3]
    assert {p.task_id for p in pairs} == set(ids[3:5])
    assert all(p.grounding for p in pairs)  # each pair carries its task's real results
    cfg = get_config("drills", {"study.world_rows": 400})
    seen = frozenset(t.id for t in world_tasks(cfg))
    pairs, _ = collect_pairs([suite], "train", 5, ("gold",), exclude=seen)
    assert {p.task_id for p in pairs} == set([i for i in ids if i not in seen][:5])
    assert len(seen) == 400 and set(ids[:30]) & seen  # the first train drills were drawn


def test_upper_bound_rehearses_the_same_pairs_again_without_grounding(tok):
    """A REHEARSE that answers ``pending`` only when its prompt lacks the real results: the
    grounded pairs get ``{}`` (recall 0), their bare twins get the status recall of the data."""
    prompts = []

    def fn(role, prompt):
        bare = "for this task\n<unavailable>" in tok.decode(prompt)  # the reference block
        prompts.append(bare)
        return rehearsal_text('{"status": "pending"}' if bare else "{}")

    suite = "tau2-retail-drills"
    report = audit((ScriptedGenerator(fn, tok), tok), [suite], cfg_(), limit=2,
                   sources=("gold",))
    ub = report["grounded_upper_bound"]
    without = ub["same_pairs_without_grounding"]
    train, _ = collect_pairs([suite], "train", 2, ("gold",))
    statuses = [fields(p.real.content).get("status") for p in train]  # JSON-encoded values
    assert ub["overall"]["pairs"] == without["pairs"] == len(train) > 0
    assert ub["overall"]["field_recall"] == 0.0 and ub["overall"]["key_recall"]["status"] == 0.0
    with_status = [s for s in statuses if s is not None]
    assert without["key_recall"]["status"] == pytest.approx(
        with_status.count('"pending"') / len(with_status))
    held = report["held_out"]["overall"]["pairs"]
    assert prompts.count(False) == len(train) and prompts.count(True) == held + len(train)


# ---------------------------------------------------------------------------------------------
# REHEARSE's error prediction per error kind, and the decisive field
# ---------------------------------------------------------------------------------------------

def test_error_kinds_by_hand():
    from envace_lite.pipelines.fidelity_metrics import edit_distance, error_kind
    from envace_lite.types import ToolCall

    seen = "Hi! What is the status of my order W3220203? My email is ana@x.com"
    call = lambda args, bad=(): ToolCall("get_order_details", args, list(bad))  # noqa: E731
    assert edit_distance("#W3220203", "#W3220208") == 1 and edit_distance("abc", "") == 3
    assert error_kind(call({"order_id": "#W3220203"}), seen) == "none"  # the '#' was added
    assert error_kind(call({"order_id": "W3220203"}), seen) == "missing_hash"  # Fig. 7
    # W3220208 against the message's W3220203 (the '#' left out on both sides): 1 edit
    assert error_kind(call({"order_id": "#W3220208"}), seen) == "mis_copied"
    assert error_kind(call({"order_id": "#W3221213"}), seen) == "mis_copied"  # 2 edits
    assert error_kind(call({"order_id": "#W3221214"}), seen) == "unknown_id"  # 3 edits
    assert error_kind(call({"order_id": "#W7999999"}), seen) == "unknown_id"  # invented
    assert error_kind(call({"order_id": "#W3220203"}, ["missing reason"]), seen) == \
        "invalid_arguments"
    assert error_kind(call({"email": "bob@x.com"}), seen) == "none"  # not an identifier key
    # tool responses count as seen: an id read from a result is copied, not invented
    assert error_kind(call({"order_id": "#W5555555"}), seen + '\n{"orders": ["#W5555555"]}') \
        == "none"


def _rec(kind, real_error, prediction, source="policy", **kw):
    return {"kind": kind, "real_error": real_error, "prediction": prediction, "source": source,
            **kw}


def test_error_kind_report_by_hand():
    from envace_lite.pipelines.fidelity_metrics import error_kind_report

    records = [
        _rec("missing_hash", True, "error"),   # caught
        _rec("missing_hash", True, "ok"),      # missed
        _rec("missing_hash", True, "none"),    # no prediction: missed, counted apart
        _rec("unknown_id", True, "error"),     # caught
        _rec("none", False, "ok"),
        _rec("none", False, "error"),          # a false error
        _rec("none", False, "none"),           # no prediction: never a false error
        _rec("none", True, "ok"),              # a rule the policy broke, missed
    ]
    rep = error_kind_report(records)
    assert list(rep) == ["missing_hash", "unknown_id", "none", "all"]
    assert rep["missing_hash"] == {"calls": 3, "real_errors": 3, "caught": 1, "recall": 1 / 3,
                                   "missed_no_prediction": 1, "real_ok": 0, "false_errors": 0,
                                   "false_error_rate": None, "ok_no_prediction": 0}
    assert rep["unknown_id"]["recall"] == 1.0
    assert (rep["none"]["recall"], rep["none"]["false_errors"], rep["none"]["false_error_rate"],
            rep["none"]["ok_no_prediction"]) == (0.0, 1, 1 / 3, 1)
    assert (rep["all"]["real_errors"], rep["all"]["caught"], rep["all"]["recall"],
            rep["all"]["false_error_rate"]) == (5, 2, 0.4, 1 / 3)


def test_decisive_fields_by_hand():
    from envace_lite.pipelines.fidelity_metrics import decisive_match, decisive_report, drill_tier

    assert drill_tier("tau2-retail-drills", "cancel:W2611340") == "cancel"
    assert drill_tier("tau2-retail-ticket", "17") == drill_tier("bfcl-base", "a:b") == ""
    real = '{"order_id": "#W1", "status": "pending", "items": []}'
    assert decisive_match('{"status": "pending"}', real, "status") is True
    assert decisive_match('{"status": "delivered"}', real, "status") is False
    assert decisive_match("Error: Order not found", real, "status") is False
    assert decisive_match('{"status": "pending"}', "Error: Order not found", "status") is None
    records = [{"tier": "cancel", "decisive_field": "status", "decisive": True},
               {"tier": "cancel", "decisive_field": "status", "decisive": False},
               {"tier": "cancel", "decisive_field": "status", "decisive": None},
               {"tier": "two_hop", "decisive_field": "orders", "decisive": True},
               {"tier": "", "decisive_field": "", "decisive": None}]
    assert decisive_report(records) == {
        "cancel": {"fields": ["status"], "pairs": 2, "recalled": 1, "recall": 0.5},
        "two_hop": {"fields": ["orders"], "pairs": 1, "recalled": 1, "recall": 1.0}}


def test_audit_policy_source_reports_error_prediction_on_the_policys_own_calls(tok):
    """``--source policy`` on the first held-out drill (``lookup:W3220203``): the policy first
    makes the Fig. 7 slip (a real error), then the right call, then answers. REHEARSE predicts
    the slip's error and the right call's record with the real status: recall 1 on
    ``missing_hash``, false-error rate 0 on ``none``, the lookup's status recalled."""
    suite = "tau2-retail-drills"
    acts = iter([assistant_text([protocol_call("W3220203")]),
                 assistant_text([protocol_call("#W3220203")]),
                 "Your order #W3220203 is processed."])
    rehearsals = iter([rehearsal_text("Error: Order not found"),
                       rehearsal_text('{"status": "processed"}')])

    def fn(role, prompt):
        return next(rehearsals) if role == "rehearse" else next(acts)

    report = audit((ScriptedGenerator(fn, tok), tok), [suite], cfg_(), limit=1,
                   sources=("policy",), upper_bound=False)
    records = report["records"]
    assert [(r["kind"], r["real_error"], r["prediction"]) for r in records] == [
        ("missing_hash", True, "error"), ("none", False, "ok")]
    pred = report["held_out"]["error_prediction"]
    assert list(pred) == ["policy"]
    kinds = pred["policy"]["error_kinds"]
    assert (kinds["missing_hash"]["recall"], kinds["missing_hash"]["real_errors"]) == (1.0, 1)
    assert (kinds["none"]["false_error_rate"], kinds["none"]["real_ok"]) == (0.0, 1)
    assert pred["policy"]["decisive_fields"] == {
        "lookup": {"fields": ["status"], "pairs": 1, "recalled": 1, "recall": 1.0}}


def protocol_call(order_id):
    from envace_lite.types import ToolCall

    return ToolCall("get_order_details", {"order_id": order_id})


def test_audit_on_a_held_out_slice_with_and_without_the_tasks_grounding(tok):
    """``split="validation"`` takes the pairs of the v2 suite's first validation drill, a lookup
    with one call. With ``grounded`` the same pair is rehearsed again with the drill's real
    result in its prompt. A REHEARSE that writes the real result when it sees it and ``{}``
    otherwise is exact on the grounded pair and not on the bare one."""
    from envace_lite.envs import list_tasks

    suite = "tau2-retail-drills-v2-compact"
    first = list_tasks(suite, "validation")[0]
    (gold,), _ = collect_pairs([suite], "validation", 1, ("gold",))
    assert (gold.task_id, gold.call.name) == (first, "get_order_details") == (
        "lookup:W2307204", "get_order_details")
    shown = []

    def fn(role, prompt):
        text = tok.decode(prompt)
        shown.append(gold.real.content in text)
        return rehearsal_text(gold.real.content if shown[-1] else "{}")

    report = audit((ScriptedGenerator(fn, tok), tok), [suite], cfg_(), limit=1,
                   sources=("gold",), upper_bound=False, split="validation", grounded=True)
    assert report["config"]["split"] == "validation" and report["config"]["grounded"]
    assert shown == [False, True]  # the bare prompt first, then the grounded one
    bare, grounded = report["held_out"], report["held_out_grounded"]
    assert (bare["grounding"], grounded["grounding"]) == ("none", "gold")
    assert bare["overall"]["pairs"] == grounded["overall"]["pairs"] == 1
    assert (bare["overall"]["exact_match"], grounded["overall"]["exact_match"]) == (0.0, 1.0)
    assert [r["task_id"] for r in grounded["records"]] == [first]
    assert grounded["error_prediction"]["gold"]["decisive_fields"]["lookup"]["recall"] == 1.0
    assert bare["error_prediction"]["gold"]["decisive_fields"]["lookup"]["recall"] == 0.0
    assert report["records"][0]["rehearsed"] == "{}"  # the bare pair's record is unchanged
