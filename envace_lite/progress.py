"""One helper for progress bars and logging.

Bars wrap ``tqdm.auto`` with an explicit ``disable=`` (the ``TQDM_DISABLE`` variable does not reach
notebook bars). Logging goes to stderr on rank 0 only; other ranks log warnings and worse.
``quiet_trainer`` removes the Hugging Face trainers' per-step printing, so that a notebook shows
what the course prints and not a log line per optimizer step.
"""
from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable
from typing import Any

with warnings.catch_warnings():
    # tqdm.auto warns at import in a notebook without ipywidgets, then falls back to text bars
    warnings.filterwarnings("ignore", message=r"IProgress not found")
    from tqdm.auto import tqdm

_CONFIGURED = False


def is_rank0() -> bool:
    """True on the main process of a distributed run (``RANK`` unset or 0)."""
    return os.environ.get("RANK", "0") == "0"


def progress(iterable: Iterable | None = None, *, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar, shown only when ``enabled`` and on rank 0.

    Args:
        iterable: what to iterate over, or ``None`` with ``total=`` for a manual bar.
        enabled: the run config's ``run.progress`` (False in headless CI profiles).
        **kwargs: passed to ``tqdm`` (``total``, ``desc``, ``unit`` ...).
    """
    return tqdm(iterable, disable=not (enabled and is_rank0()), dynamic_ncols=True, **kwargs)


def get_logger(name: str = "envace_lite") -> logging.Logger:
    """The package logger: INFO on rank 0, WARNING elsewhere (or ``ENVACE_LOG_LEVEL``), one
    stderr handler."""
    global _CONFIGURED
    root = logging.getLogger("envace_lite")
    if not _CONFIGURED:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                               "%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("ENVACE_LOG_LEVEL", "").upper()
                      or (logging.INFO if is_rank0() else logging.WARNING))
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(name)


def quiet_trainer(trainer: Any, *, progress_bar: bool = False) -> Any:
    """Remove a ``transformers.Trainer``'s console output: the ``PrinterCallback`` that prints
    every log dict when its bars are off, and (unless ``progress_bar``) its ``ProgressCallback``.
    The logs still reach ``trainer.state.log_history`` and the run's own ``metrics.jsonl``.

    Returns:
        ``trainer``.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    if not (progress_bar and is_rank0()):
        trainer.remove_callback(ProgressCallback)
    return trainer


def quiet_logs(level: str = "WARNING") -> None:
    """Lower the package's log level (a notebook shows what its cells print; the progress lines
    of loading, rollouts and training are for the console): sets ``ENVACE_LOG_LEVEL`` for loggers
    configured later and the level of the one already configured."""
    os.environ["ENVACE_LOG_LEVEL"] = level
    if _CONFIGURED:
        logging.getLogger("envace_lite").setLevel(level)
