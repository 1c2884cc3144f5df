"""Tests of envace_lite.core.rewards: the checklist judge, the LLM judge, per-output rewards.

Default tier: synthetic trajectories with hand-computed rewards; the LLM judge talks to a local
``http.server`` on 127.0.0.1.
"""
from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import pytest

from envace_lite.envs.tasks import build_checklist
from envace_lite.core.rewards import (
    checklist_reward,
    judge_turn,
    output_rewards,
    output_valid,
    reward_control,
    score_trajectories,
)
from envace_lite.core.judge import LLMJudge
from envace_lite.drills.reward_control import shuffle_rewards
from envace_lite.types import ChecklistItem, Observation, Output, Step, Task, ToolCall, Trajectory

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


USER = '{"user_id": "u1", "name": "Ann"}'


def lookup_turn(communicate=()) -> list[ChecklistItem]:
    """A lookup turn built like the data: one gold call get_user(u1) whose real output is USER.

    ``tasks.KIND_SHARES`` renormalised over the kinds present: without ``communicate``
    call = 0.6 / 0.8 = 0.75 and observation (expects "u1", "Ann") = 0.2 / 0.8 = 0.25; with it
    call 0.6, observation 0.2, communicate 0.2.
    """
    return build_checklist([ToolCall("get_user", {"user_id": "u1"})], [Observation(USER)],
                           [None], list(communicate))


def lookup(content=USER, user_turn=0, error=False) -> Step:
    return Step(0, user_turn, ToolCall("get_user", {"user_id": "u1"}),
                Observation(content, error=error), "rehearsed")


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


def test_a_call_answered_by_an_error_passes_neither_call_nor_observation():
    # official EnvACE reference: a call whose tool response is an error is not a valid call
    call, obs = TURN0[0], TURN0[1]
    failed = step("get_weather", {"city": "Paris", "days": 2}, "Error: 18C sunny")
    failed.observation.error = True
    retry = step("get_weather", {"city": "Paris", "days": 2}, "18C sunny")
    assert judge_turn([call, obs], [failed], "") == [False, False]
    assert judge_turn([call, obs], [failed, retry], "") == [True, True]  # a clean retry passes


def test_error_observation_reward_by_hand():
    # lookup turn (call 0.75, observation 0.25): the matching call's observation holds "u1" and
    # "Ann" but is an error -> both items fail; the turn closed ("Sorry."), R = 0 / 1 = 0.0.
    # (Were the error ignored, both would pass: R = 0.75 + 0.25 = 1.0.)
    t = traj([lookup(error=True)], ["Sorry."], reached=1, t=task([lookup_turn()]))
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.0) and [i["passed"] for i in d["items"][0]] == [False, False]
    t.steps = [lookup()]  # the same call without the error: 0.75 + 0.25 = 1.0
    assert checklist_reward(t)[0] == pytest.approx(1.0)


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


@pytest.mark.parametrize("stop", ["parse_error", "context_budget", "turn_limit", "env_done"])
def test_interrupted_user_turn_scores_zero(stop):
    # a good call, then the turn is cut off (e.g. broken JSON -> parse_error): no final text.
    # Lookup turn (call 0.75 + observation 0.25, both matched) would score R = 1.0 if closed; the
    # official EnvACE reference scores the open turn 0 -> R = 0 / 1 = 0.0.
    t = traj([lookup()], [""], reached=1, stop=stop, t=task([lookup_turn()]))
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.0) and d["turn_scores"] == [0.0] and d["closed"] == [False]
    assert [i["passed"] for i in d["items"][0]] == [True, True]  # raw verdicts are kept
    # with communicate (call 0.6, observation 0.2, communicate 0.2) and "Bob" in the output the
    # observation item misses "Ann": the partial credit was 0.6; now 0.0
    partial = traj([lookup('{"user_id": "u1", "name": "Bob"}')], [""], reached=1, stop=stop,
                   t=task([lookup_turn(["Ann"])]))
    assert checklist_reward(partial)[0] == pytest.approx(0.0)


def test_closed_turns_keep_their_score_and_only_the_open_turn_scores_zero():
    # closed by a final answer: 0.75 + 0.25 = 1.0; by a terminal tool: 1.0 as well
    assert checklist_reward(traj([lookup()], ["Ann"], 1, t=task([lookup_turn()])))[0] == \
        pytest.approx(1.0)
    assert checklist_reward(traj([lookup()], [""], 1, stop="terminal_tool",
                                 t=task([lookup_turn()])))[0] == pytest.approx(1.0)
    # two lookup turns: turn 0 closed (1.0), turn 1 a good call then a parse error (0):
    # R = (1.0 + 0) / 2 = 0.5 (it was (1.0 + 1.0) / 2 = 1.0)
    t = traj([lookup(), lookup(user_turn=1)], ["Ann", ""], reached=2, stop="parse_error",
             t=task([lookup_turn(), lookup_turn()]))
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.5) and d["turn_scores"] == pytest.approx([1.0, 0.0])
    assert d["closed"] == [True, False]


# ---------------------------------------------------------------------------------------------
# Per-output rewards and masks
# ---------------------------------------------------------------------------------------------

def out(role, empty=False, source="policy") -> Output:
    return Output(role, 0, [1], [2], "", empty=empty, source=source)


