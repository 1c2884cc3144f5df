"""Notebook 05's build cells against the package: private rehearsal written by hand equals
``commit.run_committed`` token for token under greedy decoding.

The notebook's parameter, config and model cells run under ``smoke`` (the tiny random Qwen3),
then its ``build-setup``, ``build`` and ``build-check`` cells: N parallel attempts on the Fig. 7
lookup drill, a FEEDBACK on each, the MEMORY m_x and the committed execution that reads it. The
test then runs ``run_committed`` itself on a fresh env of the same drill, with a fresh generator,
and compares the attempts, the feedback, the memory, the committed history and the counters.
"""
from __future__ import annotations

import nbformat
import pytest

from envace_lite import notebooks as nbs
from envace_lite import prompts, protocol
from envace_lite.commit import Episode, run_committed
from envace_lite.envs import make_env
from envace_lite.generation import HFGenerator, chat_ids

NOTEBOOK = nbs.NOTEBOOKS_DIR / "05_private_rehearsal.ipynb"
TAGS = {"build-setup", "build", "build-check"}


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def notebook_cells() -> tuple[list[str], list[str]]:
    """(the cells before the build section: parameters, config, model; the build cells)."""
    code = [c for c in nbformat.read(str(NOTEBOOK), as_version=4).cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(code) if "parameters" in tags(c))
    start = next(i for i, c in enumerate(code) if TAGS & tags(c))
    return [c.source for c in code[first:start]], [c.source for c in code if TAGS & tags(c)]


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    before, build = notebook_cells()
    space: dict = {}
    exec(compile(before[0], "<parameters>", "exec"), space)  # noqa: S102 (our own cells)
    space.update(profile="smoke", run_dir=str(tmp_path_factory.mktemp("nb05")), n_tasks=1)
    for src in before[1:] + build:
        exec(compile(src, "<cell>", "exec"), space)  # noqa: S102
    return space


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
        return chat_ids(tok, protocol.act_messages(ep.messages, ep.env.tool_schemas(),
                                                   cfg.rollout.rendering,
                                                   cfg.rollout.compact_policy_chars, history),
                        add_generation_prompt=False)

    assert ep.history == ns["history"]
    assert ids(ep.history) == ids(ns["history"])
    assert row["rehearsal_real_calls"] == 0
    assert row["real_calls"] == ns["env"].real_calls and row["turns"] == ns["turns"]
    assert row["reward"] == ns["hand_reward"]


def test_the_sequential_context_for_attempt_two(ns):
    msg = ns["context_2"]
    assert msg["role"] == "user"
    assert "### Attempt 1 (imagined results)" in msg["content"]
    assert "### Attempt 2" not in msg["content"]
    assert msg["content"].endswith(ns["feedback_texts"][0])
