"""Error rows add to the paper's warm start REHEARSE rows whose target is the real environment's
error for a call that a policy gets wrong (``study.error_rows``, ``study.error_kinds``; beyond
the paper).

The paper's warm start has none: its REHEARSE rows are the gold's own calls, whose observations
are rarely errors, so REHEARSE may never have written one. Each row here executes a bad call
for real, at transcript time, in a fresh environment of the task (``bad_call_example``), and
its real error observation is the target:

- ``slip_example``: the paper's Fig. 7 slip, the first gold call with its ids' leading ``#``
  left out (``study.error_rows``);
- ``id_error_example``: an id a policy mis-copies (``digit``: one or two digits changed) or an
  id the database does not hold (``absent``: every digit changed), ``corrupt_id``
  (``study.error_kinds="all"``).

The environment is not in the RL loop. ``drills/__init__.py`` registers ``slip_rows`` and
``id_error_rows`` as extra rows of each warm-start task with
``core.transcripts.register_extra_task_rows``; ``build_transcripts`` counts them as
``slip_rows`` and ``id_error_rows`` and puts them after the gold's own REHEARSE rows.

Usage::

    from envace_lite.drills.error_rows import slip_example
    row = slip_example(task, cfg, approx_tokens, gold=False)
"""
from __future__ import annotations

import copy
import random
from itertools import takewhile
from typing import Any

from envace_lite.protocol.prompts import assistant_text, tool_response_message
from envace_lite.protocol.rehearse_prompt import rehearsal_text, rehearse_messages
from envace_lite.config import Config
from envace_lite.core.transcripts import RehearseExample, gold_replies
from envace_lite.progress import get_logger
from envace_lite.types import Observation, Task, ToolCall

log = get_logger(__name__)


ID_ERRORS = ("digit", "absent")
"""The id errors of ``id_error_example`` besides the ``#`` slip (``slip_example``): ``digit``
mis-copies one or two digits of an id, ``absent`` writes an id of the same shape whose every
digit differs (an id the database does not hold)."""


def corrupt_id(value: str, kind: str, rng: random.Random) -> str:
    """``value`` with one of a policy's id errors (``ID_ERRORS``): ``digit`` replaces one or two of
    its digits, ``absent`` every digit, each by a different digit drawn from ``rng``. Characters
    that are not digits (``#``, letters, ``@``) are kept, so the result has the id's shape.

    Raises:
        KeyError: an unknown ``kind`` (the message names ``ID_ERRORS``).
        ValueError: ``value`` holds no digit.
    """
    if kind not in ID_ERRORS:
        raise KeyError(f"unknown id error {kind!r}: choose from {list(ID_ERRORS)}")
    digits = [i for i, ch in enumerate(value) if ch.isdigit()]
    if not digits:
        raise ValueError(f"{value!r} holds no digit to corrupt")
    chosen = digits if kind == "absent" else sorted(rng.sample(digits, min(len(digits),
                                                                          rng.choice((1, 2)))))
    out = list(value)
    for i in chosen:
        out[i] = rng.choice([d for d in "0123456789" if d != value[i]])
    return "".join(out)


def bad_call_example(task: Task, cfg: Config, count_tokens: Any, gold: bool, bad: ToolCall,
                     executed: list[dict[str, Any]], shown: list[list[dict[str, Any]]],
                     what: str) -> RehearseExample | None:
    """Execute a bad call and make its REHEARSE row: the shared step of every error row.

    ``executed`` (gold ``{"call", "observation"}`` pairs, one step each) and then ``bad`` run in
    a fresh real environment of the task; ``bad``'s real observation is the target. The prompt
    is the REHEARSE prompt of ``bad`` after the request, the gold replies ``shown`` with their
    real observations, and ``bad``'s own ACT reply, as ``transcripts.task_transcripts`` builds it.

    Args:
        task: a train-split task.
        cfg: reads ``rollout`` (rendering, prompt budget).
        count_tokens: text -> token count, for REHEARSE trimming.
        gold: REHEARSE sees the task's grounding (else ``<unavailable>``).
        bad: the call a policy gets wrong.
        executed: the gold calls run before ``bad``.
        shown: the gold replies (lists of pairs) in the prompt's history before ``bad``.
        what: names the row in the log line of a task without an environment.

    Returns:
        The row, or None when ``bad`` did not get an error (nothing to learn), or when the
        task's environment cannot be made without a USER simulator (tau2's retail and airline
        suites; the drills and the ticket suites need none).
    """
    from envace_lite.envs import make_env

    try:
        env = make_env(task.suite, task.id)
    except RuntimeError as exc:  # a suite that needs a USER simulator endpoint
        log.warning("%s: no %s row (%s)", task.id, what, exc)
        return None
    try:
        env.reset()
        for p in executed:
            env.step([ToolCall(p["call"]["name"], copy.deepcopy(p["call"]["arguments"]))])
        obs = env.step([bad])[0]
    finally:
        env.close()
    if not obs.error:
        return None
    rc = cfg.rollout
    history = [{"role": m["role"], "content": m["content"]}
               for m in task.messages if m["role"] != "system"]
    for reply in shown:
        history.append({"role": "assistant", "content": assistant_text(
            [ToolCall(p["call"]["name"], p["call"]["arguments"]) for p in reply])})
        history.append(tool_response_message(
            [Observation(**p["observation"]) for p in reply]))
    history.append({"role": "assistant", "content": assistant_text([bad])})
    flat = [g for turn in task.grounding for g in turn]
    rp = rehearse_messages(task.tools, flat if gold else None, history, bad,
                           count_tokens, rc.max_prompt_tokens, rc.rendering)
    return RehearseExample(task.id, task.suite, 0, rp.messages,
                           rehearsal_text(obs.content),
                           {"name": bad.name, "arguments": bad.arguments}, obs.to_dict(),
                           "gold" if gold else "none")


