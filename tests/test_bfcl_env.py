"""BFCL v4 multi-turn adapter (``envace_lite.envs.bfcl``): split, schemas, safe execution, scoring.

Fast tests use a handful of real entries; ``slow`` tests replay the gold calls of all 800 entries
and the corrupted (last write dropped) replay of a seeded sample. Run both tiers with::

    python -m pytest tests/test_bfcl_env.py -q -m "slow or not slow"
"""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import jsonschema
import pytest
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

from envace_lite.envs import BFCL_SUITES, bfcl, bfcl_schema, list_tasks, make_env
from envace_lite.envs.base import replay_gold
from envace_lite.paths import DATA_DIR
from envace_lite.types import ToolCall

ADD_FUNC_MSG = "I have updated some more functions you can choose from. What about now?"


_OPEN: list = []


def _started(suite: str = "bfcl-base", task_id: str = "multi_turn_base_0") -> bfcl.BfclEnv:
    """A reset environment, closed by ``_close_started`` after the test."""
    env = make_env(suite, task_id)
    env.reset()
    _OPEN.append(env)
    return env


@pytest.fixture(autouse=True)
def _close_started():
    yield
    while _OPEN:
        _OPEN.pop().close()


# ---------------------------------------------------------------------------- split and ids
def test_split_file_is_the_seeded_regeneration():
    committed = json.loads((DATA_DIR / "bfcl_split.json").read_text())
    assert committed == bfcl.make_split(0)
    assert set(committed) == {"seed", "method", "test_indices", "train_indices"}
    test, train = set(committed["test_indices"]), set(committed["train_indices"])
    assert len(test) == 50 and len(train) == 150
    assert not test & train
    assert test | train == set(range(200))
    assert bfcl.make_split(1) != committed  # the seed matters


def test_no_test_index_in_any_category_train_ids():
    test = set(bfcl.load_split()["test_indices"])
    for suite in BFCL_SUITES:
        cat = bfcl.CATEGORIES[suite]
        train_ids = list_tasks(suite, "train")
        assert all(t.startswith(cat + "_") for t in train_ids)
        train_idx = [int(t.rsplit("_", 1)[1]) for t in train_ids]
        assert not test & set(train_idx)
        assert train_idx == sorted(train_idx)
        assert [int(t.rsplit("_", 1)[1]) for t in list_tasks(suite, "test")] == sorted(test)
        assert list_tasks(suite, "all") == [f"{cat}_{i}" for i in range(200)]


def test_unknown_suite_split_or_id_raise_key_error():
    with pytest.raises(KeyError):
        make_env("bfcl-base", "multi_turn_base_200")
    with pytest.raises(KeyError):
        make_env("bfcl-base", "multi_turn_miss_func_0")
    with pytest.raises(KeyError):
        bfcl.task_ids("bfcl-nope", "all")
    with pytest.raises(KeyError):
        bfcl.task_ids("bfcl-base", "dev")


def test_bfcl_project_root_points_at_a_cache_not_site_packages():
    from bfcl_eval.constants import eval_config

    assert eval_config.PROJECT_ROOT == Path(os.environ["BFCL_PROJECT_ROOT"])
    assert "site-packages" not in str(eval_config.PROJECT_ROOT)


# ---------------------------------------------------------------------------- reset and schemas
def test_reset_returns_system_and_first_user_turn():
    env = make_env("bfcl-base", "multi_turn_base_0")
    with pytest.raises(RuntimeError):
        env.tool_schemas()
    msgs = env.reset()
    _OPEN.append(env)
    assert msgs[0] == {"role": "system", "content": bfcl.SYSTEM_PROMPT}
    assert msgs[1:] == env.entry["question"][0] and msgs[1]["role"] == "user"
    assert env.real_calls == 0 and not env.done and env.turn == 0


