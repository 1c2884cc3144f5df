"""Training-step cost: packed ACT rows vs one row per output, at 2, 5 and 10 turns.

Trajectories come from the real engine (``rollout.rollout``) on a real compact task (BFCL base)
with a scripted policy: ACT always calls the task's first gold tool, REHEARSE always answers a
fixed ``<execution_result>``. So every trajectory reaches exactly ``turns`` turns, and both
layouts train on the same tokens. The policy is the profile's real model (LoRA on ``laptop``).

Per layout, through the trainer's own code (``RoleWiseGRPOTrainer._generate_and_score_completions``
and ``compute_loss``):

* ``tokens``: real tokens of all rows (prompt + completion, REHEARSE rows included);
  ``encoded``: what the model computes, padding included (``bucketed``: after the trainer's
  length bucketing; ``padded``: the collated batch, ``rows × width``);
* ``fwd_bwd_s``: one ``compute_loss(...).backward()``; the layouts run interleaved;
* the gradient of the two layouts agree within ``1e-5`` relative (max abs difference / norm).
  On ``smoke`` the packed gradient is also checked against ``advantages.rolewise_grpo_loss``
  (the reference objective on one unpadded row per output) at the first turn count.

``grpo.beta`` is 0 here (no reference forward), so the figures are the policy's own cost.

Usage::

    python benchmarks/train_step.py --profile smoke
    python benchmarks/train_step.py --profile laptop --turns 2 5 10 --repeats 1
    python benchmarks/train_step.py --profile smoke --quick
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_config, command_line, default_out, machine_info, write_json

OBSERVATION = '{{"status": "ok", "result": {{"files": ["report_{j}.txt", "notes.md"], "count": 2}}}}'
"""The scripted REHEARSE observation of trajectory j (about 30 tokens)."""


def scripted_policy(tokenizer: Any, call: dict[str, Any], k: int, filler: int = 0) -> Any:
    """A ``ScriptedGenerator``: ACT always makes ``call``; REHEARSE answers ``OBSERVATION``.

    ``filler`` > 0 appends a ``"log"`` field of that many words to each observation (one token
    per word under Qwen's tokenizer, three under the micro one), so the ACT context grows by
    ``filler`` to ``3 × filler`` tokens per turn (``scaling.py``'s context axis).

    The engine sends the prompts of a turn in trajectory order, one REHEARSE prompt per
    trajectory here, so the j-th REHEARSE prompt of a call belongs to trajectory ``j mod k``.
    Its observation names j: trajectories differ, and so do their gradients (identical
    trajectories with rewards ±a would cancel to a zero gradient).
    """
    import itertools
    import json

    from envace_lite.protocol.rehearse_prompt import rehearsal_text
    from envace_lite.llm.scripted import ScriptedGenerator

    counter = itertools.count()

    def text(role: str, prompt: list[int]) -> str:
        if role == "rehearse":
            obs = OBSERVATION.format(j=next(counter) % k)
            if filler:
                obs = obs[:-1] + ', "log": "' + " ".join(["entry"] * filler) + '"}'
            return rehearsal_text(obs)
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return ScriptedGenerator(text, tokenizer)


def make_trajectories(task: Any, tokenizer: Any, cfg: Any, k: int, turns: int,
                      filler: int = 0) -> list[Any]:
    """``k`` scripted trajectories of exactly ``turns`` turns, scored with rewards 0, 1/k, ....

    Distinct rewards give non-zero advantages, so the gradient is not trivially zero.
    ``filler``: words added to each observation (``scripted_policy``).
    """
    from envace_lite.core.rollout import rollout

    gold = next(c for turn in task.gold_calls for c in turn)
    gen = scripted_policy(tokenizer, {"name": gold["name"], "arguments": gold["arguments"]}, k,
                          filler)
    trajs = rollout([task], gen, tokenizer, cfg, k=k)
    for i, t in enumerate(trajs):
        if t.turns != turns:
            raise RuntimeError(f"trajectory {i} stopped at {t.turns} turns ({t.stop_reason}); "
                               f"raise rollout.max_prompt_tokens for {turns} turns")
        t.reward = i / k
    return trajs


def batch_tokens(batch: dict[str, Any], buckets: list[list[int]] | None = None,
                 contiguous: bool = False) -> dict[str, int]:
    """Token counts of a collated trainer batch.

    Args:
        batch: ``collate_rows`` output: ``prompt_mask`` (B, P), ``completion_mask`` (B, C),
            ``tool_mask`` (B, C), ``row_role`` (B,); padding rows have ``row_role`` -1.
        buckets: row indices per forward (``RoleWiseGRPOTrainer.row_buckets``); None: one.
        contiguous: the buckets are in the trainer's ``causal_rows`` layout, where a forward's
            width is its longest row (prompt + completion) instead of its longest prompt plus
            its longest completion.

    Returns:
        ``rows`` (real rows), ``tokens`` (real prompt + completion tokens of the real rows),
        ``trained`` (tokens with a non-zero loss weight), ``padded`` (B × (P + C), the collated
        batch) and ``encoded`` (the sum over forwards of rows × trimmed width).
    """
    pm, cm = batch["prompt_mask"], batch["completion_mask"]
    real = batch["row_role"] >= 0
    b, width = pm.shape[0], pm.shape[1] + cm.shape[1]
    out = {"rows": int(real.sum()), "tokens": int(pm[real].sum() + cm[real].sum()),
           "trained": int((batch["tool_mask"] != 0).sum()), "padded": b * width}
    if buckets is None:
        out["encoded"] = b * width
    else:
        p_len, c_len = pm.sum(1), cm.sum(1)
        total = p_len + c_len
        out["encoded"] = sum(len(rows) * int(total[rows].max() if contiguous
                                             else p_len[rows].max() + c_len[rows].max())
                             for rows in buckets)
    return out


def flat_grad(model: Any) -> Any:
    """The trainable parameters' gradients as one vector (zeros where None)."""
    import torch

    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters() if p.requires_grad])


