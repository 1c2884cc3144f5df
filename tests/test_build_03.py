"""Notebook 03's ``build`` cells against the package, on groups whose advantages are computed by hand.

The ``build`` cells of ``notebooks/03_rolewise_advantages.ipynb`` are extracted and executed in
order, in a namespace that holds what the notebook's setup gives them: ``trajs`` (the K scored
trajectories), ``cfg`` and ``pd``. Their results (``outputs``, ``groups``, ``baseline``, ``adv``,
``plain``, and the ``rolewise_advantages_inline`` function) are compared with values written out
by hand below, and with ``envace_lite.core.grpo`` (``flatten_outputs``, ``rolewise_advantages``) within
1e-6 (paper §2.2).
"""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from test_notebooks import exec_build_cells, load

from envace_lite.course.helpers import NOTEBOOKS_DIR
from envace_lite.core.advantages import flatten_outputs, rolewise_advantages
from envace_lite.config import get_config
from envace_lite.types import Output, Trajectory

NOTEBOOK = NOTEBOOKS_DIR / "03_rolewise_advantages.ipynb"


def traj(index: int, reward: float | None, roles: str, task: str = "x", *, empty: str = "",
         valid: bool = True) -> Trajectory:
    """A scored trajectory with one output per letter of ``roles`` (a: ACT, r: REHEARSE);
    ``empty`` marks with 'e' the outputs that are empty."""
    outs = [Output("act" if c == "a" else "rehearse", 0, [], [], "",
                   empty=k < len(empty) and empty[k] == "e") for k, c in enumerate(roles)]
    return Trajectory(SimpleNamespace(suite="s", id=task), index, outputs=outs, reward=reward,
                      reward_valid=valid)


def run_build_cells(trajs: list[Trajectory], singleton: str = "self") -> dict:
    cfg = get_config("smoke")
    cfg.grpo.singleton_baseline = singleton
    ns = {"trajs": trajs, "cfg": cfg, "pd": pd}
    return exec_build_cells(NOTEBOOK, ns, at_least=5)


