"""Tests of envace_lite.pipelines.train: every mode trains, a SIGTERM-killed run resumes, end to end.

All runs use the smoke profile with a smaller tiny Qwen3 (hidden 32, one layer; the real Qwen3
vocabulary and architecture) on real BFCL train tasks. Non-zero advantages come from a scripted
policy whose two rollouts of ``multi_turn_base_0`` earn different checklist rewards: one calls
``cd(folder="document")`` (the gold call), the other ``cd(folder="nowhere")``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# the scripted two-rollout policy is shared with the torchrun worker of tests/test_scaled.py
from scaled_worker import scripted_policy

from envace_lite.config import get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.core.per_role_policy import REHEARSE_WEIGHTS
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.pipelines.resume import last_checkpoint
from envace_lite.pipelines.train import SIGTERM_EXIT, read_metrics, train, trim_metrics

TINY = {"model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 4,
        "model.intermediate_size": 64}
SHORT = {**TINY, "rollout.max_new_tokens_act": 8, "rollout.max_new_tokens_rehearse": 8}
"""The real tiny model's outputs are noise: 8 tokens of it are as good a test as 32."""
KEYS = {"step", "reward/mean", "reward/std", "act/baseline_mean", "rehearse/baseline_mean",
        "act/advantage_mean", "act/advantage_std", "rehearse/advantage_mean",
        "rehearse/advantage_std", "nonzero_adv_group_frac", "act/tokens", "rehearse/tokens",
        "turns_mean", "act/parse_error_rate", "rehearse/parse_error_rate", "violation_rate",
        "masked_frac", "grad_norm", "seconds"}


def base_0():
    return [t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_0"]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path)


def changed(saved: dict[str, torch.Tensor], init: dict[str, torch.Tensor]) -> bool:
    common = [k for k in saved if k in init]
    assert common, "no parameter names in common"
    return any(not torch.equal(saved[k], init[k]) for k in common)


@pytest.mark.parametrize("mode", ["shared", "per_role", "act_only", "act_only_real"])
def test_every_mode_trains_its_roles(tmp_path, mode):
    cfg = get_config("smoke", {**TINY, "grpo.mode": mode, "grpo.steps": 3, "grpo.save_every": 3,
                               "rollout.grounding_drop_p": 0.0})
    tok = qwen3_tokenizer()
    run = train(cfg, tmp_path, generator=scripted_policy(tok), tasks=base_0())
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert KEYS <= rows[0].keys()
    for r in rows:
        # the gold call earns cd's call item (0.25) and observation item (1/12) over 4 user turns
        assert r["reward/mean"] == pytest.approx((0.25 + 1 / 12) / 4 / 2)
        assert r["nonzero_adv_group_frac"] == 1.0 and r["grad_norm"] > 0
        assert r["act/advantage_std"] > 0 and r["act/tokens"] > 0
        trains_rehearse = mode in ("shared", "per_role")
        assert (r["rehearse/tokens"] > 0) == trains_rehearse
        assert (r["rehearse/baseline_mean"] is not None) == trains_rehearse
        assert r["tool_calls"] == 2 and r["real_calls"] == (2 if mode == "act_only_real" else 0)
    init = load_policy(cfg)[0].state_dict()
    ckpt = last_checkpoint(run)
    assert ckpt is not None and ckpt.name == "checkpoint-3"
    record = json.loads((ckpt / "envace_checkpoint.json").read_text())  # what it was trained under
    assert (record["profile"], record["model.kind"]) == ("smoke", "tiny")
    assert record["tokenizer"]["vocab_size"] == len(tok.get_vocab())
    assert not (run / ".envace.lock").exists()  # released when training ends
    act = weights(ckpt / "model.safetensors")
    assert changed(act, init)
    if mode == "per_role":
        rehearse = weights(ckpt / REHEARSE_WEIGHTS)
        assert changed(rehearse, init)
        assert any(not torch.equal(rehearse[k], act[k]) for k in rehearse if k in act)
    else:
        assert not (ckpt / REHEARSE_WEIGHTS).exists()


def test_metrics_trim_and_incomplete_checkpoints(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "x": i}) + "\n" for i, s in enumerate([1, 2, 3, 3, 4])))
    for step, complete in [(2, True), (3, True), (4, False)]:
        folder = tmp_path / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    assert last_checkpoint(tmp_path).name == "checkpoint-3"
    assert (tmp_path / "checkpoints" / "checkpoint-4").exists()  # clean=False leaves it
    assert last_checkpoint(tmp_path, clean=True).name == "checkpoint-3"
    assert not (tmp_path / "checkpoints" / "checkpoint-4").exists()
    # a kill after row 4 was written but before checkpoint-4 was complete: row 4 goes, and the
    # duplicated row 3 keeps its last version
    assert trim_metrics(tmp_path, 3) == 3
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 0), (2, 1), (3, 3)]


def test_sigterm_then_resume_gives_each_step_once(tmp_path):
    """The real tiny model through the real rollout engine, parser and BFCL tasks, via the CLI."""
    sets = [f"--set={k}={v}" for k, v in SHORT.items()]
    cmd = [sys.executable, "-m", "envace_lite.cli.main", "train", "--profile", "smoke", "--steps", "4",
           "--run-dir", str(tmp_path), *sets]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while len(read_metrics(tmp_path)) < 2:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no second step within 300 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == SIGTERM_EXIT, out[-3000:]
    stopped = len(read_metrics(tmp_path))
    assert stopped in (2, 3) and last_checkpoint(tmp_path).name == f"checkpoint-{stopped}"
    cfg = get_config("smoke", {**SHORT, "grpo.steps": 4})
    assert train(cfg, tmp_path) == tmp_path
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert last_checkpoint(tmp_path).name == "checkpoint-4"
    state = json.loads((last_checkpoint(tmp_path) / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert json.loads((tmp_path / "config.json").read_text())["grpo"]["steps"] == 4


def test_end_to_end_real_model_real_env(tmp_path):
    """act_only_real: the tiny model acts, the real BFCL adapter answers; one step."""
    cfg = get_config("smoke", {**SHORT, "grpo.mode": "act_only_real", "grpo.steps": 1,
                               "grpo.beta": 0.0})
    run = train(cfg, tmp_path, tasks=load_tasks("bfcl-base", "train")[:2])
    [row] = read_metrics(run)
    assert KEYS <= row.keys() and row["step"] == 1
    assert row["rehearse/tokens"] == 0 and row["act/tokens"] > 0
    assert row["real_calls"] == row["tool_calls"] and row["masked_frac"] == 0.0
    assert last_checkpoint(run).name == "checkpoint-1"
