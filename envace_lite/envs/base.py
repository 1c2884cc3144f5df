"""The environment interface shared by every benchmark adapter (docs/design.md, "Env").

An ``Env`` is bound to one task of one suite (``make_env(suite, task_id)``). It executes tool
calls for real, on the benchmark's own backend, and scores an episode with the benchmark's own
evaluator. ``real_calls`` counts executions done through ``step`` only: evaluator replays and gold
replays done for grounding inside ``envs/tasks.py`` use a separate instance and never touch the counter
of the episode under evaluation.

Gold replay (``replay_gold``) is the adapter's self-test: the benchmark's gold calls go through
``step`` and ``end_turn`` exactly as a model's calls would, and must score 1.0.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from envace_lite.types import Observation, ToolCall


@dataclass
class GoldTurn:
    """The benchmark's reference behaviour for one user turn.

    Attributes:
        steps: the gold tool calls, grouped into ACT replies (one inner list per reply; BFCL
            batches a turn's calls into one reply so the 20-step limit is never hit).
        final_text: the assistant text that closes the turn (carries tau2 ``communicate_info``);
            ``None`` when the turn ends with a terminal tool (telecom's ``done``).
        communicate: strings the final text must contain (tau2 ``communicate_info``).
        failing: indices (into the flattened calls) of gold calls that return an error when
            replayed. They are kept and replayed as they are; the data card lists them.
        key_args: per flattened call, the argument names the benchmark compares (tau2
            ``compare_args``), or ``None`` for all arguments (tau2 default; BFCL always).
    """

    steps: list[list[ToolCall]]
    final_text: str | None = "Done."
    communicate: list[str] = field(default_factory=list)
    failing: list[int] = field(default_factory=list)
    key_args: list[list[str] | None] = field(default_factory=list)

    @property
    def calls(self) -> list[ToolCall]:
        """All gold calls of the turn, flattened in order."""
        return [c for s in self.steps for c in s]


class Env(abc.ABC):
    """A real benchmark environment bound to one task (docs/design.md, "Env").

    Subclasses set ``suite`` and ``task_id`` and keep ``real_calls`` up to date in ``step``.
    """

    suite: str
    task_id: str
    #: tool names that end the episode and are never executed, rehearsed or counted
    terminal_tools: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.real_calls = 0
        self.done = False

    @abc.abstractmethod
    def reset(self) -> list[dict[str, Any]]:
        """Start a fresh episode; return the initial chat messages (system + first user turn)."""

    @abc.abstractmethod
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The OpenAI-format tool schemas visible now (BFCL miss_func can add tools later)."""

    @abc.abstractmethod
    def step(self, calls: list[ToolCall]) -> list[Observation]:
        """Execute ``calls`` for real, in order; one ``Observation`` per call.

        Calls with violations (unknown tool, bad arguments) get an error observation from the
        benchmark's own backend or from the adapter, and never crash. Terminal pseudo-tools end
        the episode and are not counted in ``real_calls``.
        """

    @abc.abstractmethod
    def end_turn(self, text: str) -> list[dict[str, Any]] | None:
        """Close the current user turn with the assistant's text reply.

        Returns:
            The next user messages, or ``None`` when the episode is over.
        """

    @abc.abstractmethod
    def score(self) -> tuple[float, dict[str, Any]]:
        """Score the episode with the benchmark's own evaluator: ``(reward in [0, 1], details)``."""

    @abc.abstractmethod
    def gold_turns(self) -> list[GoldTurn]:
        """The benchmark's gold calls and closing texts, one ``GoldTurn`` per user turn."""

    @abc.abstractmethod
    def is_state_changing(self, name: str) -> bool:
        """True when tool ``name`` writes state (tau2 ``ToolType.WRITE``; BFCL per-class lists)."""

    def close(self) -> None:
        """Release backend resources (BFCL module-global instances). Idempotent."""

    @property
    def num_user_turns(self) -> int:
        """The number of reference user turns of the task."""
        return len(self.gold_turns())


def replay_gold(env: Env, drop_last_write: bool = False) -> tuple[float, dict[str, Any]]:
    """Replay the gold calls of ``env``'s task through ``step``/``end_turn`` and score it.

    Args:
        env: a freshly made environment (``reset`` is called here).
        drop_last_write: drop the last state-changing gold call of the episode (the corrupted
            replay used to show that the evaluator can fail).

    Returns:
        ``(reward, details)`` from ``env.score()``; ``details["dropped"]`` names the dropped call.

    Raises:
        ValueError: if ``drop_last_write`` is set and the task has no state-changing gold call.
    """
    turns = env.gold_turns()
    drop_at: tuple[int, int, int] | None = None
    if drop_last_write:
        for ti, turn in enumerate(turns):
            for si, s in enumerate(turn.steps):
                for ci, c in enumerate(s):
                    if env.is_state_changing(c.name):
                        drop_at = (ti, si, ci)
        if drop_at is None:
            raise ValueError(f"task {env.task_id} has no state-changing gold call to drop")
    env.reset()
    dropped = None
    for ti, turn in enumerate(turns):
        for si, s in enumerate(turn.steps):
            calls = list(s)
            if drop_at is not None and drop_at[:2] == (ti, si):
                dropped = calls.pop(drop_at[2]).name
            if calls:
                env.step(calls)
            if env.done:
                break
        if env.done:
            break
        if turn.final_text is not None:
            env.end_turn(turn.final_text)
    reward, details = env.score()
    details = dict(details)
    details["dropped"] = dropped
    return reward, details
