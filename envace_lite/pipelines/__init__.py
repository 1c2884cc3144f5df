"""Runs that write run directories: warm start (``sft``), role-wise GRPO (``train``), held-out
evaluation (``evaluate``), REHEARSE fidelity (``fidelity``), paper-style tables (``tables``),
confidence intervals (``stats``), and the warm start → GRPO → held-out curve
(``learning_curve``)."""
