"""Solutions to the exercises of 04_training_with_trl.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/04_training_with_trl.py`` there. ``tests/test_notebooks.py`` runs every check
cell of the notebook against this file.
"""
from envace_lite.config import get_config


# Exercise 1: a step has a learning signal when some (task, role) group has a non-zero advantage
def signal_share(rows):
    return sum(1 for r in rows if (r.get("nonzero_adv_group_frac") or 0) > 0) / len(rows)


# Exercise 2: one override per field; the warm start enters as model.checkpoint
my_cfg = get_config("micro", {"grpo.mode": "per_role", "grpo.steps": 12, "run.seed": 3,
                              "model.checkpoint": "runs/ws/checkpoint"})
