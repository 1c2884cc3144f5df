"""Notebook 05's build cells against the package: private rehearsal written by hand equals
``execute.run_committed`` token for token under greedy decoding, and rehearse-then-select written
by hand equals ``run_committed(strategy="select")`` token for token under seeded sampling.

The notebook's parameter, config and model cells run under ``smoke`` (the tiny random Qwen3),
then its ``build-setup``, ``build`` and ``build-check`` cells: N parallel attempts on the Fig. 7
lookup drill, a FEEDBACK on each, the MEMORY m_x and the committed execution that reads it; then
N attempts with no memory, their scores, the choice and the committed call. The test then runs
``run_committed`` itself on a fresh env of the same drill, with a fresh generator, and compares
the attempts, the feedback, the memory (or the choice), the committed history and the counters.
"""
from __future__ import annotations

import nbformat
import pytest

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite import protocol
from envace_lite.protocol.prompts import act_messages, assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.protocol import prompts
from envace_lite.testtime.execute import run_committed
from envace_lite.testtime.episode import Episode
from envace_lite.envs import make_env
from envace_lite.llm.generation import HFGenerator, chat_ids
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.types import ToolCall

NOTEBOOK = NOTEBOOKS_DIR / "05_private_rehearsal.ipynb"
TAGS = {"build-setup", "build", "build-check"}


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def notebook_cells() -> tuple[list[str], list[str]]:
    """(the cells before the build section: parameters, config, model; the build cells)."""
    code = [c for c in nbformat.read(str(NOTEBOOK), as_version=4).cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(code) if "parameters" in tags(c))
    start = next(i for i, c in enumerate(code) if TAGS & tags(c))
    return [c.source for c in code[first:start]], [c.source for c in code if TAGS & tags(c)]


def run_notebook_cells(run_dir, generator=None, cfg_hook=None) -> dict:
    """The parameter, config and model cells under smoke, then the build cells; ``generator``
    replaces the notebook's ``HFGenerator`` (a factory called as ``HFGenerator(model, tok,
    seed=...)``) in the build cells, and ``cfg_hook(cfg)`` edits the config before them."""
    before, build = notebook_cells()
    space: dict = {}
    exec(compile(before[0], "<parameters>", "exec"), space)  # noqa: S102 (our own cells)
    space.update(profile="smoke", run_dir=str(run_dir), n_tasks=1)
    for src in before[1:]:
        exec(compile(src, "<cell>", "exec"), space)  # noqa: S102
    if generator is not None:
        space["HFGenerator"] = generator
    if cfg_hook is not None:
        cfg_hook(space["cfg"])
    for src in build:
        exec(compile(src, "<cell>", "exec"), space)  # noqa: S102
    return space


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    return run_notebook_cells(tmp_path_factory.mktemp("nb05"))


