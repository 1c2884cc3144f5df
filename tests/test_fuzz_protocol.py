"""Property-based fuzz of the protocol path: parse -> render -> tokenize -> REHEARSE prompt ->
env.step, on every suite's tool schemas, under the smoke, micro and laptop tokenizers.

Hypothesis writes hostile ACT and REHEARSE outputs with the strategies of ``envace_lite.protocol.fuzz``
(shared with ``benchmarks/fuzz_protocol.py``): calls of the suite's tools (and unknown ones)
with arguments holding lone surrogates (raw and as JSON escapes), ``</think>`` and tag text,
control characters, special-token text, NaN, deep nesting and duplicate keys, in every framing
(think blocks, prose, fences, unclosed, truncated). Each example must go through the whole path
without an exception, and every prompt built from it must be valid UTF-8 and tokenize.

Tiers: the default test runs a fixed, derandomized set of ``CI_EXAMPLES`` examples; the
``fuzz_long`` marker runs ``LONG_EXAMPLES`` through this whole path, ``env.step`` included (by
hand: ``pytest tests/test_fuzz_protocol.py -m fuzz_long``; ``FUZZ_EXAMPLES`` overrides the
count). The 10,000-output run is ``benchmarks/fuzz_protocol.py``: the same strategies
through parse -> render -> tokenize without the env step, then its worst outputs through a
scripted train and a ``rehearsal=parallel`` eval.
"""
from __future__ import annotations

import json
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace_lite import protocol as P
from envace_lite.protocol.prompts import (
    act_messages,
    assistant_text,
    call_json,
    tool_response_message,
)
from envace_lite.protocol.rehearse_prompt import rehearse_messages
from envace_lite.config import get_config
from envace_lite.envs import all_suites, list_tasks, make_env
from envace_lite.protocol.fuzz import act_outputs, rehearse_outputs
from envace_lite.protocol.fuzz import decoded as _decoded
from envace_lite.llm.generation import chat_ids
from envace_lite.core.rollout import rehearsal_observation

CI_EXAMPLES = 40
LONG_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10000"))
PROFILES = ("smoke", "micro", "laptop")
"""The tokenizers of the offline profiles (laptop: SmolLM2's, from the local GGUF package)."""


def _tau2_user(messages: list) -> str:  # a scripted USER for the official tau2 suites
    return "###STOP###"


@pytest.fixture(scope="module")
def world():
    """Every suite's first test task (env, reset messages, tools) and the three tokenizers."""
    from envace_lite.models.load import load_tokenizer

    suites = {}
    for s in all_suites():
        tid = list_tasks(s, "test")[0]
        kw = {"user": _tau2_user} if s in ("tau2-retail", "tau2-airline") else {}
        env = make_env(s, tid, **kw)
        suites[s] = {"env": env, "messages": env.reset(), "tools": env.tool_schemas(),
                     "id": tid, "kw": kw}
    toks = {p: load_tokenizer(get_config(p)) for p in PROFILES}
    yield {"suites": suites, "toks": toks, "ran": {"examples": 0}}
    for v in suites.values():
        v["env"].close()


def _tokenize(tok, messages) -> int:
    for m in messages:
        m["content"].encode("utf-8")  # strict: a lone surrogate raises here
    return len(chat_ids(tok, messages))


