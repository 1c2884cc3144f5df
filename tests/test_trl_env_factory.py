"""The environment ``benchmarks/trl_env_factory.py`` hands TRL's ``environment_factory``: one
class per drill tool set whose public methods are the drill's real tau2 tools.

No speed is asserted (tests/README.md); the script's figures are in benchmarks/results/.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trl_env_factory import drill_env_classes, tau2_reward  # noqa: E402
from envace_lite.envs import make_env  # noqa: E402

SUITE, TASK = "tau2-retail-drills", "two_hop:isabella_anderson_7248"


def _public(cls: type) -> list[str]:
    # how TRL's GRPOTrainer lists an environment's tools (grpo_trainer.py, environment_factory)
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


def test_env_exposes_the_drills_tools_and_calls_tau2():
    from transformers.utils import get_json_schema

    schemas = make_env(SUITE, TASK).tool_schemas()
    classes = drill_env_classes([SimpleNamespace(tools=schemas)])
    [(key, cls)] = classes.items()
    assert key == ("find_user_id_by_email,find_user_id_by_name_zip,get_user_details,"
                   "get_order_details")
    assert _public(cls) == sorted(key.split(","))
    env = cls()
    env.reset(suite=SUITE, task_id=TASK, prompt="ignored")
    # what TRL shows the model: the same names and required parameters as tau2's schemas
    for s in schemas:
        got = get_json_schema(getattr(env, s["function"]["name"]))["function"]
        assert got["name"] == s["function"]["name"]
        assert got["parameters"]["required"] == s["function"]["parameters"]["required"]
        props = s["function"]["parameters"]["properties"]
        assert set(got["parameters"]["properties"]) == set(props)
    # tau2's retail DB: the user of the drill's ticket (Isabella Anderson, zip 95125)
    assert env.find_user_id_by_name_zip(first_name="Isabella", last_name="Anderson",
                                        zip="95125") == "isabella_anderson_7248"
    assert env.get_order_details(order_id="#W0000000") == "Error: Order not found"
    assert env.env.real_calls == 2
    # a text reply without the order's status: the episode ends and tau2 scores 0
    [r] = tau2_reward([[{"role": "assistant", "content": "Done."}]], environments=[env])
    assert r == 0.0 and env.env.done