# (trajectories, singleton, expected A per output in flatten order, expected plain A per trajectory)
CASES = {
    # rewards [1, 0, 0.5, 0.5]; roles τ0 a r a, τ1 a, τ2 a r r a, τ3 a r a.
    # ACT: 7 outputs, Σ R = 1 + 1 + 0 + 0.5 + 0.5 + 0.5 + 0.5 = 4, μ_act = 4/7.
    # REHEARSE: 4 outputs, Σ R = 1 + 0.5 + 0.5 + 0.5 = 2.5, μ_rehearse = 0.625.
    # plain GRPO: μ_x = (1 + 0 + 0.5 + 0.5) / 4 = 0.5.
    "rewards 1, 0, 0.5, 0.5": (
        lambda: [traj(0, 1.0, "ara"), traj(1, 0.0, "a"), traj(2, 0.5, "arra"),
                 traj(3, 0.5, "ara")], "self",
        [3 / 7, 0.375, 3 / 7, -4 / 7, -1 / 14, -0.125, -0.125, -1 / 14, -1 / 14, -0.125, -1 / 14],
        {0: 0.5, 1: -0.5, 2: 0.0, 3: 0.0}),
    # τ0's REHEARSE output is empty: its reward is 1 - 0.1 = 0.9. τ2's judge failed: A = 0, out of
    # every mean. μ_act = (1 + 1 + 0.2) / 3 = 11/15; μ_rehearse = (0.9 + 0.2) / 2 = 0.55.
    # plain: μ_x = (1 + 0.2) / 2 = 0.6.
    "an empty output and a judge failure": (
        lambda: [traj(0, 1.0, "ara", empty=".e."), traj(1, 0.2, "ar"),
                 traj(2, None, "ar", valid=False)], "self",
        [1 - 11 / 15, 0.35, 1 - 11 / 15, 0.2 - 11 / 15, -0.35, 0.0, 0.0],
        {0: 0.4, 1: -0.4, 2: 0.0}),
    # the lone REHEARSE output: A = 0 under the paper's formula; μ_act = (0.7 + 0.1) / 2 = 0.4
    "a singleton group, paper": (
        lambda: [traj(0, 0.7, "ar"), traj(1, 0.1, "a")], "self", [0.3, 0.0, -0.3],
        {0: 0.3, 1: -0.3}),
    # ... and A = R = 0.7 under the reference code's rule (no baseline)
    "a singleton group, reference": (
        lambda: [traj(0, 0.7, "ar"), traj(1, 0.1, "a")], "none", [0.3, 0.7, -0.3],
        {0: 0.3, 1: -0.3}),
    # two tasks never share a baseline: μ_(x,act) = 0.5, μ_(y,act) = 0.4
    "two tasks": (
        lambda: [traj(0, 1.0, "a"), traj(1, 0.0, "a"), traj(2, 0.5, "a", "y"),
                 traj(3, 0.3, "a", "y")], "self", [0.5, -0.5, 0.1, -0.1],
        {0: 0.5, 1: -0.5, 2: 0.1, 3: -0.1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_build_cells_match_hand_computed_advantages_and_the_package(name):
    make, singleton, want, want_plain = CASES[name]
    trajs = make()
    ns = run_build_cells(trajs, singleton)
    # the outputs the notebook built are the package's flatten_outputs
    rewards, task_ids, roles, valid = flatten_outputs(trajs, -0.1)
    assert [y["R"] for y in ns["outputs"]] == pytest.approx(rewards.tolist(), abs=1e-6)
    assert [y["x"] for y in ns["outputs"]] == task_ids
    assert [y["role"] for y in ns["outputs"]] == roles
    assert [y["valid"] for y in ns["outputs"]] == valid.tolist()
    # the hand-built advantages: the values written out above, and the package's
    assert ns["adv"] == pytest.approx(want, abs=1e-6)
    pkg = rolewise_advantages(rewards, task_ids, roles, valid, singleton=singleton)
    assert pkg.tolist() == pytest.approx(want, abs=1e-6)
    # the one-function version (the `teach` cell) on the same lists
    inline = ns["rolewise_advantages_inline"](rewards.tolist(), task_ids, roles, valid.tolist(),
                                              singleton=singleton)
    assert inline == pytest.approx(want, abs=1e-6)
    # plain GRPO: one baseline per task, over trajectories
    assert ns["plain"] == pytest.approx(want_plain, abs=1e-6)


def test_build_baselines_are_means_over_outputs():
    ns = run_build_cells(CASES["rewards 1, 0, 0.5, 0.5"][0]())
    x = ("s", "x")
    assert ns["baseline"] == pytest.approx({(x, "act"): 4 / 7, (x, "rehearse"): 0.625})
    assert ns["mu_plain"] == pytest.approx({x: 0.5})
    assert {k: len(v) for k, v in ns["groups"].items()} == {(x, "act"): 7, (x, "rehearse"): 4}


def test_build_cells_come_before_the_package_function():
    """The package's rolewise_advantages appears only after every step was built by hand."""
    cells = [c for c in load(NOTEBOOK).cells if c.cell_type == "code"]
    first_pkg = next(k for k, c in enumerate(cells) if "rolewise_advantages(" in c.source)
    tags = [set(c.get("metadata", {}).get("tags", [])) for c in cells]
    built = [k for k, t in enumerate(tags) if "build" in t]
    assert "build-check" in tags[first_pkg]
    assert sum(k < first_pkg for k in built) >= 3  # outputs, groups and baselines, advantages
    assert (len(built) + sum("build-check" in t for t in tags)) / len(cells) >= 0.25


def test_build_advantages_on_random_groups_equal_the_package():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        trajs = []
        for i in range(int(torch.randint(1, 6, (1,), generator=gen))):
            n = int(torch.randint(1, 5, (1,), generator=gen))
            roles = "".join("ar"[int(b)] for b in torch.randint(0, 2, (n,), generator=gen))
            empty = "".join(".e"[int(b)] for b in (torch.rand(n, generator=gen) < 0.2))
            task = "xy"[int(torch.randint(0, 2, (1,), generator=gen))]
            trajs.append(traj(i, round(float(torch.rand(1, generator=gen)), 3), roles, task,
                              empty=empty))
        for singleton in ("self", "none"):
            ns = run_build_cells(trajs, singleton)
            rewards, task_ids, roles, valid = flatten_outputs(trajs, -0.1)
            pkg = rolewise_advantages(rewards, task_ids, roles, valid, singleton=singleton)
            assert ns["adv"] == pytest.approx(pkg.tolist(), abs=1e-6)
