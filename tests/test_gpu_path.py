"""The ``gpu`` profile's own code path, on CPU, with a tiny stand-in for Qwen3-1.7B.

The stand-in is a random-weight ``Qwen3ForCausalLM`` (Qwen3's architecture family, tiny sizes)
saved with the real Qwen3 tokenizer and chat template (``models.qwen3_tokenizer``: the byte-level
BPE, the think and tool-call tokens at their ids, Qwen3's template) into a local folder that
``model.name`` points at, as a downloaded hub model would be. Everything else is the ``gpu``
profile's: the ``hub`` loader, bf16 weights with an fp32 LoRA adapter (r = 64 on q, k, v, o), the
``full`` rendering, its 1,024-token generation caps (``eval`` here uses short ones, for time) and
its generation batch size; only the device is CPU and the step is small (one task, K = 2, no
accumulation). It runs ``train`` (shared mode, one step), ``eval`` with parallel and sequential
rehearsal, and notebooks 02 to 05 through the series runner with ``model_dir`` (04 and 05 with
their classroom caps on output length). Gradient checkpointing is GPU-only in the
trainer's settings, so it is not exercised here (``benchmarks/gpu_workshop.py`` is).
"""
from __future__ import annotations

import json

import pytest
import torch

from envace_lite.config import get_config
from envace_lite.models.load import load_policy, qwen3_tokenizer, tiny_qwen3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-stand-in")
    tok = qwen3_tokenizer()
    model, tok = tiny_qwen3(get_config("smoke").model, seed=0, tokenizer=tok)
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _cfg(folder, **extra):
    return get_config("gpu", {"model.name": str(folder), "model.device": "cpu",
                              "grpo.prompts_per_step": 1, "grpo.num_generations": 2,
                              "grpo.gradient_accumulation_steps": 1, "grpo.steps": 1,
                              "eval.limit": 1, "eval.suites": ["bfcl-base"], **extra})


def test_the_stand_in_loads_through_the_gpu_profiles_loader(stand_in):
    cfg = _cfg(stand_in)
    assert (cfg.model.kind, cfg.rollout.rendering, cfg.model.dtype) == ("hub", "full", "bfloat16")
    model, tok = load_policy(cfg, train=True)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in dtypes if "lora_A" in n}
    assert targets == set(cfg.model.lora_target_modules)
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert tok.convert_tokens_to_ids("<think>") == 151667
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_train_one_shared_step_under_the_gpu_profile(stand_in, tmp_path):
    from envace_lite.pipelines.train import train

    run = train(_cfg(stand_in, **{"run.runs_root": str(tmp_path)}), run_dir=tmp_path / "run")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert (run / "checkpoints" / "checkpoint-1").is_dir()


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_eval_with_rehearsal_under_the_gpu_profile(stand_in, tmp_path, mode):
    from envace_lite.pipelines.evaluate import evaluate

    # the train test samples at the profile's 1,024-token caps; here short caps keep the N
    # attempts, FEEDBACK, MEMORY and the committed run of a random model within CI's time
    cfg = _cfg(stand_in, **{"rehearsal.mode": mode, "rehearsal.n": 2,
                            "rollout.max_new_tokens_act": 64, "rollout.max_new_tokens_rehearse": 64,
                            "rehearsal.max_new_tokens_feedback": 32,
                            "rehearsal.memory_max_tokens": 32})
    [row] = evaluate("", ["bfcl-base"], mode, cfg=cfg, out=tmp_path, seed=0)
    assert (row["rehearsal"], row["n"], row["suite"]) == (mode, 2, "bfcl-base")
    assert row["rehearsal_real_calls"] == 0  # rehearsal never executes a call


def test_notebooks_02_and_03_under_the_gpu_profile_on_the_stand_in(stand_in, tmp_path):
    """Notebooks 02 and 03 through papermill (the series runner) under ``gpu``, pointed at the
    stand-in by their ``model_dir`` parameter (CPU: ``model_folder`` sets ``model.device=auto``)."""
    import nbformat

    from envace_lite.course.series import run_series

    series = run_series("gpu", ["02", "03"], tmp_path / "series",
                        {"model_dir": str(stand_in)})
    meta = json.loads((series / "series.json").read_text())
    assert [s["status"] for s in meta["stages"]] == ["ok", "ok"]
    for stage in ("02_act_and_rehearse", "03_rolewise_advantages"):
        _assert_ran_the_gpu_profile(series / stage, stand_in)
        nb = nbformat.read(str(series / stage / f"{stage}.ipynb"), as_version=4)
        text = json.dumps([c.get("outputs", []) for c in nb.cells])
        assert str(tmp_path) not in text  # no machine path in the hand-out


@pytest.mark.parametrize("nb, stage, extra", [
    ("04", "04_training_with_trl", {"steps": 1, "prompts_per_step": 8, "num_generations": 2,
                                    "micro_sft_steps": 0, "new_tokens": 16}),
    ("05", "05_private_rehearsal", {"n_tasks": 1, "select_ns": "1", "max_turns": 1,
                                    "new_tokens": 16}),
])
def test_notebooks_04_and_05_under_the_gpu_profile_on_the_stand_in(stand_in, tmp_path, nb,
                                                                    stage, extra):
    """Notebooks 04 and 05 under ``gpu`` on the stand-in, with the notebooks' own classroom caps
    (``new_tokens``: 16-token REHEARSE outputs, ACT keeps 48). 04 runs 8 prompts x 2
    trajectories, since the gpu profile's 16 accumulation steps need a multiple of 16 rollouts,
    and skips its mode comparison, which trains the ``micro`` model, not the gpu path."""
    from envace_lite.course.series import run_series

    series = run_series("gpu", [nb], tmp_path / "series", {"model_dir": str(stand_in)} | extra)
    meta = json.loads((series / "series.json").read_text())
    assert [s["status"] for s in meta["stages"]] == ["ok"]
    _assert_ran_the_gpu_profile(series / stage, stand_in)
    if nb == "05":  # 05 records its run's config, caps included (04 records the profile's)
        cfg = json.loads((series / stage / "config.json").read_text())
        assert (cfg["rollout"]["max_new_tokens_rehearse"], cfg["rollout"]["max_new_tokens_act"],
                cfg["eval"]["max_turns"]) == (16, 48, 1)


def _assert_ran_the_gpu_profile(stage_dir, stand_in) -> None:
    """The stage's recorded config is the gpu profile's, on the stand-in, with full rendering."""
    cfg = json.loads((stage_dir / "config.json").read_text())
    assert (cfg["profile"], cfg["model"]["name"], cfg["rollout"]["rendering"]) == (
        "gpu", str(stand_in), "full")