def test_empty_output_penalty_subtracts_from_r_and_keeps_trajectory_r():
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C")], ["18 degrees"], 1,
             outputs=[out("act"), out("rehearse", empty=True), out("act", empty=True)])
    with pytest.raises(ValueError, match="not scored"):
        output_rewards(t)
    stats = score_trajectories([t])
    assert stats == {"n": 1, "invalid": 0, "reward_mean": pytest.approx(0.4)}
    # empty outputs get R - 0.1 = 0.3 (they were REPLACED by -0.1 before; the official EnvACE
    # reference subtracts the penalty from R), and R - 0.5 = -0.1 with penalty -0.5
    assert output_rewards(t) == pytest.approx([0.4, 0.3, 0.3])
    assert output_rewards(t, penalty=-0.5) == pytest.approx([0.4, -0.1, -0.1])
    assert t.reward == pytest.approx(0.4)
    assert output_valid(t) == [True, True, True]


def test_empty_output_reward_is_r_minus_p_by_hand():
    # lookup turn closed by "Ann": R = 0.75 + 0.25 = 1.0. The empty REHEARSE output gets
    # R - p = 1.0 - 0.1 = 0.9 (it was -0.1); p's sign does not matter: the config's -0.1 and
    # the reference's coefficient 0.1 both subtract 0.1, never add it
    t = traj([lookup()], ["Ann"], 1, t=task([lookup_turn()]),
             outputs=[out("act"), out("rehearse", empty=True), out("act")])
    score_trajectories([t])
    assert t.reward == pytest.approx(1.0)
    assert output_rewards(t, penalty=-0.1) == pytest.approx([1.0, 0.9, 1.0])
    assert output_rewards(t, penalty=0.1) == pytest.approx([1.0, 0.9, 1.0])


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


def test_llm_judge_scores_an_interrupted_turn_zero(judge_url):
    # every verdict true, but turn 0 was cut off by a parse error (no final text): turn 0 = 0,
    # turn 1 unreached = 0 -> R = 0 / 2 = 0.0 (it was (0.5 + 0.2 + 0.3) / 2 = 0.5)
    t = traj([step("get_weather", {"city": "Paris", "days": 2}, "18C sunny")], [""],
             reached=1, stop="parse_error")
    _Handler.reply = (200, '{"verdicts": [true, true, true]}')
    assert score_trajectories([t], LLMJudge(judge_url, "judge-model", timeout=5))["invalid"] == 0
    assert t.reward == pytest.approx(0.0) and t.reward_details["closed"] == [False, False]


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


def _judged(tid: str, rewards: list) -> list[Trajectory]:
    out = []
    for i, r in enumerate(rewards):
        t = Trajectory(task(), i)
        t.task = Task(tid, "toy", "train", [], [], [], [], [], [])
        t.reward, t.reward_valid = r, r is not None
        t.reward_details = {"judge": "rule"}
        out.append(t)
    return out


def test_shuffle_rewards_permutes_inside_each_group_only():
    a = _judged("a", [0.0, 0.0, 1.0, None])        # the None is a masked trajectory
    b = _judged("b", [0.5, 0.25])
    changed = shuffle_rewards(a + b, seed=3)
    assert sorted(t.reward for t in a[:3]) == [0.0, 0.0, 1.0]
    assert sorted(t.reward for t in b) == [0.25, 0.5]
    assert a[3].reward is None and a[3].reward_valid is False
    assert [t.reward_details["shuffled_from"] for t in a[:3] + b] == [0.0, 0.0, 1.0, 0.5, 0.25]
    assert "shuffled_from" not in a[3].reward_details
    moved = sum(t.reward != t.reward_details["shuffled_from"] for t in a[:3] + b)
    assert changed == moved
    # deterministic by seed, and over seeds the 1.0 lands on every member of its group
    again = _judged("a", [0.0, 0.0, 1.0, None]) + _judged("b", [0.5, 0.25])
    shuffle_rewards(again, seed=3)
    assert [t.reward for t in again] == [t.reward for t in a + b]
    where = set()
    for seed in range(40):
        g = _judged("a", [0.0, 0.0, 1.0])
        shuffle_rewards(g, seed)
        where.add([t.reward for t in g].index(1.0))
    assert where == {0, 1, 2}


def test_shuffle_rewards_of_all_equal_groups_moves_nothing():
    g = _judged("a", [0.5, 0.5, 0.5]) + _judged("b", [0.0, 0.0])
    assert shuffle_rewards(g, seed=0) == 0
    assert [t.reward for t in g] == [0.5, 0.5, 0.5, 0.0, 0.0]


def test_reward_controls_come_from_the_drills_registry(monkeypatch):
    """``study.reward_control`` names a control that a plugin registers: the drills study's
    ``shuffle`` (loaded by name on first use), or one registered by hand."""
    import envace_lite.core.rewards as rewards_mod

    assert reward_control("shuffle") is shuffle_rewards
    with pytest.raises(KeyError, match="unknown study.reward_control 'flip'.*'shuffle'"):
        reward_control("flip")

    def zero(trajs, seed):
        for t in trajs:
            t.reward = 0.0
        return len(trajs)

    monkeypatch.setitem(rewards_mod._REWARD_CONTROLS, "zero", zero)
    g = _judged("a", [0.5, 1.0])
    assert reward_control("zero")(g, 0) == 2 and [t.reward for t in g] == [0.0, 0.0]
