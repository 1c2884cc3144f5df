"""Tests of envace_lite.course.viewer: roles, rehearsed vs real observations, the counter, escaping.

Default tier: the real Qwen3 tokenizer, scripted policies through the real rollout engine and a
real BFCL adapter, and one end-to-end run of the tiny random Qwen3.
"""
from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest

from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import get_config
from envace_lite.course.helpers import gold_rollout
from envace_lite.envs.tasks import build_task
from envace_lite.envs import list_tasks
from envace_lite.llm.generation import HFGenerator
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.core.rewards import score_trajectories
from envace_lite.core.rollout import close_envs, rollout
from envace_lite.types import ToolCall
from envace_lite.course.viewer import TrajectoryView, render_episode, render_text, render_trajectory

INJECTION = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def task():
    return build_task("bfcl-base", list_tasks("bfcl-base", "train")[0], "train")


@pytest.fixture(scope="module")
def cfg():
    return get_config("smoke", {"rollout.max_new_tokens_act": 1024,
                                "rollout.max_new_tokens_rehearse": 1024,
                                "rollout.grounding_drop_p": 0.0})


def scripted(tok, task, cfg, act, rehearse=("<execution_result>{}</execution_result>",), **kw):
    gen = ScriptedGenerator({"act": list(act), "rehearse": list(rehearse)}, tok)
    [t] = rollout([task], gen, tok, cfg, k=1, **kw)
    score_trajectories([t])
    return t