DRILL_SCRIPT = {
    # the two imagined attempts (the id as typed, then with '#'), then the committed call and
    # the committed answer (a second ACT turn, on the extended token history)
    "act": [assistant_text([ToolCall("get_order_details", {"order_id": "W3220203"})]),
            assistant_text([ToolCall("get_order_details", {"order_id": "#W3220203"})]),
            assistant_text([ToolCall("get_order_details", {"order_id": "#W3220203"})]),
            "Your order #W3220203 is processed."],
    "rehearse": [rehearsal_text("Error: Order not found"),
                 rehearsal_text('{"order_id": "#W3220203", "status": "processed"}')],
    "feedback": ["<assessment>The id lacks its '#'.</assessment><revision>Add the '#'.</revision>",
                 "<assessment>Right id.</assessment><revision>Keep it.</revision>"],
    "memory": ["<memory>Order ids are stored with '#': call get_order_details with #W3220203."
               + "</memory>"],
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """The build cells with a scripted policy that calls tools, writes tagged feedback and a
    memory: every branch the random smoke model never reaches (real calls, memory insertion)."""
    holder: dict = {}

    def factory(model, tok, seed=0):
        return ScriptedGenerator(DRILL_SCRIPT, tok)

    def two_turns(cfg):  # one-turn attempts, a two-turn committed run
        cfg.rehearsal.max_turns, cfg.eval.max_turns = 1, 2

    holder.update(run_notebook_cells(tmp_path_factory.mktemp("nb05s"), factory, two_turns))
    return holder


def test_the_notebook_builds_and_checks_in_tagged_cells():
    code = [c for c in nbformat.read(str(NOTEBOOK), as_version=4).cells if c.cell_type == "code"]
    built = sum(bool({"build", "build-check"} & tags(c)) for c in code)
    assert sum("build-check" in tags(c) for c in code) >= 3
    assert built / len(code) >= 0.25, (built, len(code))


def test_rehearsal_never_executes_and_the_memory_sits_after_the_request(ns):
    assert [tr.real_calls for tr in ns["attempts"]] == [0] * ns["N"]
    history = ns["history"]
    if ns["memory"]:
        assert history[0] == prompts.memory_message(ns["memory"])
        assert history[0]["content"].startswith("[Private rehearsal memory")
    assert ns["env"].real_calls == sum(
        len(protocol.parse_act(m["content"], ns["tools"]).calls) for m in history
        if m["role"] == "assistant")


def test_hand_rehearsal_equals_run_committed_token_for_token(ns):
    env = make_env(ns["DRILLS"], ns["drill_id"])
    ep = Episode(ns["DRILLS"], ns["drill_id"], 0, env, env.reset())
    [row] = run_committed(HFGenerator(ns["model"], ns["tok"], seed=0), ns["tok"], [ep],
                          ns["hand_cfg"], rehearsal="parallel", n=ns["N"])
    rec = ep.rehearsals[0]
    assert len(rec.attempts) == ns["N"] == 2
    assert [a.trajectory.act_ids for a in rec.attempts] == [t.act_ids for t in ns["attempts"]]
    assert [a.transcript(ns["rc"].attempt_chars) for a in rec.attempts] == ns["transcripts"]
    assert [a.feedback.text for a in rec.attempts] == ns["feedback_texts"]
    assert rec.memory.text == ns["memory"]
    tok, cfg = ns["tok"], ns["hand_cfg"]

    def ids(history):
        return chat_ids(tok, act_messages(ep.messages, ep.env.tool_schemas(),
                                          cfg.rollout.rendering,
                                          cfg.rollout.compact_policy_chars, history),
               add_generation_prompt=False)

    assert ep.history == ns["history"]
    assert ids(ep.history) == ids(ns["history"])
    assert ep.act_ids == ns["act_ids"]  # the ACT prompts, extended on token ids as in training
    assert row["rehearsal_real_calls"] == 0
    assert row["real_calls"] == ns["env"].real_calls and row["turns"] == ns["turns"]
    assert row["reward"] == ns["hand_reward"]


def test_the_sequential_context_for_attempt_two(ns):
    msg = ns["context_2"]
    assert msg["role"] == "user"
    assert "### Attempt 1 (imagined results)" in msg["content"]
    assert "### Attempt 2" not in msg["content"]
    assert msg["content"].endswith(ns["feedback_texts"][0])


def test_scripted_rehearsal_with_memory_and_real_calls_equals_run_committed(scripted):
    ns = scripted
    assert ns["feedback_texts"] == ["Assessment: The id lacks its '#'.\nRevision: Add the '#'.",
                                    "Assessment: Right id.\nRevision: Keep it."]
    assert ns["memory"] == "Order ids are stored with '#': call get_order_details with #W3220203."
    history = ns["history"]
    assert history[0] == prompts.memory_message(ns["memory"])  # right after the request
    assert history[1]["role"] == "assistant" and "#W3220203" in history[1]["content"]
    assert history[2]["content"].startswith("<tool_response>")  # a real observation
    assert ns["env"].real_calls == 1 and [t.real_calls for t in ns["attempts"]] == [0, 0]
    env = make_env(ns["DRILLS"], ns["drill_id"])
    ep = Episode(ns["DRILLS"], ns["drill_id"], 0, env, env.reset())
    [row] = run_committed(ScriptedGenerator(DRILL_SCRIPT, ns["tok"]), ns["tok"], [ep],
                          ns["hand_cfg"], rehearsal="parallel", n=2)
    assert ep.history == history
    # two committed ACT turns (a real call, then the answer): the second prompt extends the first
    # on token ids, and the hand-built one equals the package's token for token
    assert row["turns"] == ns["turns"] == 2 and ep.act_ids == ns["act_ids"]
    assert [a.trajectory.act_ids for a in ep.rehearsals[0].attempts] == [
        t.act_ids for t in ns["attempts"]]
    assert row["real_calls"] == 1 and row["rehearsal_real_calls"] == 0
    assert row["reward"] == ns["hand_reward"] and row["stop_reason"] == ns["stop"]


def test_hand_select_equals_run_committed_token_for_token(ns):
    env = make_env(ns["DRILLS"], ns["drill_id"])
    ep = Episode(ns["DRILLS"], ns["drill_id"], 0, env, env.reset())
    [row] = run_committed(HFGenerator(ns["model"], ns["tok"], seed=0), ns["tok"], [ep],
                          ns["sel_cfg"], rehearsal="parallel", n=ns["N"], strategy="select")
    [rec] = ep.selections
    assert len(rec.candidates) == ns["N"] == 2
    assert rec.chosen == (ns["chosen"]["index"] if ns["chosen"] else 0)
    assert [c.prediction for c in rec.candidates if c.usable] == [
        s["prediction"] for s in ns["scored"]]
    assert ep.history == ns["sel_history"] and ep.act_ids == ns["sel_act_ids"]
    assert row["rehearsal_real_calls"] == 0 and row["real_calls"] == ns["sel_env"].real_calls
    assert row["memories"] == [] and row["strategy"] == "select"


def test_scripted_select_commits_the_attempt_rehearse_accepts(scripted):
    """The scripted drill: attempt 1 is the slip (REHEARSE: ``Order not found``), attempt 2 the
    right id (REHEARSE: the order), so attempt 2's call is committed, then the third scripted
    ACT output (the lookup again) runs until the turn limit of 2."""
    ns = scripted
    assert [s["prediction"] for s in ns["scored"]] == ["error", "ok"]
    assert [s["unseen_ids"] for s in ns["scored"]] == [[], []]  # both ids are in the message
    assert ns["chosen"]["index"] == 2
    assert ns["sel_history"][0]["content"] == DRILL_SCRIPT["act"][1]
    assert ns["sel_history"][1]["content"].startswith("<tool_response>")
    assert "Order not found" not in ns["sel_history"][1]["content"]
    assert ns["sel_env"].real_calls == 2 and ns["sel_stop"] == "turn_limit"
    env = make_env(ns["DRILLS"], ns["drill_id"])
    ep = Episode(ns["DRILLS"], ns["drill_id"], 0, env, env.reset())
    [row] = run_committed(ScriptedGenerator(DRILL_SCRIPT, ns["tok"]), ns["tok"], [ep],
                          ns["sel_cfg"], rehearsal="parallel", n=2, strategy="select")
    assert ep.history == ns["sel_history"] and ep.act_ids == ns["sel_act_ids"]
    assert row["selections"][0]["chosen"] == 2 and row["failed_real_calls"] == 0
    assert row["real_calls"] == 2 and row["rehearsal_real_calls"] == 0
