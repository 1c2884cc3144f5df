"""Multi-process worker for tests/test_scaled.py, run under ``torchrun --nproc_per_node 2`` (gloo, CPU).

Modes::

    torchrun --nproc_per_node 2 tests/scaled_worker.py train OUT        # 2 GRPO steps via train()
    torchrun --nproc_per_node 2 tests/scaled_worker.py train-real OUT   # ... the model generating
    torchrun --nproc_per_node 2 tests/scaled_worker.py collectives OUT  # ranks finishing apart

``train`` runs the same ``envace_lite.pipelines.train.train`` that the notebooks and the CLI call, on the smoke
profile's tiny Qwen3, with a scripted policy on two copies of BFCL ``multi_turn_base_0``. It records
what each rank rolled out (task ids, per-output rewards and advantages, gathered onto rank 0 with
``all_gather_object``) in ``OUT/gathered.jsonl``, so the test can check that the ranks got disjoint
tasks and that the role baselines equal hand-computed values on the union.

``collectives`` runs ``rollout.rollout`` with ``rollout.sync_generate_calls`` on and off, rank 0's
trajectories stopping after one turn and rank 1's at the turn limit, through a generator that
performs a collective per call (as vLLM server mode does) and asserts that every rank is in the
same call; then it drives ``VLLMGenerator`` in server mode with a fake client on rank 0.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import qwen3_tokenizer
from envace_lite.types import ToolCall

TINY = {"model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 4,
        "model.intermediate_size": 64, "rollout.grounding_drop_p": 0.0}
GOOD = assistant_text([ToolCall("cd", {"folder": "document"})])
BAD = assistant_text([ToolCall("cd", {"folder": "nowhere"})])
RESULT = rehearsal_text('{"current_working_directory": "document"}')
STOP_EARLY = "[stop-early]"


def two_tasks(marker: str = "") -> list:
    """``multi_turn_base_0`` and a copy under another id (identical checklists and rewards)."""
    [base] = [t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_0"]
    copy = dataclasses.replace(base, id="multi_turn_base_0_copy")
    if marker:  # the copy's first user message carries a marker the scripted policy reacts to
        messages = [dict(m) for m in copy.messages]
        first = next(m for m in messages if m["role"] == "user")
        first["content"] = f"{marker} {first['content']}"
        copy = dataclasses.replace(copy, messages=messages)
    return [base, copy]


def scripted_policy(tok) -> ScriptedGenerator:
    """ACT: the gold call, then the wrong call (alternating per rollout), then 'All done.'."""
    calls = {"n": 0}

    def answer(role: str, prompt: list[int]) -> str:
        if role == "rehearse":
            return RESULT
        if "<tool_response>" in tok.decode(prompt):
            return "All done."
        calls["n"] += 1
        return GOOD if calls["n"] % 2 else BAD

    return ScriptedGenerator(answer, tok)


# ---------------------------------------------------------------------------------------------
def run_train(out: Path, real: bool = False) -> None:
    from envace_lite.core.grpo import RoleWiseGRPOTrainer
    from envace_lite.pipelines.train import train

    original = RoleWiseGRPOTrainer._generate_and_score_completions

    def recorded(self, inputs):
        batch = original(self, inputs)
        rec = self.last_record
        mine = {"rank": dist.get_rank(), "step": self.state.global_step,
                "tasks": sorted({t.task.id for t in rec.trajs}),
                "outputs": [[tid[1], role, float(r), bool(tr), float(a)] for tid, role, r, tr, a
                            in zip(rec.task_ids, rec.roles, rec.rewards.tolist(),
                                   rec.trained.tolist(), rec.advantages.tolist())],
                "rows": rec.rows, "pad_rows": rec.pad_rows, "batch_rows": int(batch[
                    "completion_ids"].shape[0])}
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            with (out / "gathered.jsonl").open("a") as f:
                f.write(json.dumps(everyone) + "\n")
        return batch

    RoleWiseGRPOTrainer._generate_and_score_completions = recorded
    cfg = get_config("smoke", {**TINY, "grpo.prompts_per_step": 2, "grpo.num_generations": 2,
                               "grpo.steps": 2, "grpo.save_every": 2})
    # train-real: the tiny model generates (HF generate; under ZeRO-3 on gathered weights), and
    # the ranks' trajectories end at different turns and lengths
    scripted = None if real else scripted_policy(qwen3_tokenizer())
    train(cfg, out, generator=scripted, tasks=two_tasks())


# ---------------------------------------------------------------------------------------------
class CollectiveCheck:
    """Wraps a generator; every call is a collective that checks all ranks are in the same call."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def generate(self, prompts, role, max_new_tokens, temperature, top_p):
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (len(self.calls), role))
        if len(set(everyone)) != 1:
            raise RuntimeError(f"ranks are in different generate calls: {everyone}")
        self.calls.append([role, len(prompts)])
        return self.inner.generate(prompts, role, max_new_tokens, temperature, top_p)


