"""The ACT engine: one turn-synchronous loop for training rollouts and committed execution (paper
§2.1, §2.3; docs/design.md, "Committed execution on training's tokens").

Training's ``rollout`` (every mode) and evaluation's ``execute.run_committed`` run the same loop,
``run_turns``, on the same token ids. Per turn, for the live items (trajectories or episodes):

1. ``before_act`` hook (committed: rehearse the episodes that just got a user message and apply
   m_x; training: nothing).
2. The ACT prompt (``next_prompt``): the token history ``act_ids`` (the last prompt plus its
   sampled ids, verbatim) extended by the template glue (``ChatGlue.after_turn``) of the messages
   that joined since; the ``render`` hook may render it from the messages instead (committed: the
   first prompt, and any prompt after the env's tool list changed, BFCL miss_func). A prompt over
   ``max_prompt_tokens`` stops the item (``context_budget``) before generating.
3. ONE ``generator.generate(role="act")`` call for every live prompt (except an item whose
   ``preset`` hook gives an output chosen before the turn: committed ``select``); each output
   keeps its ids verbatim (``ids_with_stop``) and is parsed (``protocol.parse_act`` against the
   ``tools`` hook).
4. Routing: tool calls (the ``route_calls`` hook picks the calls to run and a terminal call); a
   final text ends the user turn through the ``user_turn`` hook (real env: ``env.end_turn(text)``;
   the next user message joins, or the item stops with ``final_answer``); a parse error goes to
   the ``parse_error`` hook (training: the trajectory stops with ``parse_error``; committed: the
   text is taken as a reply).
5. ``observe`` hook: the env step of every item with calls (``execute``, committed: through the
   write gate), or, in training's rehearse modes, one batched REHEARSE call. Then the
   ``step_stop`` hook may stop the item (terminal tool, env done); else one user-role
   ``<tool_response>`` message joins (``join`` hook).
6. ``turn_limit`` after ``max_turns`` ACT outputs; ``stopped`` is called once per item that stopped.

An exception in one item's own work ends THAT item (``fail`` hook, ``stop_reason="error"``); the
others go on (docs/design.md, "Reliability").

Usage (what ``rollout`` and ``run_committed`` do)::

    run_turns(states, generator, tokenizer, hooks, max_new_tokens=64, temperature=1.0, top_p=1.0,
              max_prompt_tokens=4096, max_turns=8)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from envace_lite import protocol
from envace_lite.protocol.prompts import tool_response_message
from envace_lite.llm.generation import Completion, Generator
from envace_lite.progress import get_logger
from envace_lite.types import Observation, ToolCall

log = get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# Template glue, derived once per tokenizer from its own chat template
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChatGlue:
    """The text a ChatML-like template puts around messages (e.g. Qwen3, SmolLM2).

    Attributes:
        gen_prompt: the assistant generation prompt (Qwen3: ``<|im_start|>assistant\\n<think>\\n\\n
            </think>\\n\\n`` with thinking off).
        user_prefix, user_suffix: around a user message's content.
        assistant_suffix: after an assistant message's content (``<|im_end|>\\n``).
        eot_id: the end-of-turn token that starts ``assistant_suffix`` (None if it is not one
            added token); eot_text: its text.
    """

    gen_prompt: str
    user_prefix: str
    user_suffix: str
    assistant_suffix: str
    eot_id: int | None
    eot_text: str

    def close(self, stopped: bool) -> str:
        """Glue that closes an assistant turn after its sampled ids (+ eot when it stopped)."""
        if stopped and self.eot_id is not None:
            return self.assistant_suffix[len(self.eot_text):]
        return self.assistant_suffix

    def after_turn(self, stopped: bool, messages: list[dict[str, Any]]) -> str:
        """Close the assistant turn, wrap ``messages`` as user messages, open the next turn."""
        body = "".join(f"{self.user_prefix}{m['content']}{self.user_suffix}" for m in messages)
        return self.close(stopped) + body + self.gen_prompt


_PROBE = "ENVACE-PROBE-7f3a"
_GLUE: dict[tuple, ChatGlue] = {}


def _render(tokenizer: Any, messages: list[dict[str, str]], gen: bool) -> str:
    kw = {"enable_thinking": False} if "enable_thinking" in (tokenizer.chat_template or "") else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kw)


def chat_glue(tokenizer: Any) -> ChatGlue:
    """Derive the glue by diffing probe renderings of the tokenizer's template (cached).

    Raises:
        ValueError: the template is not append-only (a later message rewrites earlier text).
    """
    key = (id(tokenizer), tokenizer.chat_template, len(tokenizer))
    if key in _GLUE:
        return _GLUE[key]
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    r0 = _render(tokenizer, base, False)
    gen = _render(tokenizer, base, True)
    user = _render(tokenizer, base + [{"role": "user", "content": _PROBE}], False)
    asst = _render(tokenizer, base + [{"role": "assistant", "content": _PROBE}], False)
    if not all(r.startswith(r0) for r in (gen, user, asst)) \
            or _PROBE not in user[len(r0):] or _PROBE not in asst[len(r0):]:
        raise ValueError("the chat template is not append-only (ChatML-like); the packed ACT "
                         "history cannot be built from it: use a Qwen3 or SmolLM2 tokenizer")
    user_prefix, user_suffix = user[len(r0):].split(_PROBE)
    asst_prefix, asst_suffix = asst[len(r0):].split(_PROBE)
    if asst_prefix != gen[len(r0):]:
        log.warning("template renders assistant turns as %r but prompts with %r; the packed "
                    "history follows the generation prompt", asst_prefix, gen[len(r0):])
    eot_id, eot_text = None, ""
    ids = tokenizer.encode(asst_suffix, add_special_tokens=False)
    if ids:
        text = tokenizer.decode([ids[0]])
        if text in tokenizer.get_added_vocab() and asst_suffix.startswith(text):
            eot_id, eot_text = ids[0], text
    glue = ChatGlue(gen[len(r0):], user_prefix, user_suffix, asst_suffix, eot_id, eot_text)
    _GLUE[key] = glue
    return glue


def ids_with_stop(out: Completion, glue: ChatGlue) -> list[int]:
    """The sampled ids as the ACT history keeps them: verbatim, plus the template's end-of-turn id
    when the output stopped on a stop token (whichever stop id the generator hit)."""
    stop = out.finish_reason == "stop" and glue.eot_id is not None
    return list(out.ids) + ([glue.eot_id] if stop else [])


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------

class ActState:
    """What the engine reads and writes of one item (a trajectory or an episode).

    Subclasses map these onto their own record. Attributes: ``act_ids`` (the ACT token history),
    ``act_stopped`` (the last output ended on a stop token), ``turns`` (ACT outputs so far),
    ``stop_reason`` ("" while live), ``env`` (the real env, or None); and this turn's ``calls``
    (to execute or rehearse), ``observations`` (one per call) and ``terminal_call``.
    """

    act_ids: list[int]
    act_stopped: bool
    turns: int
    stop_reason: str
    env: Any
    calls: list[ToolCall]
    observations: list[Observation]
    terminal_call: ToolCall | None


class ActHooks:
    """Where training and committed execution differ; each hook is one documented rule.

    The defaults are the shared behaviour; ``rollout`` and ``commit`` subclass this. Attribute
    ``stages``: the labels of ``Trajectory.error``/the row's ``error`` for a failure in building
    the prompt (``prompt``), recording the output (``output``), the env step (``step``) and the
    observations (``observations``).
    """

    stages: ClassVar[dict[str, str]] = {
        "prompt": "act prompt", "output": "act output", "step": "env step",
        "observations": "observations"}

    def before_act(self, live: list[Any]) -> None:
        """Called at the top of every turn with the live items (committed: rehearsal)."""

    def keep_turning(self, acting: bool) -> bool:
        """Whether to run this turn's generate call (training with ``sync_generate_calls``: True
        while any rank has a live item)."""
        return acting

    def preset(self, x: Any) -> Completion | None:
        """An ACT output chosen before this turn, used verbatim instead of generating one
        (committed ``select``: ``selection.select_turns``), else None (the default)."""
        return None

    def render(self, x: Any) -> list[int] | None:
        """The prompt rendered from the messages when the rule says so, else None (the token
        history plus glue is used)."""
        return None

    def pending(self, x: Any) -> list[dict[str, Any]]:
        """The messages that joined since the last ACT output (their glue comes next)."""
        raise NotImplementedError

    def join(self, x: Any, messages: list[dict[str, Any]]) -> None:
        """Add ``messages`` (tool responses, a user turn) to the item's conversation."""
        raise NotImplementedError

    def tools(self, x: Any) -> list[dict[str, Any]]:
        """The tool schemas ACT outputs are parsed against."""
        raise NotImplementedError

    def on_output(self, x: Any, prompt: list[int], out: Completion, ids: list[int],
                  parsed: protocol.ActParse) -> None:
        """Record one ACT output (before ``act_ids`` is extended by ``ids``)."""

    def parse_error(self, x: Any, text: str, parsed: protocol.ActParse, turn: int) -> str | None:
        """The parse-error policy: the reply text to end the user turn with, or None when the
        item stops (the default: ``parse_error``)."""
        x.stop_reason = "parse_error"
        return None

    def user_turn(self, x: Any, text: str) -> list[dict[str, Any]] | None:
        """A text reply closed the user turn: the next user messages, or None to stop (with
        ``final_answer`` unless the hook set another reason). Default: ``env.end_turn(text)``."""
        return x.env.end_turn(text)

    def route_calls(self, x: Any, calls: list[ToolCall], turn: int) -> None:
        """Set ``x.calls`` (and ``x.terminal_call``) from an ACT output's parsed calls."""
        x.calls = list(calls)

    def observe(self, acting: list[Any]) -> None:
        """Answer the calls of every item in ``acting`` (``x.observations``). Default: each item's
        env step (``execute``), guarded one by one."""
        for x in acting:
            guarded(x, self, self.stages["step"], self.execute, x)

    def execute(self, x: Any) -> None:
        """Step the real env with ``x.calls`` and set ``x.observations``."""
        x.observations = list(x.env.step(x.calls))

    def step_stop(self, x: Any) -> str:
        """A stop reason after the env step (e.g. ``terminal_tool``), or "" to go on."""
        return ""

    def stopped(self, x: Any) -> None:
        """Called once when an item stops in the loop (committed: score it, write its row)."""

    def fail(self, x: Any, where: str, exc: BaseException) -> None:
        """End one item on an exception in its own work (``stop_reason="error"``)."""
        x.stop_reason = "error"


