"""The write gate of committed execution: refuse hallucinated or malformed writes (docs/design.md,
"Our additions beyond the paper").

A state-changing call is refused when it fails its tool's JSON schema, or when one of its
identifier arguments (``IDENTIFIER_KEY``) has a value that does not occur verbatim in a user
message or a real non-error observation of this episode (never the memory: imagined ids are
exactly what the gate stops). ``execute.run_committed`` runs every call through it when an
``Episode`` has one, and answers a refused call with ``prompts.GATE_REFUSAL``.

Usage::

    gate = WriteGate(env.reset())
    reason = gate.check(call, env, env.tool_schemas())  # None: the call may run
"""
from __future__ import annotations

import re
from typing import Any

from envace_lite import protocol
from envace_lite.envs.base import Env
from envace_lite.types import Observation, ToolCall

IDENTIFIER_KEY = re.compile(r"(?:^|_)(?:id|ids|token|number|symbol)$|[a-z0-9](?:Id|Ids|ID|Token)$")
"""Argument names (at any nesting level) whose values the write gate treats as identifiers of
existing records: ``order_id``, ``item_ids``, ``receiver_id``, ``access_token``,
``flight_number``, ``symbol``, ``userId``. Names that may create something new (``file_name``,
``dir_name``, ``destination``) are not identifiers: a new name is, by nature, unseen."""


# ---------------------------------------------------------------------------------------------
# The write gate (docs/design.md, "Our additions beyond the paper")
# ---------------------------------------------------------------------------------------------

def identifiers(arguments: Any, key: str = "") -> list[tuple[str, str]]:
    """``(argument name, value)`` for every identifier value in ``arguments``.

    A value is an identifier when its nearest key matches ``IDENTIFIER_KEY``; strings (non-blank)
    and integers count, inside lists and nested objects too. Booleans, floats and nulls never do.
    """
    out: list[tuple[str, str]] = []
    if isinstance(arguments, dict):
        for k, v in arguments.items():
            out += identifiers(v, str(k))
    elif isinstance(arguments, list):
        for v in arguments:
            out += identifiers(v, key)
    elif key and IDENTIFIER_KEY.search(key):
        if isinstance(arguments, str) and arguments.strip():
            out.append((key, arguments.strip()))
        elif isinstance(arguments, int) and not isinstance(arguments, bool):
            out.append((key, str(arguments)))
    return out


class WriteGate:
    """Refuses hallucinated or malformed writes during committed execution (docs/design.md,
    "Our additions beyond the paper").

    Args:
        messages: the episode's initial messages (their user messages are seen).
    """

    def __init__(self, messages: list[dict[str, Any]] = ()) -> None:
        self._seen: list[str] = []
        self.see_messages(messages)

    def see_messages(self, messages: list[dict[str, Any]]) -> None:
        """Record the user messages among ``messages``."""
        self._seen += [str(m.get("content") or "") for m in messages if m.get("role") == "user"]

    def see_observations(self, observations: list[Observation]) -> None:
        """Record real observations; error observations are not sources of identifiers."""
        self._seen += [o.content for o in observations if not o.error]

    def check(self, call: ToolCall, env: Env, tools: list[dict[str, Any]]) -> str | None:
        """Why ``call`` is refused, or None when it may run.

        Only state-changing calls (``env.is_state_changing``) are judged: a schema failure
        (``protocol.check_call`` against ``tools``), then each identifier value must occur
        verbatim in a user message or a real non-error observation seen so far.
        """
        if not env.is_state_changing(call.name):
            return None
        problems = protocol.check_call(call.name, call.arguments, tools)
        if problems:
            return f"{call.name} fails its schema ({problems[0]})"
        seen = "\n".join(self._seen)
        for key, value in identifiers(call.arguments):
            if value not in seen:
                return (f"{call.name}: {key}={value!r} never appeared in a user message or a real "
                        "tool result of this conversation")
        return None


__all__ = ["IDENTIFIER_KEY", "WriteGate", "identifiers"]
