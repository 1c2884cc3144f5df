"""Checklist construction (docs/design.md, "The checklist reward"): items, weights and key values,
computed by hand."""
from __future__ import annotations

import json

import pytest

from envace_lite.envs.tasks import build_checklist, key_values
from envace_lite.types import Observation, ToolCall


def test_weights_call_observation_communicate_by_hand():
    calls = [ToolCall("get_user", {"user_id": "u1"}), ToolCall("cancel", {"order_id": "#W1", "reason": "x"})]
    obs = [Observation(json.dumps({"user_id": "u1", "name": "Ann"})), Observation("Error: no", error=True)]
    items = build_checklist(calls, obs, [None, ["order_id"]], ["refund 10"])
    kinds = [i.kind for i in items]
    assert kinds == ["call", "call", "observation", "communicate"]
    # shares 0.6 / 0.2 / 0.2 (all three kinds present): two call items at 0.3 each
    assert [round(i.weight, 12) for i in items] == [0.3, 0.3, 0.2, 0.2]
    assert items[1].key_args == {"order_id": "#W1"}  # compare_args keep only the named keys
    assert items[0].key_args == {"user_id": "u1"}     # None: all arguments
    assert items[2].expected == ["u1", "Ann"]         # the error observation gives no item
    assert items[0].required_for_next_turn and not items[3].required_for_next_turn
    assert sum(i.weight for i in items) == pytest.approx(1.0)


def test_weights_renormalise_over_present_kinds():
    items = build_checklist([ToolCall("ls", {})], [Observation("Error: x", error=True)], [None], [])
    assert [(i.kind, i.weight) for i in items] == [("call", 1.0)]
    items = build_checklist([ToolCall("ls", {})], [Observation('{"files": ["a.txt"]}')], [None], [])
    # call 0.6/(0.6+0.2) = 0.75, observation 0.25
    assert [(i.kind, round(i.weight, 12)) for i in items] == [("call", 0.75), ("observation", 0.25)]
    assert items[1].expected == ["a.txt"]


def test_empty_gold_turn_is_one_no_call_item():
    items = build_checklist([], [], [], [])
    assert [(i.kind, i.weight) for i in items] == [("no_call", 1.0)]


def test_communicate_only_turn():
    items = build_checklist([], [], [], ["a", "b"])
    assert [(i.kind, i.expected, i.weight) for i in items] == [
        ("communicate", "a", 0.5), ("communicate", "b", 0.5)]


@pytest.mark.parametrize("content, expected", [
    ('{"order_id": "#W123", "status": "pending", "total": 10.5, "note": "ok"}',
     ["#W123", "pending", "10.5"]),          # identifiers and status first, then others, cap 3
    ('{"ok": true, "x": null}', []),         # booleans and nulls are not key values
    ("Transfer successful", ["Transfer successful"]),
    ("ok", []),                              # too short to be evidence
    ('[{"name": "a.txt"}, {"name": "b.txt"}]', ["a.txt", "b.txt"]),
    ("", []),
])
def test_key_values(content, expected):
    assert key_values(content) == expected
