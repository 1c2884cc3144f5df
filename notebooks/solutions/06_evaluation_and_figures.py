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


# Exercise 2: T/2 passes and T/2 failures have mean 0.5 and sample sd sqrt(T / (4 (T - 1))), so
# the half-width is z * 0.5 / sqrt(T - 1); grow T (even) until it drops below 0.10
def _half_width(t):
    values = [1.0] * (t // 2) + [0.0] * (t // 2)
    mean = sum(values) / t
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (t - 1))
    return 1.959963984540054 * sd / math.sqrt(t)


tasks_needed = next(t for t in range(2, 10_000, 2) if _half_width(t) < 0.10)  # 98
