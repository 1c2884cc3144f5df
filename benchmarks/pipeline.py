"""One seed of the drills pipeline, stage by stage: warm start, role-wise GRPO, held-out points.

The run is the package's own ``pipelines.learning_curve.run_experiment`` (the ``drills`` profile: the shipped micro base,
SFT warm start, ``grpo.steps`` RL steps, held-out points after SFT and every ``--every`` steps),
with probes patched around the package's functions; nothing of the pipeline is re-implemented.

==================  ============================================================================
stage / bucket      what
==================  ============================================================================
base                loading the policy (``models.load.load_policy``: the shipped micro base)
sft                 ``pipelines.sft.warmstart`` (transcripts, rows, TRL ``SFTTrainer``, checkpoint)
rl                  ``pipelines.train.train``; per step (HF Trainer ``on_step_begin`` → ``on_step_end``):
  act_generation      ``HFGenerator.generate`` calls of role ``act``
  rehearse_generation ``HFGenerator.generate`` calls of role ``rehearse``
  reward              the checklist judge (``RoleWiseGRPOTrainer._score``)
  rollout_engine      the rest of the rollout: prompts, parsing, the environment, glue
  rows                advantages, rows and the collated batch (the rest of
                      ``_generate_and_score_completions``)
  forward_backward    ``training_step`` less generation: policy forward + backward
  optimizer           gradient clipping + ``optimizer.step``
  bookkeeping         the rest of the step: scheduler, ``zero_grad``, metrics, callbacks
heldout             ``learning_curve.heldout_point``: committed execution on test drills (greedy,
                    real environment) and the fidelity audit
==================  ============================================================================

Tokens are counted at the model's forward (a class-level wrapper of ``Qwen3ForCausalLM.forward``):
``positions`` is what the model computed (batch × columns, padding included), ``real`` the
attended ones, so ``padding = positions - real``. Generation also records prompt tokens (the
prompts handed to ``generate``), generated tokens (the completions, without the stop token) and
decode padding (rows kept in the batch after they stopped).

FLOPs are the matmul count of a dense decoder (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", Table 1): a forward costs ``2 N`` per position (N: the weights of the
attention projections, the MLP and, at the positions whose logits are computed, the tied LM head)
plus ``2 * n_layer * context * d_attn * 2`` for the attention scores and the weighted sum; a
training position costs 3 forwards. ``matmul_gflops`` is this machine's measured fp32 rate on a
``(4096 × 256) @ (256 × 768)`` product (the MLP's shape) at the run's torch thread count:
``utilisation = flops / seconds / matmul rate`` is the share of the physical limit a stage reaches.

``--steps``, ``--eval-limit`` and ``--sft-max-steps`` shrink the run; ``extrapolation`` then
scales each stage's measured rate to the profile's full size (36 RL steps, 3 held-out points on
120 test drills, the profile's SFT epochs) and says so.

Usage::

    python benchmarks/pipeline.py                                   # the full seed (~the profile)
    python benchmarks/pipeline.py --steps 4 --every 2 --eval-limit 12 --sft-max-steps 60
    python benchmarks/pipeline.py --seeds 1 2 3 4 5 --workers 2 --threads 1   # 5 seeds, both cores

With ``--background-heldout`` the held-out checks before the last one run in a second process
while training goes on; the probes see only this process, so the ``heldout`` stage then holds the
last point alone. At the full size the JSON's ``full_seed`` holds the measured wall time against the 15-minute
target. ``--seeds`` runs each seed as its own process of this script (``--workers`` at once, each
with ``--threads`` torch threads) and writes ``pipeline_<profile>_seeds.json``: every seed's wall
time, the whole batch's wall time against 60 minutes, and each seed's JSON beside it.
"""
from __future__ import annotations

import os

# before torch loads: spinning OpenMP threads slow a process many times over when another
# process is busy on the same cores (docs/instructors.md, "Pitfalls")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import command_line, machine_info, write_json  # noqa: E402

FULL = {"steps": 36, "points": 3, "eval_limit": 120}
"""The full seed the extrapolation targets: 36 RL steps, held-out points after SFT and at steps
18 and 36, on the first 120 test drills."""


