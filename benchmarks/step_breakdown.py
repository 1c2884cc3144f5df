"""Step breakdown: where one GRPO step's wall time goes.

One real training step of the profile (its model, tasks, K, budgets; the trainer's own code):

==================  ============================================================================
bucket              what
==================  ============================================================================
generation          inside the generator's ``generate`` calls (ACT and REHEARSE)
reward              ``rewards.score_trajectories`` (the checklist judge)
reference_forward   the frozen policy's log-probs for the KL term (``grpo.beta`` > 0 only)
policy_fwd_bwd      ``compute_loss(...).backward()``
optimizer           ``optimizer.step()`` and ``zero_grad``
rest                everything else: prompt building, parsing, glue, advantages, rows, masks,
                    padding, metrics (``train.step_metrics``)
==================  ============================================================================

``rest_ms_per_output`` divides ``rest`` by the step's outputs (ACT turns + REHEARSE calls);
``rest_ms_per_row`` by its training rows. The ``*_cpu*`` figures repeat the split in process CPU
seconds (all threads), which other jobs on a shared CPU inflate far less than wall seconds. Target: ≤ 20 ms per output row on ``smoke``,
< 5 % of the step on ``laptop``.

``--scripted`` replaces the sampled policy by ``train_step.scripted_policy`` on one BFCL base
task (ACT always makes the task's first gold call, REHEARSE answers a fixed observation): every
trajectory reaches ``--max-turns`` turns, so a step has K × turns × 2 outputs and the fixed
per-step costs are spread over as many rows as a real multi-turn step. The random tiny model of
``smoke`` rarely emits a tool call, so without it a smoke step has one output per trajectory.

Usage::

    python benchmarks/step_breakdown.py --profile smoke --scripted --k 4 --max-turns 4
    python benchmarks/step_breakdown.py --profile laptop --steps 1
"""
from __future__ import annotations

import argparse
import sys
import tempfile
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


def one_step(trainer: Any, model: Any, inputs: list[dict[str, Any]], timers: dict[str, float]
             ) -> dict[str, Any]:
    """Run one step and return its buckets in seconds (``timers`` is filled by the hooks)."""
    from envace_lite.pipelines.train import step_metrics

    for key in list(timers):
        timers[key] = 0.0
    start, cpu0 = time.perf_counter(), time.process_time()
    batch = trainer._generate_and_score_completions(inputs)
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.compute_loss(model, batch).backward()
    fwd_bwd, fwd_bwd_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    optimizer, optimizer_cpu = time.perf_counter() - t0, time.process_time() - c0
    step_metrics(trainer.last_record)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu0
    rec = trainer.last_record
    outputs = sum(len(t.outputs) for t in rec.trajs)
    known = timers["generation"] + timers["reward"] + timers["reference_forward"]
    rest = total - known - fwd_bwd - optimizer
    # the same split in process CPU seconds: robust to other jobs' load on a shared CPU
    rest_cpu = (total_cpu - timers["generation_cpu"] - timers["reward_cpu"]
                - timers["reference_forward_cpu"] - fwd_bwd_cpu - optimizer_cpu)
    return {"total_s": round(total, 3), "generation_s": round(timers["generation"], 3),
            "reward_s": round(timers["reward"], 4),
            "reference_forward_s": round(timers["reference_forward"], 3),
            "policy_fwd_bwd_s": round(fwd_bwd, 3), "optimizer_s": round(optimizer, 4),
            "rest_s": round(rest, 4), "rest_share": round(rest / total, 4),
            "outputs": outputs, "rows": rec.rows,
            "rest_ms_per_output": round(1000 * rest / max(outputs, 1), 2),
            "rest_ms_per_row": round(1000 * rest / max(rec.rows, 1), 2),
            "total_cpu_s": round(total_cpu, 3), "rest_cpu_s": round(rest_cpu, 4),
            "rest_cpu_ms_per_output": round(1000 * rest_cpu / max(outputs, 1), 2),
            "rest_cpu_share": round(rest_cpu / max(total_cpu, 1e-9), 4),
            "generated_tokens": sum(len(o.ids) for t in rec.trajs for o in t.outputs),
            "turns_mean": round(sum(t.turns for t in rec.trajs) / len(rec.trajs), 2),
            # the tokens the step trains on: real (mask) and as padded in the batch
            "step_tokens": int(batch["prompt_mask"].sum() + batch["completion_mask"].sum()),
            "padded_tokens": int(batch["prompt_ids"].numel() + batch["completion_ids"].numel()),
            "completion_tokens": int(batch["completion_mask"].sum())}


