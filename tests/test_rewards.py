"""Tests of envace_lite.rewards: the checklist judge, the LLM judge, per-output rewards.

Default tier: synthetic trajectories with hand-computed rewards; the LLM judge talks to a local
``http.server`` on 127.0.0.1.
"""
from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import pytest

from envace_lite.rewards import (
    LLMJudge,
    checklist_reward,
    judge_turn,
    output_rewards,
    output_valid,
    score_trajectories,
)
from envace_lite.rollout import Output, Step, Trajectory
from envace_lite.types import ChecklistItem, Observation, Task, ToolCall

# Turn 0: weather in Paris, said to the user; turn 1: the model should ask, not call.
TURN0 = [
    ChecklistItem("call", "get_weather", {"city": "Paris", "days": 2}, weight=0.5,
                  required_for_next_turn=True),
    ChecklistItem("observation", "get_weather", {"city": "Paris", "days": 2},
                  expected=["18C", "sunny"], weight=0.2),
    ChecklistItem("communicate", expected="18 degrees", weight=0.3),
]
TURN1 = [ChecklistItem("no_call", weight=1.0, required_for_next_turn=True)]


def task(checklist=None) -> Task:
    checklist = checklist or [TURN0, TURN1]
    turns = [[{"role": "user", "content": f"message {u}"}] for u in range(len(checklist))]
    return Task("toy_1", "toy", "train", [{"role": "system", "content": "Be useful."}] + turns[0],
                [], turns, checklist, [[] for _ in checklist], [[] for _ in checklist])


def step(name, args, content, user_turn=0, turn=0) -> Step:
    return Step(turn, user_turn, ToolCall(name, args), Observation(content), "rehearsed")


def traj(steps, finals, reached, stop="final_answer", t=None, outputs=()) -> Trajectory:
    return Trajectory(t or task(), 0, steps=list(steps), final_texts=list(finals),
                      user_turns_reached=reached, stop_reason=stop, outputs=list(outputs))


# ---------------------------------------------------------------------------------------------
# judge_turn
# ---------------------------------------------------------------------------------------------

def test_call_item_compares_normalised_key_args_only():
    it = TURN0[0]
    # other key order, 2.0 == 2 after JSON normalisation, an extra argument is not compared
    assert judge_turn([it], [step("get_weather", {"days": 2.0, "city": "Paris", "u": "c"}, "")],
                      "") == [True]
    assert judge_turn([it], [step("get_weather", {"city": "paris", "days": 2}, "")], "") == [False]
    assert judge_turn([it], [step("get_weather", {"city": "Paris"}, "")], "") == [False]
    assert judge_turn([it], [step("get_forecast", {"city": "Paris", "days": 2}, "")], "") == [False]
    nested = ChecklistItem("call", "f", {"q": {"a": [1, 2], "b": None}})
    assert judge_turn([nested], [step("f", {"q": {"b": None, "a": (1, 2)}}, "")], "") == [True]


def test_observation_item_needs_a_matching_call_with_every_value():
    it = TURN0[1]
    both = step("get_weather", {"city": "Paris", "days": 2}, '{"t": "18C", "sky": "sunny"}')
    one = step("get_weather", {"city": "Paris", "days": 2}, '{"t": "18C", "sky": "rain"}')
    other_city = step("get_weather", {"city": "Rome", "days": 2}, "18C sunny")
    assert judge_turn([it], [both], "") == [True]
    assert judge_turn([it], [one], "") == [False]
    assert judge_turn([it], [other_city], "") == [False]
    assert judge_turn([it], [one, other_city, both], "") == [True]  # ANY step of the turn


@pytest.mark.parametrize("info,text,expected", [
    ("18 degrees", "It is 18 Degrees today.", True),          # case-insensitive
    ("1000 dollars", "That costs 1,000 DOLLARS.", True),       # commas removed from the text
    ("1,000", "That costs 1,000.", False),                     # ...not from the info (tau2 rule)
    ("18 degrees", "It is 18 deg.", False),
    ("18 degrees", "", False),
])
def test_communicate_follows_tau2_rule(info, text, expected):
    assert judge_turn([ChecklistItem("communicate", expected=info, weight=1.0)], [],
                      text) == [expected]


def test_no_call_needs_a_closed_turn_without_calls():
    it = TURN1[0]
    assert judge_turn([it], [], "Which city do you mean?") == [True]
    assert judge_turn([it], [step("get_weather", {}, "x", 1)], "Which city?") == [False]
    assert judge_turn([it], [], "") == [False]              # cut off (parse error): not closed
    assert judge_turn([it], [], "", closed=True) == [True]  # closed by a terminal tool


def test_unknown_item_kind_raises():
    with pytest.raises(ValueError, match="unknown checklist kind"):
        judge_turn([ChecklistItem("vibes")], [], "")


# ---------------------------------------------------------------------------------------------
# checklist_reward: R = Σ turn scores / reference user turns
# ---------------------------------------------------------------------------------------------

def test_partial_pass_and_unreached_turn():
    # call passes (0.5), observation misses "sunny" (0), communicate passes (0.3): turn 0 = 0.8;
    # turn 1 unreached = 0; R = 0.8 / 2 = 0.4
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C, rain")],
             ["It is 18 degrees."], reached=1, stop="gate_closed")
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.4)
    assert d["turn_scores"] == pytest.approx([0.8, 0.0])
    assert [i["passed"] for i in d["items"][0]] == [True, False, True]
    assert d["items"][1] == [{"kind": "no_call", "tool": "", "weight": 1.0, "passed": False}]
    assert (d["user_turns"], d["reached"]) == (2, 1)


