"""Solutions to the exercises of 05_private_rehearsal.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/05_private_rehearsal.py`` there. ``tests/test_notebooks.py`` runs every check
cell of the notebook against this file.
"""
from envace_lite.protocol.rehearsal_outputs import parse_feedback

# Exercise 1: the tagged parts of a FEEDBACK output
FEEDBACK_TEXT = ("<assessment>The attempt called cd with a folder that does not exist.</assessment>"
                 "<revision>Call ls first and cd into a folder it lists.</revision>")
revision = parse_feedback(FEEDBACK_TEXT).revision

# Exercise 2: rehearsal runs at every new user message: N feedbacks and one memory per user turn,
# and it never executes anything
feedbacks = 3 * 2
memories = 3
rehearsal_real_calls = 0