class _Balance(HTMLParser):
    """Counts open minus closed tags of the kinds the viewer nests."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = {"div": 0, "pre": 0, "details": 0, "span": 0}
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag in ("script", "img")
        if tag in self.depth:
            self.depth[tag] += 1

    def handle_endtag(self, tag):
        if tag in self.depth:
            self.depth[tag] -= 1


def parsed(page: str) -> _Balance:
    p = _Balance()
    p.feed(page)
    return p


def test_rehearsed_trajectory_marks_roles_and_imagined_observations(tok, task, cfg):
    t = gold_rollout(task, tok, cfg)
    score_trajectories([t])
    page = render_trajectory(t, title="gold")
    acts = [o for o in t.outputs if o.role == "act"]
    # one ACT block per ACT output, one REHEARSE block and one rehearsed observation per call
    assert len(re.findall(r'class="envace-act"', page)) == len(acts) == 8
    assert page.count('class="envace-rehearse"') == len(t.steps) == 10
    assert page.count("envace-obs-rehearsed") == 10 and "envace-obs-real" not in page
    assert page.count("REHEARSED ô_t") == 10 and "real call #" not in page
    assert "real calls: 0" in page and "R = 1.000" in page
    assert page.count('class="envace-user"') == len(task.user_turns) == 4
    assert all(v == 0 for v in parsed(page).depth.values())


def test_real_trajectory_counts_real_calls(tok, task, cfg):
    t = gold_rollout(task, tok, cfg, mode="real")
    try:
        page = render_trajectory(t)
    finally:
        close_envs([t])
    assert t.real_calls == len(t.steps) == 10
    assert page.count("envace-obs-real") == 10 and "envace-obs-rehearsed" not in page
    assert "envace-rehearse" not in page  # nothing was rehearsed
    for k in range(1, 11):
        assert f"real call #{k}<" in page
    assert "real call #11" not in page and "real calls: 10" in page


def test_model_text_is_escaped(tok, task, cfg):
    call = assistant_text([ToolCall("cd", {"folder": INJECTION})])
    t = scripted(tok, task, cfg, [call, INJECTION],
                 [rehearsal_text(f'{{"result": "{INJECTION}"}}')])
    page = render_trajectory(t)
    assert "<script" not in page and "<img" not in page and parsed(page).scripts == 0
    assert html.escape(INJECTION) in page  # the final answer, shown as text
    assert "&lt;script&gt;" in page
    assert all(v == 0 for v in parsed(page).depth.values())


def test_violations_and_parse_errors_are_shown(tok, task, cfg):
    unknown = assistant_text([ToolCall("delete_everything", {"path": "/"})])
    t = scripted(tok, task, cfg, [unknown, "Sorry."], ["no tags at all"])
    page = render_trajectory(t)
    assert 'class="envace-violation"' in page and "unknown tool" in page
    assert "REHEARSE parse error: no_execution_result" in page  # raw text used as ô_t
    assert "stop: gate_closed" in page

    broken = '<tool_call>{"name": "mkdir", "arguments": {"dir_name": }</tool_call>'
    t = scripted(tok, task, cfg, [broken])
    page = render_trajectory(t)
    assert t.stop_reason == "parse_error"
    assert "envace-parse-error" in page and "error code: bad_json" in page
    assert "PARSE ERROR" in page and "stop: parse_error" in page


def test_long_text_is_cut_with_a_note(tok, task, cfg):
    t = scripted(tok, task, cfg, ["x" * 5000])
    page = render_trajectory(t, max_chars=100)
    assert "x" * 100 in page and "x" * 101 not in page and "[4900 more characters]" in page


def test_text_fallback_and_view(tok, task, cfg):
    t = gold_rollout(task, tok, cfg, user_turns=1)
    score_trajectories([t])
    text = render_text(t)
    lines = text.splitlines()
    assert lines[0].startswith("task multi_turn_base_0 (bfcl-base)") and "R=0.250" in lines[0]
    assert sum(line.strip().startswith("ô_t (rehearsed)") for line in lines) == 3
    assert "[USER 1]" in text and "[USER 2]" in text and lines[-1].startswith("stop: gate_closed")
    view = TrajectoryView(t, max_chars=50)
    assert view._repr_html_() == render_trajectory(t, max_chars=50) and repr(view) == text


def test_tiny_real_model_end_to_end(task):
    """The tiny random Qwen3 through the real parser and engine; its text is escaped verbatim."""
    cfg = get_config("smoke")
    model, tok = load_policy(cfg)
    trajs = rollout([task], HFGenerator(model, tok, seed=0), tok, cfg, k=2)
    score_trajectories(trajs)
    for t in trajs:
        page = render_trajectory(t, max_chars=0)
        acts = [o for o in t.outputs if o.role == "act"]
        assert page.count('class="envace-act') == len(acts) >= 1
        for o in acts:
            assert html.escape(o.text.strip() or "(empty output)", quote=True) in page
        assert f"stop: {t.stop_reason}" in page
        assert all(v == 0 for v in parsed(page).depth.values())


# ---------------------------------------------------------------------------------------------
# A committed episode with its private rehearsal (render_episode)
# ---------------------------------------------------------------------------------------------

def scripted_episode(tok, mode: str, n: int = 2):
    """A committed bfcl-base run whose every role is scripted: ACT calls ``ls`` once per user turn
    (then says "Done."), REHEARSE imagines a listing, FEEDBACK and MEMORY write tagged text."""
    from envace_lite.testtime.execute import run_committed
    from envace_lite.testtime.episode import Episode
    from envace_lite.envs import make_env

    call = assistant_text([ToolCall("ls", {})])

    def script(role, prompt):
        if role == "act":
            return "Done." if "</tool_response>" in tok.decode(prompt[-40:]) else call
        return {"rehearse": rehearsal_text('{"current_directory_content": ["<b>x</b>"]}'),
                "feedback": "<assessment>ls worked</assessment><revision>none</revision>",
                "memory": "<memory>listing first is safe; " + INJECTION + "</memory>"}[role]

    tid = list_tasks("bfcl-base", "test")[0]
    env = make_env("bfcl-base", tid)
    ep = Episode("bfcl-base", tid, 0, env, env.reset())
    cfg = get_config("smoke", {"eval.max_turns": 12, "rollout.max_new_tokens_act": 1024,
                               "rollout.max_new_tokens_rehearse": 1024,
                               "rehearsal.max_new_tokens_feedback": 512})
    [row] = run_committed(ScriptedGenerator(script, tok), tok, [ep], cfg, rehearsal=mode, n=n)
    return ep, row


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_render_episode_shows_rehearsal_memory_and_committed_calls(tok, mode):
    ep, row = scripted_episode(tok, mode)
    turns = row["user_turns"]
    assert turns >= 2 and row["real_calls"] == turns and row["rehearsal_real_calls"] == 0
    page = render_episode(ep, row, title=f"{mode} <N=2>")
    # one rehearsal block per user turn, N attempts each with a feedback, one memory each
    assert page.count('class="envace-rehearsal"') == len(ep.rehearsals) == turns
    assert page.count('class="envace-attempt"') == 2 * turns
    assert page.count('class="envace-feedback"') == 2 * turns
    assert page.count('class="envace-memory"') == turns
    assert page.count("class=\"envace-memory-message\"") == turns  # m_x joined the history
    assert f"PRIVATE REHEARSAL · user turn 1 · {mode}, N=2" in page
    assert page.count("real calls during rehearsal: 0") == turns + 1  # + the closing line
    # imagined observations are rehearsed; the committed ones are real and numbered
    assert page.count("envace-obs-rehearsed") == 2 * turns
    assert page.count("envace-obs envace-obs-real") == turns
    for k in range(1, turns + 1):
        assert f"real call #{k}<" in page
    assert f"real call #{turns + 1}<" not in page
    assert f"real calls: {turns}" in page and "R = " in page
    assert page.count('class="envace-user"') >= turns
    assert "ls worked" in page and "&lt;N=2&gt;" in page
    # model text is escaped, tags balance
    assert "<script" not in page and parsed(page).scripts == 0
    assert all(v == 0 for v in parsed(page).depth.values())


def test_render_episode_with_one_attempt_and_without_rehearsal(tok):
    ep, row = scripted_episode(tok, "parallel", n=1)
    assert len(ep.rehearsals[0].attempts) == 1
    page = render_episode(ep, row)
    assert "<b>N</b>: 1" in page and page.count('class="envace-attempt"') == row["user_turns"]
    from envace_lite.testtime.execute import run_committed
    from envace_lite.testtime.episode import Episode
    from envace_lite.envs import make_env

    tid = list_tasks("bfcl-base", "test")[0]
    env = make_env("bfcl-base", tid)
    plain = Episode("bfcl-base", tid, 0, env, env.reset())
    gen = ScriptedGenerator({"act": [assistant_text([ToolCall("ls", {})]), "Done."]}, tok)
    [r] = run_committed(gen, tok, [plain], get_config("smoke", {"eval.max_turns": 2,
                                                                 "rollout.max_new_tokens_act": 512}))
    page = render_episode(plain, r)
    assert "envace-rehearsal" not in page and "<b>rehearsal</b>: none" in page
    assert page.count("envace-obs envace-obs-real") == r["real_calls"] == 1
    assert all(v == 0 for v in parsed(page).depth.values())
