"""Profiles, overrides and config.json round trips."""
from __future__ import annotations

import dataclasses
import json

import pytest

from envace_lite.config import Config, ConfigError, apply_overrides, get_config
from envace_lite.profiles import PROFILES


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


def test_top_p_below_one_with_the_vllm_importance_ratio_is_refused():
    """vLLM's log-probs under top_p < 1 are those of q = p / mass on the nucleus, so
    the ratio pi_train / pi_vLLM is the kept mass on every token, not 1 (shown by hand below)."""
    import math

    import torch

    from envace_lite.config import ConfigError
    from envace_lite.llm.vllm_generation import importance_weights

    # a 3-token distribution (0.5, 0.3, 0.2) under top_p 0.8: the nucleus {0.5, 0.3}, mass 0.8
    p = torch.tensor([[0.5, 0.3]])
    q = p / 0.8
    biased = importance_weights(p.log(), q.log(), cap=3.0)
    assert torch.allclose(biased, torch.tensor([[0.8, 0.8]]))  # the bias the refusal prevents
    assert torch.allclose(importance_weights(p.log(), p.log()), torch.ones(1, 2))  # top_p = 1
    for backend in ("vllm_server", "vllm_colocate"):
        with pytest.raises(ConfigError, match=r"rollout.top_p=0.95 .* biased by the kept"):
            get_config("smoke", {"rollout.generation_backend": backend, "rollout.top_p": 0.95})
        get_config("smoke", {"rollout.generation_backend": backend, "rollout.top_p": 0.95,
                             "rollout.vllm_importance_sampling": False})
        get_config("smoke", {"rollout.generation_backend": backend, "rollout.top_p": 1.0})
    assert math.isclose(get_config("smoke", {"rollout.top_p": 0.9}).rollout.top_p, 0.9)  # hf


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
    from envace_lite.envs.tasks import load_tasks
    from envace_lite.envs import list_tasks

    everything = load_tasks("bfcl-base", "test")
    assert len(everything) == len(list_tasks("bfcl-base", "test")) == 50
    assert [t.id for t in load_tasks("bfcl-base", "test", limit=0)] == [t.id for t in everything]
    assert [t.id for t in load_tasks("bfcl-base", "test", limit=2)] == [
        t.id for t in everything[:2]]
    with pytest.raises(ConfigError, match="limit=-1"):
        load_tasks("bfcl-base", "test", limit=-1)


def test_profiles_build_fresh_configs_from_their_data():
    from envace_lite.profiles import OFFLINE_PROFILES

    assert list(PROFILES) == ["smoke", "micro", "laptop", "colab", "gpu", "scaled", "drills"]
    # offline = every profile whose model is not loaded from the hub
    assert OFFLINE_PROFILES == ("smoke", "micro", "laptop", "drills")
    assert [p for p in PROFILES if get_config(p).model.kind != "hub"] == list(OFFLINE_PROFILES)
    # a built config owns its lists: mutating one leaves the profile and the next build alone
    first = get_config("micro")
    first.grpo.suites.append("bfcl-base")
    first.model.lora_target_modules.clear()
    again = get_config("micro")
    assert again.grpo.suites == ["tau2-telecom"] == PROFILES["micro"]["grpo"]["suites"]
    assert again.model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    # drills: micro's model with two changes, micro's run group, its own rollout/grpo/eval/
    # warmstart groups (fields they do not name are the dataclass defaults, not micro's)
    d, m = get_config("drills"), get_config("micro")
    assert (d.model.hidden_size, d.model.vocab_size, d.model.context_window,
            d.model.split_digits, d.study.pretrain) == (256, 4096, 1536, True, "copy")
    assert (d.warmstart.epochs, d.grpo.steps) == (6, 12)
    assert (m.model.context_window, m.model.split_digits) == (1024, False)
    assert d.run.progress is False and d.grpo.suites == ["tau2-retail-drills"]
    assert (d.warmstart.sft_share, d.warmstart.rl_overlap, m.warmstart.rl_overlap) == (
        0.08, False, True)
    # 1,408 = min(rollout.max_prompt_tokens 1408, context 1536 - act cap 48 = 1488)
    assert d.rollout.max_prompt_tokens == 1408
    # the profile value is kept as written: laptop's epochs=1 is an int in config.json
    assert get_config("laptop").to_dict()["warmstart"]["epochs"] == 1
    assert isinstance(get_config("laptop").to_dict()["warmstart"]["epochs"], int)