def guarded(x: Any, hooks: ActHooks, where: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception ends ``x`` through ``hooks.fail`` (the batch goes on)."""
    if x.stop_reason == "error":
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (one item's failure never ends the batch)
        hooks.fail(x, where, exc)
        return None


def next_prompt(x: Any, hooks: ActHooks, tokenizer: Any, glue: ChatGlue) -> list[int]:
    """The item's next ACT prompt: ``hooks.render``, else ``act_ids`` (before the first output),
    else ``act_ids`` plus the glue of the messages that joined since. Returns shape (P,)."""
    ids = hooks.render(x)
    if ids is not None:
        return ids
    if not x.turns:
        return list(x.act_ids)
    return x.act_ids + tokenizer.encode(glue.after_turn(x.act_stopped, hooks.pending(x)),
                                        add_special_tokens=False)


def _act_output(x: Any, hooks: ActHooks, prompt: list[int], out: Completion,
                glue: ChatGlue) -> None:
    """Record one ACT output, parse it, and route it: calls, the end of a user turn, or a stop."""
    ids = ids_with_stop(out, glue)
    parsed = protocol.parse_act(out.text, hooks.tools(x))
    hooks.on_output(x, prompt, out, ids, parsed)
    x.act_ids, x.act_stopped = prompt + ids, len(ids) > len(out.ids)
    x.calls, x.observations, x.terminal_call = [], [], None
    turn, x.turns = x.turns, x.turns + 1
    text = parsed.text
    if parsed.kind == "error":
        text = hooks.parse_error(x, out.text, parsed, turn)
        if text is None:
            return
    elif parsed.kind == "calls":
        hooks.route_calls(x, parsed.calls, turn)
        return
    nxt = hooks.user_turn(x, text)
    if nxt is None:
        x.stop_reason = x.stop_reason or "final_answer"
        return
    hooks.join(x, nxt)


def _after_step(x: Any, hooks: ActHooks) -> None:
    """The turn's end: the item stops, or its history grows by the observations."""
    reason = hooks.step_stop(x)
    if reason:
        x.stop_reason = reason
    else:  # h_{t+1} = h_t ⊕ (a_t, ô_t)
        hooks.join(x, [tool_response_message(x.observations)])


def run_turns(items: list[Any], generator: Generator, tokenizer: Any, hooks: ActHooks, *,
              max_new_tokens: int, temperature: float, top_p: float, max_prompt_tokens: int,
              max_turns: int) -> None:
    """Run ``items`` (``ActState``s) turn-synchronously until every one has stopped.

    Args:
        items: the items, in order; ``stopped`` is called in this order within a turn.
        generator: the acting policy; one ``generate(role="act")`` call per turn (none when
            every acting item has a ``preset`` output).
        tokenizer: the policy's tokenizer (glue).
        hooks: the rules of this caller (``ActHooks``).
        max_new_tokens, temperature, top_p: ACT sampling.
        max_prompt_tokens: a longer ACT prompt stops the item (``context_budget``).
        max_turns: ACT outputs per item (``turn_limit``).
    """
    glue = chat_glue(tokenizer)
    while True:
        hooks.before_act([x for x in items if not x.stop_reason])
        acting, prompts = [], []
        for x in items:
            if x.stop_reason:
                continue
            ids = guarded(x, hooks, hooks.stages["prompt"], next_prompt, x, hooks, tokenizer, glue)
            if x.stop_reason:
                hooks.stopped(x)
                continue
            if len(ids) > max_prompt_tokens:
                x.stop_reason = "context_budget"
                log.debug("prompt of %d tokens is over the budget of %d; the item stops",
                          len(ids), max_prompt_tokens)
                hooks.stopped(x)
                continue
            acting.append(x)
            prompts.append(ids)
        if not hooks.keep_turning(bool(acting)):
            break
        # ACT: a_t ~ π(· | h_t), one batched call for every acting item
        presets = [hooks.preset(x) for x in acting]
        todo = [p for p, pre in zip(prompts, presets) if pre is None]
        # skipped only when every acting item has a preset: an empty call (no item acting, kept
        # turning by ``any_rank``) is still made, so that collective backends see it on every rank
        made = iter(generator.generate(todo, role="act", max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p)
                    if todo or not acting else [])
        outs = [pre if pre is not None else next(made) for pre in presets]
        for x, prompt, out in zip(acting, prompts, outs):
            guarded(x, hooks, hooks.stages["output"], _act_output, x, hooks, prompt, out, glue)
        stepping = [x for x in acting if not x.stop_reason
                    and (x.calls or x.terminal_call is not None)]
        hooks.observe(stepping)  # REHEARSE: ô_t (training), or the real o_t (eval, act_only_real)
        for x in stepping:  # h_{t+1} = h_t ⊕ (a_t, ô_t)
            guarded(x, hooks, hooks.stages["observations"], _after_step, x, hooks)
        for x in acting:
            if not x.stop_reason and x.turns >= max_turns:
                x.stop_reason = "turn_limit"
            if x.stop_reason:
                hooks.stopped(x)


def any_rank(live: bool) -> bool:
    """True if ``live`` on any rank (a MAX all-reduce); ``live`` itself without a process group.

    ``rollout`` with ``rollout.sync_generate_calls`` calls it once per turn on every rank: a rank
    whose trajectories have all stopped keeps turning, with empty ``generate`` calls, until no
    rank has a live trajectory. A collective backend (vLLM server mode: every rank's prompts are
    gathered, generated on rank 0 and broadcast) then sees the same calls on every rank.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return live
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(live)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


__all__ = ["ActHooks", "ActState", "ChatGlue", "any_rank", "chat_glue", "guarded", "ids_with_stop",
           "next_prompt", "run_turns"]