class Counting:
    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def generate(self, prompts, role, max_new_tokens, temperature, top_p):
        self.calls.append([role, len(prompts)])
        return self.inner.generate(prompts, role, max_new_tokens, temperature, top_p)


def finishing_policy(tok, early: bool) -> ScriptedGenerator:
    """``early``: a final answer at once (gate_closed after one turn); else a call every turn."""
    return ScriptedGenerator(lambda role, p: RESULT if role == "rehearse"
                             else ("All done." if early else GOOD), tok)


def run_rollout(out: Path) -> None:
    from accelerate import PartialState

    from envace_lite.core.rollout import rollout

    PartialState(cpu=True)  # the process group, from torchrun's environment (gloo on CPU)
    rank, tok = dist.get_rank(), qwen3_tokenizer()
    task = two_tasks()[rank]
    report = {}
    for sync in (True, False):
        cfg = get_config("smoke", {**TINY, "rollout.sync_generate_calls": sync})
        inner = finishing_policy(tok, early=rank == 0)
        gen = CollectiveCheck(inner) if sync else Counting(inner)
        trajs = rollout([task], gen, tok, cfg, k=2)
        report[f"sync={sync}"] = {"calls": gen.calls,
                                  "stops": [t.stop_reason for t in trajs],
                                  "turns": [t.turns for t in trajs]}
    (out / f"rollout_rank{rank}.json").write_text(json.dumps(report))


# ---------------------------------------------------------------------------------------------
class FakeClient:
    """Rank 0's stand-in for TRL's VLLMClient: answers from the prompt text, as a server would."""

    def __init__(self, tok) -> None:
        self.tok, self.requests = tok, []

    def generate(self, prompts, n, temperature, top_p, top_k, min_p, repetition_penalty,
                 max_tokens, logprobs):
        assert n == 1 and logprobs == 0
        self.requests.append(len(prompts))
        ids, lps = [], []
        for p in prompts:
            text = self.tok.decode(p)
            if "You are the environment that executes tool calls" in text:
                answer = RESULT
            elif STOP_EARLY in text:
                answer = "All done."
            else:
                answer = GOOD
            a = self.tok.encode(answer, add_special_tokens=False)
            if len(a) < max_tokens:  # vLLM keeps the stop id it stopped on
                a = a + [self.tok.convert_tokens_to_ids("<|im_end|>")]
            a = a[:max_tokens]
            ids.append(a)
            lps.append([[-0.5]] * len(a))
        return {"prompt_ids": prompts, "completion_ids": ids, "logprobs": lps,
                "logprob_token_ids": None}


class FakeVLLMGeneration:
    def __init__(self, state, client) -> None:
        self.mode, self.accelerator, self.vllm_client = "server", state, client


def run_vllm(out: Path) -> None:
    from accelerate import PartialState

    from envace_lite.core.rollout import rollout
    from envace_lite.llm.vllm_generation import VLLMGenerator

    state = PartialState(cpu=True)
    rank, tok = dist.get_rank(), qwen3_tokenizer()
    client = FakeClient(tok) if state.is_main_process else None
    gen = VLLMGenerator(FakeVLLMGeneration(state, client), tok)
    # 1. unequal prompt counts, one rank empty: each rank gets completions of its own prompts
    mine = [tok.encode(f"rank {rank} prompt {i}", add_special_tokens=False)
            for i in range(3 if rank == 0 else 0)]
    first = gen.generate(mine, "act", 16, 1.0, 1.0)
    # 2. a whole rollout: rank 0's task stops after one turn, rank 1's at the turn limit
    cfg = get_config("smoke", {**TINY, "rollout.generation_backend": "vllm_server"})
    task = two_tasks(marker=STOP_EARLY)[1 - rank]  # rank 0 gets the marked copy
    trajs = rollout([task], gen, tok, cfg, k=2)
    report = {"first": [[c.text, c.finish_reason, len(c.logprobs)] for c in first],
              "calls": gen.calls, "stops": [t.stop_reason for t in trajs],
              "turns": [t.turns for t in trajs],
              "logprobs_per_output": [[len(o.logprobs or []), len(o.ids)] for t in trajs
                                      for o in t.outputs],
              "requests": client.requests if client else None}
    (out / f"vllm_rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if mode in ("train", "train-real"):
        run_train(out, real=mode == "train-real")
    else:
        run_rollout(out)
        run_vllm(out)
    if dist.is_initialized():
        dist.barrier()