def check_path(world, suite: str, act: str, rehearse: str, rendering: str) -> None:
    """parse -> render -> tokenize -> REHEARSE prompt -> env.step for one ACT/REHEARSE pair."""
    ctx = world["suites"][suite]
    tools, env = ctx["tools"], ctx["env"]
    P.parse_act(act, tools)  # the raw text must parse without raising too
    text = _decoded(act)
    parsed = P.parse_act(text, tools)
    calls = parsed.calls if parsed.kind == "calls" else []
    for c in calls:
        call_json(c).encode("utf-8")
        json.dumps(c.to_dict(), ensure_ascii=False).encode("utf-8")
    assistant_text(calls, parsed.text if parsed.kind == "final" else "").encode("utf-8")
    if env.done:
        env.close()
        ctx["env"] = env = make_env(suite, ctx["id"], **ctx["kw"])
        env.reset()
    observations = list(env.step(calls)) if calls else []  # the real env, never crashing
    obs, _ = rehearsal_observation(_decoded(rehearse))
    P.parse_rehearsal(rehearse)
    history = [{"role": "assistant", "content": text}]
    if calls:
        history.append(tool_response_message([*observations, obs]))
    plain = [{"role": m["role"], "content": m["content"]} for m in ctx["messages"]
             if m["role"] != "system"]
    for tok in world["toks"].values():
        act_prompt = act_messages(ctx["messages"], tools, rendering, 600, history)
        assert _tokenize(tok, act_prompt) > 0

        def count(s: str, tok=tok) -> int:
            return len(tok.encode(s, add_special_tokens=False))

        for c in calls:
            rp = rehearse_messages(tools, None, plain + history[:1], c, count, 12000, rendering)
            assert _tokenize(tok, rp.messages) > 0
    world["ran"]["examples"] += 1
    progress = os.environ.get("FUZZ_PROGRESS")  # the long run reports its count as it goes
    if progress and world["ran"]["examples"] % 250 == 0:
        with open(progress, "w") as f:
            json.dump(world["ran"], f)


def _example():
    return st.tuples(st.sampled_from(all_suites()), st.sampled_from(["compact", "full"]),
                     st.data())


def _run(world, case) -> None:
    suite, rendering, data = case
    tools = world["suites"][suite]["tools"]
    check_path(world, suite, data.draw(act_outputs(tools)), data.draw(rehearse_outputs()),
               rendering)


QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
         HealthCheck.large_base_example]


def _fuzz(world, examples: int) -> int:
    """Run ``examples`` derandomized Hypothesis examples through the path; how many ran."""
    before = world["ran"]["examples"]

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=QUIET)
    @given(_example())
    def run(case):
        _run(world, case)

    run()
    return world["ran"]["examples"] - before


def test_fuzz_protocol_path_ci(world):
    """A fixed (derandomized) set of examples on every suite, under all three tokenizers."""
    assert _fuzz(world, CI_EXAMPLES) >= CI_EXAMPLES


@pytest.mark.fuzz_long
def test_fuzz_protocol_path_long(world):
    """``LONG_EXAMPLES`` ACT and REHEARSE outputs through the whole path, zero exceptions."""
    ran = _fuzz(world, LONG_EXAMPLES)
    print(f"fuzz_long: {ran} ACT + {ran} REHEARSE outputs through the path, 0 exceptions")
    assert ran >= LONG_EXAMPLES


@pytest.mark.parametrize("suite", ["bfcl-base", "tau2-telecom"])
def test_the_worst_outputs_take_the_whole_path(world, suite):
    """Hand-picked worst cases (the ones the scripted train and eval runs are fed, too), on a
    BFCL and a tau2 suite (each is a 40k-character prompt under three tokenizers)."""
    for act in WORST_ACT:
        for rehearse in WORST_REHEARSE:
            check_path(world, suite, act, rehearse, "compact")


WORST_ACT = [
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "\\ud800"}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "a</think>b"}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "name": "rm", "arguments": {"folder": "x"}}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": ' + '{"x": ' * 449 + "[1]" + "}" * 449
    + "}\n</tool_call>",
    "<" + " " * 39_000 + "/ tool_call >",
    "<tool_call>" * 500,
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "<|im_end|>\\u0000\\udfff"}}',
]
"""ACT outputs that crashed or fooled the parser before (see ``tests/test_reliability.py``)."""
WORST_REHEARSE = [
    '<execution_result>{"log": "\\ud800 a</think>b"}</execution_result>',
    "<execution_result>" + "[" * 5000,
    "<think>" + "<" * 20_000,
]
