"""Notebook 04's build cells against the package: the role-wise GRPO loss, its gradient, one
optimizer step and the masked SFT rows.

The ``build-setup``, ``build`` and ``build-check`` cells of ``notebooks/04_training_with_trl.ipynb``
are executed in one namespace (the Fig. 7 drill, K = 2 scripted trajectories, a tiny random
Qwen3). The test then recomputes the package side itself: a fresh ``RoleWiseGRPOTrainer`` on the
initial weights and the same group gives the loss and gradient that the hand-written loss gave,
within 1e-5 (``tests/test_grpo.py::test_trainer_loss_and_gradient_equal_rolewise_grpo_loss`` checks the same trainer against a one-row-per-
output loss).
"""
from __future__ import annotations

import copy

import nbformat
import pytest
import torch

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.core.advantages import rolewise_advantages
from envace_lite.core.grpo import RoleWiseGRPOTrainer
from envace_lite.pipelines.train import grpo_args
from envace_lite.core.transcripts import encode_act, encode_rehearse

NOTEBOOK = NOTEBOOKS_DIR / "04_training_with_trl.ipynb"
TAGS = ("build-setup", "build", "build-check")


def build_cells(path=NOTEBOOK) -> list[str]:
    nb = nbformat.read(str(path), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"
            and set(TAGS) & set(c.get("metadata", {}).get("tags", []))]


@pytest.fixture(scope="module")
def ns():
    space = {"seed": 0}
    for src in build_cells():
        exec(compile(src, "<cell>", "exec"), space)  # noqa: S102 (our own committed cells)
    return space


def test_the_notebook_builds_and_checks_in_tagged_cells():
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in code]
    built = sum(bool({"build", "build-check"} & t) for t in tags)
    assert sum("build-check" in t for t in tags) >= 3
    assert built / len(code) >= 0.25, (built, len(code))


def test_advantages_are_reward_minus_the_role_mean(ns):
    group = ns["group"]
    r0, r1 = (tr.reward for tr in group)
    assert r0 > r1  # the call with '#' scores above the id as the user typed it
    roles = [o.role for tr in group for o in tr.outputs]
    rewards = [tr.reward for tr in group for _ in tr.outputs]
    # both trajectories have one ACT call, one REHEARSE call and one closing ACT reply:
    # mu_act = (2 r0 + 2 r1) / 4 and mu_rehearse = (r0 + r1) / 2, both (r0 + r1) / 2
    mid = (r0 + r1) / 2
    want = [x - mid for x in rewards]
    assert ns["A"] == pytest.approx(want, abs=1e-9)
    pkg = rolewise_advantages(rewards, ["x"] * len(roles), roles).tolist()
    assert pkg == pytest.approx(want, abs=1e-6)


def test_hand_loss_and_gradient_equal_a_fresh_trainer(ns, tmp_path):
    model = copy.deepcopy(ns["reference"]).train().requires_grad_(True)  # the initial weights
    trainer = RoleWiseGRPOTrainer(model, ns["tok"], [ns["drill"]], ns["hand_cfg"],
                                  grpo_args(ns["hand_cfg"], tmp_path),
                                  rollout_fn=lambda tasks, k, step: ns["group"])
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"task_index": 0}] * 2)
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    want = ns["grad_hand"]
    assert want.norm() > 0
    assert abs(float(loss) - float(ns["loss"])) < 1e-5
    assert float((grad - want).abs().max() / want.norm()) < 1e-5


def test_the_step_moves_each_output_with_its_advantage(ns):
    moved = ns["moved"]
    assert len(moved) == 6 and (moved["A"] != 0).all()
    # one AdamW step raises the objective: the advantage-weighted change of the mean log-probs
    assert float((moved["Δ mean log-prob"] * moved["A"]).sum()) > 0
    assert ns["kl_after"] > 0  # after the step the policy left the reference


def test_hand_sft_rows_equal_the_package_rows(ns):
    ids, mask = encode_act(ns["transcript"], ns["tok"])
    assert ids == ns["sft_ids"]
    assert ns["sft_labels"] == [x if m else -100 for x, m in zip(ids, mask)]
    ids, mask = encode_rehearse(ns["ex"], ns["tok"])
    assert ids == ns["reh_ids"] and sum(mask) == len(ns["target"])
