"""Plain data types shared by every module (DESIGN §8, "Data types").

These are the binding interfaces between the protocol (parsing), the environments (real execution),
the rollout engine (ACT/REHEARSE alternation) and the rewards (checklist judge). They hold no logic
beyond small helpers, so that every other module can import them without cycles.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["act", "rehearse"]
ROLES: tuple[Role, Role] = ("act", "rehearse")


@dataclass
class ToolCall:
    """One tool call a_t (or one of several in an ACT reply).

    Attributes:
        name: the function name as the model wrote it (may be unknown to the environment).
        arguments: the decoded JSON arguments (a dict; never raw text).
        violations: schema or unknown-tool problems found by ``jsonschema`` against the task's tool
            schemas. An empty list means the call is well formed. Calls with violations are still
            rehearsed or executed; the environment answers them with an error (DESIGN §8 "Parsing").
        call_id: a stable id (``call_<turn>_<k>``) used to pair tool messages with calls.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    call_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, as written into run files."""
        return asdict(self)


@dataclass
class Observation:
    """The response o_t (real) or ô_t (rehearsed) to one tool call.

    Attributes:
        content: the response text, exactly as the environment (or REHEARSE) produced it.
        error: True when the response reports an error (invalid call, failed execution).
        state_changed: True when executing the call changed the environment's state (real
            execution only; rehearsed observations leave it False).
    """

    content: str
    error: bool = False
    state_changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return asdict(self)


ChecklistKind = Literal["call", "communicate", "observation", "no_call"]


@dataclass
class ChecklistItem:
    """One weighted item of a user turn's checklist (DESIGN §1 and §8).

    Attributes:
        kind: ``call`` (a tool call with key arguments), ``communicate`` (a string the final
            answer must contain), ``observation`` (key values that the observation for the
            matching call must contain) or ``no_call`` (the turn must end without a tool call).
        tool: the tool name for ``call`` and ``observation`` items, else "".
        key_args: the arguments compared for ``call`` items (tau2 ``compare_args``; all keywords of
            the gold call for BFCL), JSON-normalised.
        expected: ``communicate``: the info string; ``observation``: a list of key values.
        weight: the item's weight; the weights of one user turn sum to 1.
        required_for_next_turn: gated user replay waits until every such item passed.
    """

    kind: ChecklistKind
    tool: str = ""
    key_args: dict[str, Any] = field(default_factory=dict)
    expected: Any = None
    weight: float = 0.0
    required_for_next_turn: bool = False


@dataclass
class Task:
    """A task x: initial messages, tools, scripted user turns, checklist and grounding (DESIGN §8).

    Attributes:
        id: the benchmark's task id (tau2 task id, BFCL entry id).
        suite: the suite name, e.g. ``tau2-telecom`` or ``bfcl-base``.
        split: ``train`` or ``test``.
        messages: the initial chat messages (system and the first user message).
        tools: OpenAI-format tool schemas visible at the start.
        user_turns: the scripted user messages, one list per user turn (turn 0 is in ``messages``).
        checklist: one list of ``ChecklistItem`` per user turn.
        grounding: per user turn, a list of ``{"call": ToolCall dict, "observation": Observation
            dict}`` from executing the gold calls once in the real environment.
        gold_calls: per user turn, the gold calls (``ToolCall`` dicts).
        rendering: ``compact`` or ``full`` (how tools and policy are rendered into prompts).
        flags: data-quality flags, e.g. ``gold_call_error`` (kept, never silently fixed).
    """

    id: str
    suite: str
    split: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    user_turns: list[list[dict[str, Any]]]
    checklist: list[list[ChecklistItem]]
    grounding: list[list[dict[str, Any]]]
    gold_calls: list[list[dict[str, Any]]]
    rendering: str = "compact"
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (used by the data cache under ``data/derived``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        """Inverse of ``to_dict``."""
        d = dict(d)
        d["checklist"] = [[ChecklistItem(**it) for it in turn] for turn in d["checklist"]]
        return cls(**d)
