"""Solutions to the exercises of 06_evaluation_and_figures.ipynb.

Paste a block into the notebook's exercise cell, or run
``%load solutions/06_evaluation_and_figures.py`` there. ``tests/test_notebooks.py`` runs every
check cell of the notebook against this file.
"""
import math

# Exercise 1: benchmark Avg. first (tau2: telecom alone; BFCL: mean of its three suites), then the
# mean of the two benchmark averages
tau2 = 0.2
bfcl = (0.6 + 0.4 + 0.2) / 3
overall = (tau2 + bfcl) / 2


# Exercise 2: the normal-approximation interval of tables.ci95
def ci95_by_hand(values):
    t = len(values)
    mean = sum(values) / t
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (t - 1))
    half = 1.96 * sd / math.sqrt(t)
    return max(0.0, mean - half), min(1.0, mean + half)
