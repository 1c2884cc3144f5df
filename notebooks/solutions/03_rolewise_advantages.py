"""Solutions to the exercises of 03_rolewise_advantages.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/03_rolewise_advantages.py`` there. ``tests/test_notebooks.py`` runs every check
cell of the notebook against this file.
"""

# Exercise 1: G_{x,rehearse} holds τ_0's two REHEARSE outputs (R = 0.5 each) and τ_1's one
# (R = 1.0). The baseline is a mean over OUTPUTS, not trajectories: (0.5 + 0.5 + 1.0) / 3.
mu_rehearse = (0.5 + 0.5 + 1.0) / 3


# Exercise 2: plain GRPO has one baseline per task, the mean over its K trajectories
def plain_grpo_advantages(traj_rewards):
    mean = sum(traj_rewards) / len(traj_rewards)
    return [r - mean for r in traj_rewards]
