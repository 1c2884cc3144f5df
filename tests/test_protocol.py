"""Tests of envace_lite.protocol: ACT/REHEARSE parsing, rendering and REHEARSE trimming.

Default tier: no network, no model, hand-written tool schemas.
"""
from __future__ import annotations

import json

import pytest

from envace_lite import protocol as P
from envace_lite.protocol.prompts import (
    COMPACT_DESC_CHARS,
    POLICY_TRUNCATED,
    act_messages,
    act_system_prompt,
    assistant_text,
    compact_signature,
    policy_excerpt,
    render_tools,
    tool_response_message,
)
from envace_lite.protocol.rehearse_prompt import (
    REHEARSE_SYSTEM,
    UNAVAILABLE,
    rehearsal_text,
    rehearse_messages,
)
from envace_lite.protocol.tags import strip_think
from envace_lite.protocol import ErrorCode as E
from envace_lite.types import Observation, ToolCall

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city. Returns JSON with temp and sky.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "units": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_flight",
        "description": "Book a flight between two airports\nwith many more details here.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string"}, "destination": {"type": "string"},
            "passengers": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["origin", "destination"]}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List files.",
        "parameters": {"type": "object", "properties": {}}}},
]

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
F = '{"name": "book_flight", "arguments": {"origin": "A", "destination": "B"}}'