def test_tool_schemas_are_valid_json_schema_for_every_doc():
    seen = {}
    for suite in ("bfcl-base", "bfcl-miss_func"):
        for tid in bfcl.task_ids(suite, "all"):
            env = make_env(suite, tid)
            for name, doc in env._docs.items():
                seen[name] = bfcl_schema.to_openai_tool(doc)
    assert len(seen) == 128  # every function of the 8 backend classes
    for name, tool in seen.items():
        assert tool["type"] == "function" and tool["function"]["name"] == name
        params = tool["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        jsonschema.Draft7Validator.check_schema(params)
        assert params["type"] == "object"
        text = json.dumps(params)
        for bfcl_only in ('"dict"', '"float"', '"tuple"', '"any"'):
            assert f'"type": {bfcl_only}' not in text
    add = seen["add"]["function"]["parameters"]
    assert add["properties"]["a"]["type"] == "number" and add["required"] == ["a", "b"]
    validator = jsonschema.Draft202012Validator(add)
    assert validator.is_valid({"a": 1, "b": 2.5}) and not validator.is_valid({"a": "1", "b": 2})


def test_any_type_maps_to_no_constraint():
    doc = {"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "any", "description": "x"},
        "t": {"type": "tuple", "items": {"type": "float"}}},
        "required": ["x"]}}
    params = bfcl_schema.to_openai_tool(doc)["function"]["parameters"]
    assert "type" not in params["properties"]["x"]
    assert params["properties"]["t"] == {"type": "array", "items": {"type": "number"}}
    assert jsonschema.Draft202012Validator(params).is_valid({"x": {"anything": [1]}, "t": [1.5]})


# ---------------------------------------------------------------------------- safe execution
def test_raw_bfcl_executor_would_run_injected_code():
    """Why the adapter never passes model text: BFCL's executor evals the string as given."""
    env = _started()
    run = bfcl._new_run_name("raw_")
    try:
        out, _ = multi_turn_utils.execute_multi_turn_func_call(
            ["__import__('os').getcwd()"], env.entry["initial_config"],
            env.entry["involved_classes"], run, env.task_id)
    finally:
        bfcl._drop_instances(run)
    assert out == [os.getcwd()]


def test_injected_function_name_is_rejected_without_execution():
    env = _started()
    obs = env.step([ToolCall("__import__('os').getcwd", {}),
                    ToolCall("ls); __import__('os').getcwd(", {})])
    assert all(o.error and not o.state_changed for o in obs)
    assert all(os.getcwd() not in o.content for o in obs)
    assert env.real_calls == 0 and env._current == []
    assert bfcl.cached_instances(env._run + "_") == []  # no backend was even built


def test_code_in_argument_values_stays_a_string():
    env = _started()
    payloads = ["__import__('os').getcwd()", "'); __import__('os').getcwd(); ('", '"""\\x00']
    obs = env.step([ToolCall("echo", {"content": p}) for p in payloads])
    assert [json.loads(o.content)["terminal_output"] for o in obs] == payloads
    bad = env.step([ToolCall("cd", {"folder": "__import__('os').getcwd()"})])[0]
    assert os.getcwd() not in bad.content and "No such" in bad.content
    non_json = env.step([ToolCall("echo", {"content": {1: "x"}}),
                         ToolCall("echo", {"content": {"s": {"a", "b"}}}),
                         ToolCall("echo", {"content": float("nan")})])
    assert all(o.error and o.content.startswith("Error during execution") for o in non_json)
    assert env.real_calls == 4


def test_unknown_argument_names_are_rejected():
    env = _started()
    obs = env.step([ToolCall("ls", {"b": True}),
                    ToolCall("cd", {"folder": "document", "x=__import__('os'),y": 1})])
    assert all(o.error for o in obs) and "unexpected keyword" in obs[0].content
    assert env.real_calls == 0 and env._current == []


def test_real_calls_count_only_executed_calls_and_steps_are_recorded():
    env = _started()
    obs = env.step([ToolCall("cd", {"folder": "document"}), ToolCall("nope", {}),
                    ToolCall("mkdir", {"dir_name": "temp"}), ToolCall("cd", {})])
    assert [o.error for o in obs] == [False, True, False, True]
    assert obs[3].content.startswith("Error during execution")  # raised inside BFCL: counted
    assert [o.state_changed for o in obs] == [False, False, True, False]
    assert env.real_calls == 3
    assert env._current == [["cd(folder='document')", "mkdir(dir_name='temp')", "cd()"]]
    env.step([ToolCall("ls", {"a": True})])
    assert env.real_calls == 4 and len(env._current) == 2


def test_is_state_changing_follows_write_functions():
    env = make_env("bfcl-base", "multi_turn_base_0")
    assert env.is_state_changing("mkdir") and env.is_state_changing("echo")
    assert env.is_state_changing("place_order") and env.is_state_changing("message_login")
    assert not env.is_state_changing("cd") and not env.is_state_changing("ls")
    assert not env.is_state_changing("get_flight_cost") and not env.is_state_changing("add")
    assert bfcl.WRITE_FUNCTIONS["MathAPI"] == frozenset()


