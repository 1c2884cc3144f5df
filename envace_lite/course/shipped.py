"""Shipped reference results and the paper's numbers (notebooks 04-07).

``reference_results`` opens a folder of ``data/reference_results/``; ``training_runs``,
``heldout_points`` and ``sweep_points`` read the files a training or evaluation run writes;
``PAPER`` holds the paper's numbers the notebooks set beside ours.

Usage::

    from envace_lite.course.shipped import reference_results
    ref = reference_results("micro_training")   # None when the folder is absent
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace_lite.paths import REPO_ROOT

REFERENCE_ROOT = REPO_ROOT / "data" / "reference_results"
"""Committed results of long runs, one folder per name, each with a ``meta.json``
(``{"profile", "seed", "commit", "command", "date", "source": "shipped", ...}``)."""


@dataclass
class Reference:
    """One folder of shipped reference results.

    Attributes:
        name: the folder name, e.g. ``micro_training``.
        path: the folder.
        meta: its ``meta.json`` (``{}`` when the file is missing).
    """

    name: str
    path: Path
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        """``shipped (<profile>, s<seed>, <commit>)``: what figure titles and tables say."""
        m = self.meta
        seed = m.get("seed")
        seeds = ",".join(map(str, seed)) if isinstance(seed, list) else seed
        return (f"shipped ({m.get('profile', '?')}, s{seeds if seeds is not None else '?'}, "
                f"{m.get('commit', '?')})")


def reference_results(name: str, root: str | Path | None = None) -> Reference | None:
    """The shipped results ``data/reference_results/<name>/``, or None when absent.

    Args:
        name: the folder, e.g. ``micro_training``, ``eval_real_cpu``, ``fidelity_real_cpu``.
        root: another root (tests); default ``REFERENCE_ROOT``.
    """
    path = Path(root or REFERENCE_ROOT) / name
    if not path.is_dir():
        return None
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return Reference(name, path, meta)


def training_runs(folder: str | Path) -> dict[str, dict[int, Path]]:
    """The ``<mode>_s<seed>/metrics.jsonl`` runs of a training-results folder.

    Returns:
        ``{mode: {seed: run dir}}``, modes and seeds sorted.
    """
    out: dict[str, dict[int, Path]] = {}
    for d in sorted(Path(folder).glob("*_s*")):
        mode, _, seed = d.name.rpartition("_s")
        if d.is_dir() and seed.isdigit() and (d / "metrics.jsonl").exists():
            out.setdefault(mode, {})[int(seed)] = d
    return {m: dict(sorted(v.items())) for m, v in sorted(out.items())}


def heldout_points(folder: str | Path, mode: str | None = None) -> list[dict[str, Any]]:
    """The held-out checkpoints of ``<folder>/heldout.json`` (``[]`` when absent).

    Args:
        mode: keep the points of this training mode (a point without ``mode`` counts as shared,
            and ``before_sft``/``after_sft`` points belong to every mode).
    """
    path = Path(folder) / "heldout.json"
    if not path.exists():
        return []
    points = json.loads(path.read_text()).get("checkpoints", [])
    if mode is None:
        return points
    return [p for p in points if p.get("mode", "shared") == mode
            or p.get("stage") in ("before_sft", "after_sft")]


def sweep_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``evaluate.budget_sweep``-shaped points from evaluation rows (one per configuration).

    Rows are grouped by (rehearsal mode, N, rehearsing policy); each group is summarized with
    ``tables.sweep_point``, so a results file written by ``evaluate``/``budget_sweep`` can be
    drawn by ``eval_figures.plot_budget_sweep`` without rerunning it.
    """
    from envace_lite.pipelines.tables import sweep_point

    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        mode = r.get("rehearsal", "none")
        key = (mode, int(r.get("n", 0)) if mode != "none" else 0,
               r.get("rehearsal_policy", "") if mode != "none" else "")
        groups.setdefault(key, []).append(r)
    points = []
    for (mode, n, rpol), sub in groups.items():
        point = sweep_point(mode, n, sub)
        if rpol and rpol != sub[0].get("policy", ""):
            point["rehearsal_policy"] = rpol
        points.append(point)
    return points


PAPER = {
    "source": "EnvACE (arXiv 2608.06197), §3.2-3.3",
    # Fig. 3: tau2-Bench Avg. (%), Qwen3 base / +GRPO / per-role policy / EnvACE (shared)
    "fig3": {"Qwen3-8B": {"base": 30.0, "GRPO": 31.2, "per_role": 35.5, "shared": 36.7},
             "Qwen3-1.7B": {"base": 10.4, "GRPO": 14.7, "per_role": 14.0, "shared": 15.3}},
    # Fig. 5: tau2-Bench offline score (0-1) of EnvACE-8B during training, by step (approximate)
    "fig5": {50: 0.30, 200: 0.36, 250: 0.341, 400: 0.335, 470: 0.367},
    # Table 3 (N = 2, Qwen3-8B): tau2 Avg., BFCL multi-turn Avg., Overall (%)
    "table3": {"Non-TTS": (31.4, 41.9, 36.7),
               "parallel, Base rehearsal": (32.2, 41.4, 36.8),
               "parallel, EnvACE rehearsal": (38.0, 43.9, 40.9),
               "sequential, Base rehearsal": (31.0, 38.8, 34.9),
               "sequential, EnvACE rehearsal": (34.8, 42.3, 38.5)},
    # Fig. 6: BFCL multi-turn (%) against N = 1, 2, 3 (EnvACE rehearsal; Base only where given)
    "fig6": {"parallel": {1: 42.12, 2: 43.88, 3: 39.00},
             "sequential": {1: 40.12, 2: 42.25, 3: 39.00},
             "parallel (Base)": {2: 41.42, 3: 37.12},
             "sequential (Base)": {2: 38.75, 3: 36.62}},
}
"""The paper's numbers that notebooks 04-07 set beside ours (different model, data, compute)."""


__all__ = [
    "PAPER",
    "REFERENCE_ROOT",
    "Reference",
    "heldout_points",
    "reference_results",
    "sweep_points",
    "training_runs",
]
