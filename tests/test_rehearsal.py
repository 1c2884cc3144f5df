"""Test-time private rehearsal, committed execution and the write gate (rehearsal.py,
testtime/execute.py).

Scripted generators drive the real chat template, parser, rollout engine and benchmark adapters;
the last tests run the tiny random Qwen3 end to end.
"""
from __future__ import annotations

import json
import re

import pytest

from envace_lite.protocol.prompts import act_messages, assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.protocol import prompts
from envace_lite.testtime.execute import run_committed
from envace_lite.testtime.episode import Episode
from envace_lite.testtime.gate import WriteGate, identifiers
from envace_lite.config import get_config
from envace_lite.envs import make_env
from envace_lite.llm.generation import HFGenerator, chat_ids
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.protocol.rehearsal_outputs import parse_feedback, parse_memory
from envace_lite.types import Observation, ToolCall

BFCL = ("bfcl-base", "multi_turn_base_5")  # 4 scripted user turns
RETAIL = ("tau2-retail-ticket", "17")  # ticket: change #W8665881's address to Suite 641
OTHER_ORDER = "#W5918442"  # a pending order of another user, never named in task 17
LS = assistant_text([ToolCall("ls", {})])


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def cfg_(**over):
    base = {"eval.max_turns": 12, "rollout.max_new_tokens_act": 256,
            "rollout.max_new_tokens_rehearse": 128, "rehearsal.max_turns": 4}
    return get_config("smoke", {**base, **over})


def episode(suite, tid, gate=False):
    env = make_env(suite, tid)
    msgs = env.reset()
    return Episode(suite, tid, 0, env, msgs, gate=WriteGate(msgs) if gate else None)


def decode(tok, ids):
    return tok.decode(ids)