def fwd_bwd(trainer: Any, model: Any, batch: dict[str, Any]) -> tuple[float, Any]:
    """One ``compute_loss(...).backward()``: ``(seconds, flat gradient)``."""
    model.zero_grad()
    start = time.perf_counter()
    trainer.compute_loss(model, batch).backward()
    return time.perf_counter() - start, flat_grad(model)


def measure(profile: str, turns_list: list[int], k: int, repeats: int,
            check_reference: bool, quick: bool = False) -> dict[str, Any]:
    """Both layouts at each turn count; see the module docstring for the figures."""
    from benchmarks.common import QUICK, bench_tasks, policy
    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.pipelines.train import grpo_args

    task = bench_tasks(2, quick=quick)[1]  # BFCL base: its gold calls replay as valid calls
    results = []
    model = tok = None
    for turns in turns_list:
        cfg = bench_config(profile, {"rollout.max_turns": turns, "rollout.max_prompt_tokens": 60000,
                                     "grpo.num_generations": k, "grpo.prompts_per_step": 1,
                                     "grpo.beta": 0.0, "grpo.gradient_accumulation_steps": 1,
                                     "rollout.grounding_drop_p": 0.0,
                                     "rollout.max_new_tokens_act": 128,
                                     "rollout.max_new_tokens_rehearse": 128,
                                     **(QUICK if quick else {})})
        if model is None:
            model, tok = policy(cfg, train=True)
        trajs = make_trajectories(task, tok, cfg, k, turns)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = RoleWiseGRPOTrainer(model, tok, [task], cfg, grpo_args(cfg, tmp),
                                          rollout_fn=lambda ts, k_, step: trajs)
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train otherwise
            inputs = [{"task_index": 0}] * k
            batches = {"packed": trainer._generate_and_score_completions(inputs)}
            trainer.row_layout = "per_output"
            batches["per_output"] = trainer._generate_and_score_completions(inputs)
            trainer.row_layout = "packed"
            row = {"turns": turns, "k": k}
            # the same packed batch in one padded forward: the length bucketing's effect
            batches["packed_one_forward"] = batches["packed"]
            times: dict[str, list[float]] = {name: [] for name in batches}
            grads = {}
            if turns == turns_list[0]:  # warm-up: first-call allocations and thread start
                fwd_bwd(trainer, model, batches["packed"])
            for _ in range(repeats):
                for name, batch in batches.items():
                    trainer.bucket_rows = name != "packed_one_forward"
                    seconds, grads[name] = fwd_bwd(trainer, model, batch)
                    times[name].append(seconds)
            for name, batch in batches.items():
                trainer.bucket_rows = name != "packed_one_forward"
                buckets = trainer.row_buckets(batch["prompt_mask"], batch["completion_mask"])
                row[name] = batch_tokens(batch, buckets) | {
                    "fwd_bwd_s": round(min(times[name]), 3),
                    "fwd_bwd_s_all": [round(t, 3) for t in times[name]]}
            rel = float((grads["packed"] - grads["per_output"]).abs().max()
                        / grads["per_output"].norm())
            row["grad_rel_diff"] = rel
            row["grad_rel_diff_bucketing"] = float(
                (grads["packed"] - grads["packed_one_forward"]).abs().max()
                / grads["packed_one_forward"].norm())
            row["bucketing_fwd_bwd_ratio"] = round(
                row["packed"]["fwd_bwd_s"] / row["packed_one_forward"]["fwd_bwd_s"], 3)
            trainer.bucket_rows = True
            row["grad_norm"] = float(grads["packed"].norm())
            if check_reference and turns == turns_list[0]:  # by hand: one forward per output
                row["grad_rel_diff_reference"] = reference_check(trainer, model, trajs,
                                                                 grads["packed"])
            for key in ("tokens", "encoded"):
                row[f"{key}_ratio"] = round(row["packed"][key] / row["per_output"][key], 3)
            row["fwd_bwd_ratio"] = round(row["packed"]["fwd_bwd_s"]
                                         / row["per_output"]["fwd_bwd_s"], 3)
            results.append(row)
            print(f"turns {turns}: tokens packed/per_output {row['packed']['tokens']}/"
                  f"{row['per_output']['tokens']}, fwd+bwd {row['fwd_bwd_ratio']}, grad diff "
                  f"{rel:.2e}", flush=True)
    return {"rows": results, "setup": {
        "profile": profile, "model": cfg.model.name,
        "model_checkpoint": cfg.model.checkpoint or "base", "lora_r": cfg.model.lora_r,
        "task": f"{task.suite}/{task.id}", "k": k, "repeats": repeats, "beta": 0.0,
        "aggregation": cfg.grpo.aggregation, "policy": "scripted (engine rollout)",
        "fwd_bwd_s": "minimum over repeats"}}


