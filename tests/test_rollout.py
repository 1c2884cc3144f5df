"""Tests of envace_lite.core.rollout: packing, batching, modes, stops and bad model text.

Default tier: the real Qwen3 tokenizer, scripted generators, real BFCL / tau2 adapters, and one
end-to-end run of the tiny random Qwen3 through the real parser.
"""
from __future__ import annotations

import pytest

from envace_lite import protocol
from envace_lite.protocol.prompts import (
    act_messages,
    assistant_text,
    call_json,
    tool_response_message,
)
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.envs import make_env
from envace_lite.llm.generation import HFGenerator, chat_ids
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.core.rewards import checklist_reward, output_valid, score_trajectories
from envace_lite.core.engine import chat_glue
from envace_lite.core.rollout import close_envs, rollout, rollout_stats
from envace_lite.types import ChecklistItem, Task, ToolCall

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book", "description": "Book a table.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]
CALL = assistant_text([ToolCall("get_weather", {"city": "Paris"})])
CALL2 = assistant_text([ToolCall("get_weather", {"city": "Paris"}),
                        ToolCall("book", {"city": "Paris"})])
RESULT = rehearsal_text('{"temp": "18C"}')


def toy_task(n_turns: int = 1, tid: str = "toy_0", required: bool = True) -> Task:
    """A small task: every user turn asks for Paris weather (a required ``call`` item)."""
    turns = [[{"role": "user", "content": f"{tid} question {u}"}] for u in range(n_turns)]
    item = ChecklistItem("call", "get_weather", {"city": "Paris"}, weight=1.0,
                         required_for_next_turn=required)
    grounding = [{"call": {"name": "get_weather", "arguments": {"city": "Paris"}},
                  "observation": {"content": '{"temp": "18C"}', "error": False}}]
    return Task(tid, "toy", "train", [{"role": "system", "content": "Be brief."}] + turns[0],
                TOOLS, turns, [[item] for _ in turns], [grounding for _ in turns],
                [[] for _ in turns])


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def cfg_(**kw):
    over = {"rollout.max_new_tokens_act": 256, "rollout.max_new_tokens_rehearse": 256,
            "rollout.grounding_drop_p": 0.0}
    return get_config("smoke", {**over, **{f"rollout.{k}": v for k, v in kw.items()}})


def run(tok, acts, rehearse=(RESULT,), tasks=None, k=1, cfg=None, **kw):
    gen = ScriptedGenerator({"act": list(acts), "rehearse": list(rehearse)}, tok)
    trajs = rollout(tasks or [toy_task()], gen, tok, cfg or cfg_(), k=k, **kw)
    return trajs, gen


def check_packing(tok, t):
    """(f): mask sums, spans, prompt ids, and the initial prompt."""
    acts = [o for o in t.outputs if o.role == "act"]
    assert sum(t.act_mask) == sum(len(o.ids) for o in acts)
    assert len(t.act_ids) == len(t.act_mask) and len(t.act_spans) == len(acts) == t.turns
    for o, (a, b) in zip(acts, t.act_spans):
        assert t.act_ids[a:b] == o.ids and set(t.act_mask[a:b]) <= {1}
        assert o.prompt_ids == t.act_ids[:a]
    first = chat_ids(tok, act_messages(t.task.messages, t.task.tools, "compact",
                                       get_config("smoke").rollout.compact_policy_chars))
    assert t.act_ids[:t.act_prompt_len] == first and sum(t.act_mask[:t.act_prompt_len]) == 0


# ---------------------------------------------------------------------------------------------
# Packing: the glue comes from the template and the packed ids decode to its rendering
# ---------------------------------------------------------------------------------------------

def test_glue_is_derived_from_the_qwen3_template(tok):
    g = chat_glue(tok)
    assert g.gen_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert (g.user_prefix, g.user_suffix) == ("<|im_start|>user\n", "<|im_end|>\n")
    assert g.assistant_suffix == "<|im_end|>\n" and g.eot_id == tok.convert_tokens_to_ids(
        "<|im_end|>")
    assert g.close(True) == "\n" and g.close(False) == "<|im_end|>\n"