def test_step_limit_force_terminates_after_maximum_steps():
    env = _started()
    for _ in range(20):
        env.step([ToolCall("ls", {})])
    assert not env.done
    env.step([ToolCall("ls", {})])  # BFCL executes the 21st step, then quits
    assert env.done and env.force_terminated and env.real_calls == 21
    with pytest.raises(RuntimeError):
        env.step([ToolCall("ls", {})])
    reward, details = env.score()
    assert reward == 0.0 and details["error_type"] == "multi_turn:force_terminated"
    assert details["turns_recorded"] == 1 and details["padded_check"]["valid"] is False


# ---------------------------------------------------------------------------- turns and scoring
def test_end_turn_advances_through_the_scripted_user_turns():
    env = _started("bfcl-base", "multi_turn_base_0")
    n = len(env.ground_truth)
    for i in range(1, n):
        assert env.end_turn("ok") == env.entry["question"][i] and env.turn == i
    assert env.end_turn("ok") is None and env.done
    assert env.end_turn("again") is None and env.final_texts == ["ok"] * n


def test_miss_func_tools_grow_at_the_held_out_turn():
    env = _started("bfcl-miss_func", "multi_turn_miss_func_0")
    assert {int(k) for k in env.entry["missed_function"]} == {3}
    before = [t["function"]["name"] for t in env.tool_schemas()]
    assert "sort" not in before
    assert env.step([ToolCall("sort", {"file_name": "x"})])[0].content  # whitelisted (quirk)
    env.end_turn("a")
    env.end_turn("b")
    assert [t["function"]["name"] for t in env.tool_schemas()] == before
    assert env.end_turn("c") == [{"role": "user", "content": ADD_FUNC_MSG}]
    assert [t["function"]["name"] for t in env.tool_schemas()] == before + ["sort"]
    assert env.end_turn("d") == env.entry["question"][4]


def test_empty_and_early_ended_episodes_score_zero():
    env = _started("bfcl-base", "multi_turn_base_1")
    reward, details = env.score()
    assert reward == 0.0 and details["error_type"] == "multi_turn:force_terminated"
    while env.end_turn("nothing") is not None:
        pass
    reward, details = env.score()
    assert reward == 0.0 and details["error_type"] == "multi_turn:empty_turn_model_response"
    assert details["turns_recorded"] == details["turns_expected"] == len(env.ground_truth)


def test_gold_replay_scores_one_and_leaves_no_cached_instances():
    before = len(bfcl.cached_instances())
    env = make_env("bfcl-long_context", "multi_turn_long_context_0")
    reward, details = replay_gold(env)
    assert reward == 1.0 and details["valid"] and details["error_type"] is None
    assert bfcl.cached_instances(env._run + "_") == []
    assert len(bfcl.cached_instances()) == before == 0
    env.reset()
    _OPEN.append(env)
    env.step([ToolCall("ls", {})])
    assert len(bfcl.cached_instances(env._run + "_")) == len(env.entry["involved_classes"]) == 2
    env.close()
    env.close()
    assert bfcl.cached_instances() == []


def test_corrupted_replay_fails_and_score_is_repeatable():
    env = make_env("bfcl-base", "multi_turn_base_0")
    reward, details = replay_gold(env, drop_last_write=True)
    assert reward == 0.0 and details["dropped"] in bfcl.WRITE_FUNCTIONS["GorillaFileSystem"]
    env.reset()
    _OPEN.append(env)
    for turn in env.gold_turns()[:2]:
        env.step(turn.steps[0])
        env.end_turn("Done.")
    first = env.score()
    assert first == env.score()  # a fresh checker namespace each time: no carried state
    assert first[1]["error_type"] == "multi_turn:force_terminated"
    assert first[1]["padded_check"]["error_type"] == "multi_turn:empty_turn_model_response"


