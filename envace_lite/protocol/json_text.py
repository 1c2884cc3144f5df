"""Strict JSON decoding of model text, shared by both roles' parsers (``protocol``).

``loads`` refuses NaN, Infinity and out-of-range floats; ``loads_call`` also records duplicate
keys; ``out_of_bounds`` caps a call's arguments at ``MAX_ARG_DEPTH`` levels and
``MAX_ARG_VALUES`` values; ``utf8`` and ``escape_surrogates`` make lone surrogates safe;
``unfence`` strips one Markdown code fence.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

_FENCE = re.compile(r"^```[\w-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(s: str) -> float:
    if math.isinf(x := float(s)):
        raise ValueError(f"{s} overflows a float")
    return x


def loads(s: str) -> Any:
    """Strict ``json.loads``: NaN, Infinity and overflowing numbers (1e999) are rejected.

    Raises:
        ValueError or RecursionError (very deep nesting).
    """
    return json.loads(s, parse_constant=_reject_constant, parse_float=_finite_float)


MAX_ARG_DEPTH = 32
"""Arguments nested deeper than this (lists and objects, the arguments object counting 1) are
dropped with a violation: downstream code that recurses (``asdict``, ``deepcopy``, the BFCL
checks) must never meet the ~1000 levels that ``json.loads`` still accepts."""
MAX_ARG_VALUES = 4096
"""Arguments holding more JSON values than this (every value counts, containers included) are
dropped with a violation."""


def loads_call(s: str, duplicates: list[str]) -> Any:
    """``loads`` that also appends to ``duplicates`` every key an object repeats.

    Raises:
        ValueError or RecursionError, as ``loads``.
    """
    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    duplicates.append(key)
                seen.add(key)
        return obj

    return json.loads(s, parse_constant=_reject_constant, parse_float=_finite_float,
                      object_pairs_hook=pairs_hook)


def out_of_bounds(args: dict[str, Any]) -> str:
    """Why ``args`` is too deep or too large ("" when within bounds); iterative, never recurses."""
    stack, values = [(args, 1)], 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_ARG_VALUES:
            return f"arguments dropped: more than {MAX_ARG_VALUES} JSON values"
        if isinstance(value, (dict, list)):
            if depth > MAX_ARG_DEPTH:
                return f"arguments dropped: nested more than {MAX_ARG_DEPTH} levels deep"
            items = value.values() if isinstance(value, dict) else value
            stack.extend((x, depth + 1) for x in items)
    return ""


def utf8(s: str) -> str:
    """``s`` with each lone surrogate (not encodable as UTF-8) written out as ``\\udXXX``."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def escape_surrogates(value: Any, path: str, found: list[str]) -> Any:
    """``value`` with lone surrogates escaped in every string and key (recursive: call it only
    within ``MAX_ARG_DEPTH``); the JSON path of each escape goes to ``found``."""
    if isinstance(value, str):
        fixed = utf8(value)
        if fixed != value:
            found.append(path)
        return fixed
    if isinstance(value, list):
        return [escape_surrogates(x, f"{path}[{i}]", found) for i, x in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, x in value.items():
            key = utf8(k)
            if key != k:
                found.append(f"{path} key {key!r}")
            out[key] = escape_surrogates(x, f"{path}.{key}", found)
        return out
    return value


def unfence(s: str) -> str:
    """Strip whitespace and one Markdown code fence around the whole string (```json ... ```)."""
    s = s.strip()
    m = _FENCE.match(s)
    return m.group(1).strip() if m else s


__all__ = [
    "MAX_ARG_DEPTH",
    "MAX_ARG_VALUES",
    "escape_surrogates",
    "loads",
    "loads_call",
    "out_of_bounds",
    "unfence",
    "utf8",
]