@pytest.mark.parametrize("cap", [256, 12])  # 12 tokens: the call is cut, finish_reason=length
def test_packed_history_decodes_to_the_template_rendering(tok, cap):
    task = toy_task()
    (t,), _ = run(tok, [CALL, "It is 18C."], cfg=cfg_(max_new_tokens_act=cap))
    a0 = t.outputs[0]
    if cap == 12:  # a cut call is a parse error: one output, nothing appended after it
        assert a0.finish_reason == "length" and t.stop_reason == "parse_error"
        assert a0.ids == tok.encode(CALL, add_special_tokens=False)[:12] and len(t.act_ids) == \
            t.act_prompt_len + 12
        return
    assert a0.finish_reason == "stop" and a0.ids[-1] == chat_glue(tok).eot_id
    obs = tool_response_message([t.steps[0].observation])
    msgs = act_messages(task.messages, task.tools, "compact", 600,
                        [{"role": "assistant", "content": CALL}, obs])
    # up to the second generation prompt (one turn of history)
    a1_start = t.act_spans[1][0]
    packed = tok.decode(t.act_ids[:a1_start])
    rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                       enable_thinking=False)
    # Qwen3's template drops the empty think block of earlier assistant turns; the packed history
    # keeps the generation prompt that the model was actually sampled from
    assert packed.replace("<think>\n\n</think>\n\n", "", 1) == rendered
    head = tok.apply_chat_template(msgs[:3], tokenize=False, enable_thinking=False)
    assert tok.decode(t.act_ids[:t.act_spans[0][1]]) + "\n" == head
    assert t.act_ids[-1] == chat_glue(tok).eot_id  # nothing appended after the last output
    check_packing(tok, t)


def test_smollm2_glue_when_cached():
    from transformers import AutoTokenizer

    from envace_lite.paths import CACHE_STAMP, cache_dir

    folder = cache_dir("models") / "smollm2-135m"
    if not (folder / CACHE_STAMP).exists():
        pytest.skip("SmolLM2 HF folder not cached (built by models.smollm2_hf_dir)")
    tok = AutoTokenizer.from_pretrained(folder)
    g = chat_glue(tok)
    assert g.gen_prompt == "<|im_start|>assistant\n" and g.user_prefix == "<|im_start|>user\n"
    assert g.assistant_suffix == "<|im_end|>\n" and g.eot_id == tok.convert_tokens_to_ids(
        "<|im_end|>")
    (t,), _ = run(tok, [CALL, "It is 18C."])
    obs = tool_response_message([t.steps[0].observation])
    msgs = act_messages(t.task.messages, TOOLS, "compact", 600,
                        [{"role": "assistant", "content": CALL}, obs])
    assert tok.decode(t.act_ids[:t.act_spans[1][0]]) == tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------

class RaisingEnv:
    """A live real env whose ``step`` must never be called."""

    def __init__(self, env):
        self._env = env

    def step(self, calls):
        raise AssertionError("rehearse mode executed a real call")

    def __getattr__(self, name):
        return getattr(self._env, name)


