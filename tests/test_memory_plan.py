"""The one-GPU memory plan (``models.memory``) against hand-computed values, and the GPU
profiles against the plan's choices."""
from __future__ import annotations

from pathlib import Path

from envace_lite.config import get_config
from envace_lite.models.memory import (
    GIB,
    QWEN3,
    SETTINGS,
    kv_bytes_per_token,
    lora_parameters,
    plan,
    plan_table,
    setting_plan,
    trajectory_activation_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
Q17 = QWEN3["Qwen/Qwen3-1.7B"]


def test_shapes_by_hand():
    # Qwen3-1.7B: embedding 151936 x 2048 (tied); per layer q 2048x2048, k and v 2048x1024,
    # o 2048x2048, MLP 3 x 2048x6144, norms 2 x 2048 + 2 x 128; final norm 2048
    per_layer = 2048 * 2048 * 2 + 2048 * 1024 * 2 + 3 * 2048 * 6144 + 2 * 2048 + 2 * 128
    assert Q17.parameters() == 151936 * 2048 + 28 * per_layer + 2048 == 1_720_574_976
    # LoRA r=64 on q, k, v, o: 64 x (2048+2048) + 2 x 64 x (2048+1024) + 64 x (2048+2048) per layer
    assert lora_parameters(Q17, 64, ["q_proj", "k_proj", "v_proj", "o_proj"]) == 28 * 917_504
    assert lora_parameters(Q17, 0, ["q_proj"]) == 0
    assert kv_bytes_per_token(Q17, 2) == 2 * 28 * 8 * 128 * 2 == 114_688


def test_one_trajectory_by_hand():
    # rows of 12000 + 1024 tokens; 1 ACT row + 10 REHEARSE rows; h_0 of 4386 tokens
    a = trajectory_activation_bytes(Q17, dtype_bytes=2, prompt_tokens=4386, tool_calls=10,
                                    max_prompt_tokens=12000, max_new_tokens=1024)
    assert a["tokens"] == 11 * 13024
    assert a["completion_tokens"] == 13024 - 4386 + 10 * 1024 == 18878
    assert a["checkpoints"] == 11 * 13024 * 28 * 2048 * 2
    assert a["logits"] == 18878 * 151936 * 3 * 2
    # one layer: 3 x 2048 + 2 x 2048 + 2 x 1024 + 4 x 6144 = 36864 elements per token
    assert a["recompute"] == 13024 * 36864 * 2


def test_plan_chooses_the_smallest_accumulation_that_fits():
    p80 = plan(Q17, gpu_gib=80, prompt_tokens=4386, tool_calls=10)
    per_traj = trajectory_activation_bytes(Q17, dtype_bytes=2, prompt_tokens=4386, tool_calls=10,
                                           max_prompt_tokens=12000, max_new_tokens=1024)["total"]
    static = Q17.parameters() * 2 + lora_parameters(Q17, 64, ["q_proj", "k_proj", "v_proj",
                                                              "o_proj"]) * 16
    room = 0.9 * 80 * GIB - static
    assert 2 * per_traj <= room < 4 * per_traj  # two trajectories fit, four do not
    assert p80["gradient_accumulation_steps"] == 16
    # accumulation 1 would put all 32 trajectories through one backward: about 1 TiB
    assert 32 * per_traj / GIB > 1000
    assert plan(Q17, gpu_gib=40, prompt_tokens=4386, tool_calls=10)[
        "gradient_accumulation_steps"] == 32
    assert plan(Q17, gpu_gib=8, prompt_tokens=4386, tool_calls=10)["fits"] is False


def test_the_gpu_profiles_use_the_plans_choices():
    for profile, setting in (("gpu", SETTINGS[0]), ("colab", SETTINGS[3])):
        cfg = get_config(profile)
        worst = [setting_plan(setting, s) for s in ("bfcl-base", "tau2-telecom")]
        assert cfg.grpo.gradient_accumulation_steps == max(
            p["gradient_accumulation_steps"] for p in worst)
        assert cfg.rollout.generation_batch_size == min(p["generation_batch_size"] for p in worst)
        assert cfg.model.name == setting["model"] and cfg.model.dtype == setting["dtype"]
        assert cfg.rollout.max_prompt_tokens == setting["max_prompt_tokens"]
        assert cfg.grpo.prompts_per_step * cfg.grpo.num_generations == setting[
            "trajectories_per_step"]


def test_the_doc_holds_the_computed_table():
    doc = (ROOT / "docs" / "before-the-workshop.md").read_text()
    assert plan_table() in doc
