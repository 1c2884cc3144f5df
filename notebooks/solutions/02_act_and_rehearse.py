"""Solutions to the exercises of 02_act_and_rehearse.ipynb.

Paste a block into the notebook's exercise cell, or run ``%load solutions/02_act_and_rehearse.py``
there. ``tests/test_notebooks.py`` runs every check cell of the notebook against this file.
"""
from envace_lite.protocol.prompts import assistant_text
from envace_lite.types import ToolCall

# Exercise 1: a well-formed call of a real tool with an argument its schema does not have. It is
# a call with a violation, not a parse error: it would be rehearsed (or executed) and answered
# with an error observation.
bad_arguments_text = assistant_text([ToolCall("mkdir", {"folder_name": "temp"})])


# Exercise 2: the ⊕ of turn m is everything between the end of ACT output m and the start of m + 1
def glue_after(traj, m):
    return traj.act_ids[traj.act_spans[m][1]:traj.act_spans[m + 1][0]]