def test_enumerations_have_one_home():
    import typing

    from envace_lite.config import field_type, literal_fields, parse_overrides
    from envace_lite.types import (
        DECODING,
        DECODINGS,
        REHEARSAL_MODES,
        REHEARSING_MODES,
        TRAIN_MODES,
        Decoding,
        RehearsalMode,
        TrainMode,
        rehearsal_mode,
    )

    assert TRAIN_MODES == ("shared", "per_role", "act_only", "act_only_real")
    assert REHEARSAL_MODES == ("none", "parallel", "sequential")
    assert REHEARSING_MODES == ("parallel", "sequential")
    assert tuple(DECODING) == DECODINGS == ("greedy", "sample")
    assert (field_type("grpo.mode"), field_type("rehearsal.mode")) == (TrainMode, RehearsalMode)
    assert field_type("eval.decoding") == field_type("rehearsal.decoding") == Decoding
    assert len(literal_fields()) == 22
    assert {"grpo.judge", "study.copy_names", "study.pretrain_names"} <= set(literal_fields())
    assert {"study.reward_control", "study.pretrain_schedule"} <= set(literal_fields())
    assert {"study.memory_source", "rehearsal.memory_placement"} <= set(literal_fields())
    # every value of the home is accepted, and a value outside it is refused in both places
    # (overrides at parse time, finalize for a field set by hand), with the same message
    for mode in TRAIN_MODES:
        assert get_config("smoke", {"grpo.mode": mode}).grpo.mode == mode
    msg = "grpo.mode='both': expected one of ['act_only', 'act_only_real', 'per_role', 'shared']"
    with pytest.raises(ConfigError) as err:
        parse_overrides(["grpo.mode=both"])
    assert str(err.value) == msg
    cfg = get_config("smoke")
    cfg.grpo.mode = "both"
    with pytest.raises(ConfigError) as err:
        cfg.finalize()
    assert str(err.value) == msg
    for key in literal_fields():
        tp = field_type(key)
        assert typing.get_origin(tp) is typing.Literal
    # "none" is the one spelling of no rehearsal; None converts to it at the Python edges
    assert [rehearsal_mode(v) for v in (None, "none", "parallel")] == ["none", "none", "parallel"]
    with pytest.raises(ValueError, match="rehearsal='both'"):
        rehearsal_mode("both")


# ---------------------------------------------------------------------------------------------
# The drills study's levers: one key each, in the study group
# ---------------------------------------------------------------------------------------------
OLD_STUDY_KEYS = {"model.pretrain": "copy_hops", "model.pretrain_epochs": 3.0,
                  "model.pretrain_steps": 40, "model.pretrain_seed": 5,
                  "model.pretrain_schedule": "cosine", "warmstart.world_rows": 7,
                  "warmstart.error_rows": True, "warmstart.error_kinds": "all",
                  "grpo.reward_control": "shuffle", "rehearsal.memory_source": "calls"}
"""The keys the study levers had in the groups of the paper's mechanisms, each with a value."""

STUDY_FIELDS = ("pretrain", "pretrain_epochs", "pretrain_steps", "pretrain_seed",
                "pretrain_schedule", "world_rows", "error_rows", "error_kinds", "reward_control",
                "memory_source")


def study_values(cfg: Config) -> tuple:
    return tuple(getattr(cfg.study, f) for f in STUDY_FIELDS)


