"""Plain data types shared by every module (docs/design.md, "Data types").

These are the binding interfaces between the protocol (parsing), the environments (real execution),
the rollout engine (ACT/REHEARSE alternation) and the rewards (checklist judge). They hold no logic
beyond small helpers, so that every other module can import them without cycles.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

# ---------------------------------------------------------------------------------------------
# Enumerations: each is defined once, here, as a Literal; its tuple is derived from it, and the
# config (``Config.finalize``), the trainer, the rehearsal, the evaluation and the CLI help read
# the tuple, never a copy of the values.
# ---------------------------------------------------------------------------------------------
Role = Literal["act", "rehearse"]
"""A policy output's role: ACT (emit a tool call or an answer) or REHEARSE (write the observation
the call would get); paper §2.1."""
ROLES: tuple[Role, ...] = get_args(Role)

TrainMode = Literal["shared", "per_role", "act_only", "act_only_real"]
"""``grpo.mode``: ``shared`` (EnvACE: one policy trained on both roles), ``per_role`` (two copies,
each trained on its own role), ``act_only`` (only ACT; the frozen initial policy rehearses) or
``act_only_real`` (only ACT; the real environment answers). Paper Fig. 3."""
TRAIN_MODES: tuple[TrainMode, ...] = get_args(TrainMode)

RehearsalMode = Literal["none", "parallel", "sequential"]
"""``rehearsal.mode``: test-time private rehearsal (paper §2.3). ``"none"`` is the one spelling of
"no rehearsal" in configs, result rows, labels and plots; the Python entry points that also take
``None`` (``evaluate.evaluate``, ``execute.run_committed``) turn it into ``"none"`` on entry."""
REHEARSAL_MODES: tuple[RehearsalMode, ...] = get_args(RehearsalMode)
REHEARSING_MODES: tuple[RehearsalMode, ...] = tuple(m for m in REHEARSAL_MODES if m != "none")
"""The modes that rehearse: ``("parallel", "sequential")``."""

Aggregation = Literal["output_mean", "token_mean"]
"""``grpo.aggregation``: how per-token losses become one number, a mean over outputs of token
means or a token mean."""
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)

RolloutMode = Literal["rehearse", "real", "frozen_simulator"]
"""The rollout engine's ``mode`` (``Trajectory.mode``): REHEARSE answers the calls, the real
environment does, or a frozen copy of the initial policy does."""
ROLLOUT_MODES: tuple[RolloutMode, ...] = get_args(RolloutMode)

Decoding = Literal["greedy", "sample"]
"""``eval.decoding`` and ``rehearsal.decoding``: how test-time outputs are sampled."""
DECODINGS: tuple[Decoding, ...] = get_args(Decoding)
DECODING: dict[Decoding, tuple[float, float]] = {"greedy": (0.0, 1.0), "sample": (0.6, 0.95)}
"""``(temperature, top_p)`` of each decoding (``sample``: the reference's validation sampling);
its keys are ``DECODINGS``, in order."""


def rehearsal_mode(value: str | None) -> RehearsalMode:
    """``value`` as a ``RehearsalMode``: the edge conversion of ``None`` (no rehearsal) to
    ``"none"``.

    Raises:
        ValueError: anything else outside ``REHEARSAL_MODES``, naming them.
    """
    mode = "none" if value is None else value
    if mode not in REHEARSAL_MODES:
        raise ValueError(f"rehearsal={value!r}: use one of {list(REHEARSAL_MODES)} "
                         "(or None for 'none')")
    return mode  # type: ignore[return-value]


@dataclass
class ToolCall:
    """One tool call a_t (or one of several in an ACT reply).

    Attributes:
        name: the function name as the model wrote it (may be unknown to the environment).
        arguments: the decoded JSON arguments (a dict; never raw text).
        violations: schema or unknown-tool problems found by ``jsonschema`` against the task's tool
            schemas. An empty list means the call is well formed. Calls with violations are still
            rehearsed or executed; the environment answers them with an error (docs/design.md,
            "Parsing").
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
    """One weighted item of a user turn's checklist (docs/design.md, "The checklist reward").

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
    """A task x: initial messages, tools, scripted user turns, checklist and grounding
    (docs/design.md, "Data types").

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


# ---------------------------------------------------------------------------------------------
# Trajectories: what the rollout engine records, and what rewards and the trainer read
# ---------------------------------------------------------------------------------------------
@dataclass
class Output:
    """One policy output y_{i,m}: an ACT turn or one REHEARSE call (paper §2.2).

    Attributes:
        role: ``"act"`` or ``"rehearse"``.
        turn: the ACT turn index t (0-based) this output belongs to; a REHEARSE output carries the
            turn of the call it answers.
        call_index: REHEARSE only: which call of the turn's ACT reply it answers (else -1).
        prompt_ids: the exact token ids the output was sampled from. ACT: the whole append-only
            history h_t at that turn (``act_ids[:start]``). REHEARSE: its own rebuilt prompt.
        ids: the sampled token ids, verbatim, INCLUDING the stop token when the output stopped on
            one (so the loss teaches stopping); shape (L,). The stop token recorded is the
            template's end-of-turn id (``ChatGlue.eot_id``) whichever stop id the generator hit.
        text: the generator's text of the sampled ids, without the stop token.
        logprobs: per-token log-probabilities at sampling time, as the generator gave them: they
            cover the ids BEFORE the appended stop token (len(ids) - 1 when it was appended);
            None for generators without logprobs.
        parse_kind: ACT: ``calls`` | ``final`` | ``error``; REHEARSE: ``ok`` | ``error``.
        error_code: the ``protocol.ErrorCode`` value ("" when none).
        empty: True when the output is empty after stripping (``ErrorCode.EMPTY``; it gets the
            empty-output penalty).
        finish_reason: ``stop`` or ``length``.
        user_turn: the reference user turn the output belongs to.
        source: ``policy``, or ``frozen_simulator`` for REHEARSE outputs of the frozen simulator
            (records only: never train on them, never count them in a baseline).
        prompt_fits: REHEARSE: False when the prompt stayed over budget after trimming.
    """

    role: Role
    turn: int
    prompt_ids: list[int]
    ids: list[int]
    text: str
    call_index: int = -1
    logprobs: list[float] | None = None
    parse_kind: str = ""
    error_code: str = ""
    empty: bool = False
    finish_reason: str = "stop"
    user_turn: int = 0
    source: str = "policy"
    prompt_fits: bool = True


@dataclass
class Step:
    """One executed (or rehearsed) tool call of a trajectory, with its observation.

    Attributes:
        turn: the ACT turn index.
        user_turn: the reference user turn the call belongs to (for the checklist).
        call: the parsed call (violations included).
        observation: o_t (real) or ô_t (rehearsed).
        source: ``real`` | ``rehearsed`` | ``frozen_simulator``.
    """

    turn: int
    user_turn: int
    call: ToolCall
    observation: Observation
    source: str


@dataclass
class Trajectory:
    """One rollout τ_i of task x (paper §2.1).

    The ACT side is packed: ``act_ids`` is the append-only token history (initial prompt, then
    each ACT output followed by template glue and the observations), and ``act_mask`` marks the
    tokens sampled by ACT (1) versus prompt, glue and observations (0). The packed ACT row of the
    trainer is ``act_ids[act_prompt_len:]`` with ``act_mask[act_prompt_len:]``; ``act_spans``
    gives each ACT output's ``[start, end)`` in ``act_ids`` (in the order of the ACT outputs).

    Attributes:
        task: the task x.
        index: i, the rollout index within the task's group of K.
        act_ids: shape (T,); the full ACT token history.
        act_mask: shape (T,); 1 on ACT-sampled tokens.
        act_prompt_len: length of the initial ACT prompt (system, tools, first user message).
        outputs: every output, in generation order (ACT turn t, then its REHEARSE calls).
        steps: every tool call with its observation, in order.
        final_texts: per reached user turn, the ACT final answer text ("" if none).
        user_turns_reached: how many reference user turns were shown to ACT.
        stop_reason: ``final_answer`` | ``terminal_tool`` | ``turn_limit`` | ``context_budget`` |
            ``parse_error`` | ``gate_closed`` | ``env_done`` (real mode) | ``error`` (an
            exception inside this trajectory's own work; see ``error``).
        error: ``error`` stops: where it happened and the exception, e.g. ``"rehearse prompt:
            UnicodeEncodeError: ..."``; "" otherwise.
        real_calls: real executions made by this rollout (0 in ``rehearse`` mode).
        grounding: ``gold`` or ``none`` (whether REHEARSE saw the task's grounding).
        mode: ``rehearse`` | ``real`` | ``frozen_simulator``.
        reward: R_i, set by ``rewards``; None until scored, and None when the judge failed.
        reward_valid: False when the judge failed (the trajectory is masked out of the loss).
        reward_details: per-turn scores and per-item verdicts.
        turns: the number of ACT outputs.
        act_spans: ``[start, end)`` of each ACT output's ids in ``act_ids``.
        env: ``real`` mode (or a given ``env_factory``): the trajectory's env, for
            ``rewards.verifiable_reward``; release it with ``close_envs`` (before any
            ``dataclasses.asdict``, which would deep-copy it).
    """

    task: Task
    index: int
    act_ids: list[int] = field(default_factory=list)
    act_mask: list[int] = field(default_factory=list)
    act_prompt_len: int = 0
    outputs: list[Output] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    final_texts: list[str] = field(default_factory=list)
    user_turns_reached: int = 1
    stop_reason: str = ""
    real_calls: int = 0
    grounding: str = "gold"
    mode: str = "rehearse"
    reward: float | None = None
    reward_valid: bool = True
    reward_details: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    act_spans: list[tuple[int, int]] = field(default_factory=list)
    env: Any = field(default=None, repr=False, compare=False)
    error: str = ""
