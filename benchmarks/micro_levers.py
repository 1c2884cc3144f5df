"""Speed levers of the micro policy, each measured side by side in one run (ratios).

The drills profile's model shape (4.2M-parameter Qwen3, 4,096 ids) at random init, with its stop
id replaced by one it never samples, so that every variant decodes the same number of tokens:
timings do not depend on the weights, only on shapes.

==========================  ======================================================================
lever                       variants (A vs B), interleaved A B A B ... ``--repeats`` times
==========================  ======================================================================
``threads_generation``      ``HFGenerator.generate`` (16 prompts, the drills' REHEARSE budget) at
                            1 vs 2 torch threads
``threads_train``           one SFT-sized forward + backward (4 rows × 600 tokens) at 1 vs 2
                            threads
``decode_loop``             ``HFGenerator.generate`` vs a bare loop of the model's forward on a
                            static cache (greedy, same prompts, same outputs checked equal): the
                            share of a decode step that is HF ``generate``'s own work
``compact_decode``          the shipped micro base on the REHEARSE prompts of the gold calls of
                            the first train drills (``--rows`` prompts; greedy, the profile's
                            REHEARSE budget, grounded as in RL, prefix cache on):
                            ``HFGenerator(compact=False)`` (``model.generate``: a stopped row
                            decodes on as padding) vs ``compact=True`` (it leaves the batch);
                            same outputs checked equal, decode padding of each reported
``causal_rows``             the shipped micro base, one scripted GRPO batch (``train_step``'s
                            scripted policy on one BFCL base task: K = 4 trajectories of 3 turns,
                            ``--filler`` words added to each observation, the profile's KL
                            reference): the trainer's ``compute_loss(...).backward()`` with
                            ``causal_rows=False`` (TRL's layout and padding mask per bucket) vs
                            ``True`` (rows from column 0, no mask, SDPA's causal kernel); the
                            gradients' relative difference and the encoded tokens of each
``causal_sft``              the drills warm start's first ``--sft-steps`` SFT steps (its rows,
                            batch size and seed) from the shipped base, ``run_sft(causal=False)``
                            (TRL's padding mask) vs ``causal=True`` (batches padded at the end go
                            through the backbone without a mask); the losses of each
==========================  ======================================================================

Each lever reports the median seconds of A and of B and the median of the pairwise ratios A/B.

Usage::

    python benchmarks/micro_levers.py --repeats 3
    python benchmarks/micro_levers.py --only causal_rows --filler 100   # one lever, its own JSON
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see pipeline.py)

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import command_line, machine_info, write_json  # noqa: E402


def _model() -> tuple[Any, Any]:
    from envace_lite.config import get_config
    from envace_lite.models.load import load_tokenizer
    from envace_lite.models.micro import micro_model

    cfg = get_config("drills")
    tok = load_tokenizer(cfg)
    model = micro_model(cfg, tok)
    return model, tok


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4000, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def bare_decode(model: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy decoding of ``prompts`` (left-padded) with the model's forward on a
    ``StaticCache``: one prefill, then ``new - 1`` one-token forwards, no stop check."""
    import torch
    from transformers import StaticCache

    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((b, width), dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        att[r, width - len(p):] = 1
    out = []
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=width + new)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        o = model(input_ids=ids, attention_mask=att, position_ids=pos, past_key_values=cache,
                  use_cache=True, logits_to_keep=1)
        nxt = o.logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        last = pos[:, -1:]
        for s in range(new - 1):
            att = torch.cat([att, att.new_ones((b, 1))], 1)
            last = last + 1
            o = model(input_ids=nxt, attention_mask=att, position_ids=last, past_key_values=cache,
                      use_cache=True, cache_position=torch.tensor([width + s]))
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
    return torch.cat(out, 1).tolist()


