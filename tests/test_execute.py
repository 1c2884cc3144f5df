"""Committed execution on training's tokens: for the same history, the committed ACT prompt
(``execute.run_committed``) equals the training ACT prompt (``rollout(mode="real")``) token for
token, under Qwen3's template and SmolLM2's (docs/design.md, "Committed execution on training's
tokens").

Both loops run the same scripted ACT texts on the same real BFCL task (the gold calls of each
user turn, then an answer), so both histories hold the same real observations.
"""
from __future__ import annotations

import pytest

from envace_lite.protocol.prompts import act_messages, assistant_text, tool_response_message
from envace_lite.testtime.execute import run_committed
from envace_lite.testtime.episode import Episode
from envace_lite.config import get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.envs import make_env
from envace_lite.llm.generation import chat_ids
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_tokenizer, qwen3_tokenizer
from envace_lite.core.rollout import close_envs, rollout
from envace_lite.types import ToolCall

THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_3")


def tokenizer(template: str):
    return qwen3_tokenizer() if template == "qwen3" else load_tokenizer(get_config("laptop"))  # SmolLM2


def gold_script(task) -> list[str]:
    """ACT texts: each user turn's gold calls in one reply, then "Done."."""
    script = []
    for calls in task.gold_calls:
        script += [assistant_text([ToolCall(c["name"], c["arguments"]) for c in calls]),
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
    obs = tool_response_message([s.observation for s in traj.steps if s.turn == 0])
    rerendered = chat_ids(tok, act_messages(
        task.messages, task.tools, cfg.rollout.rendering, cfg.rollout.compact_policy_chars,
        [{"role": "assistant", "content": script[0]}, obs]))
    if template == "qwen3":
        assert rerendered != training[1]
        assert tok.decode(training[1]).replace(THINK, "", 1) == tok.decode(rerendered)
    else:
        assert rerendered == training[1]


def test_committed_execution_and_real_rollout_run_one_engine(task, monkeypatch):
    """With neutral committed hooks (no gate, no rehearsal, no parse error), committed execution
    and ``rollout(mode="real")`` on the same scripted outputs go through the same engine step
    (``engine._act_output``) with the same prompts, end on the same ACT token history, and make
    the same real env calls with the same observations."""
    from envace_lite.core import engine

    tok = qwen3_tokenizer()
    cfg = get_config("smoke", {"rollout.max_new_tokens_act": 512, "rollout.max_turns": 10,
                               "eval.max_turns": 10, "rollout.max_prompt_tokens": 100_000,
                               "model.context_window": 200_000})
    script = gold_script(task)
    steps: list[tuple[str, list[int], str]] = []
    act_output = engine._act_output

    def spy(x, hooks, prompt, out, glue):
        steps.append((type(hooks).__name__, list(prompt), out.text))
        return act_output(x, hooks, prompt, out, glue)

    monkeypatch.setattr(engine, "_act_output", spy)
    (traj,) = rollout([task], ScriptedGenerator({"act": script}, tok), tok, cfg, k=1, mode="real")
    close_envs([traj])
    env = make_env(task.suite, task.id)
    ep = Episode(task.suite, task.id, 0, env, env.reset())
    [row] = run_committed(ScriptedGenerator({"act": script}, tok), tok, [ep], cfg)

    training = [(p, t) for hooks, p, t in steps if hooks == "_TrainingHooks"]
    committed = [(p, t) for hooks, p, t in steps if hooks == "_CommittedHooks"]
    assert len(training) == len(committed) == len(script) == 4
    assert committed == training
    assert ep.act_ids == traj.act_ids
    executed = [(c["name"], c["arguments"]) for e in ep.events if e["kind"] == "step"
                for c in e["calls"]]
    observed = [o["content"] for e in ep.events if e["kind"] == "step" for o in e["observations"]]
    assert executed == [(s.call.name, s.call.arguments) for s in traj.steps]
    assert observed == [s.observation.content for s in traj.steps]
    assert row["real_calls"] == traj.real_calls == len(executed) > 0
    assert row["stop_reason"] == traj.stop_reason == "final_answer"