@pytest.fixture(scope="module")
def bfcl_task():
    return next(t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_3")


def gold_script(task):
    """ACT texts that make each user turn's gold calls in one reply, then answer."""
    script = []
    for calls in task.gold_calls:
        script += [assistant_text([ToolCall(c["name"], c["arguments"])
                                   for c in calls]), "Done."]
    return script


def per_trajectory(tok, task, acts):
    """A generator function for k > 1: ACT answers ``acts[turn]`` (the turn is read off the
    prompt), REHEARSE answers the grounding's real result of the current call."""
    world = {call_json(ToolCall(g["call"]["name"], g["call"]["arguments"])):
             rehearsal_text(g["observation"]["content"])
             for turn in task.grounding for g in turn}

    def answer(role, prompt):
        text = tok.decode(prompt)
        if role == "act":
            return acts[text.count("<|im_start|>assistant") - 1]
        call = text.split("## Current call\n<tool_call>\n")[1].split("\n</tool_call>")[0]
        return world[call]

    return ScriptedGenerator(answer, tok)


def test_rehearse_mode_never_steps_the_real_env(tok, bfcl_task):
    envs = []

    def factory(task):
        envs.append(RaisingEnv(make_env(task.suite, task.id)))
        return envs[-1]

    gen = per_trajectory(tok, bfcl_task, gold_script(bfcl_task))
    trajs = rollout([bfcl_task], gen, tok, cfg_(max_turns=8), k=2, env_factory=factory)
    try:
        for t in trajs:
            assert t.real_calls == 0 and t.env.real_calls == 0
            assert len(t.steps) == 5 and {s.source for s in t.steps} == {"rehearsed"}
            assert t.stop_reason == "final_answer" and t.user_turns_reached == 2
        assert checklist_reward(trajs[0])[0] == pytest.approx(1.0)  # faithful rehearsal
    finally:
        close_envs(trajs)


def test_real_mode_makes_one_real_call_per_parsed_call(tok, bfcl_task):
    trajs, gen = run(tok, gold_script(bfcl_task), (), [bfcl_task], cfg=cfg_(max_turns=8),
                     mode="real")
    (t,) = trajs
    n_parsed = sum(len(protocol.parse_act(o.text, bfcl_task.tools).calls) for o in t.outputs)
    assert t.real_calls == t.env.real_calls == n_parsed == len(t.steps) == 5
    assert {s.source for s in t.steps} == {"real"} and t.grounding == "none"
    assert [r for r, _ in gen.calls] == ["act"] * 4  # REHEARSE never runs
    assert t.stop_reason == "final_answer" and t.user_turns_reached == 2
    assert score_trajectories(trajs, "rule")["reward_mean"] == pytest.approx(1.0)
    assert score_trajectories(trajs, "verifiable")["reward_mean"] == 1.0
    close_envs(trajs)
    assert t.env is None


def test_frozen_simulator_writes_the_observations(tok):
    policy = ScriptedGenerator({"act": [CALL, "It is 18C."]}, tok)
    sim = ScriptedGenerator({"rehearse": [rehearsal_text("frozen says 20C")]}, tok)
    (t,) = rollout([toy_task()], policy, tok, cfg_(), k=1, mode="frozen_simulator",
                   simulator=sim)
    assert [r for r, _ in policy.calls] == ["act", "act"]
    assert [r for r, _ in sim.calls] == ["rehearse"]
    assert t.steps[0].observation.content == "frozen says 20C"
    assert t.steps[0].source == "frozen_simulator"
    score_trajectories([t])
    assert [o.source for o in t.outputs] == ["policy", "frozen_simulator", "policy"]
    assert output_valid(t) == [True, False, True]
    with pytest.raises(ValueError, match="simulator="):
        rollout([toy_task()], policy, tok, cfg_(), k=1, mode="frozen_simulator")


# ---------------------------------------------------------------------------------------------
# Batching, replay, stops
# ---------------------------------------------------------------------------------------------

def test_turn_synchronous_batching_and_drop_out(tok):
    tasks = [toy_task(tid="toy_a"), toy_task(tid="toy_b")]
    # turn 0, in task-major order a0 a1 b0 b1; turn 1: a0 b0 b1; turn 2: b1
    acts = [CALL, "final a1", CALL2, CALL, "final a0", "final b0", CALL, "final b1"]
    trajs, gen = run(tok, acts, tasks=tasks, k=2)
    assert [(r, len(p)) for r, p in gen.calls] == [
        ("act", 4), ("rehearse", 4), ("act", 3), ("rehearse", 1), ("act", 1)]
    assert [(t.task.id, t.index) for t in trajs] == [
        ("toy_a", 0), ("toy_a", 1), ("toy_b", 0), ("toy_b", 1)]
    assert [t.turns for t in trajs] == [2, 1, 2, 3]
    assert [t.final_texts[0] for t in trajs] == ["final a0", "final a1", "final b0", "final b1"]
    assert [len(t.steps) for t in trajs] == [1, 0, 2, 2]
    assert [s.call.call_id for s in trajs[2].steps] == ["call_0_0", "call_0_1"]
    assert [s.call.call_id for s in trajs[3].steps] == ["call_0_0", "call_1_0"]
    # each REHEARSE output records the prompt it was sampled from, in batch order
    reh = [o for t in trajs for o in t.outputs if o.role == "rehearse" and o.turn == 0]
    assert [o.prompt_ids for o in reh] == gen.calls[1][1]
    assert [o.call_index for o in reh] == [0, 0, 1, 0]
    assert trajs[0].outputs[1].prompt_ids != trajs[0].outputs[0].prompt_ids
    for t in trajs:
        check_packing(tok, t)
        assert t.stop_reason == "final_answer"


def test_gated_and_always_replay(tok):
    task = toy_task(n_turns=3)
    (gated,), g1 = run(tok, ["No call, sorry."], tasks=[task])
    assert gated.stop_reason == "gate_closed" and gated.user_turns_reached == 1
    assert len(g1.calls) == 1
    (always,), g2 = run(tok, ["No call, sorry."], tasks=[task],
                        cfg=cfg_(user_replay="always"))
    assert always.stop_reason == "final_answer" and always.user_turns_reached == 3
    assert always.final_texts == ["No call, sorry."] * 3 and len(g2.calls) == 3
    # the next user turn joined the history as a user message
    assert "toy_0 question 2" in tok.decode(always.act_ids)
    # a passed required item opens the gate
    (passed,), _ = run(tok, [CALL, "18C.", CALL, "18C.", "no"], tasks=[task],
                       cfg=cfg_(max_turns=10))
    assert passed.user_turns_reached == 3 and passed.stop_reason == "final_answer"
    assert checklist_reward(passed)[0] == pytest.approx(2 / 3)
    # items that are not required never close the gate
    (free,), _ = run(tok, ["No call."], tasks=[toy_task(n_turns=2, required=False)])
    assert free.stop_reason == "final_answer" and free.user_turns_reached == 2


def test_good_call_then_broken_json_scores_zero(tok):
    # the toy turn's one item is the Paris call (weight 1.0). ACT makes it, REHEARSE answers,
    # then ACT writes broken JSON: parse_error, the user turn never closed. The matched call
    # would give R = 1.0 in a closed turn; an interrupted turn scores 0 (official EnvACE reference)
    broken = '<tool_call>{"name": "get_weather", "arguments": {</tool_call>'
    (t,), _ = run(tok, [CALL, broken])
    assert t.stop_reason == "parse_error" and len(t.steps) == 1 and t.final_texts == [""]
    r, d = checklist_reward(t)
    assert r == pytest.approx(0.0) and d["items"][0][0]["passed"] and d["closed"] == [False]


def test_context_budget_stops_before_generating(tok):
    task = toy_task()
    n = len(chat_ids(tok, act_messages(task.messages, TOOLS, "compact", 600)))
    (t,), gen = run(tok, [CALL], cfg=cfg_(max_prompt_tokens=n - 1))
    assert t.stop_reason == "context_budget" and t.outputs == [] and gen.calls == []
    # one turn fits; the observation glue would push the next prompt over the budget
    (t,), gen = run(tok, [CALL], cfg=cfg_(max_prompt_tokens=n + 30))
    assert t.stop_reason == "context_budget" and t.turns == 1
    assert [r for r, _ in gen.calls] == ["act", "rehearse"]
    assert len(t.act_ids) <= n + 30 and t.act_ids[-1] == chat_glue(tok).eot_id


def test_turn_limit(tok):
    (t,), _ = run(tok, [CALL], cfg=cfg_(max_turns=3))
    assert t.stop_reason == "turn_limit" and t.turns == 3 and len(t.steps) == 3
    assert [o.role for o in t.outputs] == ["act", "rehearse"] * 3
    check_packing(tok, t)


def test_telecom_done_is_terminal_not_rehearsed_not_counted(tok):
    task = load_tasks("tau2-telecom", "train")[0]
    toggle = ToolCall("toggle_airplane_mode", {})
    script = [assistant_text([toggle, ToolCall("done", {}), toggle]),
              assistant_text([ToolCall("done", {})])]
    trajs, gen = run(tok, script, tasks=[task], k=2)
    first, second = trajs
    assert first.stop_reason == second.stop_reason == "terminal_tool"
    assert [s.call.name for s in first.steps] == ["toggle_airplane_mode"]  # after done: dropped
    assert second.steps == [] and [o.role for o in second.outputs] == ["act"]
    assert [(r, len(p)) for r, p in gen.calls] == [("act", 2), ("rehearse", 1)]
    assert first.real_calls == second.real_calls == 0


def test_rehearse_prompt_over_budget_is_generated_anyway(tok):
    task = toy_task()
    n = len(chat_ids(tok, act_messages(task.messages, TOOLS, "compact", 600)))
    (t,), _ = run(tok, [CALL, "ok"], cfg=cfg_(max_prompt_tokens=n + 80))
    reh = t.outputs[1]
    assert reh.role == "rehearse" and not reh.prompt_fits
    assert t.steps[0].observation.content == '{"temp": "18C"}'
    assert t.stop_reason == "final_answer" and rollout_stats([t])["rehearse/over_budget"] == 1


def test_grounding_drop_is_seeded_per_trajectory(tok):
    def pattern(p, seed):
        gen = ScriptedGenerator(lambda role, prompt: RESULT if role == "rehearse" else
                                CALL if tok.decode(prompt).count("<tool_response>") == 0 else
                                "ok", tok)
        trajs = rollout([toy_task()], gen, tok, cfg_(grounding_drop_p=p), k=8, seed=seed)
        hidden = "for this task\n<unavailable>"
        shown = [hidden not in tok.decode(prompt) for prompt in gen.calls[1][1]]
        assert shown == [t.grounding == "gold" for t in trajs]
        return [t.grounding for t in trajs]

    assert pattern(0.0, 0) == ["gold"] * 8 and pattern(1.0, 0) == ["none"] * 8
    half = pattern(0.5, 3)
    assert half == pattern(0.5, 3) and set(half) == {"gold", "none"}


@pytest.mark.parametrize("scope", ["task", "seen"])
def test_grounding_scope_hides_future_user_turns(tok, scope):
    # two user turns; the gold result of turn 0 says 18C, that of turn 1 says 25C
    task = toy_task(2)
    task.grounding = [[{"call": {"name": "get_weather", "arguments": {"city": "Paris"}},
                        "observation": {"content": f'{{"temp": "{t}"}}', "error": False}}]
                      for t in ("18C", "25C")]
    (t,), gen = run(tok, [CALL, "ok", CALL, "ok"], (RESULT, RESULT), tasks=[task],
                    cfg=cfg_(grounding_scope=scope))
    reh = [tok.decode(p) for role, ps in gen.calls if role == "rehearse" for p in ps]
    assert len(reh) == 2 and t.user_turns_reached == 2
    # turn 0's REHEARSE sees turn 1's result only with the whole task's grounding
    assert "18C" in reh[0] and ("25C" in reh[0]) == (scope == "task")
    assert "18C" in reh[1] and "25C" in reh[1]  # in turn 1 both are current or earlier


# ---------------------------------------------------------------------------------------------
# (e) Bad model output: every case ends in its recorded outcome; nothing escapes
# ---------------------------------------------------------------------------------------------

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ACT_CASES = [  # (ACT text, stop_reason, error_code of the ACT output, steps, violations)
    ("", "parse_error", "empty_output", 0, False),
    ("<think>\n\n</think>\n\n", "parse_error", "empty_output", 0, False),
    ("<think>I will call get_weather", "parse_error", "unclosed_think", 0, False),
    ('<tool_call>{"name": "get_weather", "arguments": {</tool_call>', "parse_error", "bad_json", 0,
     False),
    ("<tool_call></tool_call>", "parse_error", "empty_call", 0, False),
    ('<TOOL_CALL>{"name": "book"}</TOOL_CALL>', "parse_error", "malformed_tag", 0, False),
    ('<tool_call>[{"name": "book"}]</tool_call>', "parse_error", "call_not_object", 0, False),
    ('<tool_call>{"arguments": {}}</tool_call>', "parse_error", "missing_name", 0, False),
    ('<tool_call>{"name": 3}</tool_call>', "parse_error", "bad_name", 0, False),
    ('<tool_call>{"name": "book", "arguments": 5}</tool_call>', "parse_error",
     "arguments_not_object", 0, False),
    ("</tool_call>", "parse_error", "unbalanced_tag", 0, False),
    ('<tool_call>{"name": "book"', "parse_error", "unclosed_tag", 0, False),
    ('<tool_call>{"name": "book", "arguments": {"city": NaN}}</tool_call>', "parse_error",
     "bad_json", 0, False),
    (f"<tool_call>{W}</tool_call><tool_call>{W}", "final_answer", "", 2, False),  # last one: JSON
    # violations are not parse errors: the call is rehearsed, the episode goes on
    ('<tool_call>{"name": "teleport", "arguments": {}}</tool_call>', "final_answer", "", 1, True),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>', "final_answer",
     "", 1, True),
    (f"<tool_call>{W}", "final_answer", "", 1, False),  # unclosed, but the rest is complete JSON
]
REHEARSE_CASES = [  # (REHEARSE text, observation content, error flag, error_code)
    ("", "", False, "empty_output"),
    ("no tags at all", "no tags at all", False, "no_execution_result"),
    ("Error: city not found", "Error: city not found", True, "no_execution_result"),
    ("<Execution_Result>x</Execution_Result>", "<Execution_Result>x</Execution_Result>", False,
     "malformed_tag"),
    ("<execution_result></execution_result>", "<execution_result></execution_result>", False,
     "empty_result"),
    ("<execution_result>partial text", "<execution_result>partial text", False,
     "unclosed_result"),
    ("<think>the weather is", "", False, "unclosed_think"),
    ("<execution_result><execution_result>x</execution_result>",
     "<execution_result><execution_result>x</execution_result>", False, "unbalanced_tag"),
    ("x" * 3000, "x" * 2000, False, "no_execution_result"),  # raw text capped
    # proper results, errors included: ordinary observations, the episode goes on
    ('<execution_result>{"error": "unknown city"}</execution_result>', '{"error": "unknown city"}',
     True, ""),
    ("<execution_result>Error: no such city</execution_result>", "Error: no such city", True, ""),
    ('<execution_result>{"temp": "18C"}', '{"temp": "18C"}', False, ""),
    ("<think>plan</think><execution_result>sunny</execution_result>", "sunny", False, ""),
]


