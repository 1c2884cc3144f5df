"""Notebook 02's ``build`` cells against the package's ``rollout()``, token for token (greedy).

The ``build`` cells of ``notebooks/02_act_and_rehearse.ipynb`` are extracted and executed in
order, in a namespace that holds what the notebook's setup cell gives them: ``task`` (the Fig. 7
lookup drill of ``tau2-retail-drills``), ``model`` and ``tok`` (the smoke profile's tiny
random-weight Qwen3), ``greedy`` (the smoke config at temperature 0) and ``seed``. Then:

- the hand-built turn 0 (h_0, a_0, the REHEARSE prompt, ô_0 and h_1 = h_0 ⊕ (a_0, ô_0)) equals the
  ids ``rollout()`` records for the same turn;
- ``rollout_by_hand`` equals ``rollout()`` token for token (packed ACT ids and mask, every
  output's prompt ids and sampled ids, the observations and the stop reason) on every stop
  reason it builds: final answer, parse error, gate closed, turn limit, context budget; with the
  grounding shown and dropped; with several calls in one turn and several user turns (a BFCL
  task's gold script).
"""
from __future__ import annotations

import copy

import pytest
from test_notebooks import exec_build_cells

from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import get_config
from envace_lite.course.helpers import NOTEBOOKS_DIR, gold_script
from envace_lite.envs.tasks import build_task
from envace_lite.envs import list_tasks
from envace_lite.llm.generation import HFGenerator
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.core.grpo import RoleRoutedGenerator
from envace_lite.models.load import load_policy
from envace_lite.core.rollout import rollout

NOTEBOOK = NOTEBOOKS_DIR / "02_act_and_rehearse.ipynb"


@pytest.fixture(scope="module")
def built():
    cfg = get_config("smoke")
    greedy = copy.deepcopy(cfg)
    greedy.rollout.temperature = 0.0
    ids = list_tasks("tau2-retail-drills", "train")
    task = build_task("tau2-retail-drills", next(i for i in ids if i.startswith("lookup:")),
                      "train")
    model, tok = load_policy(cfg)
    ns = {"task": task, "model": model, "tok": tok, "greedy": greedy, "seed": 0}
    return exec_build_cells(NOTEBOOK, ns, at_least=6)


def same(mine: dict, traj) -> None:
    """Token-for-token equality of a hand-built trajectory and a package one."""
    assert mine["act_ids"] == traj.act_ids
    assert mine["act_mask"] == traj.act_mask
    assert mine["outputs"] == [(o.role, o.prompt_ids, o.ids) for o in traj.outputs]
    assert [s.observation for s in mine["steps"]] == [s.observation for s in traj.steps]
    assert [(s.turn, s.user_turn, s.call.name, s.call.arguments, s.call.call_id)
            for s in mine["steps"]] == [(s.turn, s.user_turn, s.call.name, s.call.arguments,
                                         s.call.call_id) for s in traj.steps]
    assert mine["stop"] == traj.stop_reason


def both(ns: dict, make, cfg, task=None, seed: int = 0):
    task = ns["task"] if task is None else task
    mine = ns["rollout_by_hand"](task, make(), cfg, seed=seed)
    [traj] = rollout([task], make(), ns["tok"], cfg, k=1, seed=seed)
    return mine, traj


def fig7_policy(ns):
    return lambda: RoleRoutedGenerator({
        "act": ScriptedGenerator({"act": ns["FIG7_ACT"]}, ns["tok"]),
        "rehearse": HFGenerator(ns["model"], ns["tok"], seed=0)})


def test_turn_zero_by_hand_equals_the_engine(built):
    """h_0, a_0, the REHEARSE prompt, ô_0 and h_1 of the notebook's cells are rollout()'s ids."""
    ns = built
    mine, traj = both(ns, fig7_policy(ns), ns["fig7_cfg"])
    act0, reh0, act1 = traj.outputs[:3]
    assert (act0.role, reh0.role, act1.role) == ("act", "rehearse", "act")
    assert ns["h"] == act0.prompt_ids == traj.act_ids[:traj.act_prompt_len]
    assert ns["a_ids"] == act0.ids
    assert ns["r_prompt"] == reh0.prompt_ids
    assert ns["o_ids"] == reh0.ids
    assert ns["obs"] == traj.steps[0].observation
    assert ns["h1"] == act1.prompt_ids  # h_1 = h_0 ⊕ (a_0, ô_0), on token ids
    assert ns["mask1"] == traj.act_mask[:len(ns["h1"])]
    # the Fig. 7 call is the gold call without its '#'
    assert ns["call"].name == "get_order_details"
    assert "#" + ns["call"].arguments["order_id"] == ns["gold"]["arguments"]["order_id"]
    same(mine, traj)
    assert traj.stop_reason == "final_answer" and traj.turns == 3 and len(traj.steps) == 2


def test_the_policy_alone_greedy(built):
    ns = built
    mine, traj = both(ns, lambda: HFGenerator(ns["model"], ns["tok"], seed=0), ns["greedy"])
    same(mine, traj)
    assert len(traj.outputs) >= 1 and traj.outputs[0].finish_reason in ("stop", "length")


def test_the_notebook_check_cell_cases(built):
    """The perfect world model (scripted in both roles) and the real observations."""
    ns = built
    make = lambda: ScriptedGenerator(
        {"act": ns["FIG7_ACT"], "rehearse": [rehearsal_text("Error: Order not found"),
                                             rehearsal_text("{}")]}, ns["tok"])
    cfg = copy.deepcopy(ns["fig7_cfg"])
    cfg.rollout.max_new_tokens_rehearse = 64
    mine, traj = both(ns, make, cfg)
    same(mine, traj)
    assert [s.observation.error for s in traj.steps] == [True, False]


