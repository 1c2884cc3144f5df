"""Profiles, overrides and config.json round trips."""
from __future__ import annotations

import dataclasses
import json

import pytest

from envace_lite.config import PROFILES, Config, apply_overrides, get_config


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profiles_build_and_round_trip(profile, tmp_path):
    cfg = get_config(profile)
    assert cfg.profile == profile
    path = cfg.save(tmp_path)
    again = Config.from_dict(json.loads(path.read_text()))
    assert again.to_dict() == cfg.to_dict()


def test_profile_facts():
    smoke, laptop, gpu, scaled = (get_config(p) for p in ("smoke", "laptop", "gpu", "scaled"))
    assert (smoke.model.kind, smoke.rollout.rendering) == ("tiny", "compact")
    assert (laptop.model.kind, laptop.model.name, laptop.rollout.rendering) == (
        "gguf", "SmolLM2-135M-Instruct", "compact")
    assert (gpu.model.name, gpu.rollout.rendering) == ("Qwen/Qwen3-1.7B", "full")
    assert gpu.model.lora_r > 0
    assert scaled.model.name == "Qwen/Qwen3-8B"
    # the paper's reference run (§3.1) is the scaled profile's GRPO config
    g = scaled.grpo
    assert (g.learning_rate, g.beta, g.epsilon, g.num_generations, g.prompts_per_step, g.steps) == (
        1e-6, 1e-4, 0.2, 4, 16, 470)
    assert scaled.rollout.max_prompt_tokens == 12000 and scaled.rollout.max_turns == 30


def test_prompt_budget_is_derived_from_context_window():
    cfg = get_config("smoke", {"model.context_window": 1000, "rollout.max_new_tokens_act": 100})
    assert cfg.rollout.max_prompt_tokens == 900


def test_unknown_keys_and_values_raise():
    with pytest.raises(KeyError, match="rollout has"):
        get_config("smoke", {"rollout.max_turn": 3})
    with pytest.raises(KeyError, match="group.field"):
        get_config("smoke", {"seed": 3})
    with pytest.raises(KeyError, match="unknown profile"):
        get_config("tiny")
    with pytest.raises(ValueError, match="grpo.mode"):
        get_config("smoke", {"grpo.mode": "both"})


def test_every_field_has_a_docstring():
    import ast
    import inspect

    import envace_lite.config as mod

    tree = ast.parse(inspect.getsource(mod))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (
                        f"{node.name}.{stmt.target.id} has no docstring")


def test_apply_overrides_is_in_place():
    cfg = get_config("smoke")
    assert apply_overrides(cfg, {"eval.limit": 7}) is cfg and cfg.eval.limit == 7
    assert dataclasses.is_dataclass(cfg.eval)


def test_act_only_lora_on_vllm_is_refused_without_a_real_frozen_simulator():
    over = {"grpo.mode": "act_only", "model.lora_r": 8}
    for backend in ("vllm_server", "vllm_colocate"):
        with pytest.raises(ValueError, match="no frozen simulator"):
            get_config("smoke", {**over, "rollout.generation_backend": backend})
        cfg = get_config("smoke", {**over, "rollout.generation_backend": backend,
                                   "grpo.frozen_simulator_backend": "hf"})
        assert cfg.grpo.frozen_simulator_backend == "hf"
    # the same combination is fine where the frozen weights are real: HF generation, no LoRA
    # (a full frozen copy), or a mode that has no frozen simulator
    get_config("smoke", {**over, "rollout.generation_backend": "hf"})
    get_config("smoke", {"grpo.mode": "act_only", "rollout.generation_backend": "vllm_server"})
    get_config("smoke", {"grpo.mode": "act_only_real", "model.lora_r": 8,
                         "rollout.generation_backend": "vllm_server"})


def test_act_only_baseline_and_grounding_scope_values():
    assert get_config("smoke").grpo.act_only_baseline == "outputs"
    assert get_config("smoke").rollout.grounding_scope == "task"
    with pytest.raises(ValueError, match="act_only modes only"):
        get_config("smoke", {"grpo.act_only_baseline": "trajectories"})
    with pytest.raises(ValueError, match="grounding_scope"):
        get_config("smoke", {"rollout.grounding_scope": "future"})
    cfg = get_config("smoke", {"grpo.mode": "act_only", "grpo.act_only_baseline": "trajectories"})
    assert cfg.grpo.act_only_baseline == "trajectories"


def test_limit_zero_means_all_tasks_and_negative_is_refused():
    from envace_lite.config import BOUNDS, ConfigError, first_tasks

    ids = ["t0", "t1", "t2"]
    assert first_tasks(ids, 0) == ["t0", "t1", "t2"]  # 0 = all
    assert first_tasks(ids, 2) == ["t0", "t1"] and first_tasks(ids, 9) == ids
    with pytest.raises(ConfigError, match=r"^--limit=-1: expected int >= 0 \(0 = all tasks\)$"):
        first_tasks(ids, -1, "--limit")  # ids[:-1] would have run t0 and t1 silently
    with pytest.raises(ConfigError, match="limit=True"):
        first_tasks(ids, True)
    # the config bound says the same for eval.limit
    assert BOUNDS["eval.limit"] == (0, None, "[]")
    assert get_config("smoke", {"eval.limit": 0}).eval.limit == 0
    with pytest.raises(ConfigError, match=r"^eval.limit=-1: expected int >= 0$"):
        get_config("smoke", {"eval.limit": -1})


def test_load_tasks_limit_zero_is_all_and_negative_is_refused():
    from envace_lite.config import ConfigError
    from envace_lite.data import load_tasks
    from envace_lite.envs import list_tasks

    everything = load_tasks("bfcl-base", "test")
    assert len(everything) == len(list_tasks("bfcl-base", "test")) == 50
    assert [t.id for t in load_tasks("bfcl-base", "test", limit=0)] == [t.id for t in everything]
    assert [t.id for t in load_tasks("bfcl-base", "test", limit=2)] == [
        t.id for t in everything[:2]]
    with pytest.raises(ConfigError, match="limit=-1"):
        load_tasks("bfcl-base", "test", limit=-1)