def reference_check(trainer: Any, model: Any, trajs: list[Any], packed: Any) -> float:
    """Relative difference of the packed gradient and ``advantages.rolewise_grpo_loss``'s
    (one unpadded row per output; ``grpo.beta`` is 0 here)."""
    import torch

    from envace_lite.core.advantages import output_logps, rolewise_grpo_loss

    rec = trainer.last_record
    flat = [o for tr in trajs for o in tr.outputs]
    model.zero_grad()
    logps = [output_logps(model, o.prompt_ids, o.ids, trainer.temperature) if o.ids
             else torch.zeros(0, dtype=torch.float64) for o in flat]
    rolewise_grpo_loss(logps, rec.advantages, [o.role for o in flat], rec.trained,
                       aggregation=trainer.cfg.grpo.aggregation).backward()
    want = flat_grad(model)
    return float((packed - want).abs().max() / want.norm())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, measure, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="laptop", choices=["smoke", "laptop"])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="tiny size (the tests)")
    p.add_argument("--turns", type=int, nargs="+", default=[2, 5, 10])
    p.add_argument("--k", type=int, default=2, help="trajectories (one task)")
    p.add_argument("--repeats", type=int, default=None, help="default 3 smoke, 1 laptop")
    a = p.parse_args(argv)
    if a.quick:
        a.turns, a.repeats = [2], 1
    repeats = a.repeats or (3 if a.profile == "smoke" else 1)
    payload = {"benchmark": "train_step", "command": command_line("train_step.py", argv),
               "machine": machine_info()}
    payload |= measure(a.profile, a.turns, a.k, repeats, check_reference=a.profile == "smoke", quick=a.quick)
    path = write_json(a.out or default_out("train_step", a.profile, a.quick), payload)
    print(path)
    return payload


if __name__ == "__main__":
    main()