@pytest.mark.parametrize("drop_p,seed", [(0.0, 0), (1.0, 0), (0.5, 3), (0.5, 4)])
def test_grounding_shown_or_dropped(built, drop_p, seed):
    ns = built
    cfg = copy.deepcopy(ns["fig7_cfg"])
    cfg.rollout.grounding_drop_p = drop_p
    mine, traj = both(ns, fig7_policy(ns), cfg, seed=seed)
    same(mine, traj)


def test_turn_limit_and_context_budget(built):
    ns = built
    cfg = copy.deepcopy(ns["fig7_cfg"])
    cfg.rollout.max_turns = 2
    mine, traj = both(ns, fig7_policy(ns), cfg)
    same(mine, traj)
    assert traj.stop_reason == "turn_limit" and traj.turns == 2
    cfg = copy.deepcopy(ns["fig7_cfg"])
    cfg.rollout.max_prompt_tokens = len(ns["h"]) + 40  # room for a_0, not for its glue too
    mine, traj = both(ns, fig7_policy(ns), cfg)
    same(mine, traj)
    assert traj.stop_reason == "context_budget" and traj.turns == 1


def test_parse_error(built):
    ns = built
    make = lambda: ScriptedGenerator(
        {"act": ['<tool_call>{"name": "get_order_details", "arguments": {"order_id": }</tool_call>']},
        ns["tok"])
    mine, traj = both(ns, make, ns["fig7_cfg"])
    same(mine, traj)
    assert traj.stop_reason == "parse_error"


@pytest.fixture(scope="module")
def bfcl_task():
    return build_task("bfcl-base", list_tasks("bfcl-base", "train")[0], "train")


def scripted_cfg(ns, texts):
    cfg = copy.deepcopy(ns["greedy"])
    cfg.rollout.max_new_tokens_act = cfg.rollout.max_new_tokens_rehearse = 4096
    cfg.rollout.max_turns = len(texts["act"])
    return cfg


def test_several_calls_and_user_turns(built, bfcl_task):
    """A BFCL task's gold: several calls in one reply, then the gated next user turns."""
    ns = built
    texts = gold_script(bfcl_task)
    make = lambda: ScriptedGenerator(texts, ns["tok"])
    mine, traj = both(ns, make, scripted_cfg(ns, texts), task=bfcl_task)
    same(mine, traj)
    assert traj.user_turns_reached == len(bfcl_task.user_turns) > 1
    assert max(len([s for s in traj.steps if s.turn == t]) for t in range(traj.turns)) > 1


def test_gate_closed(built, bfcl_task):
    """The second user turn answered in text without its calls: the gate closes."""
    ns = built
    texts = gold_script(bfcl_task, user_turns=1)
    make = lambda: ScriptedGenerator(texts, ns["tok"])
    mine, traj = both(ns, make, scripted_cfg(ns, texts), task=bfcl_task)
    same(mine, traj)
    assert traj.stop_reason == "gate_closed"


def test_grounding_scope_of_the_build(built, bfcl_task):
    """``grounding_for`` honours ``rollout.grounding_scope`` (docs/design.md, "5. REHEARSE
    grounding"): ``task`` shows every user turn's gold pairs, ``seen`` those up to the current one."""
    ns = built
    turns = bfcl_task.grounding
    assert len(turns) > 1 and all(turns)  # several user turns, each with gold pairs
    cfg = copy.deepcopy(ns["greedy"]).rollout
    flat = [g for turn in turns for g in turn]
    cfg.grounding_scope = "task"
    assert ns["grounding_for"](bfcl_task, True, 0, cfg) == flat
    assert ns["grounding_for"](bfcl_task, False, 0, cfg) is None
    cfg.grounding_scope = "seen"
    assert ns["grounding_for"](bfcl_task, True, 0, cfg) == list(turns[0])
    assert ns["grounding_for"](bfcl_task, True, 1, cfg) == list(turns[0]) + list(turns[1])
    assert ns["grounding_for"](bfcl_task, True, len(turns) - 1, cfg) == flat
    assert ns["grounding_for"](bfcl_task, False, 1, cfg) is None


def test_grounding_scope_equals_the_engine(built, bfcl_task):
    """The gold script of a several-user-turn task, grounding always shown: token for token under
    either scope, and the scopes really differ on the first user turn's REHEARSE prompts."""
    ns = built
    texts = gold_script(bfcl_task)
    first_turn_prompts = {}
    for scope in ("task", "seen"):
        cfg = scripted_cfg(ns, texts)
        cfg.rollout.grounding_drop_p = 0.0
        cfg.rollout.grounding_scope = scope
        mine, traj = both(ns, lambda: ScriptedGenerator(texts, ns["tok"]), cfg, task=bfcl_task)
        same(mine, traj)
        assert max(s.user_turn for s in traj.steps) > 0
        rehearse = [o for o in traj.outputs if o.role == "rehearse"]
        first_turn_prompts[scope] = [o.prompt_ids for o, s in zip(rehearse, traj.steps)
                                     if s.user_turn == 0]
    task_p, seen_p = first_turn_prompts["task"], first_turn_prompts["seen"]
    assert task_p and len(task_p) == len(seen_p)
    assert all(len(s) < len(t) for s, t in zip(seen_p, task_p))  # "seen" hides turn 1's pairs
