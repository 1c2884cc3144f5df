"""Solutions to the exercises of 07_fidelity_audit.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/07_fidelity_audit.py`` there. ``tests/test_notebooks.py`` runs every check cell
of the notebook against this file.
"""
import json


# Exercise 1: compare JSON values when both sides parse, else the stripped text
def exact(rehearsed, real):
    try:
        return json.loads(rehearsed) == json.loads(real)
    except ValueError:
        return rehearsed.strip() == real.strip()


# Exercise 2: the diagonal of the confusion matrix over all pairs
agreement = (2 + (30 - 3)) / 40
always_ok = 30 / 40  # right on every real success, wrong on every real error
