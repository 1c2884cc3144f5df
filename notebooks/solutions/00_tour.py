"""Solutions to the exercises of 00_tour.ipynb.

Paste a block into the notebook's exercise cell, or run ``%load solutions/00_tour.py`` there.
``tests/test_notebooks.py`` runs every check cell of the notebook against this file.
"""
from envace_lite.config import get_config
from envace_lite.core.advantages import rolewise_advantages

# Exercise 1: overrides are "group.field" keys; get_config applies them and finalizes
my_cfg = get_config("laptop", {"grpo.num_generations": 8, "grpo.prompts_per_step": 4})

# Exercise 2: the group means μ_{x,r} are computed inside rolewise_advantages
mu_function = rolewise_advantages