def tc(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


PARIS = [("get_weather", {"city": "Paris"})]

# (id, text, kind, error code, [(name, arguments)] or None to skip, violation substrings per call)
ACT_CASES = [
    ("empty", "", "error", E.EMPTY, None, None),
    ("whitespace", "  \n\t ", "error", E.EMPTY, None, None),
    ("none_text", None, "error", E.EMPTY, None, None),
    ("plain_final", "The weather in Paris is sunny.", "final", E.NONE, [], None),
    ("bare_json_is_final", W, "final", E.NONE, [], None),
    ("one_call", tc(W), "calls", E.NONE, PARIS, [[]]),
    ("no_newlines", f"<tool_call>{W}</tool_call>", "calls", E.NONE, PARIS, [[]]),
    ("two_calls", tc(W) + "\n" + tc(F), "calls", E.NONE,
     PARIS + [("book_flight", {"origin": "A", "destination": "B"})], [[], []]),
    ("text_around", f"Let me check.\n{tc(W)}\nOne moment.", "calls", E.NONE, PARIS, [[]]),
    ("think_then_call", f"<think>I need the weather.</think>\n{tc(W)}", "calls", E.NONE, PARIS,
     [[]]),
    ("think_only", "<think>hmm</think>\n", "error", E.EMPTY, None, None),
    ("unclosed_think", "<think>I should call get_weather", "error", E.UNCLOSED_THINK, None, None),
    ("unclosed_think_with_call", f"<think>maybe {tc(W)}", "error", E.UNCLOSED_THINK, None, None),
    ("prefilled_think", f"reasoning here</think>\n{tc(W)}", "calls", E.NONE, PARIS, [[]]),
    ("call_only_in_think", f"<think>{tc(W)}</think>It is sunny.", "final", E.NONE, [], None),
    ("call_in_and_out_of_think", f"<think>{tc(F)}</think>{tc(W)}", "calls", E.NONE, PARIS, [[]]),
    ("unclosed_call_complete_json", f"<tool_call>\n{W}\n", "calls", E.NONE, PARIS, [[]]),
    ("unclosed_call_truncated", '<tool_call>\n{"name": "get_weather", "argu', "error",
     E.UNCLOSED_TAG, None, None),
    ("bad_json_unquoted", tc("{name: get_weather}"), "error", E.BAD_JSON, None, None),
    ("trailing_comma", tc('{"name": "get_weather", "arguments": {"city": "Paris",}}'), "error",
     E.BAD_JSON, None, None),
    ("single_quotes", tc("{'name': 'get_weather', 'arguments': {'city': 'Paris'}}"), "error",
     E.BAD_JSON, None, None),
    ("nan_value", tc('{"name": "book_flight", "arguments": {"passengers": NaN}}'), "error",
     E.BAD_JSON, None, None),
    ("float_overflow", tc('{"name": "book_flight", "arguments": {"passengers": 1e999}}'), "error",
     E.BAD_JSON, None, None),
    ("extra_text_in_block", tc(W + " thanks"), "error", E.BAD_JSON, None, None),
    ("deep_nesting", tc("[" * 20000), "error", E.BAD_JSON, None, None),
    ("json_array_of_calls", tc(f"[{W}]"), "error", E.NOT_OBJECT, None, None),
    ("json_string", tc('"get_weather"'), "error", E.NOT_OBJECT, None, None),
    ("empty_block", "<tool_call>\n</tool_call>", "error", E.EMPTY_CALL, None, None),
    ("missing_name", tc('{"arguments": {"city": "Paris"}}'), "error", E.MISSING_NAME, None, None),
    ("null_name", tc('{"name": null, "arguments": {}}'), "error", E.MISSING_NAME, None, None),
    ("name_not_string", tc('{"name": 42, "arguments": {}}'), "error", E.BAD_NAME, None, None),
    ("name_blank", tc('{"name": "  ", "arguments": {}}'), "error", E.BAD_NAME, None, None),
    ("args_json_string", tc('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'),
     "calls", E.NONE, PARIS, [[]]),
    ("args_string_not_json", tc('{"name": "get_weather", "arguments": "Paris"}'), "error",
     E.ARGS_NOT_OBJECT, None, None),
    ("args_string_json_list", tc('{"name": "get_weather", "arguments": "[1]"}'), "error",
     E.ARGS_NOT_OBJECT, None, None),
    ("args_list", tc('{"name": "get_weather", "arguments": ["Paris"]}'), "error",
     E.ARGS_NOT_OBJECT, None, None),
    ("args_missing", tc('{"name": "list_files"}'), "calls", E.NONE, [("list_files", {})], [[]]),
    ("args_null", tc('{"name": "list_files", "arguments": null}'), "calls", E.NONE,
     [("list_files", {})], [[]]),
    ("parameters_alias", tc('{"name": "get_weather", "parameters": {"city": "Paris"}}'), "calls",
     E.NONE, PARIS, [[]]),
    ("extra_keys_ignored", tc('{"id": "x", "type": "function", "name": "get_weather", '
                              '"arguments": {"city": "Paris"}}'), "calls", E.NONE, PARIS, [[]]),
    ("unknown_tool", tc('{"name": "delete_db", "arguments": {}}'), "calls", E.NONE,
     [("delete_db", {})], [["unknown tool 'delete_db'"]]),
    ("missing_required", tc('{"name": "get_weather", "arguments": {}}'), "calls", E.NONE,
     [("get_weather", {})], [["'city' is a required property"]]),
    ("wrong_type", tc('{"name": "book_flight", "arguments": {"origin": "A", "destination": "B", '
                      '"passengers": "two"}}'), "calls", E.NONE, None,
     [["arguments.passengers", "is not of type 'integer'"]]),
    ("bad_enum", tc('{"name": "get_weather", "arguments": {"city": "Paris", "units": "k"}}'),
     "calls", E.NONE, None, [["arguments.units", "is not one of"]]),
    ("extra_arg_forbidden", tc('{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}'),
     "calls", E.NONE, None, [["Additional properties are not allowed"]]),
    ("extra_arg_allowed", tc('{"name": "book_flight", "arguments": {"origin": "A", '
                             '"destination": "B", "x": 1}}'), "calls", E.NONE, None, [[]]),
    ("nested_tags", f"<tool_call><tool_call>{W}</tool_call></tool_call>", "error",
     E.UNBALANCED_TAG, None, None),
    ("stray_close", f"{W}</tool_call>", "error", E.UNBALANCED_TAG, None, None),
    ("open_open_close", f"<tool_call>{W}<tool_call>{W}</tool_call>", "error", E.UNBALANCED_TAG,
     None, None),
    ("very_long", "a" * 100_000, "error", E.TOO_LONG, None, None),
    ("very_long_call", tc('{"name": "get_weather", "arguments": {"city": "%s"}}' % ("x" * 10**5)),
     "error", E.TOO_LONG, None, None),
    ("unicode", tc('{"name": "get_weather", "arguments": {"city": "São Paulo 東京 🌧"}}'),
     "calls", E.NONE, [("get_weather", {"city": "São Paulo 東京 🌧"})], [[]]),
    ("fence_inside", f"<tool_call>\n```json\n{W}\n```\n</tool_call>", "calls", E.NONE, PARIS, [[]]),
    ("fence_around", f"```xml\n{tc(W)}\n```", "calls", E.NONE, PARIS, [[]]),
    ("duplicate_calls", tc(W) + tc(W), "calls", E.NONE, PARIS * 2, [[], []]),
    ("upper_case_tags", f"<TOOL_CALL>{W}</TOOL_CALL>", "error", E.MALFORMED_TAG, None, None),
    ("plural_tag", f"<tool_calls>{W}</tool_calls>", "error", E.MALFORMED_TAG, None, None),
    ("tag_attribute", f'<tool_call name="get_weather">{W}</tool_call>', "error", E.MALFORMED_TAG,
     None, None),
    ("second_block_bad", tc(W) + tc("{oops}"), "error", E.BAD_JSON, None, None),
]


@pytest.mark.parametrize("text,kind,code,calls,violations",
                         [c[1:] for c in ACT_CASES], ids=[c[0] for c in ACT_CASES])
def test_parse_act_table(text, kind, code, calls, violations):
    p = P.parse_act(text, TOOLS)
    assert (p.kind, p.error_code) == (kind, code), p.reason
    if kind == "error":
        assert p.calls == [] and p.reason
    else:
        assert p.error_code is E.NONE
    if calls is not None:
        assert [(c.name, c.arguments) for c in p.calls] == calls
    if violations is not None:
        assert len(p.calls) == len(violations)
        for call, subs in zip(p.calls, violations):
            assert bool(call.violations) == bool(subs), call.violations
            assert all(any(s in v for v in call.violations) for s in subs), call.violations


def test_act_case_count():
    assert len(ACT_CASES) >= 30


def test_parse_act_details():
    p = P.parse_act(f"Let me check.\n{tc(W)}\nOne moment.\n{tc(F)}", TOOLS)
    assert p.text == "Let me check.\nOne moment."
    assert [c.call_id for c in p.calls] == ["call_0", "call_1"]
    assert P.parse_act("<think>x</think> Sunny. ", TOOLS).text == "Sunny."
    unclosed = P.parse_act(f"<tool_call>\n{W}", TOOLS)
    assert "unclosed" in unclosed.reason
    assert P.parse_act("<think>only</think>", TOOLS).reason == "only reasoning, no answer"


def test_strip_think():
    assert strip_think("a<think>b</think>c<think>d</think>e") == ("ace", True)
    assert strip_think("x</think>y") == ("y", True)
    assert strip_think("a<think>b") == ("a", False)
    assert strip_think("<think>a</think>b</think>c") == ("bc", True)


# (id, text, ok, code, content, is_json, is_error)
R = rehearsal_text
REHEARSAL_CASES = [
    ("json_ok", R('{"temp": 20}'), True, E.NONE, '{"temp": 20}', True, False),
    ("think_then_result", "<think>valid call</think>" + R('{"temp": 20}'), True, E.NONE,
     '{"temp": 20}', True, False),
    ("text_outside_ignored", "Here you go:\n" + R("OK") + "\nbye", True, E.NONE, "OK", False,
     False),
    ("no_tags", "temp is 20", False, E.NO_RESULT, "", False, False),
    ("empty", "", False, E.EMPTY, "", False, False),
    ("think_only", "<think>x</think>", False, E.EMPTY, "", False, False),
    ("unclosed_think", "<think>validating", False, E.UNCLOSED_THINK, "", False, False),
    ("unclosed_complete_json", '<execution_result>\n{"temp": 20}', True, E.NONE, '{"temp": 20}',
     True, False),
    ("unclosed_truncated", '<execution_result>\n{"temp": 2', False, E.UNCLOSED_RESULT, "", False,
     False),
    ("empty_block", "<execution_result>\n\n</execution_result>", False, E.EMPTY_RESULT, "", False,
     False),
    ("json_error_key", R('{"error": "no city"}'), True, E.NONE, '{"error": "no city"}', True, True),
    ("json_error_tool_call", R('{"error_tool_call": {"code": "TOOL_NOT_AVAILABLE"}}'), True, E.NONE,
     None, True, True),
    ("json_null_error", R('{"error": null, "result": 1}'), True, E.NONE, None, True, False),
    ("text_error", R("Error: order #12 not found"), True, E.NONE, "Error: order #12 not found",
     False, True),
    ("bfcl_text_error", R("Error during execution: no such file"), True, E.NONE, None, False, True),
    ("json_string_error", R('"error: bad input"'), True, E.NONE, None, True, True),
    ("traceback", R("Traceback (most recent call last):\n  ..."), True, E.NONE, None, False, True),
    ("error_word_inside", R("No errors found; 3 files."), True, E.NONE, None, False, False),
    ("errors_prefix_word", R("Errors list is empty"), True, E.NONE, None, False, False),
    ("array_not_error", R('[{"error": "x"}]'), True, E.NONE, None, True, False),
    ("fence_inside", "<execution_result>\n```json\n{\"a\": 1}\n```\n</execution_result>", True,
     E.NONE, '{"a": 1}', True, False),
    ("first_block_wins", R("1") + R("2"), True, E.NONE, "1", True, False),
    ("upper_case_tag", "<EXECUTION_RESULT>1</EXECUTION_RESULT>", False, E.MALFORMED_TAG, "", False,
     False),
    ("nested_open", "<execution_result><execution_result>1</execution_result>", False,
     E.UNBALANCED_TAG, "", False, False),
    ("too_long", R("x" * 60_000), False, E.TOO_LONG, "", False, False),
]


@pytest.mark.parametrize("text,ok,code,content,is_json,is_error",
                         [c[1:] for c in REHEARSAL_CASES], ids=[c[0] for c in REHEARSAL_CASES])
def test_parse_rehearsal_table(text, ok, code, content, is_json, is_error):
    r = P.parse_rehearsal(text)
    assert (r.ok, r.error_code, r.is_json, r.is_error) == (ok, code, is_json, is_error)
    if content is not None:
        assert r.content == content


@pytest.mark.parametrize("calls,text", [
    ([ToolCall("get_weather", {"city": "Paris"})], ""),
    ([ToolCall("get_weather", {"city": "São Paulo"}), ToolCall("list_files", {})], "Checking."),
    ([ToolCall("book_flight", {"origin": "A", "destination": "B", "tags": ["x", {"y": [None]}]})],
     "  multi\nline  "),
    ([ToolCall("no_such_tool", {"q": "a <b> & \"c\""})], ""),
    ([], "Just an answer."),
])
def test_round_trip(calls, text):
    p = P.parse_act(assistant_text(calls, text), TOOLS)
    assert p.kind == ("calls" if calls else "final")
    assert [(c.name, c.arguments) for c in p.calls] == [(c.name, c.arguments) for c in calls]
    assert p.text == text.strip()


def test_assistant_text_rejects_tags():
    with pytest.raises(ValueError, match="must not contain"):
        assistant_text([], "see <tool_call>")
    with pytest.raises(ValueError, match="must not contain"):
        assistant_text([], "see <TOOL_CALLS>")


def test_rehearsal_text_round_trip():
    for content in ['{"a": [1, 2]}', "Error: nope", "plain\nmulti-line text"]:
        r = P.parse_rehearsal(rehearsal_text(content))
        assert r.ok and r.content == content


def test_render_compact():
    compact = render_tools(TOOLS, "compact")
    full = render_tools(TOOLS, "full")
    assert compact == render_tools(json.loads(json.dumps(TOOLS)), "compact")  # deterministic
    assert compact.splitlines() == [
        'get_weather(city: string, units?: "c"|"f") - Get the current weather for a city.',
        ("book_flight(origin: string, destination: string, passengers?: integer, tags?: string[])"
         " - Book a flight between two airports"),
        "list_files() - List files.",
    ]
    assert len(compact) < len(full)
    assert [json.loads(line) for line in full.splitlines()] == TOOLS
    long_desc = {"type": "function", "function": {"name": "t", "description": "word " * 100}}
    assert len(compact_signature(long_desc)) <= len("t() - ") + COMPACT_DESC_CHARS
    with pytest.raises(ValueError, match="compact"):
        render_tools(TOOLS, "tiny")


def test_act_system_prompt_and_messages():
    policy = "You are an airline agent. " + "Rule. " * 300
    compact = act_system_prompt(policy, TOOLS, "compact", 100)
    full = act_system_prompt(policy, TOOLS, "full", 100)
    assert compact.startswith("You are an airline agent.") and POLICY_TRUNCATED in compact
    assert compact.index(POLICY_TRUNCATED) <= 100 and policy.strip() in full
    for s in (compact, full):
        assert "<tools>\n" in s and "</tools>" in s and "<tool_call></tool_call>" in s
    assert act_system_prompt("", TOOLS, "full", 10).startswith("# Tools")
    task = [{"role": "system", "content": policy}, {"role": "user", "content": "Weather?"}]
    call = ToolCall("get_weather", {"city": "Paris"})
    history = [{"role": "assistant", "content": assistant_text([call])},
               tool_response_message([Observation('{"temp": 20}')]),
               {"role": "assistant", "content": "It is 20 C."}]
    msgs = act_messages(task, TOOLS, "compact", 100, history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[0]["content"] == compact and msgs[1]["content"] == "Weather?"
    assert P.parse_act(msgs[2]["content"], TOOLS).calls[0].arguments == {"city": "Paris"}
    assert msgs[3]["content"] == "<tool_response>\n{\"temp\": 20}\n</tool_response>"
    with pytest.raises(ValueError, match="tool_response_message"):
        act_messages(task, TOOLS, "full", 100, [{"role": "tool", "content": "x"}])
    assert policy_excerpt(policy, 0) == ""


def test_tool_response_message():
    m = tool_response_message([Observation("A"), Observation('{"b": 1}', error=True)])
    assert m == {"role": "user",
                 "content": "<tool_response>\nA\n</tool_response>\n"
                            "<tool_response>\n{\"b\": 1}\n</tool_response>"}
    with pytest.raises(ValueError):
        tool_response_message([])


# ---- REHEARSE prompt and trimming, hand-checked with a whitespace word counter ----------------

def words(s: str) -> int:
    return len(s.split())


def ex(name: str, args: dict, tag: str) -> dict:
    # observation: tag + 40 filler words = 41 words
    return {"call": ToolCall(name, args).to_dict(), "observation": {"content": tag + " f" * 40}}


FLIGHT = {"origin": "A", "destination": "B"}  # call JSON = 7 words
GROUNDING = [ex("book_flight", FLIGHT, "OTHERA"), ex("get_weather", {"city": "Paris"}, "SAMEA"),
             ex("book_flight", FLIGHT, "OTHERB")]
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"MSG{i}" + " v" * 20}
           for i in range(6)]  # each line "User: MSGi v*20" = 22 words
