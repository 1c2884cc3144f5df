"""Rollout throughput: the turn-synchronous engine vs a naive one-trajectory-at-a-time loop.

Both variants play the same tasks (the profile's real compact prompts: tau2 telecom and BFCL base
train tasks, alternating) with the same model, budgets and greedy decoding, up to ``--turns`` ACT
turns, REHEARSE included:

* **engine**: ``rollout.rollout`` with ``HFGenerator(batch_size=n)``: every live trajectory's ACT
  prompt in one ``generate`` call per turn, then all REHEARSE prompts in one more; the packed ACT
  history is extended with token ids, never re-tokenized. Its ``PrefixCache`` prefills only what
  no earlier prompt shares: the suite's system prompt and tool schemas once, and a trajectory's
  last prompt once (``prefix_cache_reused_tokens`` vs ``prefix_cache_prefilled_tokens``).
* **naive**: ``naive_rollout``: one trajectory at a time, one prompt per ``generate`` call, the
  whole ACT history re-rendered through the chat template and re-tokenized every turn
  (``HFGenerator(prefix_cache=0)``: every prompt is prefilled whole).

Greedy decoding makes both variants sample (nearly) the same tokens, so the ratio of tokens/s is
a ratio of the work's wall time; ``same_outputs`` counts the naive trajectories whose texts equal
the engine's. The naive loop's throughput does not depend on how many trajectories it plays (it
plays them one by one), so ``--naive-every m`` plays every m-th *pair* of tasks (one per suite:
tasks 0, 1, 2m, 2m + 1, ...) to bound the wall time. The variants run interleaved (naive,
engine, naive, engine, ...) in one process. Each variant also records its process CPU seconds
(``cpu_s``, ``tokens_per_cpu_s``): on a CPU shared with other jobs the load can change between
the variants, and CPU time is much less sensitive to it than wall time.

Prefill and decode are timed inside the model's forward (``common.ForwardTimer``); ``other_s``
is the rest of the wall time (tokenization, templates, parsing, sampling, the prefix cache's
lookups and batch-cache assembly, Python). ``total_tokens_per_s`` counts every prompt id of
every call (prefilled or served by the prefix cache) plus the generated ids.

Usage::

    python benchmarks/rollout_throughput.py --profile laptop            # ~8 min on 2 cores
    python benchmarks/rollout_throughput.py --profile smoke
    python benchmarks/rollout_throughput.py --profile smoke --quick     # the test's size
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    ForwardTimer,
    bench_config,
    bench_tasks,
    command_line,
    default_out,
    machine_info,
    write_json,
)


class CountingGenerator:
    """Wraps a ``Generator`` and records every call: prompts, prompt and generated tokens, time.

    Attributes:
        calls: ``[{"role", "prompts", "prompt_tokens", "generated_tokens", "seconds",
            "cpu_seconds"}]`` (wall and process CPU seconds).
        prompts: the prompt batch of each call (token ids), for replays.
    """

    def __init__(self, gen: Any) -> None:
        self.gen, self.calls, self.prompts = gen, [], []

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Any]:
        start, cpu = time.perf_counter(), time.process_time()
        outs = self.gen.generate(prompts, role, max_new_tokens, temperature, top_p)
        self.prompts.append([list(p) for p in prompts])
        self.calls.append({"role": role, "prompts": len(prompts),
                           "prompt_tokens": sum(map(len, prompts)),
                           "generated_tokens": sum(len(o.ids) for o in outs),
                           "seconds": time.perf_counter() - start,
                           "cpu_seconds": time.process_time() - cpu})
        return outs


def naive_rollout(task: Any, gen: Any, tokenizer: Any, cfg: Any) -> list[str]:
    """One trajectory, one prompt per ``generate`` call, the history re-encoded every turn.

    The same protocol as the engine (ACT, then one REHEARSE per call; a final answer replays the
    next user turn; a parse error or a terminal tool stops), with gold grounding and greedy
    decoding as the benchmark sets them. Only the execution differs.

    Returns:
        The generated texts in order (ACT, its REHEARSE calls, next ACT, ...).
    """
    from envace_lite import protocol
    from envace_lite.protocol.prompts import act_messages, tool_response_message
    from envace_lite.protocol.rehearse_prompt import rehearse_messages
    from envace_lite.llm.generation import chat_ids
    from envace_lite.core.rollout import TERMINAL_TOOLS, rehearsal_observation

    rc = cfg.rollout
    history: list[dict[str, Any]] = []
    plain = [{"role": m["role"], "content": m["content"]}
             for m in task.messages if m["role"] != "system"]
    grounding = [g for turn in task.grounding for g in turn]
    terminal = TERMINAL_TOOLS.get(task.suite, frozenset())
    texts, user_turn = [], 0

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    def one(prompt: list[int], role: str, budget: int) -> str:
        [out] = gen.generate([prompt], role, budget, rc.temperature, rc.top_p)
        texts.append(out.text)
        return out.text

    for _ in range(rc.max_turns):
        prompt = chat_ids(tokenizer, act_messages(
            task.messages, task.tools, rc.rendering, rc.compact_policy_chars, history))
        if len(prompt) > rc.max_prompt_tokens:
            break
        text = one(prompt, "act", rc.max_new_tokens_act)
        parsed = protocol.parse_act(text, task.tools)
        history.append({"role": "assistant", "content": text})
        plain.append({"role": "assistant", "content": text})
        if parsed.kind == "error":
            break
        if parsed.kind == "final":
            if user_turn + 1 >= len(task.user_turns):
                break
            user_turn += 1
            nxt = [{"role": "user", "content": str(m.get("content") or "")}
                   for m in task.user_turns[user_turn]]
            history += nxt
            plain += nxt
            continue
        calls = []
        for call in parsed.calls:
            if call.name in terminal:
                break
            calls.append(call)
        observations = []
        for call in calls:
            rp = rehearse_messages(task.tools, grounding, plain, call, count,
                                   rc.max_prompt_tokens, rc.rendering)
            observations.append(rehearsal_observation(
                one(chat_ids(tokenizer, rp.messages), "rehearse", rc.max_new_tokens_rehearse))[0])
        if len(calls) < len(parsed.calls) or not observations:
            break
        msg = tool_response_message(observations)
        history.append(msg)
        plain.append(msg)
    return texts


def naive_subset(n: int, every: int, suites: int = 2) -> list[int]:
    """Indices of the tasks the naive loop plays: every ``every``-th group of ``suites`` tasks.

    ``bench_tasks`` alternates suites, so each group holds one task of each suite and the subset
    keeps the suite mix (``range(0, n, 4)`` would pick tau2 telecom only).
    """
    return [i for i in range(n) if (i // suites) % every == 0]


def _summary(name: str, wall: float, counter: CountingGenerator, timer: ForwardTimer,
             trajectories: int, cpu: float) -> dict[str, Any]:
    gen_tokens = sum(c["generated_tokens"] for c in counter.calls)
    fwd = timer.as_dict()
    return {
        "variant": name, "trajectories": trajectories, "wall_s": round(wall, 3),
        "generate_calls": len(counter.calls),
        "outputs": sum(c["prompts"] for c in counter.calls),
        "generated_tokens": gen_tokens, **fwd,
        "other_s": round(wall - timer.prefill_s - timer.decode_s, 3),
        "tokens_per_s": round(gen_tokens / wall, 2), "cpu_s": round(cpu, 2),
        "tokens_per_cpu_s": round(gen_tokens / max(cpu, 1e-9), 3),
        "prefill_tokens_per_s": round(timer.prefill_tokens / max(timer.prefill_s, 1e-9), 1),
        "decode_tokens_per_s": round(gen_tokens / max(timer.decode_s, 1e-9), 2),
        # every prompt id the calls covered, prefilled or served by the prefix cache
        "prompt_tokens": sum(c["prompt_tokens"] for c in counter.calls),
        "total_tokens_per_s": round(
            (gen_tokens + sum(c["prompt_tokens"] for c in counter.calls)) / wall, 1),
    }


def run(profile: str, n: int, turns: int, repeats: int, naive_every: int,
        torch_profile: bool = False, quick: bool = False,
        max_new_tokens: int | None = None, prefix_cache: int = 32768) -> dict[str, Any]:
    """Measure both variants, interleaved; returns the JSON payload's figures.

    Args:
        profile: ``smoke`` or ``laptop`` (model and budgets).
        n: concurrent trajectories of the engine (one task each: greedy K > 1 would repeat).
        turns: ``rollout.max_turns``.
        repeats: rounds of (naive, engine).
        naive_every: the naive loop plays the task pairs 0, m, 2m, ... (``naive_subset``).
        torch_profile: also profile one engine run with ``torch.profiler`` (top CPU ops).
        quick: the tests' tiny model and toy tasks.
        max_new_tokens: the ACT and the REHEARSE budget of both variants (the profile's when
            ``None``).
        prefix_cache: the engine's ``HFGenerator(prefix_cache=...)`` (0: off, the engine before
            prefix cache).
    """
    import torch

    from benchmarks.common import QUICK, policy
    from envace_lite.llm.generation import HFGenerator
    from envace_lite.core.rollout import rollout

    cfg = bench_config(profile, {"rollout.max_turns": turns, "rollout.temperature": 0.0,
                                 "rollout.grounding_drop_p": 0.0, "rollout.user_replay": "always",
                                 **(QUICK if quick else {}),
                                 **({"rollout.max_new_tokens_act": max_new_tokens,
                                     "rollout.max_new_tokens_rehearse": max_new_tokens}
                                    if max_new_tokens else {})})
    model, tok = policy(cfg)
    tasks = bench_tasks(n, quick=quick)
    picked = naive_subset(len(tasks), naive_every)
    subset = [tasks[i] for i in picked]
    rounds: list[dict[str, Any]] = []
    same = None
    for rep in range(repeats):
        counter = CountingGenerator(HFGenerator(model, tok, seed=rep, batch_size=1,
                                                prefix_cache=0))
        with ForwardTimer(model) as timer:
            start, cpu = time.perf_counter(), time.process_time()
            naive_texts = [naive_rollout(t, counter, tok, cfg) for t in subset]
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rounds.append(_summary("naive", wall, counter, timer, len(subset), cpu))
        engine = HFGenerator(model, tok, seed=rep, batch_size=n, prefix_cache=prefix_cache)
        counter = CountingGenerator(engine)
        with ForwardTimer(model) as timer:
            start, cpu = time.perf_counter(), time.process_time()
            trajs = rollout(tasks, counter, tok, cfg, k=1, seed=rep)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rounds.append(_summary("engine", wall, counter, timer, len(tasks), cpu))
        if engine.prefix_cache is not None:
            rounds[-1]["prefix_cache_reused_tokens"] = engine.prefix_cache.reused_tokens
            rounds[-1]["prefix_cache_prefilled_tokens"] = engine.prefix_cache.prefilled_tokens
        rounds[-1]["turns_mean"] = round(sum(t.turns for t in trajs) / len(trajs), 2)
        rounds[-1]["stops"] = dict(sorted(
            {r: sum(t.stop_reason == r for t in trajs) for r in {t.stop_reason for t in trajs}}
            .items()))
        engine_texts = [[o.text for o in trajs[i].outputs] for i in picked]
        same = sum(a == b for a, b in zip(naive_texts, engine_texts))
    out: dict[str, Any] = {"rounds": rounds}
    for name in ("naive", "engine"):
        rs = [r for r in rounds if r["variant"] == name]
        out[name] = {key: round(sum(r[key] for r in rs) / len(rs), 3) for key in rs[0]
                     if isinstance(rs[0][key], (int, float))}
    out["speedup_tokens_per_s"] = round(out["engine"]["tokens_per_s"]
                                        / out["naive"]["tokens_per_s"], 2)
    out["speedup_decode"] = round(out["engine"]["decode_tokens_per_s"]
                                  / out["naive"]["decode_tokens_per_s"], 2)
    out["speedup_prefill"] = round(out["engine"]["prefill_tokens_per_s"]
                                   / out["naive"]["prefill_tokens_per_s"], 2)
    out["speedup_tokens_per_cpu_s"] = round(out["engine"]["tokens_per_cpu_s"]
                                            / out["naive"]["tokens_per_cpu_s"], 2)
    out["same_outputs"] = f"{same}/{len(subset)}"
    out["setup"] = {"profile": profile, "model": cfg.model.name,
                    "model_checkpoint": cfg.model.checkpoint or "base",
                    "trajectories": n, "tasks": [f"{t.suite}/{t.id}" for t in tasks],
                    "naive_trajectories": len(subset), "naive_tasks": picked, "max_turns": turns,
                    "max_new_tokens_act": cfg.rollout.max_new_tokens_act,
                    "max_new_tokens_rehearse": cfg.rollout.max_new_tokens_rehearse,
                    "decoding": "greedy", "grounding": "gold", "user_replay": "always",
                    "repeats": repeats, "torch_threads": torch.get_num_threads(),
                    "engine_prefix_cache_tokens": prefix_cache}
    if torch_profile:
        out["torch_profile"] = profile_engine(model, tok, tasks, cfg)
    return out


def profile_engine(model: Any, tok: Any, tasks: list[Any], cfg: Any, top: int = 12
                   ) -> list[dict[str, Any]]:
    """One engine rollout under ``torch.profiler``: the ``top`` ops by self CPU time (ms, %)."""
    from torch.profiler import ProfilerActivity, profile

    from envace_lite.llm.generation import HFGenerator
    from envace_lite.core.rollout import rollout

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rollout(tasks, HFGenerator(model, tok, seed=0, batch_size=len(tasks)), tok, cfg, k=1)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1000, 1),
             "share": round(e.self_cpu_time_total / total, 3), "calls": e.count}
            for e in events[:top]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, measure, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="laptop", choices=["smoke", "laptop"])
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    p.add_argument("--quick", action="store_true", help="tiny size (the tests)")
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 1 laptop, 2 smoke)")
    p.add_argument("--naive-every", type=int, default=None,
                   help="naive plays every m-th trajectory (default 4 laptop, 1 smoke)")
    p.add_argument("--torch-profile", action="store_true", help="add torch.profiler top ops")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="ACT and REHEARSE budget of both variants (default: the profile's)")
    p.add_argument("--prefix-cache", type=int, default=32768,
                   help="the engine's prefix cache, cached ids (0: off)")
    a = p.parse_args(argv)
    random.seed(0)
    if a.quick:
        a.trajectories, a.turns, a.repeats, a.naive_every = 2, 2, 1, 1
    repeats = a.repeats or (1 if a.profile == "laptop" else 2)
    every = a.naive_every or (4 if a.profile == "laptop" else 1)
    payload = {"benchmark": "rollout_throughput", "command": command_line(
        "rollout_throughput.py", argv), "machine": machine_info()}
    payload |= run(a.profile, a.trajectories, a.turns, repeats, every, a.torch_profile, a.quick,
                   a.max_new_tokens, a.prefix_cache)
    path = write_json(a.out or default_out("rollout_throughput", a.profile, a.quick), payload)
    print(f"{path}: engine {payload['engine']['tokens_per_s']} tok/s, naive "
          f"{payload['naive']['tokens_per_s']} tok/s, ratio {payload['speedup_tokens_per_s']}")
    return payload


if __name__ == "__main__":
    main()