@pytest.mark.parametrize("text,stop,code,n_steps,violated", ACT_CASES)
def test_malformed_act_output(tok, text, stop, code, n_steps, violated):
    (t,), _ = run(tok, [text, "It is 18C."], cfg=cfg_(max_new_tokens_rehearse=4096))
    assert t.stop_reason == stop and t.outputs[0].error_code == code
    assert t.outputs[0].parse_kind == ("error" if code else "calls")
    assert t.outputs[0].empty == (code == "empty_output") and len(t.steps) == n_steps
    assert all(bool(st.call.violations) == violated for st in t.steps)
    assert all(st.observation.content == '{"temp": "18C"}' for st in t.steps)  # rehearsed
    check_packing(tok, t)


@pytest.mark.parametrize("text,content,error,code", REHEARSE_CASES)
def test_malformed_rehearse_output(tok, text, content, error, code):
    (t,), _ = run(tok, [CALL, "It is 18C."], [text], cfg=cfg_(max_new_tokens_rehearse=4096))
    reh = t.outputs[1]
    assert reh.role == "rehearse" and reh.error_code == code
    assert reh.parse_kind == ("error" if code else "ok") and reh.empty == (code == "empty_output")
    assert (t.steps[0].observation.content, t.steps[0].observation.error) == (content, error)
    assert t.stop_reason == "final_answer" and t.turns == 2  # the episode always goes on
    assert rollout_stats([t])["rehearse/parse_errors"] == (1 if code else 0)


