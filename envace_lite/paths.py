"""Where files go: caches, derived data and run dirs (STYLE rule 8).

Environment variables move each root: ``ENVACE_CACHE`` (default ``~/.cache/envace_lite``),
``ENVACE_RUNS`` (default ``runs`` under the current directory).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout root (holds ``data/``, ``notebooks/``)."""

DATA_DIR = REPO_ROOT / "data"
"""Committed split files and the data card."""


def cache_dir(*parts: str) -> Path:
    """A writable cache folder (created), e.g. ``cache_dir("bfcl")``."""
    root = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace_lite"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(command: str, profile: str, seed: int, root: str | None = None) -> Path:
    """Create ``runs/<command>/<profile>__s<seed>__<time>/`` and return it (DESIGN §8).

    The root is ``ENVACE_RUNS`` when set, else ``root`` (the config's ``run.runs_root``), else
    ``runs`` under the current directory.
    """
    base = Path(os.environ.get("ENVACE_RUNS") or root or "runs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / command / f"{profile}__s{seed}__{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / command / f"{profile}__s{seed}__{stamp}-{n}"
    path.mkdir(parents=True)
    return path
