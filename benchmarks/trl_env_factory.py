"""Our turn-synchronous tool loop vs TRL's ``GRPOTrainer(environment_factory=...)`` loop.

One process, the same small setup for both: the ``drills`` profile's micro policy (the shipped
base, warm-started first by a short ACT-only SFT, ``warm_start``, since the bare base writes no
tool call that parses; loaded by ``models.load.load_policy``), ``--prompts`` tau2-retail-drills
train tasks per step × ``--k`` generations, ``--steps`` GRPO steps, temperature 1,
``rollout.max_new_tokens_act`` new tokens per generation and at most ``rollout.max_turns``
generations per rollout. Both loops execute the drills' **real tau2 tools** (``envs.make_env``'s
``DrillEnv.step``, tau2's ``get_response``).

==============  ==================================================================================
loop            what runs
==============  ==================================================================================
ours            ``RoleWiseGRPOTrainer`` in mode ``act_only_real`` (``core.rollout.rollout``: one
                batched ``generate`` per turn over every live trajectory, the real environment
                answers, checklist reward)
trl             TRL's ``GRPOTrainer`` with ``environment_factory``: one environment class per
                drill tool set (``drill_env_classes``), whose public methods are the tau2 tools
                built from ``Env.tool_schemas()``; TRL renders them with the chat template,
                parses the tool calls (``parse_response``), calls the methods and regenerates
                (``_tool_call_loop``); reward: tau2's evaluator (``Env.score``) after the last
                text reply
==============  ==================================================================================

The same 8 tasks feed both (``prompts × steps`` first RL train drills; one epoch of TRL's
``RepeatSampler``), and both use ``train.grpo_args`` (loss, learning rate, K, temperature) with
``beta = 0`` (TRL would otherwise rebuild a reference model from the policy's hub path) and no
checkpoints. TRL-only settings: ``generation_kwargs={"max_new_tokens": max_new_tokens_act}``
(each generation's budget, as ours), ``max_tool_calling_iterations = max_turns - 1`` and
``max_completion_length = --trl-completion-budget`` (TRL counts every turn's output and every
tool result against it; our loop has no such cap).

Counted the same way for both loops, by class-level wrappers:

* ``generated_tokens``: the new ids of every ``Qwen3ForCausalLM.generate`` call that are not the
  pad id (the stop token counts once per row; rows padded after they stopped do not count);
  ``generate_s`` the seconds inside those calls.
* ``rollout_s``: ours ``core.rollout.rollout`` (generation, parsing, the environment); TRL
  ``GRPOTrainer._generate`` (generation, parsing, the tool loop). ``reward_s``: ours
  ``RoleWiseGRPOTrainer._score`` (the checklist judge), TRL ``_calculate_rewards`` (tau2's
  evaluator, which replays the episode). ``env_reset_s``: ``DrillEnv.reset`` seconds (a fresh tau2 environment per rollout), inside
  ours' ``rollout``; TRL runs them before ``_generate``, and they are added to its
  ``rollout_s``. Ours prefills prompts with ``PrefixCache`` forwards outside ``generate``:
  they count in ``rollout_s``, not in ``generate_s``.
* ``tool_calls`` / ``tool_s``: ``DrillEnv.step`` calls (unknown tools included) and
  seconds.
* ``step_s``: HF Trainer ``on_step_begin`` → ``on_step_end`` per optimizer step;
  ``step_s_mean_less_reward`` without ``reward_s`` (the two loops' rewards differ).
* ``rollout_tokens_per_s = generated_tokens / rollout_s``; ratios are ours / TRL.

The micro tokenizer's own chat template renders no tools, and TRL refuses it
(``supports_tool_calling``). The script records that exception (type, message, the TRL line
that raised), then tries at most two tool-capable templates TRL ships and can parse (Qwen3's,
then Qwen2.5's), recording each attempt; the first that trains is timed.

Usage::

    nice python benchmarks/trl_env_factory.py          # warm start, then 2 steps of 4 prompts × 4
    nice python benchmarks/trl_env_factory.py --checkpoint CKPT --steps 1 --prompts 2 --k 2 \
        --out small.json                               # a warm-started policy folder, smaller
"""
from __future__ import annotations

import os