def test_there_are_at_least_20_malformed_cases():
    bad = [c for c in ACT_CASES if c[2]] + [c for c in REHEARSE_CASES if c[3]]
    assert len(bad) >= 20


# ---------------------------------------------------------------------------------------------
# End to end: the tiny random Qwen3, the real parser, real tasks
# ---------------------------------------------------------------------------------------------

def test_tiny_real_model_end_to_end(bfcl_task):
    cfg = get_config("smoke", {"rollout.max_turns": 2, "rollout.max_new_tokens_act": 16,
                               "rollout.max_new_tokens_rehearse": 16})
    model, tok = load_policy(cfg)
    gen = HFGenerator(model, tok, seed=0, return_logprobs=True)
    telecom = load_tasks("tau2-telecom", "train")[0]
    trajs = rollout([bfcl_task, telecom], gen, tok, cfg, k=2, seed=1)
    # REHEARSE by the real model too: scripted ACT calls, tiny-model observations
    acts = per_trajectory(tok, bfcl_task, gold_script(bfcl_task))

    def mixed_generate(prompts, role, **kw):
        return (acts if role == "act" else gen).generate(prompts, role=role, **kw)

    mixed = type("Mixed", (), {"generate": staticmethod(mixed_generate)})()
    cfg.rollout.max_new_tokens_act = 256  # room for the scripted calls
    trajs += rollout([bfcl_task], mixed, tok, cfg, k=2)
    score_trajectories(trajs)
    assert len(trajs) == 6
    for t in trajs:
        assert 0.0 <= t.reward <= 1.0 and t.reward_valid and t.real_calls == 0
        assert 1 <= t.turns <= 2 and t.outputs and t.stop_reason
        for o in t.outputs:
            assert len(o.ids) <= (17 if o.role == "rehearse" or t in trajs[:4] else 257)
            if o.role == "rehearse" or t in trajs[:4]:  # sampled by the tiny model
                assert len(o.logprobs) == len(o.ids) - (o.finish_reason == "stop")
        check_packing(tok, t)
    rehearsed = [o for t in trajs[4:] for o in t.outputs if o.role == "rehearse"]
    assert len(rehearsed) == 2  # turn 0 of multi_turn_base_3 has one gold call
    assert all(t.stop_reason == "turn_limit" and t.user_turns_reached == 2 for t in trajs[4:])
