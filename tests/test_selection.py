"""Rehearse, then select (testtime/selection.py, testtime/execute.py): hand-computed choices on scripted policies,
the committed call taken verbatim, zero real calls in rehearsal, unparsed REHEARSE outputs as
no prediction, crashed attempts skipped, and the controls (rules, vote, another REHEARSE).

The running task is the paper's Fig. 7 drill: the user asks for order ``W3220203`` without the
``#`` that tau2's ``get_order_details`` needs (``Error: Order not found`` otherwise).
"""
from __future__ import annotations

import pytest

from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.testtime.episode import Episode
from envace_lite.testtime.execute import run_committed
from envace_lite.config import get_config
from envace_lite.envs import list_tasks, make_env
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import qwen3_tokenizer
from envace_lite.testtime.candidates import (
    Candidate,
    accepted,
    choose,
    id_seen,
    selection_key,
    unseen_ids,
)
from envace_lite.types import ToolCall

DRILLS = "tau2-retail-drills"
ORDER = "W3220203"  # the first lookup drill of the test split asks for it, without the '#'
NOT_FOUND = rehearsal_text("Error: Order not found")
FOUND = rehearsal_text('{"order_id": "#W3220203", "status": "processed"}')
ANSWER = "Your order #W3220203 is processed."


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def lookup(order_id: str) -> str:
    return assistant_text([ToolCall("get_order_details", {"order_id": order_id})])


def drill_episode() -> Episode:
    tid = next(t for t in list_tasks(DRILLS, "test") if t.startswith("lookup:"))
    assert tid == f"lookup:{ORDER}"
    env = make_env(DRILLS, tid)
    return Episode(DRILLS, tid, 0, env, env.reset())


def cfg_(strategy: str, **over):
    return get_config("smoke", {"rehearsal.strategy": strategy, "rehearsal.max_turns": 1,
                                "eval.max_turns": 3, **over})


class Watched(ScriptedGenerator):
    """A scripted generator that records the env's real-call counter at every generate call."""

    def __init__(self, outputs, tok, env):
        super().__init__(outputs, tok)
        self.env, self.counter = env, []

    def generate(self, prompts, role, max_new_tokens, temperature=0.0, top_p=1.0):
        self.counter.append((role, self.env.real_calls))
        return super().generate(prompts, role, max_new_tokens, temperature, top_p)


# ---------------------------------------------------------------------------------------------
# The rules, by hand
# ---------------------------------------------------------------------------------------------

def cand(index, prediction="none", unseen=0, invalid=0, later=0, signature="", usable=True):
    from types import SimpleNamespace as NS
    c = Candidate(index, output=NS(text="x", ids=[1]) if usable else None, kind="calls",
                  signature=signature or f"sig{index}", prediction=prediction,
                  unseen_ids=["id=x"] * unseen, invalid=["bad"] * invalid, later_errors=later)
    return c


def test_selection_keys_and_ties_by_hand():
    # select: REHEARSE's verdict first (ok < none < error), then failed checks, later imagined
    # errors, agreement, the earliest index
    a = cand(1, "error")
    b = cand(2, "none", unseen=1)
    c = cand(3, "ok", unseen=1, signature="S")
    d = cand(4, "ok", unseen=1, signature="S")
    e = cand(5, "ok", unseen=1, later=1)
    assert choose([a, b, c, d, e], "select").index == 3  # c and d tie on all but index
    assert (c.agreement, d.agreement, a.agreement) == (1, 1, 0)
    assert selection_key(c, "select") == (0, 1, 0, -1, 3)
    assert selection_key(e, "select") == (0, 1, 1, 0, 5)
    # rules: failed checks, agreement, index: a has no failed check
    assert choose([a, b, c, d, e], "rules").index == 1
    # vote: the largest group (c, d), its earliest member
    assert choose([a, b, c, d, e], "vote").index == 3
    # a text reply with no prediction beats a rejected call; two agreeing text replies win a vote
    t1, t2 = cand(2, signature="T"), cand(3, signature="T")
    assert choose([cand(1, "error"), t1, t2], "select").index == 2
    assert choose([cand(1), t1, t2], "vote").index == 2
    # nothing usable: no choice
    assert choose([cand(1, usable=False)], "select") is None
    crashed = cand(1, "ok")
    crashed.crashed = "boom"
    assert choose([crashed, cand(2, "error")], "select").index == 2
    with pytest.raises(ValueError, match="selection strategy"):
        selection_key(a, "memory")