def test_full_pass_two_turns():
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C sunny")],
             ["18 degrees and sunny", "Which day?"], reached=2)
    r, d = checklist_reward(t)
    assert r == pytest.approx(1.0) and d["turn_scores"] == pytest.approx([1.0, 1.0])


def test_no_call_turn_fails_on_a_call_and_steps_count_only_in_their_turn():
    # the Paris call is made in turn 1: turn 0 gets only communicate (0.3); turn 1's no_call
    # fails because of that call; R = 0.3 / 2 = 0.15
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C sunny", user_turn=1)],
             ["18 degrees", "done"], reached=2)
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.15) and d["turn_scores"] == pytest.approx([0.3, 0.0])


def test_no_call_turn_cut_off_by_a_parse_error_scores_zero():
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C sunny")],
             ["18 degrees", ""], reached=2, stop="parse_error")
    assert checklist_reward(t)[0] == pytest.approx(0.5)
    t.stop_reason = "terminal_tool"  # a terminal tool closes the turn: no_call passes
    assert checklist_reward(t)[0] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# Per-output rewards and masks
# ---------------------------------------------------------------------------------------------

def out(role, empty=False, source="policy") -> Output:
    return Output(role, 0, [1], [2], "", empty=empty, source=source)


def test_empty_output_penalty_replaces_r_and_keeps_trajectory_r():
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C")], ["18 degrees"], 1,
             outputs=[out("act"), out("rehearse", empty=True), out("act", empty=True)])
    with pytest.raises(ValueError, match="not scored"):
        output_rewards(t)
    stats = score_trajectories([t])
    assert stats == {"n": 1, "invalid": 0, "reward_mean": pytest.approx(0.4)}
    assert output_rewards(t) == pytest.approx([0.4, -0.1, -0.1])
    assert output_rewards(t, penalty=-0.5) == pytest.approx([0.4, -0.5, -0.5])
    assert t.reward == pytest.approx(0.4)
    assert output_valid(t) == [True, True, True]


def test_output_valid_masks_frozen_simulator_and_invalid_trajectories():
    t = traj([], [""], 1, outputs=[out("act"), out("rehearse", source="frozen_simulator")])
    score_trajectories([t])
    assert output_valid(t) == [True, False]
    t.reward_valid, t.reward = False, None
    assert output_valid(t) == [False, False] and output_rewards(t) == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# The LLM judge against a local server
# ---------------------------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    reply: ClassVar[tuple[int, str]] = (200, "")
    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append(body)
        code, content = _Handler.reply
        if code != 200:
            self.send_error(code)
            return
        data = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def judge_url():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


def test_llm_judge_good_garbage_and_http_error(judge_url):
    judge = LLMJudge(judge_url, "judge-model", timeout=5)
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C sunny")],
             ["18 degrees"], reached=1)
    # good: 3 items of the one reached turn; call + communicate pass -> 0.8 / 2 turns = 0.4
    _Handler.reply = (200, '```json\n{"verdicts": [true, false, true]}\n```')
    assert score_trajectories([t], judge)["invalid"] == 0
    assert t.reward == pytest.approx(0.4) and t.reward_valid
    assert t.reward_details["judge"] == "llm"
    sent = _Handler.seen[-1]
    assert sent["model"] == "judge-model"
    assert "3 booleans" in sent["messages"][1]["content"]
    assert "get_weather" in sent["messages"][1]["content"]
    for reply in [(200, "I think the agent did well."),            # no JSON
                  (200, '{"verdicts": [true, false]}'),           # wrong item count
                  (200, '{"verdicts": [1, 0, 1]}'),               # not booleans
                  (500, "")]:                                      # HTTP error
        _Handler.reply = reply
        stats = score_trajectories([t], judge)
        assert stats == {"n": 1, "invalid": 1, "reward_mean": None}
        assert t.reward is None and not t.reward_valid
        assert "judge_error" in t.reward_details


def test_llm_judge_unreachable_endpoint_is_masked():
    t = traj([], ["hi"], reached=1)
    stats = score_trajectories([t], LLMJudge("http://127.0.0.1:9/v1", "m", timeout=2))
    assert stats["invalid"] == 1 and t.reward is None


# ---------------------------------------------------------------------------------------------
# Verifiable rewards
# ---------------------------------------------------------------------------------------------

class _Env:
    def __init__(self, result):
        self.result = result

    def score(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_verifiable_rewards_use_env_score_and_mask_crashes():
    good, bad = traj([], [""], 1), traj([], [""], 1)
    good.env, bad.env = _Env((1.0, {"valid": True})), _Env(RuntimeError("checker crashed"))
    stats = score_trajectories([good, bad], "verifiable")
    assert stats == {"n": 2, "invalid": 1, "reward_mean": 1.0}
    assert good.reward == 1.0 and good.reward_details["valid"] is True
    assert bad.reward is None and not bad.reward_valid
    with pytest.raises(ValueError, match="mode='real'"):
        score_trajectories([traj([], [""], 1)], "verifiable")
    with pytest.raises(ValueError, match="judge="):
        score_trajectories([good], "magic")
