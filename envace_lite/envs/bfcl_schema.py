"""BFCL function docs as JSON Schema tools, and tool calls as BFCL's call strings.

``to_openai_tool`` converts a BFCL function doc (its types mapped by ``_TYPE_MAP``);
``render_call`` writes ``name(k=repr(v),...)`` as BFCL's ``convert_to_function_call`` does, for
arguments that ``is_json_value`` accepted.
"""
from __future__ import annotations

import math
from typing import Any

from envace_lite.protocol.json_text import MAX_ARG_DEPTH

_TYPE_MAP = {"dict": "object", "object": "object", "float": "number", "number": "number",
             "double": "number", "integer": "integer", "int": "integer", "long": "integer",
             "string": "string", "str": "string", "char": "string", "boolean": "boolean",
             "bool": "boolean", "array": "array", "list": "array", "tuple": "array", "any": None}
"""BFCL doc type -> JSON Schema type (after BFCL's ``GORILLA_TO_OPENAPI``, except ``any``: no
constraint here, where BFCL says ``string``)."""


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one BFCL parameter doc (and its nested ``properties``/``items``) to JSON Schema."""
    out: dict[str, Any] = {}
    if "type" in node:
        if node["type"] not in _TYPE_MAP:
            raise ValueError(f"BFCL type {node['type']!r} has no JSON Schema mapping: add it")
        if _TYPE_MAP[node["type"]] is not None:
            out["type"] = _TYPE_MAP[node["type"]]
    for key in ("description", "enum", "default"):
        if key in node:
            out[key] = node[key]
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _json_schema(node["items"])
    if node.get("required"):
        out["required"] = list(node["required"])
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool; the ``response`` doc is dropped."""
    params = _json_schema(doc["parameters"])
    params["type"] = "object"
    params.setdefault("properties", {})
    return {"type": "function", "function": {
        "name": doc["name"], "description": doc["description"], "parameters": params}}


def is_json_value(v: Any, max_depth: int = MAX_ARG_DEPTH) -> bool:
    """True for JSON values (finite numbers, string keys): the only things ``repr`` may render.

    Iterative, so no nesting raises ``RecursionError``; values nested more than ``max_depth``
    lists or objects deep are refused (the parser drops such arguments too).
    """
    stack = [(v, 0)]
    while stack:
        x, depth = stack.pop()
        if x is None or isinstance(x, (bool, int, str)):
            continue
        if isinstance(x, float):
            if not math.isfinite(x):
                return False
            continue
        if depth >= max_depth:
            return False
        if isinstance(x, list):
            stack.extend((y, depth + 1) for y in x)
        elif isinstance(x, dict) and all(isinstance(k, str) for k in x):
            stack.extend((y, depth + 1) for y in x.values())
        else:
            return False
    return True


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """``name(k=repr(v),...)`` as BFCL's ``convert_to_function_call``; inputs must be checked."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


__all__ = ["is_json_value", "render_call", "to_openai_tool"]
