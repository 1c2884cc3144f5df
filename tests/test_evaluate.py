"""Committed execution end to end: real parser, real adapters, scripted and tiny real policies."""
from __future__ import annotations

import json

import pytest

from envace_lite import protocol
from envace_lite.protocol.prompts import assistant_text
from envace_lite.config import get_config
from envace_lite.envs import make_env
from envace_lite.testtime.episode import Episode
from envace_lite.testtime.execute import run_committed
from envace_lite.llm.generation import HFGenerator
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.pipelines.tables import format_table


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_tokenizer()


def _episode(suite, tid):
    env = make_env(suite, tid)
    return Episode(suite, tid, 0, env, env.reset())


def test_scripted_gold_policy_scores_one_on_bfcl(tokenizer):
    """A policy that writes the gold calls in the Hermes format passes the official checker."""
    suite, tid = "bfcl-base", "multi_turn_base_5"
    env = make_env(suite, tid)
    script = []
    for turn in env.gold_turns():
        for step in turn.steps:
            script.append(assistant_text(step))
        script.append("Done.")
    env.close()
    ep = _episode(suite, tid)
    cfg = get_config("smoke", {"eval.max_turns": 50, "rollout.max_new_tokens_act": 1024})
    gen = ScriptedGenerator({"act": script}, tokenizer)
    rows = run_committed(gen, tokenizer, [ep], cfg)
    (row,) = rows
    n_calls = sum(len(protocol.parse_act(s, []).calls) for s in script)
    assert row["reward"] == 1.0
    assert row["tool_calls"] == row["real_calls"] == n_calls
    assert row["turns"] == len(script) and row["stop_reason"] == "final_answer"
    assert row["rehearsal_real_calls"] == 0 and row["grounding"] == "none"


def test_scripted_text_only_policy_scores_zero_and_table_says_no_calls(tokenizer):
    eps = [_episode("bfcl-base", "multi_turn_base_5"), _episode("tau2-telecom",
                                                                 _first_telecom_test())]
    cfg = get_config("smoke", {"eval.max_turns": 20})
    gen = ScriptedGenerator({"act": ["I cannot help with that."]}, tokenizer)
    rows = run_committed(gen, tokenizer, eps, cfg)
    assert [r["reward"] for r in rows] == [0.0, 0.0]
    assert [r["real_calls"] for r in rows] == [0, 0]
    # BFCL replays every scripted user turn; telecom solo ends on the first text reply
    assert rows[0]["user_turns"] == rows[0]["turns"] > 1
    assert rows[1]["turns"] == 1 and rows[1]["stop_reason"] == "final_answer"
    table = format_table(rows)
    assert table.count("NO tool call") == 2


def test_malformed_outputs_are_logged_not_raised(tokenizer):
    outputs = ['<tool_call>{"name": "ls", "arguments": {', '<tool_call>{"name": "rm_rf_all"}</tool_call>',
               '<tool_call>{"name": "cd", "arguments": {"folder": 3}}</tool_call>', ""]
    ep = _episode("bfcl-base", "multi_turn_base_5")
    cfg = get_config("smoke", {"eval.max_turns": 4, "rollout.max_new_tokens_act": 1024})
    rows = run_committed(ScriptedGenerator({"act": outputs}, tokenizer), tokenizer, [ep], cfg)
    (row,) = rows
    assert row["parse_errors"] == 2          # the broken JSON and the empty output
    assert row["violations"] == 2            # the unknown tool and the wrong argument type
    assert row["real_calls"] == 1            # cd(folder=3) reaches the backend, which answers an error
    # the row logs both calls that reached the env adapter, in order, with the errors it answered
    log_ = row["real_call_log"]
    assert [(c["name"], c["arguments"], c["error"]) for c in log_] == [
        ("rm_rf_all", {}, True), ("cd", {"folder": 3}, True)]
    assert log_[0]["observation"] == ("Error during execution: function 'rm_rf_all' is not "
                                      "available")
    # the backend's own error text (a Python message, whose wording is the interpreter's)
    assert log_[1]["observation"].startswith("Error during execution: ")
    assert row["failed_real_calls"] == 2 == sum(c["error"] for c in row["real_call_log"])
    assert row["stop_reason"] == "turn_limit" and row["reward"] == 0.0


