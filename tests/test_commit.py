"""Committed execution on training's tokens: for the same history, the committed ACT prompt
(``commit.run_committed``) equals the training ACT prompt (``rollout(mode="real")``) token for
token, under Qwen3's template and SmolLM2's (docs/design.md, "Committed execution on training's
tokens").

Both loops run the same scripted ACT texts on the same real BFCL task (the gold calls of each
user turn, then an answer), so both histories hold the same real observations.
"""
from __future__ import annotations

import pytest

from envace_lite import protocol
from envace_lite.commit import Episode, run_committed
from envace_lite.config import get_config
from envace_lite.data import load_tasks
from envace_lite.envs import make_env
from envace_lite.generation import ScriptedGenerator, chat_ids
from envace_lite.models import load_tokenizer, qwen3_tokenizer
from envace_lite.rollout import close_envs, rollout
from envace_lite.types import ToolCall

THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_3")


def tokenizer(template: str):
    return qwen3_tokenizer() if template == "qwen3" else load_tokenizer("laptop")  # SmolLM2


def gold_script(task) -> list[str]:
    """ACT texts: each user turn's gold calls in one reply, then "Done."."""
    script = []
    for calls in task.gold_calls:
        script += [protocol.assistant_text([ToolCall(c["name"], c["arguments"]) for c in calls]),
                   "Done."]
    return script


@pytest.mark.parametrize("template", ["qwen3", "smollm2"])
def test_committed_act_prompts_equal_training_act_prompts(task, template):
    tok = tokenizer(template)
    cfg = get_config("smoke", {"rollout.max_new_tokens_act": 512, "rollout.max_turns": 10,
                               "eval.max_turns": 10, "rollout.max_prompt_tokens": 100_000,
                               "model.context_window": 200_000})
    script = gold_script(task)

    train_gen = ScriptedGenerator({"act": script}, tok)
    (traj,) = rollout([task], train_gen, tok, cfg, k=1, mode="real")
    close_envs([traj])
    training = [o.prompt_ids for o in traj.outputs if o.role == "act"]

    commit_gen = ScriptedGenerator({"act": script}, tok)
    env = make_env(task.suite, task.id)
    [row] = run_committed(commit_gen, tok, [Episode(task.suite, task.id, 0, env, env.reset())],
                          cfg)
    committed = [p for role, prompts in commit_gen.calls if role == "act" for p in prompts]

    # the whole script ran in both loops: 2 user turns × (one call reply + "Done.")
    assert len(task.gold_calls) == 2 and len(training) == len(committed) == len(script) == 4
    assert traj.stop_reason == row["stop_reason"] == "final_answer"
    assert committed == training

    # what the old committed loop did, re-rendering the history as text, differs under Qwen3:
    # its template drops the empty think block of the earlier ACT reply
    obs = protocol.tool_response_message([s.observation for s in traj.steps if s.turn == 0])
    rerendered = chat_ids(tok, protocol.act_messages(
        task.messages, task.tools, cfg.rollout.rendering, cfg.rollout.compact_policy_chars,
        [{"role": "assistant", "content": script[0]}, obs]))
    if template == "qwen3":
        assert rerendered != training[1]
        assert tok.decode(training[1]).replace(THINK, "", 1) == tok.decode(rerendered)
    else:
        assert rerendered == training[1]
