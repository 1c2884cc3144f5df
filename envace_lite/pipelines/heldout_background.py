"""Held-out checks beside training: the process they run in and the checkpoint copies they read.

``learning_curve.run_experiment(background_heldout=True)`` hands the held-out checks before the
last one to ``background_pool`` and reads intermediate checkpoints from ``snapshot`` copies in
``SNAPSHOTS``, because training keeps only its last checkpoint. ``collect`` saves the points the
background process finished (``collect_finished``: those that ended well, after an interruption)
and deletes their copies.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SNAPSHOTS = "heldout_snapshots"
"""The folder, in an experiment's run folder, of the checkpoint copies that background held-out
checks read (``run_experiment(background_heldout=True)``)."""


def one_thread(leader: int | None = None, every: float = 1.0) -> None:
    """The background held-out process's initializer: one torch thread, beside training's, and a
    watchdog that ends this process when its leader is gone.

    Args:
        leader: the pid of the experiment process (None: this process's parent at start).
        every: seconds between two looks at the leader.
    """
    import os
    import threading

    import torch

    torch.set_num_threads(1)
    leader = os.getppid() if leader is None else leader

    def watch() -> None:  # a kill -9 of the leader leaves no one to shut this process down
        while True:
            time.sleep(every)
            if os.getppid() != leader:
                os._exit(1)

    threading.Thread(target=watch, name="leader-watchdog", daemon=True).start()


def background_pool() -> Any:
    """The background held-out checks' executor: one spawned process with one torch thread
    (spawned, not forked: the parent holds torch's thread pools) that ends when this process
    does, a kill -9 included (``one_thread``'s watchdog)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import os

    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=one_thread, initargs=(os.getpid(),))


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


def collect(pending: dict[Any, Path | None], keep: Callable[[dict[str, Any]], None],
            wait: bool) -> None:
    """Save the background points that are done (all of them, waiting, when ``wait``).

    Args:
        pending: ``{future: snapshot copy or None}`` of the submitted held-out checks; the
            collected ones are removed from it, and their copies deleted.
        keep: saves one held-out point (``learning_curve``'s ``heldout.json``).
        wait: wait for every pending check.

    Raises:
        Whatever a collected check raised in the background process.
    """
    import shutil

    for fut in list(pending):
        if wait or fut.done():
            snap = pending.pop(fut)
            keep(fut.result())
            if snap is not None:
                shutil.rmtree(snap, ignore_errors=True)


def collect_finished(pending: dict[Any, Path | None],
                     keep: Callable[[dict[str, Any]], None]) -> int:
    """After an interruption: save the background points that ended well, as ``collect`` does;
    leave the rest in ``pending`` (a rerun measures them).

    Returns:
        The number of points saved.
    """
    import shutil

    n = 0
    for fut in list(pending):
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            snap = pending.pop(fut)
            keep(fut.result())
            if snap is not None:
                shutil.rmtree(snap, ignore_errors=True)
            n += 1
    return n