def test_sequential_early_stop_by_hand():
    assert not accepted([cand(1, "error"), cand(2, "ok", unseen=1)], "select", 3)
    assert accepted([cand(1, "error"), cand(2, "ok")], "select", 3)
    assert not accepted([cand(1, "ok", invalid=1)], "rules", 3)
    assert accepted([cand(1, "error")], "rules", 3)  # rules never read REHEARSE
    # vote: stop once a signature holds more than N/2 of the N candidates
    assert not accepted([cand(1, signature="A"), cand(2, signature="B")], "vote", 3)
    assert accepted([cand(1, signature="A"), cand(2, signature="A")], "vote", 3)
    assert not accepted([cand(1, signature="A"), cand(2, signature="A")], "vote", 4)


def test_ids_seen_in_the_dialogue():
    seen = "Hi! What is the status of my order W3220203?"
    assert id_seen("W3220203", seen) and id_seen("#W3220203", seen)  # the '#' may be added
    assert not id_seen("#W3220208", seen) and not id_seen("#", seen)
    assert unseen_ids({"order_id": "#W9999999", "reason": "W3220203", "user_id": "W3220203"},
                      seen) == ["order_id=#W9999999"]


# ---------------------------------------------------------------------------------------------
# Through run_committed on the Fig. 7 drill
# ---------------------------------------------------------------------------------------------

def test_select_commits_the_attempt_rehearse_accepts_verbatim(tok):
    """Three parallel attempts: the bare id (REHEARSE: not found), the id with its '#'
    (REHEARSE: found), an invented id (REHEARSE's output does not parse). Hand-computed keys:
    attempt 1 (2, 0, 0, 0, 1), attempt 2 (0, 0, 0, 0, 2), attempt 3 (1, 1, 0, 0, 3): attempt 2."""
    ep = drill_episode()
    script = {"act": [lookup(ORDER), lookup("#W3220203"), lookup("#W9999999"), ANSWER],
              "rehearse": [NOT_FOUND, FOUND, "no block here"]}
    gen = Watched(script, tok, ep.env)
    [row] = run_committed(gen, tok, [ep], cfg_("select"), rehearsal="parallel", n=3)
    [sel] = row["selections"]
    assert [c["prediction"] for c in sel["candidates"]] == ["error", "ok", "none"]
    assert [c["unpredicted"] for c in sel["candidates"]] == [0, 0, 1]
    assert [c["unseen_ids"] for c in sel["candidates"]] == [[], [], ["order_id=#W9999999"]]
    assert sel["chosen"] == 2 and row["rejected_attempts"] == 1
    # the attempts' ACT and REHEARSE, then ONE committed generate call (the answer): the first
    # committed output was not generated again, it is attempt 2's, token for token
    assert [(r, len(p)) for r, p in gen.calls] == [("act", 3), ("rehearse", 3), ("act", 1)]
    attempt = ep.selections[0].candidates[1].output
    first_prompt = gen.calls[0][1][1]
    assert ep.act_ids[:len(first_prompt) + len(attempt.ids)] == first_prompt + attempt.ids
    assert ep.history[0]["content"] == lookup("#W3220203")
    # zero real calls while rehearsing; the one real call is the committed one, and it worked
    assert gen.counter == [("act", 0), ("rehearse", 0), ("act", 1)]
    assert row["rehearsal_real_calls"] == 0 and row["real_calls"] == 1
    assert row["failed_real_calls"] == 0 and row["reward"] == 1.0
    assert row["strategy"] == "select" and row["rehearse_outputs"] == 3
    assert row["memories"] == [] and row["rehearsal_tokens"] == sum(
        c["tokens"] for c in sel["candidates"])
    # generated: the candidates' tokens, plus the one committed output generated afterwards
    assert row["generated_tokens"] == row["rehearsal_tokens"] + len(
        tok.encode(ANSWER, add_special_tokens=False))


