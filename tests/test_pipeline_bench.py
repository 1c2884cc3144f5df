"""benchmarks/pipeline.py's FLOP count, by hand (the run itself is a benchmark, never a test)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline import model_flops


def test_model_flops_of_the_drills_shape_by_hand():
    # the drills micro model: d 256, 4 layers, 4 heads of 64, 2 key/value heads, MLP 768, V 4096
    cfg = SimpleNamespace(hidden_size=256, num_hidden_layers=4, head_dim=64,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
                          vocab_size=4096)
    f = model_flops(cfg)
    # per layer: q 256*256 + k, v 256*128 each + o 256*256 + MLP 3*256*768 = 786,432 weights
    assert f["body"] == 2 * 4 * 786_432 == 6_291_456
    assert f["head"] == 2 * 256 * 4096 == 2_097_152
    # scores q.k and the weighted sum of v: 2 * 2 * 256 per key per layer, 4 layers
    assert f["attn_per_key"] == 4 * 4 * 256 == 4096


def test_without_drops_a_flag_and_its_values():
    from benchmarks.pipeline import _without

    argv = ["--seeds", "1", "2", "--workers", "2", "--set", "a=1", "--threads", "1"]
    assert _without(argv, "--seeds") == ["--workers", "2", "--set", "a=1", "--threads", "1"]
    assert _without(argv, "--set") == ["--seeds", "1", "2", "--workers", "2", "--threads", "1"]
    assert _without(argv, "--absent") == argv
    assert _without(argv, "--seeds", "--threads") == ["--workers", "2", "--set", "a=1"]


def test_run_seeds_runs_one_process_per_seed_and_records_a_failed_one(tmp_path, monkeypatch):
    """Each seed is its own ``pipeline.py --seed S --threads T`` with OMP_NUM_THREADS=T; a seed
    whose process fails is recorded with its code and log, and the batch is then not met."""
    import argparse
    import json
    import subprocess

    from benchmarks.pipeline import run_seeds

    calls = []
    real_run = subprocess.run

    def fake_run(cmd, **kw):
        if "--seed" not in cmd:  # not a seed's process (machine_info asks git for the commit)
            return real_run(cmd, **kw)
        calls.append((cmd, kw["env"]["OMP_NUM_THREADS"]))
        seed = int(cmd[cmd.index("--seed") + 1])
        if seed == 2:
            return SimpleNamespace(returncode=1, stdout="", stderr="boom")
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text(json.dumps({"full_seed": {"wall_s": 700.0, "met": True},
                                   "sft": {"steps": 696, "loss_first": 5.0, "loss_last": 0.6}}))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    a = argparse.Namespace(seeds=[1, 2, 3], workers=2, threads=0, profile="drills",
                           out=str(tmp_path / "batch.json"), keep=None)
    argv = ["--seeds", "1", "2", "3", "--workers", "2", "--steps", "36"]
    payload = run_seeds(a, argv)
    assert sorted(int(c[c.index("--seed") + 1]) for c, _ in calls) == [1, 2, 3]
    assert all(t == "1" and c[c.index("--threads") + 1] == "1" and "--seeds" not in c
               and c[c.index("--steps") + 1] == "36" for c, t in calls)
    rows = {r["seed"]: r for r in payload["seeds"]}
    assert rows[1]["full_seed"] == {"wall_s": 700.0, "met": True}
    assert rows[1]["sft"] == {"steps": 696, "loss_first": 5.0, "loss_last": 0.6}
    assert rows[2]["returncode"] == 1 and rows[2]["log_tail"] == "boom"
    assert payload["met"] is False and payload["target_s"] == 3600
    assert json.loads((tmp_path / "batch.json").read_text())["threads_per_worker"] == 1