# before torch loads: spinning OpenMP threads slow a process many times over when another
# process is busy on the same cores (docs/instructors.md, "Pitfalls")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import argparse
import contextlib
import copy
import inspect
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, command_line, machine_info, write_json  # noqa: E402

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float,
                               "boolean": bool, "object": dict}


# ---------------------------------------------------------------------------------------------
# The environment TRL drives: the drill's real tau2 tools as methods
# ---------------------------------------------------------------------------------------------
def _py_type(schema: dict[str, Any]) -> Any:
    """A Python annotation for a JSON-schema property (``transformers.get_json_schema`` maps it
    back): ``array`` of ``T`` → ``list[T]``; an unknown or missing type → ``str``."""
    kind = schema.get("type")
    if kind == "array":
        return list[_py_type(schema.get("items") or {})]
    return _JSON_TYPES.get(kind, str)


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


def tool_method(schema: dict[str, Any]) -> Any:
    """A method named after an OpenAI-format tool whose call executes it in ``self.env``.

    The signature (keyword parameters with annotations; optional ones default to ``None``) and the
    Google-style docstring (description, ``Args:``, ``Returns:``) are what TRL's
    ``get_json_schema`` reads to show the tool to the model. The body forwards exactly the
    arguments the model wrote (unknown ones included: tau2 answers them with an error).

    Args:
        schema: ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    Returns:
        ``method(self, **arguments) -> str``: the observation's text.
    """
    fn = schema["function"]
    name = fn["name"]
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])

    def method(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for p, spec in props.items():
        annotations[p] = _py_type(spec)
        sig.append(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[p],
                                     default=inspect.Parameter.empty if p in required else None))
    annotations["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(sig, return_annotation=str)  # type: ignore
    method.__annotations__ = annotations
    args = "".join(f"    {p}: {_one_line(spec.get('description') or spec.get('title') or p)}\n"
                   for p, spec in props.items())
    method.__doc__ = (f"{_one_line(fn.get('description') or name)}\n\n"
                      + (f"Args:\n{args}\n" if args else "")
                      + "Returns:\n    The tool's response.\n")
    return method


class DrillToolEnv:
    """One rollout's drill environment for TRL's ``environment_factory``.

    ``reset(suite, task_id, **row)`` builds a fresh real environment (``envs.make_env``) for the
    dataset row's task; the subclasses ``drill_env_classes`` makes add one public method per tool.
    ``_finish(text)`` closes the episode with the last text reply and returns tau2's reward.
    """

    def __init__(self) -> None:
        self.env: Any = None

    def reset(self, **row: Any) -> None:
        """A fresh episode of ``row["task_id"]`` in ``row["suite"]``; the prompt is unchanged."""
        from envace_lite.envs import make_env

        if self.env is not None:
            self.env.close()
        self.env = make_env(row["suite"], row["task_id"])
        self.env.reset()
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        from envace_lite.types import ToolCall

        return self.env.step([ToolCall(name, dict(arguments))])[0].content

    def _finish(self, text: str) -> float:
        if not self.env.done:
            self.env.end_turn(text)
        return float(self.env.score()[0])


def drill_env_classes(tasks: list[Any]) -> dict[str, type]:
    """One ``DrillToolEnv`` subclass per distinct tool set of ``tasks`` (the drills show each
    kind of drill its own subset of retail tools).

    Returns:
        ``{key: class}``, ``key`` the tool names joined by ``,`` in schema order.
    """
    out: dict[str, type] = {}
    for t in tasks:
        key = ",".join(tool["function"]["name"] for tool in t.tools)
        if key not in out:
            methods = {tool["function"]["name"]: tool_method(tool) for tool in t.tools}
            out[key] = type(f"DrillEnv{len(out)}", (DrillToolEnv,), methods)
    return out


LAST_COMPLETIONS: list[Any] = []
"""The completions ``tau2_reward`` scored last (for the JSON's samples)."""


def tau2_reward(completions: list[Any], environments: list[Any] | None = None,
                **kwargs: Any) -> list[float]:
    """TRL reward function: each rollout's last text reply ends its episode, then tau2's
    evaluator scores it (``Env.score``, 0 or 1)."""
    LAST_COMPLETIONS[:] = completions
    out = []
    for messages, env in zip(completions, environments or [], strict=True):
        text = ""
        for m in reversed(messages):
            if m.get("role") == "assistant" and not m.get("tool_calls"):
                text = m.get("content") or ""
                break
        out.append(env._finish(text if isinstance(text, str) else str(text)))
    return out


# ---------------------------------------------------------------------------------------------
# Counters shared by both loops
# ---------------------------------------------------------------------------------------------
class Counters:
    """Generated tokens, generate/rollout/tool seconds and step times, by class-level wrappers.

    ``pad_id``: the loaded policy's pad id, set by each loop when it loads the policy."""

    def __init__(self) -> None:
        self.pad_id: int | None = None
        self.reset()
        self._undo: list[tuple[Any, str, Any]] = []

    def reset(self) -> None:
        self.generated = self.generate_calls = self.tool_calls = 0
        self.generate_s = self.rollout_s = self.tool_s = self.reward_s = self.reset_s = 0.0
        self.steps: list[dict[str, Any]] = []
        self._step: dict[str, Any] | None = None

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = owner.__dict__.get(name, getattr(owner, name))
        self._undo.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def install(self, rollout_owners: list[tuple[Any, str]],
                reward_owners: list[tuple[Any, str]]) -> None:
        """Wrap ``Qwen3ForCausalLM.generate``, the drills' ``DrillEnv.step`` and ``reset``, each ``(owner, name)`` of
        ``rollout_owners`` (the loops' rollout entry points) and ``reward_owners`` (their
        reward computations)."""
        import torch
        from transformers import Qwen3ForCausalLM

        from envace_lite.drills.suite import DrillEnv

        c = self

        def gen(orig: Any) -> Any:
            def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
                ids = kwargs.get("input_ids", args[0] if args else None)
                t = time.perf_counter()
                out = orig(model, *args, **kwargs)
                c.generate_s += time.perf_counter() - t
                seq = out.sequences if hasattr(out, "sequences") else out
                if isinstance(seq, torch.Tensor) and ids is not None:
                    c.generated += int((seq[:, ids.shape[1]:] != c.pad_id).sum())
                c.generate_calls += 1
                return out
            return wrapped

        def step(orig: Any) -> Any:
            def wrapped(env: Any, calls: Any) -> Any:
                t = time.perf_counter()
                try:
                    return orig(env, calls)
                finally:
                    c.tool_s += time.perf_counter() - t
                    c.tool_calls += len(calls)
            return wrapped

        def timer(attr: str) -> Any:
            def wrap(orig: Any) -> Any:
                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        setattr(c, attr, getattr(c, attr) + time.perf_counter() - t)
                return wrapped
            return wrap

        self._patch(Qwen3ForCausalLM, "generate", gen)
        self._patch(DrillEnv, "step", step)
        self._patch(DrillEnv, "reset", timer("reset_s"))
        for owner, name in rollout_owners:
            self._patch(owner, name, timer("rollout_s"))
        for owner, name in reward_owners:
            self._patch(owner, name, timer("reward_s"))

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def callback(self) -> Any:
        """A ``TrainerCallback`` recording each step's seconds and counter deltas."""
        from transformers import TrainerCallback

        c = self

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                c._step = {"t": time.perf_counter(), **c.snapshot()}

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if c._step is None:
                    return
                now = c.snapshot()
                row = {"step": state.global_step,
                       "step_s": round(time.perf_counter() - c._step["t"], 3)}
                row |= {k: round(now[k] - c._step[k], 3) if isinstance(now[k], float)
                        else now[k] - c._step[k] for k in now}
                c.steps.append(row)
                c._step = None

        return StepTimer()

    def snapshot(self) -> dict[str, Any]:
        return {"generated_tokens": self.generated, "generate_calls": self.generate_calls,
                "generate_s": self.generate_s, "rollout_s": self.rollout_s,
                "tool_calls": self.tool_calls, "tool_s": self.tool_s, "reward_s": self.reward_s,
                "reset_s": self.reset_s}


def summarize(steps: list[dict[str, Any]], wall: float, resets_outside: bool) -> dict[str, Any]:
    """Totals over the steps and the rollout rate; ``steps`` as ``Counters.callback`` wrote them.

    ``resets_outside``: the environments' ``reset`` runs outside the wrapped rollout entry point
    (TRL resets them in ``_generate_and_score_completions`` before ``_generate``); their seconds
    are then added to ``rollout_s``, so that both loops' rollout includes building the episodes.
    """
    tot = {k: sum(s[k] for s in steps) for k in ("step_s", "generated_tokens", "generate_s",
                                                  "rollout_s", "tool_calls", "tool_s", "reward_s",
                                                  "reset_s")}
    if resets_outside:
        tot["rollout_s"] += tot["reset_s"]
    n = len(steps) or 1
    return {"steps": steps, "wall_s": round(wall, 2),
            "step_s_mean": round(tot["step_s"] / n, 3),
            "step_s_mean_less_reward": round((tot["step_s"] - tot["reward_s"]) / n, 3),
            "env_reset_s": round(tot["reset_s"], 3),
            "generated_tokens": tot["generated_tokens"],
            "rollout_s": round(tot["rollout_s"], 3), "generate_s": round(tot["generate_s"], 3),
            "tool_calls": tot["tool_calls"], "tool_s": round(tot["tool_s"], 3),
            "reward_s": round(tot["reward_s"], 3),
            "rollout_tokens_per_s": round(tot["generated_tokens"] / tot["rollout_s"], 2)
            if tot["rollout_s"] else None,
            "generate_tokens_per_s": round(tot["generated_tokens"] / tot["generate_s"], 2)
            if tot["generate_s"] else None}


def error_record(e: BaseException) -> dict[str, Any]:
    """The exception's type and message and the innermost frame inside TRL that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    trl = [f for f in frames if f"{os.sep}trl{os.sep}" in f.filename]
    at = trl[-1] if trl else (frames[-1] if frames else None)
    where = None
    if at is not None:
        where = {"file": at.filename.split(f"site-packages{os.sep}")[-1], "line": at.lineno,
                 "function": at.name, "code": at.line}
    return {"type": type(e).__name__, "message": str(e)[:2000], "raised_at": where}


# ---------------------------------------------------------------------------------------------
# The two loops
# ---------------------------------------------------------------------------------------------
def run_ours(cfg: Any, tasks: list[Any], counters: Counters, folder: str) -> dict[str, Any]:
    """``RoleWiseGRPOTrainer`` (mode ``act_only_real``) for ``cfg.grpo.steps`` steps."""
    from transformers.trainer_callback import PrinterCallback

    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.models.load import load_policy
    from envace_lite.pipelines.train import grpo_args

    model, tok = load_policy(cfg, train=True)
    counters.pad_id = tok.pad_token_id
    args = grpo_args(cfg, Path(folder) / "ours")
    args.save_strategy = "no"
    counters.reset()
    trainer = RoleWiseGRPOTrainer(model, tok, tasks, cfg, args, callbacks=[counters.callback()])
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    out = summarize(counters.steps, time.perf_counter() - start, False)
    rec = trainer.last_record
    if rec is not None:
        n = max(1, len(rec.trajs))
        out["last_step_act_outputs_per_rollout"] = round(
            sum(sum(o.role == "act" for o in t.outputs) for t in rec.trajs) / n, 2)
        out["last_step_reward_mean"] = round(float(rec.rewards.mean()), 4)
        acts = [o for t in rec.trajs for o in t.outputs if o.role == "act"]
        out["last_step_act_parse_kinds"] = {k: sum(o.parse_kind == k for o in acts)
                                            for k in sorted({o.parse_kind for o in acts})}
        out["sample_act_output"] = acts[0].text[:400] if acts else None
    return out


def trl_dataset(tasks: list[Any], cfg: Any, classes: dict[str, type]) -> Any:
    """TRL's rows: the ACT prompt's system text (the compact policy excerpt) and the ticket,
    the environment key of the task's tool set, and the task's suite and id for ``reset``."""
    from datasets import Dataset

    from envace_lite.protocol.prompts import policy_excerpt

    rows: dict[str, list[Any]] = {"prompt": [], "environment": [], "suite": [], "task_id": []}
    for t in tasks:
        system = "\n\n".join(m["content"] for m in t.messages if m["role"] == "system")
        rest = [{"role": m["role"], "content": m["content"]}
                for m in t.messages if m["role"] != "system"]
        rows["prompt"].append([{"role": "system", "content": policy_excerpt(
            system, cfg.rollout.compact_policy_chars)}] + rest)
        rows["environment"].append(",".join(x["function"]["name"] for x in t.tools))
        rows["suite"].append(t.suite)
        rows["task_id"].append(t.id)
    assert set(rows["environment"]) <= set(classes)
    return Dataset.from_dict(rows)


def run_trl(cfg: Any, tasks: list[Any], counters: Counters, folder: str, template: str | None,
            budget: int) -> dict[str, Any]:
    """TRL's ``GRPOTrainer(environment_factory=...)`` for ``cfg.grpo.steps`` steps.

    Args:
        template: ``None`` (the micro tokenizer's own chat template) or the name of a
            ``trl.chat_template_utils`` template (``qwen3_chat_template``, ...).
        budget: ``max_completion_length``.
    """
    import trl.chat_template_utils as ctu
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from envace_lite.models.load import load_policy
    from envace_lite.pipelines.train import grpo_args

    model, tok = load_policy(cfg, train=True)
    counters.pad_id = tok.pad_token_id
    tok = copy.deepcopy(tok)
    if template is not None:
        tok.chat_template = getattr(ctu, template)
    args = grpo_args(cfg, Path(folder) / f"trl_{template}")
    args.save_strategy = "no"
    args.generation_kwargs = {"max_new_tokens": cfg.rollout.max_new_tokens_act}
    args.max_completion_length = budget
    args.max_tool_calling_iterations = cfg.rollout.max_turns - 1
    classes = drill_env_classes(tasks)
    dataset = trl_dataset(tasks, cfg, classes)
    counters.reset()
    trainer = GRPOTrainer(model=model, reward_funcs=[tau2_reward], args=args,
                          train_dataset=dataset, processing_class=tok,
                          environment_factory=dict(classes),
                          callbacks=[counters.callback()])
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    out = summarize(counters.steps, time.perf_counter() - start, True)
    out["tool_sets"] = list(classes)
    last = list(LAST_COMPLETIONS)
    out["last_step_completions_with_tool_calls"] = sum(
        any(m.get("tool_calls") for m in c) for c in last)
    out["sample_completion"] = [{k: str(v)[:400] for k, v in m.items()} for m in last[0]] \
        if last else None
    m = trainer._metrics.get("train", {})
    for key in ("tools/call_frequency", "tools/failure_frequency", "reward",
                "completions/mean_length"):
        if m.get(key):
            out[key] = [round(float(v), 4) for v in m[key]]
    return out


WARM_START = {"warmstart.act_share": 1.0, "warmstart.token_budget": 70_000,
              "warmstart.eval_first_turns": 0}
"""The short warm start run first: ACT rows only (``act_share`` 1 of a 70k-token budget, about
217 rows of the SFT drills), so that the policy writes ``<tool_call>`` blocks and both loops
execute tools (the shipped base writes none that parse)."""


def warm_start(steps: int, seed: int, folder: str) -> tuple[str, dict[str, Any]]:
    """``pipelines.sft.warmstart`` of the drills profile with ``WARM_START`` for ``steps`` SFT
    steps, into ``folder``; returns ``(checkpoint folder, summary)``."""
    import json

    from envace_lite.config import get_config
    from envace_lite.pipelines.sft import warmstart

    cfg = get_config("drills", WARM_START | {"warmstart.max_steps": steps, "run.seed": seed})
    start = time.perf_counter()
    run = warmstart(cfg, Path(folder) / "warmstart", measure=False)
    summary = json.loads((run / "summary.json").read_text())
    return str(run / "checkpoint"), {
        "overrides": WARM_START | {"warmstart.max_steps": steps},
        "seconds": round(time.perf_counter() - start, 1), "sft": summary.get("sft"),
        "rows": (summary.get("rows") or {}).get("rows_kept")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, run both loops, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4, help="tasks per step")
    p.add_argument("--k", type=int, default=4, help="generations per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trl-completion-budget", type=int, default=1024,
                   help="TRL max_completion_length (all turns and tool results of a rollout)")
    p.add_argument("--checkpoint", default="",
                   help="a warm-started policy folder (model.checkpoint); skips the warm start")
    p.add_argument("--warm-start-steps", type=int, default=150,
                   help="SFT steps of the ACT-only warm start run first (0: the shipped base)")
    p.add_argument("--out", default=None,
                   help="the JSON (default benchmarks/results/trl_env_factory.json)")
    a = p.parse_args(argv)

    import torch

    from envace_lite.config import get_config
    import envace_lite.core.rollout as rollout_module
    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.pipelines.train import load_train_tasks
    from trl import GRPOTrainer

    overrides = {"grpo.mode": "act_only_real", "grpo.steps": a.steps,
                 "grpo.prompts_per_step": a.prompts, "grpo.num_generations": a.k,
                 "grpo.beta": 0.0, "run.seed": a.seed}
    payload: dict[str, Any] = {"benchmark": "trl_env_factory",
                               "command": command_line("trl_env_factory.py", argv),
                               "machine": machine_info()}
    stack = contextlib.ExitStack()
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    if a.checkpoint:
        overrides["model.checkpoint"] = a.checkpoint
    elif a.warm_start_steps:
        overrides["model.checkpoint"], payload["warm_start"] = warm_start(
            a.warm_start_steps, a.seed, folder)
    cfg = get_config("drills", overrides)
    tasks = load_train_tasks(cfg)[: a.prompts * a.steps]
    payload["setup"] = {
        "profile": "drills", "tasks": [t.id for t in tasks],
        "overrides": overrides | ({"model.checkpoint": "the warm start (warm_start)"}
                                  if "warm_start" in payload else {}),
        "k": a.k, "prompts_per_step": a.prompts, "steps": a.steps,
        "max_new_tokens_per_generation": cfg.rollout.max_new_tokens_act,
        "max_turns": cfg.rollout.max_turns, "trl_max_completion_length": a.trl_completion_budget,
        "trl_max_tool_calling_iterations": cfg.rollout.max_turns - 1,
        "temperature": cfg.rollout.temperature, "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    counters = Counters()
    counters.install([(rollout_module, "rollout"), (GRPOTrainer, "_generate")],
                     [(RoleWiseGRPOTrainer, "_score"), (GRPOTrainer, "_calculate_rewards")])
    loadavg: dict[str, Any] = {}
    try:
        with stack:
            loadavg["before_ours"] = [round(x, 2) for x in os.getloadavg()]
            payload["ours"] = run_ours(cfg, tasks, counters, folder)
            attempts = []
            for template in (None, "qwen3_chat_template", "qwen2_5_chat_template"):
                loadavg[f"before_trl_{template or 'own'}"] = [round(x, 2) for x in os.getloadavg()]
                label = template or "the micro tokenizer's own chat template"
                try:
                    res = run_trl(cfg, tasks, counters, folder, template, a.trl_completion_budget)
                except Exception as e:  # noqa: BLE001 - the failure is the finding
                    attempts.append({"chat_template": label, "ok": False} | error_record(e))
                    print(f"TRL with {label}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                attempts.append({"chat_template": label, "ok": True})
                payload["trl"] = res | {"chat_template": label}
                break
            payload["trl_attempts"] = attempts
            loadavg["end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        counters.restore()
    payload["load_avg_1_5_15"] = loadavg
    ours, trl = payload["ours"], payload.get("trl")
    if trl:
        def ratio(x: Any, y: Any) -> float | None:
            return round(x / y, 3) if x and y else None

        payload["ratios_ours_over_trl"] = {
            "rollout_tokens_per_s": ratio(ours["rollout_tokens_per_s"],
                                          trl["rollout_tokens_per_s"]),
            "step_s_mean": ratio(ours["step_s_mean"], trl["step_s_mean"]),
            "step_s_mean_less_reward": ratio(ours["step_s_mean_less_reward"],
                                             trl["step_s_mean_less_reward"]),
            "generated_tokens": ratio(ours["generated_tokens"], trl["generated_tokens"])}
    path = write_json(a.out or RESULTS / "trl_env_factory.json", payload)
    r = payload.get("ratios_ours_over_trl")
    print(f"{path}: ours {ours['rollout_tokens_per_s']} tok/s, step {ours['step_s_mean']} s; "
          + (f"TRL {trl['rollout_tokens_per_s']} tok/s, step {trl['step_s_mean']} s; ratios {r}"
             if trl else "TRL's loop did not run: see trl_attempts"))
    return payload


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with contextlib.suppress(KeyboardInterrupt):
        main()