def test_call_log_caps_long_observations_and_arguments():
    from types import SimpleNamespace

    from envace_lite.testtime.episode import CALL_LOG_CHARS, call_log
    from envace_lite.drills.report import is_hash_slip

    items = ["1234567890"] * 30  # its JSON: 30 * 12 quoted ids + 29 * 2 separators + 2 = 420
    big = {"order_id": "W1234567", "item_ids": items}
    events = [{"kind": "rehearse"},
              {"kind": "step", "calls": [{"name": "return_items", "arguments": big},
                                         {"name": "cancel", "arguments": {"id": "#W1"}},
                                         {"name": "odd", "arguments": ["x"] * 100}],
               "observations": [{"content": "x" * 500, "error": True},
                                {"content": "Error: Order not found", "error": True},
                                {"content": "Error", "error": True}]}]
    log_ = call_log(SimpleNamespace(events=events))
    assert len(log_) == 3  # the rehearse event is no real call
    text = json.dumps(items)
    assert len(text) == 420 and CALL_LOG_CHARS == 200
    assert log_[0] == {"name": "return_items", "error": True, "observation": "x" * 200,
                       "arguments": {"order_id": "W1234567",
                                     "item_ids": {"_truncated": text[:200]}}}
    assert is_hash_slip(log_[0])  # the short id survives the cap of its long neighbour
    assert log_[1] == {"name": "cancel", "arguments": {"id": "#W1"}, "error": True,
                       "observation": "Error: Order not found"}
    assert log_[2]["arguments"] == {"_not_an_object": {"_truncated": json.dumps(["x"] * 100)[:200]}}


def test_context_budget_ends_episode_before_generation(tokenizer):
    ep = _episode("bfcl-base", "multi_turn_base_5")
    cfg = get_config("smoke")
    cfg.rollout.max_prompt_tokens = 50
    gen = ScriptedGenerator({"act": ["x"]}, tokenizer)
    (row,) = run_committed(gen, tokenizer, [ep], cfg)
    assert row["stop_reason"] == "context_budget" and row["turns"] == 0 and gen.calls == []


def test_tiny_real_model_end_to_end_on_both_benchmarks():
    """The tiny random Qwen3 through the real chat template, parser and adapters."""
    cfg = get_config("smoke")
    model, tok = load_policy(cfg)
    eps = [_episode("bfcl-base", "multi_turn_base_5"),
           _episode("tau2-telecom", _first_telecom_test())]
    rows = run_committed(HFGenerator(model, tok, seed=0), tok, eps, cfg)
    assert [r["suite"] for r in rows] == ["bfcl-base", "tau2-telecom"]
    for r in rows:
        assert r["reward"] == 0.0 and 1 <= r["turns"] <= cfg.eval.max_turns
        assert r["stop_reason"] in {"final_answer", "turn_limit", "context_budget", "terminal_tool"}
        json.dumps(r)  # rows are JSON-serialisable


def _first_telecom_test():
    from envace_lite.envs import list_tasks

    return list_tasks("tau2-telecom", "test")[0]


def test_eval_shows_episodes_done_and_keeps_each_row(tokenizer, tmp_path, capsys):
    """An evaluation shows a bar over its episodes (done of total, time left) and has appended
    every finished episode's row to results.jsonl by the time the bar closes."""
    from envace_lite.pipelines.evaluate import evaluate

    cfg = get_config("smoke", {"eval.max_turns": 4, "run.progress": True})
    gen = ScriptedGenerator({"act": ["I cannot help with that."]}, tokenizer)
    rows = evaluate((gen, tokenizer), "tau2-telecom", cfg=cfg, limit=2, out=tmp_path)
    err = capsys.readouterr().err
    assert len(rows) == 2 and "2/2" in err and "episode" in err and "<" in err
    kept = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in kept) == sorted(r["task_id"] for r in rows)