def paired(a: Any, b: Any, repeats: int) -> dict[str, Any]:
    """Run ``a`` and ``b`` in turn ``repeats`` times (after one untimed round); medians and the
    median of the pairwise ratios a/b."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        a()
        ta.append(time.perf_counter() - t)
        t = time.perf_counter()
        b()
        tb.append(time.perf_counter() - t)
    return {"a_s": round(statistics.median(ta), 3), "b_s": round(statistics.median(tb), 3),
            "ratio_a_over_b": round(statistics.median(x / y for x, y in zip(ta, tb)), 3),
            "a_runs": [round(x, 3) for x in ta], "b_runs": [round(x, 3) for x in tb]}


def with_threads(n: int, fn: Any) -> Any:
    import torch

    def run() -> Any:
        old = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            return fn()
        finally:
            torch.set_num_threads(old)
    return run


def compact_lever(rows: int, repeats: int) -> dict[str, Any]:
    """The ``compact_decode`` lever (see the module docstring)."""
    from envace_lite.protocol.rehearse_prompt import rehearse_messages
    from envace_lite.config import get_config
    from envace_lite.llm.generation import HFGenerator, chat_ids, token_counter
    from envace_lite.models.load import load_policy
    from envace_lite.pipelines.fidelity import collect_pairs

    cfg = get_config("drills")
    model, tok = load_policy(cfg)
    suite, rc = cfg.grpo.suites[0], cfg.rollout
    pairs, _ = collect_pairs([suite], "train", rows, ("gold",), grounded=True)
    count = token_counter(tok)
    prompts = [chat_ids(tok, rehearse_messages(
        p.tools, p.grounding, p.history, p.call, count, rc.max_prompt_tokens,
        rc.rendering).messages) for p in pairs[:rows]]
    gens = {c: HFGenerator(model, tok, batch_size=rows, compact=c) for c in (False, True)}

    def run(compact: bool) -> Any:
        gens[compact].prefix_cache.clear()  # each call prefills alike
        return gens[compact].generate(prompts, "rehearse", rc.max_new_tokens_rehearse, 0.0, 1.0)

    same = [c.ids for c in run(False)] == [c.ids for c in run(True)]
    out = paired(lambda: run(False), lambda: run(True), repeats)
    for g in gens.values():  # one more call each, counted alone
        g.decode_padding = 0
    run(False)
    lens = [len(c.ids) for c in run(True)]
    return out | {"variants": "A: model.generate (compact=False), B: compact=True",
                  "same_greedy_ids": same, "suite": suite, "prompts": len(prompts),
                  "max_new_tokens": rc.max_new_tokens_rehearse, "output_ids": lens,
                  "decode_padding_per_call": {
                      "compact=False": gens[False].decode_padding,
                      "compact=True": gens[True].decode_padding}}


def causal_lever(repeats: int, filler: int, k: int = 4, turns: int = 3) -> dict[str, Any]:
    """The ``causal_rows`` lever (see the module docstring)."""
    import tempfile

    from benchmarks.common import bench_tasks
    from benchmarks.train_step import batch_tokens, fwd_bwd, make_trajectories
    from envace_lite.config import get_config
    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.models.load import load_policy
    from envace_lite.pipelines.train import grpo_args

    cfg = get_config("drills", {
        "rollout.max_turns": turns, "grpo.num_generations": k, "grpo.prompts_per_step": 1,
        "grpo.gradient_accumulation_steps": 1, "rollout.grounding_drop_p": 0.0,
        "rollout.max_prompt_tokens": 200000, "model.context_window": 200000,
        "rollout.max_new_tokens_act": 128, "rollout.max_new_tokens_rehearse": 128 + 4 * filler})
    model, tok = load_policy(cfg, train=True)
    task = bench_tasks(2)[1]  # BFCL base: its gold call replays as a valid call
    trajs = make_trajectories(task, tok, cfg, k, turns, filler)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = RoleWiseGRPOTrainer(model, tok, [task], cfg, grpo_args(cfg, tmp),
                                      rollout_fn=lambda ts, k_, step: trajs)
        trainer.current_gradient_accumulation_steps = 1
        batch = trainer._generate_and_score_completions([{"task_index": 0}] * k)
        grads, encoded = {}, {}

        def run(causal: bool) -> None:
            trainer.causal_rows = causal
            _, grads[causal] = fwd_bwd(trainer, model, batch)

        out = paired(lambda: run(False), lambda: run(True), repeats)
        for causal in (False, True):
            trainer.causal_rows = causal
            buckets = trainer.row_buckets(batch["prompt_mask"], batch["completion_mask"])
            encoded[causal] = batch_tokens(batch, buckets, contiguous=causal)["encoded"]
        rel = float((grads[True] - grads[False]).abs().max() / grads[False].norm())
    return out | {"variants": "A: causal_rows=False (TRL layout, padding mask), B: causal_rows=True",
                  "grad_rel_diff": rel, "grad_norm": float(grads[False].norm()),
                  "tokens": batch_tokens(batch)["tokens"],
                  "encoded_tokens": {"causal_rows=False": encoded[False],
                                     "causal_rows=True": encoded[True]},
                  "k": k, "turns": turns, "filler": filler, "beta": cfg.grpo.beta,
                  "rows": int((batch["row_role"] >= 0).sum())}


def causal_sft_lever(repeats: int, steps: int) -> dict[str, Any]:
    """The ``causal_sft`` lever (see the module docstring)."""
    import copy
    import tempfile

    from envace_lite.config import get_config
    from envace_lite.core.task_split import training_tasks
    from envace_lite.core.transcripts import build_transcripts
    from envace_lite.models.load import load_policy
    from envace_lite.pipelines.sft import run_sft, sft_rows

    cfg = get_config("drills", {"warmstart.max_steps": steps})
    w = cfg.warmstart
    base, tok = load_policy(cfg, train=True)
    ts = build_transcripts(training_tasks(cfg, "sft"), cfg, tok)
    rows, _ = sft_rows(ts, tok, w.max_length, w.token_budget, cfg.run.seed, w.act_share)
    losses: dict[bool, list[float]] = {}

    def run(causal: bool) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = run_sft(copy.deepcopy(base), tok, rows, cfg, Path(tmp), causal=causal)
        losses[causal] = [r["loss"] for r in out["log"]]

    out = paired(lambda: run(False), lambda: run(True), repeats)
    return out | {"variants": "A: run_sft(causal=False), B: run_sft(causal=True)",
                  "steps": steps, "batch_size": w.batch_size, "rows": len(rows),
                  "losses": {"causal=False": losses[False], "causal=True": losses[True]},
                  "loss_max_rel_diff": max(abs(x - y) / abs(y) for x, y in
                                           zip(losses[True], losses[False]))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=16, help="prompts per generate call")
    p.add_argument("--prompt", type=int, default=600, help="prompt tokens (first row)")
    p.add_argument("--new", type=int, default=64, help="tokens decoded per row")
    p.add_argument("--filler", type=int, default=100,
                   help="causal_rows: words added to each scripted observation")
    p.add_argument("--sft-steps", type=int, default=40, help="causal_sft: SFT steps per run")
    p.add_argument("--only", choices=["causal_rows", "causal_sft", "compact_decode"],
                   default=None,
                   help="measure this lever alone")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    from envace_lite.llm.generation import HFGenerator

    payload: dict[str, Any] = {"benchmark": "micro_levers",
                               "command": command_line("micro_levers.py", argv),
                               "machine": machine_info()}
    levers: dict[str, Any] = {}
    single = {"causal_rows": lambda: causal_lever(a.repeats, a.filler),
              "causal_sft": lambda: causal_sft_lever(a.repeats, a.sft_steps),
              "compact_decode": lambda: compact_lever(a.rows, a.repeats)}
    if a.only:
        levers[a.only] = single[a.only]()
        return _write(a, payload, levers, f"micro_levers_{a.only}.json")
    model, tok = _model()
    never = len(tok) - 1
    prompts = _prompts(a.rows, a.prompt)
    gen = HFGenerator(model, tok, seed=0, batch_size=a.rows, prefix_cache=0)
    gen.stop_ids = [never]

    def hf() -> Any:
        return gen.generate(prompts, "rehearse", a.new, 0.0, 1.0)

    levers["threads_generation"] = paired(with_threads(1, hf), with_threads(2, hf), a.repeats)
    levers["threads_generation"]["variants"] = "A: 1 thread, B: 2 threads"

    rows = torch.randint(3, 4000, (4, 600), generator=torch.Generator().manual_seed(1))

    def fwd_bwd() -> None:
        model.train()
        model(input_ids=rows, labels=rows).loss.backward()
        model.zero_grad(set_to_none=True)
        model.eval()

    levers["threads_train"] = paired(with_threads(1, fwd_bwd), with_threads(2, fwd_bwd),
                                     a.repeats)
    levers["threads_train"]["variants"] = "A: 1 thread, B: 2 threads"

    same = [c.ids for c in hf()] == [r[:a.new] for r in bare_decode(model, prompts, a.new)]
    levers["decode_loop"] = paired(hf, lambda: bare_decode(model, prompts, a.new), a.repeats)
    levers["decode_loop"] |= {"variants": "A: HFGenerator.generate, B: bare static-cache loop",
                              "same_greedy_ids": same}
    for name, fn in single.items():
        levers[name] = fn()
    return _write(a, payload, levers, "micro_levers.json")


def _write(a: Any, payload: dict[str, Any], levers: dict[str, Any], name: str) -> dict[str, Any]:
    """Add the setup and the levers to ``payload``, write it (``--out`` or results/``name``)."""
    import torch

    payload |= {"setup": {"rows": a.rows, "prompt_tokens_first_row": a.prompt,
                          "new_tokens": a.new, "repeats": a.repeats, "filler": a.filler,
                          "sft_steps": a.sft_steps,
                          "torch_threads_default": torch.get_num_threads()},
                "levers": levers}
    path = write_json(a.out or Path(__file__).parent / "results" / name, payload)
    print(path, {k: v["ratio_a_over_b"] for k, v in levers.items()})
    return payload


if __name__ == "__main__":
    main()
