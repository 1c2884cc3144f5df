"""One client for OpenAI-compatible chat endpoints (a vLLM server, any hosted API).

Used by the tau2 USER simulator (``envs.tau2.OpenAICompatibleUser``) and the LLM checklist judge
(``judge.LLMJudge``). Standard library only, so it adds no dependency.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class EndpointError(RuntimeError):
    """The endpoint could not be reached or answered something that is not a chat completion."""


def chat_completion(base_url: str, model: str, messages: list[dict[str, Any]], *,
                    api_key: str | None = None, temperature: float = 0.0,
                    timeout: float = 60.0) -> str:
    """POST ``messages`` to ``{base_url}/chat/completions`` and return the reply text.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        messages: OpenAI chat messages.
        api_key: sent as a Bearer token when given.
        temperature: sampling temperature.
        timeout: seconds before giving up.

    Raises:
        EndpointError: on HTTP errors, time-outs, and replies without ``choices[0].message``.
    """
    url = base_url.rstrip("/") + "/chat/completions"
    body = json.dumps({"model": model, "messages": messages, "temperature": temperature}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = json.loads(r.read().decode())
        return str(data["choices"][0]["message"].get("content") or "")
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError,
            AttributeError) as e:
        raise EndpointError(f"endpoint {url} failed: {type(e).__name__}: {e}") from e
