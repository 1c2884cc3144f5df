"""A generator that answers with scripted texts, for tests and notebooks.

Usage::

    from envace_lite.llm.scripted import ScriptedGenerator
    gen = ScriptedGenerator({"act": ['<tool_call>{"name": "f", "arguments": {}}</tool_call>']}, tok)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envace_lite.llm.generation import Completion


class ScriptedGenerator:
    """A fake generator that answers with scripted texts, for tests and notebooks.

    Args:
        outputs: either ``{role: [text, text, ...]}``, consumed in order per role (one text per
            prompt; when a role's list runs out its last text repeats), or a function
            ``(role, prompt_ids) -> text``.
        tokenizer: encodes the texts (no special tokens added) and decodes nothing.

    Attributes:
        calls: ``(role, prompts)`` of every ``generate`` call, for assertions.
    """

    def __init__(self, outputs: dict[str, list[str]] | Callable[[str, list[int]], str],
                 tokenizer: Any) -> None:
        self.outputs, self.tokenizer = outputs, tokenizer
        self.used: dict[str, int] = {}
        self.calls: list[tuple[str, list[list[int]]]] = []

    def _next_text(self, role: str, prompt: list[int]) -> str:
        if callable(self.outputs):
            return self.outputs(role, prompt)
        script = self.outputs.get(role)
        if not script:
            raise KeyError(f"ScriptedGenerator has no outputs for role {role!r}: "
                           f"scripted roles are {sorted(self.outputs)}")
        k = self.used.get(role, 0)
        self.used[role] = k + 1
        return script[min(k, len(script) - 1)]

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0) -> list[Completion]:
        """Return the next scripted text per prompt, cut to ``max_new_tokens`` tokens."""
        self.calls.append((role, [list(p) for p in prompts]))
        results = []
        for prompt in prompts:
            text = self._next_text(role, prompt)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            reason = "stop"
            if len(ids) > max_new_tokens:
                ids, reason = ids[:max_new_tokens], "length"
                text = self.tokenizer.decode(ids)
            results.append(Completion(ids=list(ids), text=text, logprobs=None,
                                      finish_reason=reason))
        return results


__all__ = ["ScriptedGenerator"]