def matmul_gflops(repeats: int = 20) -> float:
    """This machine's fp32 matmul rate in GFLOP/s: the median of ``repeats`` timed
    ``(4096 × 256) @ (256 × 768)`` products (2 m k n FLOPs each) at the current thread count."""
    import torch

    a, b = torch.randn(4096, 256), torch.randn(256, 768)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    times.sort()
    return 2 * 4096 * 256 * 768 / times[len(times) // 2] / 1e9


def model_flops(config: Any) -> dict[str, float]:
    """Per-position matmul FLOPs of a Qwen3 config: ``body`` (attention projections + MLP, all
    layers, forward), ``head`` (the LM head, forward), ``attn_per_key`` (scores and weighted sum,
    all layers, forward, per attended key)."""
    d, layers = config.hidden_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", d // config.num_attention_heads)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * config.intermediate_size
    return {"body": 2.0 * layers * per_layer, "head": 2.0 * d * config.vocab_size,
            "attn_per_key": 4.0 * layers * q}


class Probe:
    """Times and token counts by stage, from patches around the package's functions."""

    def __init__(self) -> None:
        self.stage = "setup"
        self.sub = ""
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.steps: list[dict[str, Any]] = []
        self.step: dict[str, Any] | None = None
        self.flops: dict[str, float] | None = None
        self.keep: Any = 0
        self._undo: list[tuple[Any, str, Any]] = []

    # ---- patching ----------------------------------------------------------------------------
    def patch(self, owner: Any, name: str, wrapper: Any) -> None:
        """Replace ``owner.name`` by ``wrapper(original)`` until ``restore``."""
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def key(self) -> str:
        return f"{self.stage}/{self.sub}" if self.sub else self.stage

    def add_step(self, bucket: str, seconds: float) -> None:
        if self.step is not None:
            self.step[bucket] = self.step.get(bucket, 0.0) + seconds

    @contextlib.contextmanager
    def sub_stage(self, name: str) -> Any:
        old, self.sub = self.sub, name
        try:
            yield
        finally:
            self.sub = old

    # ---- the probes --------------------------------------------------------------------------
    def install(self) -> None:
        import torch
        from transformers import Qwen3ForCausalLM, Qwen3Model
        from transformers.trainer_callback import CallbackHandler

        from envace_lite.core.grpo import RoleWiseGRPOTrainer
        from envace_lite.llm.generation import HFGenerator
        from envace_lite.pipelines import learning_curve, sft
        from envace_lite.pipelines import train as train_mod

        probe = self

        def outer(orig: Any) -> Any:  # the LM: remembers how many positions get logits
            def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
                old, probe.keep = probe.keep, kwargs.get("logits_to_keep", 0)
                try:
                    return orig(model, *args, **kwargs)
                finally:
                    probe.keep = old
            return wrapped

        def backbone(orig: Any) -> Any:  # the decoder: every forward, TRL's fused head included
            def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
                ids = kwargs.get("input_ids", args[0] if args else None)
                if ids is not None and ids.dim() == 2:
                    if probe.flops is None:
                        probe.flops = model_flops(model.config)
                    mask = kwargs.get("attention_mask")
                    cols = ids.shape[1]
                    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
                        real, keys = int(mask[:, -cols:].sum()), mask.shape[1]
                    else:  # generate passes prepared (per layer type) masks: no padding count
                        pos = kwargs.get("cache_position")
                        real = ids.numel()
                        keys = int(pos[-1]) + 1 if isinstance(pos, torch.Tensor) else cols
                    keep = kwargs.get("logits_to_keep") or probe.keep or cols
                    keep = min(keep, cols) if isinstance(keep, int) else cols
                    train = torch.is_grad_enabled() and model.training
                    f = probe.flops
                    # causal: position i of the last ``cols`` attends keys - cols + 1 + i keys
                    fwd = (ids.numel() * (f["body"] + f["attn_per_key"] * (keys - (cols - 1) / 2))
                           + ids.shape[0] * keep * f["head"])
                    t = probe.tokens[probe.key()]
                    t["positions"] += ids.numel()
                    t["real"] += real
                    t["flops"] += fwd * (3 if train else 1)
                return orig(model, *args, **kwargs)
            return wrapped

        self.patch(Qwen3ForCausalLM, "forward", outer)
        self.patch(Qwen3Model, "forward", backbone)

        def generate(orig: Any) -> Any:
            def wrapped(gen: Any, prompts: list[list[int]], *args: Any, **kwargs: Any) -> Any:
                role = kwargs.get("role", args[0] if args else "unknown")
                with probe.sub_stage(f"{role}_generation"):
                    t0, padding_before = time.perf_counter(), gen.decode_padding
                    out = orig(gen, prompts, *args, **kwargs)
                    dt = time.perf_counter() - t0
                    t = probe.tokens[probe.key()]
                    t["calls"] += 1
                    t["prompt_tokens"] += sum(len(p) for p in prompts)
                    t["generated_tokens"] += sum(len(c.ids) for c in out)
                    # rows decoded after they stopped (``model.generate``; none when compact)
                    t["decode_padding"] += gen.decode_padding - padding_before
                    probe.seconds[probe.key()] += dt
                probe.add_step(f"{role}_generation", dt)
                return out
            return wrapped

        self.patch(HFGenerator, "generate", generate)

        def timed(bucket: str) -> Any:
            def wrapper(orig: Any) -> Any:
                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        probe.add_step(bucket, time.perf_counter() - t0)
                return wrapped
            return wrapper

        self.patch(RoleWiseGRPOTrainer, "_score", timed("reward"))
        self.patch(RoleWiseGRPOTrainer, "_clip_grad_norm", timed("optimizer"))

        def gen_and_score(orig: Any) -> Any:
            def wrapped(trainer: Any, inputs: Any) -> Any:
                t0 = time.perf_counter()
                batch = orig(trainer, inputs)
                dt = time.perf_counter() - t0
                rec = trainer.last_record
                probe.add_step("generate_and_score", dt)
                probe.add_step("rollout", rec.rollout_seconds)
                if probe.step is not None:
                    cm = batch["completion_mask"]
                    weight = batch.get("tool_mask", cm)
                    probe.step["rows"] = rec.rows
                    probe.step["pad_rows"] = rec.pad_rows
                    probe.step["trained_tokens"] = int(((weight > 0) & (cm > 0)).sum())
                    probe.step["row_tokens"] = int(batch["prompt_mask"].sum() + cm.sum())
                    probe.step["batch_cells"] = int(batch["prompt_mask"].numel() + cm.numel())
                    probe.step["reward_mean"] = float(rec.rewards.mean()) if len(rec.rewards) \
                        else None
                    probe.step["outputs"] = sum(len(t.outputs) for t in rec.trajs)
                return batch
            return wrapped

        self.patch(RoleWiseGRPOTrainer, "_generate_and_score_completions", gen_and_score)
        self.patch(RoleWiseGRPOTrainer, "training_step", timed("training_step"))

        def step_begin(orig: Any) -> Any:
            def wrapped(handler: Any, *args: Any, **kwargs: Any) -> Any:
                if probe.stage == "rl":
                    probe.step = {"t0": time.perf_counter()}
                return orig(handler, *args, **kwargs)
            return wrapped

        def step_end(orig: Any) -> Any:
            def wrapped(handler: Any, *args: Any, **kwargs: Any) -> Any:
                out = orig(handler, *args, **kwargs)
                if probe.stage == "rl" and probe.step is not None:
                    s = probe.step
                    s["total"] = time.perf_counter() - s.pop("t0")
                    probe.steps.append(s)
                    probe.step = None
                return out
            return wrapped

        def pre_opt(orig: Any) -> Any:
            def wrapped(handler: Any, *args: Any, **kwargs: Any) -> Any:
                if probe.step is not None:
                    probe.step["_opt0"] = time.perf_counter()
                return orig(handler, *args, **kwargs)
            return wrapped

        def post_opt(orig: Any) -> Any:
            def wrapped(handler: Any, *args: Any, **kwargs: Any) -> Any:
                if probe.step is not None and "_opt0" in probe.step:
                    probe.add_step("optimizer", time.perf_counter() - probe.step.pop("_opt0"))
                return orig(handler, *args, **kwargs)
            return wrapped

        self.patch(CallbackHandler, "on_step_begin", step_begin)
        self.patch(CallbackHandler, "on_step_end", step_end)
        self.patch(CallbackHandler, "on_pre_optimizer_step", pre_opt)
        self.patch(CallbackHandler, "on_optimizer_step", post_opt)

        def staged(stage: str) -> Any:
            def wrapper(orig: Any) -> Any:
                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    old, probe.stage = probe.stage, stage
                    t0 = time.perf_counter()
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        probe.seconds[stage] += time.perf_counter() - t0
                        probe.tokens[stage]["calls"] += 1
                        probe.stage = old
                return wrapped
            return wrapper

        self.patch(sft, "warmstart", staged("sft"))
        self.patch(train_mod, "train", staged("rl"))
        self.patch(learning_curve, "heldout_point", staged("heldout"))

    # ---- the report --------------------------------------------------------------------------
    def rl_steps(self) -> list[dict[str, Any]]:
        """Per RL step, each bucket in seconds (see the module docstring)."""
        rows = []
        for s in self.steps:
            act, reh = s.get("act_generation", 0.0), s.get("rehearse_generation", 0.0)
            rollout, reward = s.get("rollout", 0.0), s.get("reward", 0.0)
            gas, ts = s.get("generate_and_score", 0.0), s.get("training_step", 0.0)
            opt = s.get("optimizer", 0.0)
            row = {"total_s": s["total"], "act_generation_s": act, "rehearse_generation_s": reh,
                   "reward_s": reward, "rollout_engine_s": rollout - act - reh - reward,
                   "rows_s": gas - rollout, "forward_backward_s": ts - gas, "optimizer_s": opt}
            row["bookkeeping_s"] = s["total"] - sum(v for k, v in row.items() if k != "total_s")
            row = {k: round(v, 3) for k, v in row.items()}
            row |= {k: s.get(k) for k in ("outputs", "rows", "pad_rows", "trained_tokens",
                                          "row_tokens", "batch_cells", "reward_mean")}
            rows.append(row)
        return rows


def stage_table(probe: Probe, gflops: float) -> dict[str, Any]:
    """Per stage and sub-stage: seconds, tokens, FLOPs, throughput and utilisation."""
    out = {}
    for key in sorted(set(probe.tokens) | set(probe.seconds)):
        t = dict(probe.tokens.get(key, {}))
        secs = probe.seconds.get(key)
        row: dict[str, Any] = {"seconds": round(secs, 2) if secs is not None else None}
        row |= {k: int(v) if k != "flops" else v for k, v in t.items()}
        if "positions" in t:
            row["padding"] = int(t["positions"] - t["real"])
        if secs and t.get("flops"):
            row["gflops_per_s"] = round(t["flops"] / secs / 1e9, 3)
            row["utilisation"] = round(t["flops"] / secs / 1e9 / gflops, 4)
        if secs and t.get("generated_tokens"):
            row["generated_tokens_per_s"] = round(t["generated_tokens"] / secs, 1)
        out[key] = row
    return out


def extrapolate(summary: dict[str, Any], steps: list[dict[str, Any]], stages: dict[str, Any],
                cfg: Any, eval_limit: int, sft_steps_run: int, sft_steps_full: int
                ) -> dict[str, Any]:
    """Each stage at the full size (``FULL``), from its measured rate in this run."""
    sft_s = stages.get("sft", {}).get("seconds") or 0.0
    rl = [s["total_s"] for s in steps[1:]] or [s["total_s"] for s in steps]
    step_mean = sum(rl) / len(rl) if rl else 0.0
    held = [p for p in summary.get("points", [])]
    per_task = (sum(p["seconds"] for p in held) / max(1, sum(p["tasks"] for p in held))
                if held else 0.0)
    sft_full = sft_s * sft_steps_full / max(1, sft_steps_run)
    est = {"sft_s": round(sft_full, 1), "rl_s": round(step_mean * FULL["steps"], 1),
           "heldout_s": round(per_task * FULL["eval_limit"] * FULL["points"], 1)}
    est["total_s"] = round(sum(est.values()), 1)
    est["target_s"] = 15 * 60
    est["met"] = est["total_s"] <= est["target_s"]
    est["method"] = (f"SFT seconds × {sft_steps_full}/{sft_steps_run} optimizer steps; mean RL "
                     f"step (first step left out when there are more) × {FULL['steps']}; held-out "
                     f"seconds per test drill × {FULL['eval_limit']} drills × {FULL['points']} "
                     "points. RL steps of a longer run may change length as the policy learns.")
    return est


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, run one seed under the probes, write the JSON; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="drills")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=FULL["steps"], help="RL steps")
    p.add_argument("--every", type=int, default=18, help="a held-out point every N RL steps")
    p.add_argument("--eval-limit", type=int, default=FULL["eval_limit"],
                   help="test drills per held-out point")
    p.add_argument("--sft-max-steps", type=int, default=0,
                   help="stop SFT after N optimizer steps (0: the profile's epochs)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override (repeatable)")
    p.add_argument("--out", default=None, help="the JSON (default benchmarks/results/"
                   "pipeline_<profile>.json)")
    p.add_argument("--keep", default=None, help="keep the run folder here (default: a temp dir)")
    p.add_argument("--background-heldout", action="store_true",
                   help="held-out checks before the last one in a second process, while "
                   "training goes on (run_experiment(background_heldout=True))")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run these seeds, each in its own process of this script")
    p.add_argument("--workers", type=int, default=2, help="with --seeds: processes at once")
    a = p.parse_args(argv)
    if a.seeds:
        return run_seeds(a, argv or sys.argv[1:])

    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from envace_lite.config import get_config
    from envace_lite.pipelines.learning_curve import run_experiment

    overrides: dict[str, Any] = {"grpo.steps": a.steps, "run.seed": a.seed,
                                 "eval.limit": a.eval_limit}
    if a.sft_max_steps:
        overrides["warmstart.max_steps"] = a.sft_max_steps
    for item in a.set:
        k, _, v = item.partition("=")
        try:
            overrides[k] = json.loads(v)
        except json.JSONDecodeError:
            overrides[k] = v
    cfg = get_config(a.profile, overrides)
    payload: dict[str, Any] = {"benchmark": "pipeline", "command": command_line("pipeline.py", argv),
                               "machine": machine_info()}
    gflops = matmul_gflops()
    payload["matmul_gflops"] = round(gflops, 2)
    probe = Probe()
    probe.install()
    start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            folder = a.keep or stack.enter_context(tempfile.TemporaryDirectory())
            from envace_lite.models.load import load_policy

            t0 = time.perf_counter()
            load_policy(cfg)
            probe.seconds["base"] = time.perf_counter() - t0
            summary = run_experiment(cfg, folder, heldout_every=a.every, before_sft=False,
                                     background_heldout=a.background_heldout)
            ws = json.loads((Path(folder) / "warmstart" / "summary.json").read_text())
    finally:
        probe.restore()
    wall = time.perf_counter() - start
    stages = stage_table(probe, gflops)
    steps = probe.rl_steps()
    sft = ws.get("sft", {})
    rows = ws.get("rows", {})
    w = cfg.warmstart
    n_rows = rows.get("rows_kept") or 0
    sft_full = math.ceil(n_rows / w.batch_size) * math.ceil(w.epochs) if n_rows else 0
    payload |= {
        "setup": {"profile": a.profile, "seed": a.seed, "mode": cfg.grpo.mode,
                  "rl_steps": a.steps, "heldout_every": a.every, "eval_limit": a.eval_limit,
                  "sft_max_steps": a.sft_max_steps, "background_heldout": a.background_heldout,
                  "k": cfg.grpo.num_generations,
                  "prompts_per_step": cfg.grpo.prompts_per_step,
                  "torch_threads": torch.get_num_threads(),
                  "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "overrides": overrides},
        "wall_s": round(wall, 1), "stages": stages,
        "sft": {k: sft.get(k) for k in ("steps", "seconds", "loss_first", "loss_last")}
        | {"rows": rows},
        "rl_steps": steps,
        "heldout": [{k: pt.get(k) for k in ("stage", "step", "committed_reward", "tasks",
                                            "tool_call_share", "seconds")}
                    for pt in summary["points"]],
        "experiment_seconds": summary["seconds"],
    }
    if steps:
        keys = [k for k in steps[0] if k.endswith("_s")]
        body = steps[1:] or steps
        payload["rl_step_mean"] = {k: round(sum(s[k] for s in body) / len(body), 3) for k in keys}
    full = (a.steps, a.eval_limit, a.every, a.sft_max_steps) == (
        FULL["steps"], FULL["eval_limit"], FULL["steps"] // 2, 0)
    if full:  # the measured seed against the target, no extrapolation needed
        payload["full_seed"] = {"wall_s": payload["wall_s"], "target_s": 15 * 60,
                                "met": payload["wall_s"] <= 15 * 60}
    payload["extrapolation"] = extrapolate(summary, steps, stages, cfg, a.eval_limit,
                                           sft.get("steps") or 0, sft_full)
    path = write_json(a.out or Path(__file__).parent / "results" / f"pipeline_{a.profile}.json",
                      payload)
    e = payload["extrapolation"]
    print(f"{path}: wall {payload['wall_s']} s; full seed ≈ {e['total_s']} s "
          f"(SFT {e['sft_s']}, RL {e['rl_s']}, held-out {e['heldout_s']}); "
          f"15-minute target {'met' if e['met'] else 'not met'}")
    return payload


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less each of ``flags`` and the values that follow it."""
    out, skip = [], False
    for x in argv:
        if x.startswith("--"):
            skip = x in flags
        if not skip:
            out.append(x)
    return out


def run_seeds(a: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run ``a.seeds``, each as ``pipeline.py --seed S`` in a process of its own, ``a.workers`` at
    a time, and write the batch's JSON.

    Each process gets ``--threads a.threads`` (1 when 0) and ``OMP_NUM_THREADS`` to match, so
    two workers on two cores do not oversubscribe them. A seed whose process fails is recorded
    with its return code and the tail of its log; the others still run.

    Returns:
        The payload: ``seeds`` (per seed: ``seed``, ``returncode``, ``wall_s``, ``json``, and the
        seed's ``full_seed`` or ``extrapolation``), ``wall_s`` of the whole batch, ``target_s``
        3,600 and ``met``.
    """
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    threads = a.threads or 1
    base = _without(argv, "--seeds", "--workers", "--out", "--keep", "--threads")
    out_dir = Path(a.out).parent if a.out else Path(__file__).parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(seed: int) -> dict[str, Any]:
        js = out_dir / f"pipeline_{a.profile}_s{seed}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *base, "--seed", str(seed),
               "--threads", str(threads), "--out", str(js)]
        if a.keep:
            cmd += ["--keep", str(Path(a.keep) / f"s{seed}")]
        env = os.environ | {"OMP_NUM_THREADS": str(threads)}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        row: dict[str, Any] = {"seed": seed, "returncode": proc.returncode,
                               "wall_s": round(time.perf_counter() - t0, 1), "json": js.name}
        if proc.returncode == 0 and js.exists():
            got = json.loads(js.read_text())
            row["full_seed"] = got.get("full_seed")
            row["extrapolation"] = got.get("extrapolation")
            row["heldout"] = got.get("heldout")
            row["sft"] = {k: got.get("sft", {}).get(k) for k in ("steps", "loss_first", "loss_last")}
        else:
            row["log_tail"] = (proc.stdout + proc.stderr)[-2000:]
        print(f"seed {seed}: rc {proc.returncode}, {row['wall_s']} s", flush=True)
        return row

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, a.workers)) as pool:
        rows = list(pool.map(one, a.seeds))
    wall = round(time.perf_counter() - start, 1)
    payload = {"benchmark": "pipeline_seeds", "command": command_line("pipeline.py", argv),
               "machine": machine_info(), "workers": a.workers, "threads_per_worker": threads,
               "seeds": rows, "wall_s": wall, "target_s": 60 * 60,
               "met": wall <= 3600 and all(r["returncode"] == 0 for r in rows)}
    path = write_json(a.out or out_dir / f"pipeline_{a.profile}_seeds.json", payload)
    print(f"{path}: {len(rows)} seeds in {wall} s with {a.workers} workers; 60-minute target "
          f"{'met' if payload['met'] else 'not met'}")
    return payload


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