def test_unparsed_rehearse_is_no_prediction_never_success(tok):
    """Two attempts make the same call; REHEARSE's output for the first does not parse, for the
    second it is a real-looking result. The earlier attempt loses: ``none`` ranks below ``ok``.
    An unparsed output that LOOKS like an error is no rejection either."""
    ep = drill_episode()
    script = {"act": [lookup("#W3220203"), lookup("#W3220203"), ANSWER],
              "rehearse": ["{\"status\": \"processed\"} (no block)", FOUND]}
    [row] = run_committed(ScriptedGenerator(script, tok), tok, [ep], cfg_("select"),
                          rehearsal="parallel", n=2)
    [sel] = row["selections"]
    assert [c["prediction"] for c in sel["candidates"]] == ["none", "ok"]
    assert [c["agreement"] for c in sel["candidates"]] == [1, 1] and sel["chosen"] == 2
    ep = drill_episode()
    script = {"act": [lookup(ORDER), ANSWER], "rehearse": ["Error: Order not found"]}
    [row] = run_committed(ScriptedGenerator(script, tok), tok, [ep], cfg_("select"),
                          rehearsal="parallel", n=1)
    [c] = row["selections"][0]["candidates"]
    assert (c["prediction"], c["imagined_errors"], c["unpredicted"]) == ("none", 0, 1)
    assert row["rejected_attempts"] == 0


def test_a_crashed_attempt_is_logged_and_skipped_and_the_episode_commits(tok, caplog):
    """The acting policy raises on its 2nd and 4th ACT prompts: the batch of three fails, then
    attempt by attempt: attempt 1 (prompt 3) works, attempt 2 (prompt 4) crashes, attempt 3
    (prompt 5) works. Both survivors agree; the earliest (1) is committed."""
    ep = drill_episode()
    count = {"act": 0}

    def fn(role, prompt):
        if role == "rehearse":
            return FOUND
        count["act"] += 1
        if count["act"] in (2, 4):
            raise RuntimeError("attempt crashed")
        return lookup("#W3220203") if count["act"] < 6 else ANSWER

    with caplog.at_level("WARNING"):
        [row] = run_committed(ScriptedGenerator(fn, tok), tok, [ep], cfg_("select"),
                              rehearsal="parallel", n=3)
    [sel] = row["selections"]
    assert [bool(c["crashed"]) for c in sel["candidates"]] == [False, True, False]
    assert "RuntimeError: attempt crashed" in sel["candidates"][1]["crashed"]
    assert sel["chosen"] == 1 and row["crashed_attempts"] == 1
    assert "crashed and is skipped" in caplog.text
    assert row["real_calls"] == 1 and row["reward"] == 1.0 and row["error"] == ""


def test_every_attempt_crashing_still_commits(tok):
    ep = drill_episode()
    count = {"act": 0}

    def fn(role, prompt):
        count["act"] += 1
        if count["act"] <= 3:  # the batch of two, then each attempt alone
            raise RuntimeError("attempt crashed")
        return [lookup("#W3220203"), ANSWER][min(count["act"] - 4, 1)]

    [row] = run_committed(ScriptedGenerator(fn, tok), tok, [ep], cfg_("select"),
                          rehearsal="parallel", n=2)
    assert row["selections"][0]["chosen"] == 0 and row["crashed_attempts"] == 2
    assert row["real_calls"] == 1 and row["reward"] == 1.0  # the committed ACT generated


def test_sequential_select_stops_at_the_first_accepted_attempt(tok):
    """Attempt 1: the bare id, rejected; attempt 2: the '#' id, accepted (ok, no failed check):
    attempt 3 of N = 3 is never made."""
    ep = drill_episode()
    script = {"act": [lookup(ORDER), lookup("#W3220203"), ANSWER],
              "rehearse": [NOT_FOUND, FOUND]}
    gen = ScriptedGenerator(script, tok)
    [row] = run_committed(gen, tok, [ep], cfg_("select"), rehearsal="sequential", n=3)
    assert [(r, len(p)) for r, p in gen.calls] == [("act", 1), ("rehearse", 1), ("act", 1),
                                                   ("rehearse", 1), ("act", 1)]
    assert row["selections"][0]["chosen"] == 2 and len(row["selections"][0]["candidates"]) == 2
    assert row["reward"] == 1.0


