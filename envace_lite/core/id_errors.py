"""The id errors a policy makes, written on purpose: an id with mis-copied or replaced digits.

``corrupt_id`` turns a real id into the ``digit`` or ``absent`` error of ``ID_ERRORS``;
``transcripts.id_error_example`` executes such a call for real and makes a REHEARSE row of its
error observation (``study.error_kinds="all"``; beyond the paper).
"""
from __future__ import annotations

import random


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


__all__ = ["ID_ERRORS", "corrupt_id"]
