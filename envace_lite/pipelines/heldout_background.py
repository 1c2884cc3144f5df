"""Held-out checks beside training: the process they run in and the checkpoint copies they read.

``learning_curve.run_experiment(background_heldout=True)`` hands the held-out checks before the
last one to ``background_pool`` and reads intermediate checkpoints from ``snapshot`` copies in
``SNAPSHOTS``, because training keeps only its last checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SNAPSHOTS = "heldout_snapshots"
"""The folder, in an experiment's run folder, of the checkpoint copies that background held-out
checks read (``run_experiment(background_heldout=True)``)."""


def one_thread() -> None:
    """The background held-out process's initializer: one torch thread, beside training's."""
    import torch

    torch.set_num_threads(1)


def background_pool() -> Any:
    """The background held-out checks' executor: one spawned process with one torch thread
    (spawned, not forked: the parent holds torch's thread pools)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=one_thread)


def snapshot(checkpoint: Path, dest: Path) -> Path:
    """Copy a training checkpoint's weights, config and tokenizer (not its optimizer, scheduler
    or RNG state) to ``dest``; the copy is written beside ``dest`` and renamed into place, so a
    ``dest`` that exists is whole."""
    import shutil

    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(
        "optimizer.pt", "scheduler.pt", "rng_state*", "training_args.bin"))
    tmp.rename(dest)
    return dest