def slip_example(task: Task, cfg: Config, count_tokens: Any, gold: bool) -> RehearseExample | None:
    """One REHEARSE row of the paper's Fig. 7 slip (``study.error_rows``).

    The task's first gold call with every string argument that starts with ``#`` written
    without it, executed in a fresh real environment of the task; its observation (tau2's real
    error, e.g. ``Error: Order not found``) is the target. The prompt is the REHEARSE prompt of
    that call after the request (``bad_call_example``).

    Returns:
        The row, or None when the first gold call has no ``#`` argument, when its slip did not
        get an error (nothing to learn), or when the task's environment cannot be made without
        a USER simulator.
    """
    if not task.grounding or not task.grounding[0]:
        return None
    first = task.grounding[0][0]["call"]
    args = {k: (v[1:] if isinstance(v, str) and v.startswith("#") else v)
            for k, v in first["arguments"].items()}
    if args == first["arguments"]:
        return None
    return bad_call_example(task, cfg, count_tokens, gold, ToolCall(first["name"], args),
                            [], [], "slip")


def id_error_example(task: Task, cfg: Config, count_tokens: Any, gold: bool,
                     kind: str) -> RehearseExample | None:
    """One REHEARSE row for an id error a policy makes (``study.error_kinds="all"``): a gold
    call of the first user turn, drawn with ``random.Random(f"{kind}:{suite}:{task id}")`` among
    those with a string argument that holds a digit, with that argument corrupted
    (``corrupt_id``). The gold calls before it and the corrupted call run in a fresh real
    environment of the task; the corrupted call's real observation (tau2's error, e.g.
    ``Error: Order not found``) is the target. The prompt is the REHEARSE prompt of that call
    after the gold replies and real observations before it (``bad_call_example``).

    Returns:
        The row, or None when no gold call has such an argument, when the corrupted call did not
        get an error (nothing to learn), or when the task's environment needs a USER simulator.

    Raises:
        KeyError: an unknown ``kind``.
    """
    if kind not in ID_ERRORS:
        raise KeyError(f"unknown id error {kind!r}: choose from {list(ID_ERRORS)}")
    replies = gold_replies(task, 0) if task.grounding else []
    pairs = [p for reply in replies for p in reply]
    rng = random.Random(f"{kind}:{task.suite}:{task.id}")
    slots = [(j, k) for j, p in enumerate(pairs) for k, v in p["call"]["arguments"].items()
             if isinstance(v, str) and any(ch.isdigit() for ch in v)]
    if not slots:
        return None
    j, key = rng.choice(slots)
    call = pairs[j]["call"]
    bad = ToolCall(call["name"], {**call["arguments"],
                                  key: corrupt_id(call["arguments"][key], kind, rng)})
    shown = list(takewhile(lambda reply: reply[0] is not pairs[j], replies))
    return bad_call_example(task, cfg, count_tokens, gold, bad, pairs[:j], shown, kind)


def slip_rows(task: Task, cfg: Config, count_tokens: Any, gold: bool) -> list[RehearseExample]:
    """The extra warm-start rows ``slip_rows`` of one task (``transcripts.ExtraTaskRows``): its
    ``slip_example`` when ``study.error_rows`` is set and it has one, else []."""
    if not cfg.study.error_rows:
        return []
    ex = slip_example(task, cfg, count_tokens, gold)
    return [] if ex is None else [ex]


def id_error_rows(task: Task, cfg: Config, count_tokens: Any,
                  gold: bool) -> list[RehearseExample]:
    """The extra warm-start rows ``id_error_rows`` of one task: with ``study.error_rows`` and
    ``study.error_kinds="all"``, its ``id_error_example`` of each kind of ``ID_ERRORS`` that it
    has, in that order; else []."""
    if not (cfg.study.error_rows and cfg.study.error_kinds == "all"):
        return []
    rows = (id_error_example(task, cfg, count_tokens, gold, kind) for kind in ID_ERRORS)
    return [ex for ex in rows if ex is not None]


__all__ = ["ID_ERRORS", "bad_call_example", "corrupt_id", "id_error_example", "id_error_rows",
           "slip_example", "slip_rows"]