def last_user_block(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[-1]


class Rehearser:
    """A scripted rehearsing policy with unique markers per attempt and per feedback.

    Attempt k's first ACT output is ``mkdir(dir_name="attempt_k")`` (a write that would change
    the backend if it ran); its next one is the final text ``FINAL-k``.
    """

    def __init__(self, tok, env=None, memory="<memory>MEMORY-TEXT-42</memory>",
                 feedback=None):
        self.tok, self.env, self.memory, self.feedback = tok, env, memory, feedback
        self.attempts = self.feedbacks = self.memories = 0
        self.prompts: list[tuple[str, int, str]] = []  # (role, phase, decoded prompt)
        self.first_prompt: dict[int, str] = {}  # attempt k -> its first ACT prompt
        self.real_calls_seen: list[tuple[int, int]] = []  # (phase, env.real_calls)

    def __call__(self, role, prompt):
        text = self.tok.decode(prompt)
        self.prompts.append((role, self.memories, text))
        if self.env is not None:
            self.real_calls_seen.append((self.memories, self.env.real_calls))
        if role == "act":
            if last_user_block(text).startswith("<tool_response>"):
                k = re.findall(r"attempt_(\d+)", text)[-1]
                return f"FINAL-{k}"
            self.attempts += 1
            self.first_prompt[self.attempts] = text
            return assistant_text([ToolCall("mkdir",
                                            {"dir_name": f"attempt_{self.attempts}"})])
        if role == "rehearse":
            return rehearsal_text('{"result": "created"}')
        if role == "feedback":
            self.feedbacks += 1
            if self.feedback is not None:
                return self.feedback
            k = self.feedbacks
            return f"<assessment>FB-ASSESS-{k}</assessment>\n<revision>FB-REV-{k}</revision>"
        self.memories += 1
        return self.memory


def actor(tok, texts=(LS, "Done.")):
    """The acting policy: alternates an ``ls`` call and a closing text."""
    state = {"i": 0}

    def fn(role, prompt):
        state["i"] += 1
        return texts[(state["i"] - 1) % len(texts)]
    return ScriptedGenerator(fn, tok)


# ---------------------------------------------------------------------------------------------
# Zero real calls during rehearsal; the commit makes only its own
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_rehearsal_makes_zero_real_calls(tok, mode):
    ep = episode(*BFCL)
    reh = Rehearser(tok, env=ep.env)
    act = actor(tok)
    (row,) = run_committed(act, tok, [ep], cfg_(), rehearsal=mode, n=3,
                           rehearsal_generator=ScriptedGenerator(reh, tok))
    # every user turn was rehearsed, 3 attempts each, each attempt imagined one mkdir
    assert row["user_turns"] == 4 and len(ep.rehearsals) == 4
    assert [len(r.attempts) for r in ep.rehearsals] == [3, 3, 3, 3]
    assert row["rehearse_outputs"] == 12 and reh.attempts == 12
    # the live env's counter never moved while the rehearsing policy was working: at user turn
    # u it equals the committed calls of turns < u (one ls per turn)
    for phase, calls in reh.real_calls_seen:
        assert calls == phase
    assert row["rehearsal_real_calls"] == 0
    # the commit made exactly its own calls: one ls per user turn, and no mkdir ever ran
    assert row["real_calls"] == row["tool_calls"] == 4
    assert all("mkdir" not in c for step in ep.env.score()[1]["decoded"] for s in step for c in s)
    assert row["rehearsal_tokens"] > 0 and row["memory_tokens"] > 0


# ---------------------------------------------------------------------------------------------
# Prompt content
# ---------------------------------------------------------------------------------------------

def test_sequential_attempt_sees_earlier_attempts_and_feedback(tok):
    ep = episode(*BFCL)
    reh = Rehearser(tok)
    run_committed(actor(tok), tok, [ep], cfg_(), rehearsal="sequential", n=3,
                  rehearsal_generator=ScriptedGenerator(reh, tok))
    third = reh.first_prompt[3]
    for marker in ("attempt_1", "attempt_2", "FINAL-1", "FINAL-2", "FB-ASSESS-1", "FB-REV-1",
                   "FB-ASSESS-2", "FB-REV-2"):
        assert marker in third, marker
    assert "attempt_3" not in third and "FB-ASSESS-3" not in third
    assert "Private rehearsal of the current request" in third
    assert "attempt_" not in reh.first_prompt[1]
    # the memory prompt holds the three attempts and the three feedbacks
    memory_prompt = next(p for role, _, p in reh.prompts if role == "memory")
    for k in (1, 2, 3):
        assert f"attempt_{k}" in memory_prompt and f"FB-REV-{k}" in memory_prompt


def test_parallel_attempts_are_independent_and_batched(tok):
    ep = episode(*BFCL)
    reh = Rehearser(tok)
    gen = ScriptedGenerator(reh, tok)
    run_committed(actor(tok), tok, [ep], cfg_(), rehearsal="parallel", n=3,
                  rehearsal_generator=gen)
    first_turn = [(role, p) for role, phase, p in reh.prompts if phase == 0]
    for role, p in first_turn:
        if role in ("act", "rehearse"):
            assert "FB-" not in p
            own = set(re.findall(r"attempt_(\d+)", p))
            assert len(own) <= 1  # at most its own attempt, never another one
    # one batch of three attempts per step, then one batch of three feedbacks
    roles = [(role, len(prompts_)) for role, prompts_ in gen.calls[:4]]
    assert roles == [("act", 3), ("rehearse", 3), ("act", 3), ("feedback", 3)]


def test_memory_reaches_committed_act_and_no_future_user_turn(tok):
    ep = episode(*BFCL)
    questions = [q[0]["content"] for q in ep.env.entry["question"]]
    reh = Rehearser(tok)
    act = actor(tok)
    run_committed(act, tok, [ep], cfg_(), rehearsal="sequential", n=2,
                  rehearsal_generator=ScriptedGenerator(reh, tok))
    committed = [decode(tok, p) for _, ps in act.calls for p in ps]
    assert all("MEMORY-TEXT-42" in p for p in committed)
    assert prompts.memory_message("MEMORY-TEXT-42")["content"] in committed[0]
    # the memory message follows the request it was rehearsed for
    assert committed[0].index(questions[0]) < committed[0].index("MEMORY-TEXT-42")
    for role, phase, p in reh.prompts:  # phase u = rehearsal of user turn u
        assert questions[phase] in p, (role, phase)
        for future in questions[phase + 1:]:
            assert future not in p, (role, phase)


# ---------------------------------------------------------------------------------------------
# The write gate
# ---------------------------------------------------------------------------------------------

def _address(order_id):
    return ToolCall("modify_pending_order_address", {
        "order_id": order_id, "address1": "123 Elm Street", "address2": "Suite 641",
        "city": "Austin", "state": "TX", "country": "USA", "zip": "78712"})


def test_write_gate_refuses_unseen_id_and_passes_a_valid_write(tok):
    bad = ToolCall("cancel_pending_order", {"order_id": OTHER_ORDER, "reason": "no longer needed"})
    # the real backend WOULD apply the bad call: on a scratch env the DB hash changes
    scratch = make_env(*RETAIL)
    scratch.reset()
    h0 = scratch._env.get_db_hash()
    (obs,) = scratch.step([bad])
    assert not obs.error and obs.state_changed and scratch._env.get_db_hash() != h0

    ep = episode(*RETAIL, gate=True)
    seen = []

    def fn(role, prompt):
        seen.append((ep.env.real_calls, ep.env._env.get_db_hash(), decode(tok, prompt)))
        return [assistant_text([bad]), assistant_text([_address("#W8665881")]),
                "Your order will be delivered to Suite 641."][len(seen) - 1]

    (row,) = run_committed(ScriptedGenerator(fn, tok), tok, [ep], cfg_())
    (calls0, hash0, _), (calls1, hash1, prompt1), (calls2, hash2, _) = seen
    assert (calls1, hash1) == (calls0, hash0) == (0, h0)  # refused: nothing ran, hash unchanged
    assert "refused by the write gate" in prompt1 and OTHER_ORDER in prompt1
    assert calls2 == 1 and hash2 != h0  # the valid write (its id is in the ticket) passed
    assert row["gated_calls"] == 1 and row["real_calls"] == 1 and row["write_gate"] is True


def test_write_gate_rules():
    env = make_env(*RETAIL)
    msgs = env.reset()
    tools = env.tool_schemas()
    gate = WriteGate(msgs)
    read = ToolCall("get_order_details", {"order_id": OTHER_ORDER})
    assert gate.check(read, env, tools) is None  # reads are never judged
    no_reason = ToolCall("cancel_pending_order", {"order_id": "#W8665881"})
    assert "fails its schema" in gate.check(no_reason, env, tools)
    cancel = ToolCall("cancel_pending_order", {"order_id": OTHER_ORDER, "reason": "ordered by mistake"})
    assert OTHER_ORDER in gate.check(cancel, env, tools)
    gate.see_observations([Observation(f'{{"error": "{OTHER_ORDER} not yours"}}', error=True)])
    assert gate.check(cancel, env, tools) is not None  # error observations are no source
    gate.see_observations([Observation(f'{{"orders": ["{OTHER_ORDER}"]}}')])
    assert gate.check(cancel, env, tools) is None
    assert identifiers({"order_id": "#W1", "item_ids": ["1", "2"], "reason": "x",
                        "flights": [{"flight_number": "HAT1", "date": "2024-05-01"}],
                        "userId": 7, "flag_id": True, "file_name": "new.txt", "amount": 3}) == [
        ("order_id", "#W1"), ("item_ids", "1"), ("item_ids", "2"), ("flight_number", "HAT1"),
        ("userId", "7")]


def test_write_gate_lets_the_gold_replay_through(tok):
    """BFCL base 5's gold calls (mv, post_tweet, comment...) pass the gate and still score 1."""
    ep = episode(*BFCL, gate=True)
    script = [x for t in ep.env.gold_turns()
              for x in [assistant_text(s) for s in t.steps] + ["Done."]]
    cfg = cfg_(**{"eval.max_turns": 50, "rollout.max_new_tokens_act": 1024})
    (row,) = run_committed(ScriptedGenerator({"act": script}, tok), tok, [ep], cfg)
    assert row["reward"] == 1.0 and row["gated_calls"] == 0


# ---------------------------------------------------------------------------------------------
# Bad input: empty memory, unparseable feedback, memory over budget
# ---------------------------------------------------------------------------------------------

def test_parse_feedback_and_memory_outcomes(tok):
    fb = parse_feedback("")
    assert (fb.ok, fb.error, fb.text) == (False, "empty", prompts.NO_FEEDBACK)
    fb = parse_feedback("<think>hmm</think>It looked fine to me.")
    assert (fb.ok, fb.error, fb.assessment, fb.revision) == (False, "no_tags",
                                                             "It looked fine to me.", "")
    fb = parse_feedback("<assessment>wrong id</assessment> <revision>look it up")
    assert (fb.ok, fb.assessment, fb.revision) == (True, "wrong id", "look it up")
    assert fb.text == "Assessment: wrong id\nRevision: look it up"

    assert parse_memory("<memory>  </memory>", tok, 10).empty
    assert parse_memory("", tok, 10).empty
    m = parse_memory("Call ls first.", tok, 10)
    assert (m.text, m.parsed, m.empty, m.truncated) == ("Call ls first.", False, False, False)
    long = " ".join(f"step{i}" for i in range(50))
    m = parse_memory(f"<memory>{long}</memory>", tok, 12)
    assert m.truncated and 0 < m.tokens <= 12 and long.startswith(m.text)


def test_empty_memory_leaves_the_committed_prompt_unchanged(tok):
    plain = episode(*BFCL)
    ref = actor(tok)
    run_committed(ref, tok, [plain], cfg_(**{"eval.max_turns": 1}))
    ep = episode(*BFCL)
    act = actor(tok)
    reh = Rehearser(tok, memory="<memory></memory>")
    (row,) = run_committed(act, tok, [ep], cfg_(**{"eval.max_turns": 1}), rehearsal="parallel",
                           n=2, rehearsal_generator=ScriptedGenerator(reh, tok))
    assert row["empty_memories"] == 1 and row["memory_tokens"] == 0 and row["memories"] == [""]
    assert act.calls[0][1] == ref.calls[0][1]  # exactly the no-rehearsal prompt
    # and the imagined attempts started from that same real state
    assert reh.first_prompt[1] == decode(tok, ref.calls[0][1][0])


def test_unparseable_feedback_and_over_budget_memory_are_counted(tok):
    ep = episode(*BFCL)
    long = " ".join(f"note{i}" for i in range(200))
    reh = Rehearser(tok, memory=f"<memory>{long}</memory>", feedback="UNTAGGED-FEEDBACK here")
    cfg = cfg_(**{"eval.max_turns": 1, "rehearsal.memory_max_tokens": 20})
    (row,) = run_committed(actor(tok), tok, [ep], cfg, rehearsal="sequential", n=2,
                           rehearsal_generator=ScriptedGenerator(reh, tok))
    assert row["feedback_parse_errors"] == 2
    assert row["truncated_memories"] == 1 and 0 < row["memory_tokens"] <= 20
    memory_prompt = next(p for role, _, p in reh.prompts if role == "memory")
    assert memory_prompt.count("Assessment: UNTAGGED-FEEDBACK here") == 2
    assert ep.rehearsals[0].attempts[1].feedback.error == "no_tags"


def test_rehearsal_prompts_are_trimmed_to_the_budget(tok):
    """Long attempts are cut (then the tool list dropped) so FEEDBACK and MEMORY prompts fit; a
    sequential attempt whose context cannot fit stops before generating (``context_budget``)."""
    ep = episode(*BFCL)
    first = chat_ids(tok, act_messages(ep.messages, ep.env.tool_schemas(), "compact",
                                       600, []))
    cfg = cfg_(**{"eval.max_turns": 1, "rollout.max_new_tokens_act": 200})
    cfg.rollout.max_prompt_tokens = budget = len(first) + 100

    def fn(role, prompt):
        return {"act": "word " * 400, "memory": "<memory>m</memory>"}.get(
            role, "<assessment>a</assessment><revision>b</revision>")

    gen = ScriptedGenerator(fn, tok)
    run_committed(actor(tok), tok, [ep], cfg, rehearsal="sequential", n=2,
                  rehearsal_generator=gen)
    sizes = {role: [len(p) for p in ps] for role, ps in gen.calls}
    assert sizes["act"] == [len(first)]  # attempt 2 never generated
    assert all(n <= budget for n in sizes["feedback"] + sizes["memory"])
    a1, a2 = ep.rehearsals[0].attempts
    assert a1.trajectory.stop_reason == "final_answer" and a2.trajectory.stop_reason == \
        "context_budget"
    feedback = [tok.decode(p) for role, ps in gen.calls if role == "feedback" for p in ps]
    assert "characters cut" in feedback[0]


def test_docs_show_the_current_prompts():
    """docs/rehearsal.md shows every rehearsal prompt verbatim (the docs cannot drift)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "rehearsal.md").read_text()
    for name in ("FEEDBACK_SYSTEM", "FEEDBACK_USER", "MEMORY_SYSTEM", "MEMORY_USER",
                 "ATTEMPT_BLOCK", "SEQUENTIAL_CONTEXT", "MEMORY_MESSAGE", "GATE_REFUSAL"):
        assert getattr(prompts, name) in doc, name


# ---------------------------------------------------------------------------------------------
# End to end: the tiny real model through rehearsal and commit on real adapters
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    cfg = get_config("smoke")
    return load_policy(cfg)


@pytest.mark.parametrize("mode,suite", [("parallel", "bfcl-base"), ("sequential", "tau2-telecom")])
def test_tiny_model_rehearses_and_commits(tiny, mode, suite):
    model, tok = tiny
    cfg = get_config("smoke", {"eval.max_turns": 2, "rehearsal.max_turns": 2,
                               "rehearsal.max_new_tokens_feedback": 16,
                               "rehearsal.memory_max_tokens": 16})
    eps = [episode(*BFCL) if suite == "bfcl-base" else episode(suite, _telecom())]
    gen = HFGenerator(model, tok, seed=0)
    rows = run_committed(gen, tok, eps, cfg, rehearsal=mode, n=2)
    for ep, row in zip(eps, rows):
        assert row["rehearsal"] == mode and row["n"] == 2
        assert row["rehearsal_real_calls"] == 0 and row["grounding"] == "none"
        assert len(ep.rehearsals) >= 1 and all(len(r.attempts) == 2 for r in ep.rehearsals)
        assert row["rehearsal_tokens"] > 0
        assert row["memory_tokens"] <= 16 * len(ep.rehearsals)
        assert 1 <= row["turns"] <= 2 and row["reward"] == 0.0
        json.dumps(row)


def _telecom():
    from envace_lite.envs import list_tasks

    return list_tasks("tau2-telecom", "test")[0]


# ---------------------------------------------------------------------------------------------
# Options beyond the paper: the rule-built memory and its placement in the request
# ---------------------------------------------------------------------------------------------

def _attempt(index, calls):
    """An Attempt whose ACT turn t made the calls ``calls[t]``: (text, [imagined error?])."""
    from types import SimpleNamespace as NS

    from envace_lite.testtime.rehearsal import Attempt
    outputs, steps = [], []
    for turn, (text, errors) in enumerate(calls):
        outputs.append(NS(role="act", text=text))
        for err in errors:
            outputs.append(NS(role="rehearse", text="{}"))
            steps.append(NS(turn=turn, observation=Observation("x", error=err)))
    return Attempt(index, NS(outputs=outputs, steps=steps), [])


def test_calls_memory_keeps_the_best_attempts_working_calls(tok):
    from envace_lite.protocol.prompts import CALLS_MEMORY_HEADER
    from envace_lite.drills.calls_memory import calls_memory
    a1 = _attempt(1, [("CALL-A1", [True]), ("CALL-B1", [False]), ("The end.", [])])
    a2 = _attempt(2, [("CALL-A2", [False]), ("CALL-B2", [False, False])])
    a3 = _attempt(3, [("CALL-A3", [False]), ("CALL-B3", [False])])
    m = calls_memory([a1, a2, a3], tok, 64)
    # working outputs: a1 1 (CALL-A1's call got an imagined error), a2 2, a3 2; a2 and a3 tie
    # on errors (0) too, so the earlier one
    assert m.text == f"{CALLS_MEMORY_HEADER}\nCALL-A2\nCALL-B2"
    assert (m.empty, m.truncated) == (False, False)
    assert m.tokens == len(tok.encode(m.text, add_special_tokens=False))
    # a tie on working outputs goes to the fewer errors, then to the earliest attempt
    a4 = _attempt(4, [("CALL-A4", [True]), ("CALL-B4", [False]), ("CALL-C4", [False])])
    m = calls_memory([a4, _attempt(5, [("CALL-A5", [False]), ("CALL-B5", [False])])], tok, 64)
    assert m.text == f"{CALLS_MEMORY_HEADER}\nCALL-A5\nCALL-B5"
    m = calls_memory([a3, _attempt(6, [("CALL-A6", [False]), ("CALL-B6", [False])])], tok, 64)
    assert m.text == f"{CALLS_MEMORY_HEADER}\nCALL-A3\nCALL-B3"
    # a failed call is left out; an attempt that only answered in text never wins over one
    # with a working call
    assert calls_memory([a1], tok, 64).text == f"{CALLS_MEMORY_HEADER}\nCALL-B1"
    text_only = _attempt(1, [("The end.", [])])
    assert calls_memory([text_only, _attempt(2, [("CALL-X", [True]), ("CALL-Y", [False])])],
                        tok, 64).text == f"{CALLS_MEMORY_HEADER}\nCALL-Y"
    # nothing worked, or no attempt: an empty memory (no memory is inserted)
    assert calls_memory([_attempt(1, [("CALL", [True])])], tok, 64).empty
    assert calls_memory([_attempt(1, [("Just text.", [])])], tok, 64).empty
    assert calls_memory([], tok, 64).empty
    # over budget: whole lines go from the end; one line still over it is cut
    three = _attempt(1, [("CALL-ONE", [False]), ("CALL-TWO", [False]), ("CALL-THREE", [False])])
    budget = len(tok.encode(f"{CALLS_MEMORY_HEADER}\nCALL-ONE\nCALL-TWO",
                            add_special_tokens=False))
    m = calls_memory([three], tok, budget)
    assert m.text == f"{CALLS_MEMORY_HEADER}\nCALL-ONE\nCALL-TWO" and m.truncated
    assert m.tokens == budget
    long = _attempt(1, [(" ".join(f"w{i}" for i in range(80)), [False])])
    m = calls_memory([long], tok, 10)
    assert m.truncated and 0 < m.tokens <= 10 and m.text.startswith(CALLS_MEMORY_HEADER[:5])


def test_calls_memory_reaches_the_committed_act_without_a_memory_prompt(tok):
    ep = episode(*BFCL)
    reh = Rehearser(tok)
    act = actor(tok)
    cfg = cfg_(**{"eval.max_turns": 1, "study.memory_source": "calls"})
    (row,) = run_committed(act, tok, [ep], cfg, rehearsal="parallel", n=2,
                           rehearsal_generator=ScriptedGenerator(reh, tok))
    assert reh.memories == 0 and not any(role == "memory" for role, _, _ in reh.prompts)
    first = decode(tok, act.calls[0][1][0])
    call1 = assistant_text([ToolCall("mkdir", {"dir_name": "attempt_1"})]).strip()
    assert prompts.memory_message(
        f"{prompts.CALLS_MEMORY_HEADER}\n{call1}")["content"] in first  # both attempts tie: the first
    assert "attempt_2" not in first
    assert row["memory_tokens"] > 0 and row["empty_memories"] == 0


def test_ticket_placement_appends_the_memory_to_the_request(tok):
    plain = episode(*BFCL)
    ref = actor(tok)
    run_committed(ref, tok, [plain], cfg_(**{"eval.max_turns": 1}), rehearsal="parallel", n=2,
                  rehearsal_generator=ScriptedGenerator(Rehearser(tok), tok))
    ep = episode(*BFCL, gate=True)
    task_messages = [dict(m) for m in ep.messages]
    original = ep.messages
    act = actor(tok)
    cfg = cfg_(**{"eval.max_turns": 1, "rehearsal.memory_placement": "ticket"})
    run_committed(act, tok, [ep], cfg, rehearsal="parallel", n=2,
                  rehearsal_generator=ScriptedGenerator(Rehearser(tok), tok))
    as_message, in_ticket = decode(tok, ref.calls[0][1][0]), decode(tok, act.calls[0][1][0])
    memory = prompts.memory_message("MEMORY-TEXT-42")["content"]
    question = ep.env.entry["question"][0][0]["content"]
    # one user message fewer: the memory is in the request's own message, after a blank line
    assert as_message.count("<|im_start|>user") == in_ticket.count("<|im_start|>user") + 1
    assert f"{question}\n\n{memory}" in in_ticket
    assert original == task_messages  # the episode's messages were replaced, never changed
    assert not any("MEMORY-TEXT-42" in seen for seen in ep.gate._seen)  # the gate never reads m_x
    assert ep.history[0]["role"] == "assistant"


def test_ticket_placement_in_a_later_user_turn_goes_to_that_turns_request(tok):
    """After the first ACT output, only the messages no ACT prompt holds yet are searched: the
    new user turn, never a tool response or an earlier request already in act_ids."""
    from envace_lite.testtime.turn_records import apply_rehearsal
    from envace_lite.testtime.rehearsal import TurnRehearsal
    from envace_lite.protocol.rehearsal_outputs import Memory
    ep = episode(*BFCL)
    first_request = ep.messages[-1]["content"]
    ep.history = [{"role": "assistant", "content": "A"},
                  {"role": "user", "content": "<tool_response>\nR\n</tool_response>"},
                  {"role": "assistant", "content": "B"},
                  {"role": "user", "content": "<tool_response>\nS\n</tool_response>"},
                  {"role": "user", "content": "SECOND REQUEST"}]
    ep.act_ids, ep.act_history_len = [1, 2, 3], 3
    rec = TurnRehearsal(1, "parallel", memory=Memory("MEM", tokens=1))
    apply_rehearsal(ep, rec, "ticket")
    memory = prompts.memory_message("MEM")["content"]
    assert ep.history[4]["content"] == f"SECOND REQUEST\n\n{memory}" and len(ep.history) == 5
    assert ep.history[3]["content"] == "<tool_response>\nS\n</tool_response>"
    assert ep.messages[-1]["content"] == first_request
    # no new request since the last ACT reply (only a tool response): a memory message instead
    ep.history = ep.history[:4]
    apply_rehearsal(ep, rec, "ticket")
    assert ep.history[-1] == prompts.memory_message("MEM") and len(ep.history) == 5


def test_apply_rehearsal_rejects_an_unknown_placement(tok):
    from envace_lite.testtime.turn_records import apply_rehearsal
    from envace_lite.testtime.rehearsal import TurnRehearsal
    from envace_lite.protocol.rehearsal_outputs import Memory
    rec = TurnRehearsal(0, "parallel", memory=Memory("m", tokens=1))
    with pytest.raises(ValueError, match="'message' or 'ticket'"):
        apply_rehearsal(episode(*BFCL), rec, "system")