def test_gold_turns_parse_literals_into_one_parallel_step_per_turn():
    env = make_env("bfcl-base", "multi_turn_base_24")
    calls = [c for t in env.gold_turns() for c in t.calls]
    assert "cd('archives')" in [s for t in env.ground_truth for s in t]
    assert ("cd", {"folder": "archives"}) in [(c.name, c.arguments) for c in calls]  # by signature
    mf = make_env("bfcl-miss_func", "multi_turn_miss_func_0").gold_turns()
    assert mf[2].steps == [] and all(len(t.steps) == 1 for i, t in enumerate(mf) if i != 2)
    assert mf[3].calls == [ToolCall("sort", {"file_name": "final_report.pdf"}, call_id="call_3_0")]
    assert all(t.final_text == "Done." and t.failing == [] for t in mf)
    assert [t.key_args for t in mf] == [[None] * len(t.calls) for t in mf]
    lc = make_env("bfcl-long_context", "multi_turn_long_context_46").gold_turns()
    assert max(len(t.steps[0]) for t in lc if t.steps) == 34  # one step, under the 20-step limit
    with pytest.raises(ValueError):
        bfcl.parse_call("ls(a=__import__('os'))", {"ls": "GorillaFileSystem"})
    with pytest.raises(ValueError):
        bfcl.parse_call("os.getcwd()", {"ls": "GorillaFileSystem"})


def test_gold_turns_are_copies():
    env = make_env("bfcl-base", "multi_turn_base_0")
    turns = env.gold_turns()
    turns[0].steps[0].clear()
    assert env.gold_turns()[0].steps[0]


# ---------------------------------------------------------------------------- slow: full sets
@pytest.mark.slow
@pytest.mark.parametrize("suite", BFCL_SUITES)
def test_gold_replay_scores_one_on_every_entry(suite):
    scores = {t: replay_gold(make_env(suite, t))[0] for t in list_tasks(suite, "all")}
    assert sum(scores.values()) == 200, [t for t, s in scores.items() if s != 1.0]
    assert bfcl.cached_instances() == []


@pytest.mark.slow
@pytest.mark.parametrize("suite", BFCL_SUITES)
def test_corrupted_replay_fails_on_a_seeded_sample(suite):
    with_write = [t for t in list_tasks(suite, "all")
                  if any(bfcl._WRITE_NAMES & {c.name for g in make_env(suite, t).gold_turns()
                                               for c in g.calls})]
    assert len(with_write) == 194
    sample = random.Random(0).sample(with_write, 50)
    results = {t: replay_gold(make_env(suite, t), drop_last_write=True) for t in sample}
    exceptions = sorted(t for t, (r, _) in results.items() if r != 0.0)
    assert exceptions == []  # measured: 50/50 fail
    kinds = {d["error_type"] for _, d in results.values()}
    assert kinds == {"multi_turn:instance_state_mismatch", "multi_turn:empty_turn_model_response"}


@pytest.mark.slow
@pytest.mark.parametrize("suite", BFCL_SUITES)
def test_gold_calls_never_raise_and_fit_the_schemas(suite):
    failing, invalid = [], []
    for tid in list_tasks(suite, "all"):
        env = make_env(suite, tid)
        params = {n: bfcl_schema.to_openai_tool(d)["function"]["parameters"] for n, d in env._docs.items()}
        for ti, turn in enumerate(env.gold_turns()):
            failing += [(tid, ti, k) for k in turn.failing]
            invalid += [(tid.rsplit("_", 1)[1], c.name) for c in turn.calls if not
                        jsonschema.Draft202012Validator(params[c.name]).is_valid(c.arguments)]
    assert failing == []
    assert invalid == [("173", "close_ticket")]  # ticket_id='ticket_001' where the doc says integer


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["bfcl-base", "bfcl-long_context"])
def test_only_write_functions_change_checked_state(suite):
    """Replay every gold call alone and diff the public attributes the state checker compares."""
    utils = multi_turn_utils
    changed_by = set()
    for tid in list_tasks(suite, "all"):
        env = make_env(suite, tid)
        run = bfcl._new_run_name("probe_")
        args = (env.entry["initial_config"], env.entry["involved_classes"], run, tid)

        def public_state(args=args, lc=env.long_context):
            _, inst = utils.execute_multi_turn_func_call([], *args, long_context=lc)
            return {k: copy.deepcopy({a: v for a, v in vars(i).items() if not a.startswith("_")})
                    for k, i in inst.items()}
        try:
            for call in (c for t in env.gold_turns() for c in t.calls):
                before = public_state()
                utils.execute_multi_turn_func_call([bfcl_schema.render_call(call.name, call.arguments)],
                                                   *args, long_context=env.long_context)
                if public_state() != before:
                    changed_by.add(call.name)
        finally:
            bfcl._drop_instances(run)
    assert changed_by and changed_by <= bfcl._WRITE_NAMES
