"""Solutions to the exercises of 01_tools_environments_tasks.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/01_tools_environments_tasks.py`` there. ``tests/test_notebooks.py`` runs every
check cell of the notebook against this file.
"""


# Exercise 1: gold calls that change state, in order, across all user turns
def write_calls(env):
    return [call.name for turn in env.gold_turns() for call in turn.calls
            if env.is_state_changing(call.name)]


# Exercise 2: a user turn scores the sum of the weights of its passed items (docs/design.md, "The checklist reward")
def turn_score(items, passed):
    return sum(item.weight for item, ok in zip(items, passed) if ok)