CALL = ToolCall("get_weather", {"city": "Rome"})


def rehearse(budget, grounding=GROUNDING):
    return rehearse_messages(TOOLS, grounding, HISTORY, CALL, words, budget, "compact")


def test_rehearse_prompt_sections():
    p = rehearse(10**6)
    assert p.fits and p.grounding_dropped == p.history_omitted == 0
    system, user = p.messages
    assert system == {"role": "system", "content": REHEARSE_SYSTEM}
    assert render_tools(TOOLS, "compact") in user["content"]
    assert all(t in user["content"] for t in ("OTHERA", "SAMEA", "OTHERB", "MSG0", "MSG5"))
    assert user["content"].index("## Current call") > user["content"].index("## Conversation")
    assert '"city": "Rome"' in user["content"] and "Schema of get_weather" in user["content"]
    assert p.n_tokens == words(system["content"]) + words(user["content"])
    hidden = rehearse(10**6, grounding=None).messages[1]["content"]
    assert f"## Reference calls and real results for this task\n{UNAVAILABLE}\n" in hidden
    unknown = rehearse_messages(TOOLS, None, [], ToolCall("nope", {}), words, 10**6, "full")
    assert "'nope' is not among the candidate tools" in unknown.messages[1]["content"]
    assert "(empty)" in unknown.messages[1]["content"]