def run(profile: str, steps: int, overrides: dict[str, Any], quick: bool = False,
        scripted: bool = False, filler: int = 0) -> dict[str, Any]:
    """``steps`` steps of the profile; the first is a warm-up, left out of ``mean``.

    Args:
        scripted: ``train_step.scripted_policy`` on one BFCL base task instead of sampling.
        filler: words added to each scripted observation (``scripted_policy``).
    """
    from envace_lite.llm.generation import HFGenerator
    from envace_lite.core.grpo import ROLLOUT_MODE, RoleWiseGRPOTrainer
    from envace_lite.core.rewards import score_trajectories
    from envace_lite.core.rollout import rollout
    from envace_lite.pipelines.train import grpo_args

    cfg = bench_config(profile, overrides)
    g = cfg.grpo
    from benchmarks.common import policy

    model, tok = policy(cfg, train=True)
    if scripted:
        from benchmarks.train_step import scripted_policy

        tasks = bench_tasks(2, quick=quick)[1:]  # BFCL base: its gold call replays as valid
        gold = next(c for turn in tasks[0].gold_calls for c in turn)
    else:
        tasks = bench_tasks(g.prompts_per_step, quick=quick)
    timers = {f"{b}{c}": 0.0 for b in ("generation", "reward", "reference_forward")
              for c in ("", "_cpu")}

    def rollout_fn(ts: list[Any], k: int, step: int) -> list[Any]:
        inner = (scripted_policy(tok, {"name": gold["name"], "arguments": gold["arguments"]}, k,
                                 filler)
                 if scripted else HFGenerator(model, tok, seed=step, batch_size=len(ts) * k))
        gen = CountingGenerator(inner)
        trajs = rollout(ts, gen, tok, cfg, k=k, mode=ROLLOUT_MODE[g.mode], seed=step)
        timers["generation"] += sum(c["seconds"] for c in gen.calls)
        timers["generation_cpu"] += sum(c["cpu_seconds"] for c in gen.calls)
        t0, c0 = time.perf_counter(), time.process_time()
        score_trajectories(trajs, judge="rule")
        timers["reward"] += time.perf_counter() - t0
        timers["reward_cpu"] += time.process_time() - c0
        return trajs

    with tempfile.TemporaryDirectory() as tmp:
        trainer = RoleWiseGRPOTrainer(model, tok, tasks, cfg, grpo_args(cfg, tmp),
                                      rollout_fn=rollout_fn)
        trainer.current_gradient_accumulation_steps = 1
        trainer.create_optimizer()
        ref = trainer._ref_logps

        def timed_ref(batch: dict[str, Any]) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            out = ref(batch)
            timers["reference_forward"] += time.perf_counter() - t0
            timers["reference_forward_cpu"] += time.process_time() - c0
            return out

        trainer._ref_logps = timed_ref
        inputs = [{"task_index": i} for i in range(len(tasks)) for _ in range(g.num_generations)]
        rows = [one_step(trainer, model, inputs, timers) for _ in range(steps)]
    measured = rows[1:] or rows
    mean = {key: round(sum(r[key] for r in measured) / len(measured), 4) for key in measured[0]}
    return {"steps": rows, "mean": mean, "warm_up_excluded": len(rows) > 1, "setup": {
        "profile": profile, "model": cfg.model.name,
        "model_checkpoint": cfg.model.checkpoint or "base", "tasks": [t.id for t in tasks],
        "k": g.num_generations, "max_turns": cfg.rollout.max_turns, "beta": g.beta,
        "max_new_tokens_act": cfg.rollout.max_new_tokens_act,
        "max_new_tokens_rehearse": cfg.rollout.max_new_tokens_rehearse,
        "lora_r": cfg.model.lora_r,
        "policy": "scripted (train_step.scripted_policy)" if scripted else "sampled"}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, measure, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="laptop", choices=["smoke", "laptop"])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="one short step (the tests)")
    p.add_argument("--steps", type=int, default=None, help="default 3 smoke, 1 laptop")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--k", type=int, default=None, help="trajectories per task (profile's)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="ACT and REHEARSE budget (default: the profile's)")
    p.add_argument("--scripted", action="store_true",
                   help="scripted policy on one task: every trajectory makes --max-turns turns")
    a = p.parse_args(argv)
    overrides: dict[str, Any] = {"rollout.max_turns": a.max_turns}
    if a.k:
        overrides["grpo.num_generations"] = a.k
    if a.max_new_tokens:
        overrides |= {"rollout.max_new_tokens_act": a.max_new_tokens,
                      "rollout.max_new_tokens_rehearse": a.max_new_tokens}
    if a.scripted:  # ScriptedGenerator cuts its texts to the budget: 128 keeps them whole
        overrides = {"grpo.prompts_per_step": 1, "rollout.grounding_drop_p": 0.0,
                     "rollout.max_prompt_tokens": 60000, "rollout.max_new_tokens_act": 128,
                     "rollout.max_new_tokens_rehearse": 128} | overrides
    if a.quick:
        from benchmarks.common import QUICK

        a.steps = 1
        overrides |= QUICK | ({"rollout.max_turns": 2} if a.scripted  # scripted texts: untrimmed
                              else {"rollout.max_turns": 1, "rollout.max_new_tokens_act": 4})
    steps = a.steps or (3 if a.profile == "smoke" else 1)
    payload = {"benchmark": "step_breakdown", "command": command_line("step_breakdown.py", argv),
               "machine": machine_info()}
    payload |= run(a.profile, steps, overrides, a.quick, a.scripted)
    path = write_json(a.out or default_out("step_breakdown", a.profile, a.quick), payload)
    m = payload["mean"]
    print(f"{path}: step {m['total_s']} s, rest {m['rest_ms_per_output']} ms/output "
          f"({100 * m['rest_share']:.1f} %)")
    return payload


if __name__ == "__main__":
    main()