def test_rules_and_vote_sample_first_calls_and_never_rehearse(tok):
    """Three sampled first outputs: the bare id, an invented id, the bare id again. Rules: the
    invented id fails its check; 1 and 3 agree, 1 is earliest. Vote: the same group. Both commit
    the Fig. 7 slip, which only REHEARSE can tell from the right call."""
    for strategy in ("rules", "vote"):
        ep = drill_episode()
        script = {"act": [lookup(ORDER), lookup("#W1111111"), lookup(ORDER), ANSWER]}
        gen = Watched(script, tok, ep.env)
        [row] = run_committed(gen, tok, [ep], cfg_(strategy), rehearsal="parallel", n=3)
        [sel] = row["selections"]
        assert [c["unseen_ids"] for c in sel["candidates"]] == [[], ["order_id=#W1111111"], []]
        assert [c["agreement"] for c in sel["candidates"]] == [1, 0, 1]
        assert sel["chosen"] == 1 and row["rehearse_outputs"] == 0
        # one batch of three samples, then, after the committed slip failed for real, the answer
        assert [(r, len(p)) for r, p in gen.calls] == [("act", 3), ("act", 1)]
        assert [c for _, c in gen.counter] == [0, 1]
        # the samples came from the committed prompt itself
        assert gen.calls[0][1][0] == gen.calls[0][1][2]
        assert ep.act_ids[:len(gen.calls[0][1][0])] == gen.calls[0][1][0]
        assert row["failed_real_calls"] == 1 and row["rehearsal_real_calls"] == 0


def test_select_with_another_rehearse_policy(tok):
    """The untrained-REHEARSE control: the acting policy writes the attempts' ACT outputs, the
    other policy only their REHEARSE outputs. Here it predicts success for the slip, so the
    slip is committed (key (0, 0, 0, 0, 1) against attempt 2's identical one)."""
    ep = drill_episode()
    act = ScriptedGenerator({"act": [lookup(ORDER), lookup("#W3220203"), ANSWER]}, tok)
    other = ScriptedGenerator({"rehearse": [FOUND]}, tok)
    [row] = run_committed(act, tok, [ep], cfg_("select"), rehearsal="parallel", n=2,
                          rehearsal_generator=other)
    assert {r for r, _ in act.calls} == {"act"} and {r for r, _ in other.calls} == {"rehearse"}
    assert row["selections"][0]["chosen"] == 1 and row["failed_real_calls"] == 1


def test_bad_strategy_is_refused(tok):
    with pytest.raises(ValueError, match="rehearsal strategy"):
        run_committed(ScriptedGenerator({"act": [ANSWER]}, tok), tok, [drill_episode()],
                      cfg_("select"), rehearsal="parallel", n=1, strategy="best")


def test_evaluate_keeps_the_controls_apart_in_one_folder(tok, tmp_path):
    """``select`` and ``rules`` rows share a results folder (the strategy is a per-row key), each
    with its own config hash and label; a rerun skips them."""
    from envace_lite.pipelines.evaluate import evaluate
    from envace_lite.pipelines.run_records import read_rows
    from envace_lite.pipelines.tables import summarize_runs

    cfg = cfg_("memory")

    def policy():
        return (ScriptedGenerator({"act": [lookup(ORDER), lookup("#W3220203"), ANSWER],
                                   "rehearse": [NOT_FOUND, FOUND]}, tok), tok)

    # rules cannot tell the slip from the right call (both ids are in the message): it takes the
    # earliest, the slip, which fails for real
    for strategy, chosen, failed in (("select", 2, 0), ("rules", 1, 1)):
        [row] = evaluate(policy(), DRILLS, "parallel", n=2, cfg=cfg, limit=1, out=tmp_path,
                         strategy=strategy)
        assert row["strategy"] == strategy and row["selections"][0]["chosen"] == chosen
        assert row["result_config"]["rehearsal.strategy"] == strategy
        assert row["failed_real_calls"] == failed
    rows = read_rows(tmp_path / "results.jsonl")
    assert len(rows) == 2 and len({r["config_hash"] for r in rows}) == 2
    assert list(summarize_runs(rows)) == ["parallel/N=2/select", "parallel/N=2/rules"]
    again = evaluate(policy(), DRILLS, "parallel", n=2, cfg=cfg, limit=1, out=tmp_path,
                     strategy="select")
    assert again == [rows[0]] and len(read_rows(tmp_path / "results.jsonl")) == 2
    with pytest.raises(ValueError, match="strategy"):
        evaluate(policy(), DRILLS, "parallel", n=2, cfg=cfg, limit=1, strategy="best")


def test_cli_refuses_an_unknown_strategy_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from envace_lite.cli.main import app

    res = CliRunner().invoke(app, ["eval", "--profile", "smoke", "--strategy", "best",
                                   "--limit", "1", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "rehearsal.strategy='best'" in res.output and "select" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "out").exists()