def test_rehearse_trimming_order():
    full = rehearse(10**6).n_tokens
    # example block = <tool_call> + call JSON + </tool_call> + <execution_result> + 41 + close:
    # book_flight 1+7+1+1+41+1 = 52 words, get_weather 1+5+1+1+41+1 = 50 words;
    # the marker "[... n reference examples omitted ...]" is 6 words.
    p = rehearse(full)
    assert p.fits and p.grounding_dropped == 0
    p = rehearse(full - 1)  # the last other-tool example goes first: -52 + 6
    u = p.messages[1]["content"]
    assert (p.grounding_dropped, p.n_tokens) == (1, full - 46)
    assert "OTHERB" not in u and "OTHERA" in u and "SAMEA" in u
    p = rehearse(full - 47)  # then the other other-tool example: -52 more
    u = p.messages[1]["content"]
    assert (p.grounding_dropped, p.n_tokens) == (2, full - 98)
    assert "OTHERA" not in u and "SAMEA" in u
    p = rehearse(full - 99)  # then the same-tool example: -50 more
    u = p.messages[1]["content"]
    assert (p.grounding_dropped, p.history_omitted, p.n_tokens) == (3, 0, full - 148)
    assert "SAMEA" not in u and "[... 3 reference examples omitted ...]" in u
    # then the middle of the history: one 22-word line out, a 5-word marker in
    p = rehearse(full - 149)
    u = p.messages[1]["content"]
    assert (p.history_omitted, p.n_tokens, p.fits) == (1, full - 165, True)
    assert "MSG1" not in u and "MSG0" in u and "MSG2" in u and "[... 1 messages omitted ...]" in u
    p = rehearse(full - 166)  # two lines out: -44 + 5
    assert (p.history_omitted, p.n_tokens) == (2, full - 187)
    # nothing else can go: system, tools, first and last messages and the call stay
    p = rehearse(1)
    u = p.messages[1]["content"]
    assert not p.fits and p.history_omitted == 4 and p.n_tokens == full - 148 - 4 * 22 + 5
    assert p.messages[0]["content"] == REHEARSE_SYSTEM
    assert render_tools(TOOLS, "compact") in u and "MSG0" in u and "MSG5" in u
    assert '"city": "Rome"' in u


def test_rehearse_trimming_is_monotone():
    full = rehearse(10**6).n_tokens
    seen = []
    for budget in range(full, full - 260, -3):
        p = rehearse(budget)
        u = p.messages[1]["content"]
        assert p.fits == (p.n_tokens <= budget)
        if p.history_omitted:
            assert p.grounding_dropped == 3  # history only after all grounding
        if "OTHERA" in u or "OTHERB" in u:
            assert "SAMEA" in u  # same-tool examples outlive other-tool ones
        seen.append((p.grounding_dropped, p.history_omitted))
    assert seen == sorted(seen)


def test_parsers_never_raise_on_garbage():
    import random
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<execution_result>",
              "</execution_result>", W, F, "{", "}", "[", "]", '"', ",", ":", "\n", "```", "null",
              '"name"', '"arguments"', "Error:", "x", " ", "\\", "\udcff", "NaN", "1e999"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        p = P.parse_act(text, TOOLS)
        assert (p.kind == "error") == (p.error_code is not E.NONE)
        assert p.kind != "calls" or p.calls
        r = P.parse_rehearsal(text)
        assert r.ok == (r.error_code is E.NONE) and (r.ok or r.content == "")
