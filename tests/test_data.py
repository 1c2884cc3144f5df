"""Derived tasks: splits, checklist invariants, grounding from real executions, flags."""
from __future__ import annotations

import json

import pytest

from envace_lite.envs.tasks import checklist_weights_ok, load_tasks
from envace_lite.envs import list_tasks, make_env
from envace_lite.paths import DATA_DIR


@pytest.mark.parametrize("suite", ["bfcl-base", "bfcl-miss_param", "tau2-telecom"])
def test_training_tasks_are_train_split_only_and_well_formed(suite):
    tasks = load_tasks(suite, "train")
    test_ids = set(list_tasks(suite, "test"))
    assert tasks and all(t.split == "train" for t in tasks)
    assert not {t.id for t in tasks} & test_ids
    assert all(checklist_weights_ok(t) for t in tasks)
    for t in tasks:
        assert len(t.checklist) == len(t.user_turns) == len(t.grounding) == len(t.gold_calls)
        for turn, ground in zip(t.gold_calls, t.grounding):
            assert [g["call"]["name"] for g in ground] == [c["name"] for c in turn]


def test_miss_param_empty_gold_turns_get_no_call_items():
    tasks = load_tasks("bfcl-miss_param", "train")
    no_call_turns = sum(1 for t in tasks for turn in t.checklist if turn[0].kind == "no_call")
    empty_gold = sum(1 for t in tasks for g in t.gold_calls if not g)
    assert no_call_turns == empty_gold and empty_gold >= len(tasks)  # at least one per entry


def test_grounding_is_the_real_observation():
    (task,) = load_tasks("bfcl-base", "train", limit=1)
    env = make_env("bfcl-base", task.id)
    env.reset()
    first = task.grounding[0][0]
    from envace_lite.types import ToolCall

    [obs] = env.step([ToolCall(first["call"]["name"], first["call"]["arguments"])])
    env.close()
    assert obs.content == first["observation"]["content"]


def test_flagged_gold_errors_match_the_adapter_and_the_card():
    tasks = load_tasks("tau2-retail-ticket", "test")
    flagged = sorted(t.id for t in tasks if t.flags)
    assert flagged == ["12", "38", "39", "55", "64", "68"]
    for tid in flagged:
        env = make_env("tau2-retail-ticket", tid)
        (turn,) = env.gold_turns()
        assert [int(f.split(":")[2]) for f in next(t for t in tasks if t.id == tid).flags] \
            == turn.failing
    card = json.loads((DATA_DIR / "card.json").read_text())
    assert len(card["tau2-retail-ticket"]["test"]["gold_call_errors"]) == 6


def test_tau2_compare_args_restrict_key_args():
    tasks = load_tasks("tau2-telecom", "all")
    restricted = 0
    for t in tasks:
        env = make_env("tau2-telecom", t.id)
        (turn,) = env.gold_turns()
        calls = [c for c in turn.calls if c.name != "done"]
        items = [i for i in t.checklist[0] if i.kind == "call"]
        for c, names, item in zip(calls, turn.key_args, items):
            expected = c.arguments if names is None else {k: c.arguments.get(k) for k in names}
            assert item.key_args == json.loads(json.dumps(expected))
            restricted += names is not None
    assert restricted == 20  # tau2 telecom sets compare_args on 20 gold actions


def test_card_counts_match_the_splits():
    card = json.loads((DATA_DIR / "card.json").read_text())
    assert card["tau2-telecom"]["train"]["tasks"] == 74 and card["tau2-telecom"]["test"]["tasks"] == 40
    assert card["tau2-retail-ticket"]["train"]["tasks"] == 74
    assert card["tau2-airline-ticket"]["test"]["tasks"] == 20
    for cat in ("base", "miss_func", "miss_param", "long_context"):
        assert card[f"bfcl-{cat}"]["train"]["tasks"] == 150
        assert card[f"bfcl-{cat}"]["test"]["tasks"] == 50