def test_each_study_lever_has_one_key(tmp_path):
    """A lever's key in a paper's group is unknown everywhere a key is read: get_config,
    --set, an override file, a saved config.json; its study key gives the value."""
    from envace_lite.config import load_overrides, parse_overrides

    for key, value in OLD_STUDY_KEYS.items():
        new = "study." + key.partition(".")[2]
        with pytest.raises(ConfigError, match=f"unknown config key '{key}'"):
            get_config("smoke", {key: value})
        with pytest.raises(ConfigError, match=f"unknown config key '{key}'"):
            parse_overrides([f"{key}={json.dumps(value)}"])
        assert parse_overrides([f"{new}={json.dumps(value)}"]) == {new: value}
        group, _, name = key.partition(".")
        saved = get_config("smoke").to_dict()
        saved[group][name] = value
        with pytest.raises(ConfigError, match="unknown config key"):
            Config.from_dict(saved)
    path = tmp_path / "o.yaml"
    path.write_text("warmstart.world_rows: 4\n")
    with pytest.raises(ConfigError, match="unknown config key 'warmstart.world_rows'"):
        get_config("smoke", load_overrides(path))
    cfg = get_config("smoke", {"study." + k.partition(".")[2]: v
                               for k, v in OLD_STUDY_KEYS.items()})
    assert study_values(cfg) == ("copy_hops", 3.0, 40, 5, "cosine", 7, True, "all", "shuffle",
                                 "calls")
    saved = cfg.to_dict()
    assert "pretrain" not in saved["model"] and "world_rows" not in saved["warmstart"]
    assert "reward_control" not in saved["grpo"] and "memory_source" not in saved["rehearsal"]


def test_no_shipped_file_names_a_study_lever_by_an_old_key():
    """Every command, config and README the project ships names a lever by its study key."""
    import re
    import subprocess

    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    pattern = re.compile("|".join(re.escape(k) + r"\b" for k in OLD_STUDY_KEYS))
    found = [f"{f}: {m.group(0)}" for f in files
             if f.endswith((".json", ".jsonl", ".md", ".py", ".ipynb", ".yaml", ".yml", ".txt"))
             and f != "tests/test_config.py"
             for m in [pattern.search((root / f).read_text(errors="replace"))] if m]
    assert found == []


def test_study_memory_source_is_free_on_resume():
    """study.memory_source is a test-time setting: a resumed training run may change it."""
    from envace_lite.pipelines.resume import config_drift

    cfg = get_config("drills")
    recorded = cfg.to_dict()
    recorded["study"]["memory_source"] = "calls"
    assert config_drift(recorded, cfg) == []
    recorded["study"]["pretrain"] = "retail"
    assert config_drift(recorded, cfg) == ["study.pretrain: 'retail' -> 'copy'"]


def test_unknown_study_key_is_one_line():
    with pytest.raises(ConfigError) as err:
        get_config("smoke", {"study.pretrian": "copy"})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("unknown config key 'study.pretrian': study has [")
    assert "'pretrain'" in msg and "'world_rows'" in msg
    with pytest.raises(ConfigError, match="unknown config key 'model.pretrian'"):
        get_config("smoke", {"model.pretrian": "copy"})


def test_profiles_resolve_the_study_levers_as_before():
    # the values main's profiles resolved before the study group existed (get_config(p) on
    # main, read as (model.pretrain, model.pretrain_epochs, model.pretrain_steps,
    # model.pretrain_seed, model.pretrain_schedule, warmstart.world_rows, warmstart.error_rows,
    # warmstart.error_kinds, grpo.reward_control, rehearsal.memory_source))
    defaults = ("", 12.0, 300, 0, "constant", 0, False, "hash", "none", "policy")
    before = {"smoke": defaults, "micro": defaults, "laptop": defaults, "colab": defaults,
              "gpu": defaults, "scaled": defaults,
              "drills": ("copy", 12.0, 300, 0, "constant", 0, False, "hash", "none", "policy")}
    assert set(before) == set(PROFILES)
    for profile, values in before.items():
        assert study_values(get_config(profile)) == values, profile


