"""Resuming a training run: which checkpoint it continues from, and under which settings.

A run dir's ``checkpoints/checkpoint-<step>`` folders are complete once their
``trainer_state.json`` (which HF writes last) parses; ``last_checkpoint`` finds the newest one and
can remove the incomplete ones a kill during a save left behind. A resumed run must keep every
setting that changes what training computes (``config_drift``, ``check_resume_config``; the
fields in ``RESUME_FREE`` and the groups in ``RESUME_FREE_GROUPS`` may change).
``resume_hint`` is the CLI command that resumes a stopped run. ``train.py`` calls all of them
and re-exports them.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from envace_lite.config import STUDY_HOME, Config, ConfigError, current_dict
from envace_lite.progress import get_logger

log = get_logger(__name__)

CHECKPOINTS = "checkpoints"
"""The folder of a run dir that holds its ``checkpoint-<step>`` folders."""


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def checkpoint_step(path: Path) -> int:
    """The GRPO step of a ``checkpoint-<step>`` folder (``checkpoint-12`` → 12)."""
    return int(path.name.rsplit("-", 1)[1])


def _complete(checkpoint: Path) -> bool:
    """Whether a checkpoint's ``trainer_state.json`` (HF writes it last) is there and parses."""
    try:
        return isinstance(json.loads((checkpoint / "trainer_state.json").read_text()), dict)
    except (OSError, ValueError):  # absent, or torn by a kill during the save
        return False


def last_checkpoint(run_dir: str | Path, clean: bool = False) -> Path | None:
    """The newest complete checkpoint of a run (its ``trainer_state.json`` parses), or None.

    Args:
        clean: delete incomplete checkpoint folders newer than it (a kill during a save).
    """
    folder = Path(run_dir) / CHECKPOINTS
    found = sorted(folder.glob("checkpoint-*"), key=checkpoint_step) if folder.exists() else []
    complete = [p for p in found if _complete(p)]
    last = complete[-1] if complete else None
    if clean:
        for p in found:
            if p not in complete and (last is None or checkpoint_step(p) > checkpoint_step(last)):
                log.warning("removing incomplete checkpoint %s", p)
                shutil.rmtree(p)
    return last


# ---------------------------------------------------------------------------------------------
# The settings a resumed run may change
# ---------------------------------------------------------------------------------------------
RESUME_FREE = ("grpo.steps", "grpo.save_every", "run.progress", "run.runs_root")
"""Fields a resumed run may change: a longer run, its checkpoint cadence, progress bars and
the runs root. The ``eval`` and ``rehearsal`` groups (test-time settings training never reads)
may change too; every other field changes what training computes."""
RESUME_FREE_GROUPS = ("eval", "rehearsal")
"""Groups a resumed run may change (see ``RESUME_FREE``); a ``study`` lever may change when the
group of the mechanism it acts on may (``config.STUDY_HOME``: ``study.memory_source`` is a
rehearsal setting)."""


def config_drift(recorded: dict[str, Any], cfg: Config,
                 free: tuple[str, ...] = RESUME_FREE,
                 free_groups: tuple[str, ...] = RESUME_FREE_GROUPS) -> list[str]:
    """``key: recorded -> now`` for each field of a recorded ``config.json`` that differs from
    ``cfg`` and changes results (outside ``free`` and ``free_groups``); ``profile`` included.

    A ``config.json`` saved with a study lever under its old group (``model.pretrain``) is
    compared under its ``study`` key (``config.current_dict``), so that the lever is neither
    reported as drifted nor missed."""
    recorded = current_dict(recorded, "recorded config")
    new = cfg.to_dict()
    diffs = []
    if recorded.get("profile") != new["profile"]:
        diffs.append(f"profile: {recorded.get('profile')!r} -> {new['profile']!r}")
    for g, sub in new.items():
        if not isinstance(sub, dict) or g in free_groups:
            continue
        old = recorded.get(g) if isinstance(recorded.get(g), dict) else {}
        for k, v in sub.items():
            key = f"{g}.{k}"
            if STUDY_HOME.get(key) in free_groups:  # a study lever of a free group
                continue
            if key not in free and old.get(k, v) != v:
                diffs.append(f"{g}.{k}: {old.get(k)!r} -> {v!r}")
    return diffs


def check_resume_config(run_dir: str | Path, cfg: Config, free: tuple[str, ...] = RESUME_FREE,
                        free_groups: tuple[str, ...] = RESUME_FREE_GROUPS) -> None:
    """Refuse to resume ``run_dir`` under a config that changes results (``config_drift`` with
    ``free`` and ``free_groups``).

    Called before anything is written into the folder; its ``config.json`` is left as it is.

    Raises:
        ConfigError: one line naming each differing field, its recorded and its new value.
    """
    path = Path(run_dir) / "config.json"
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path} is not JSON ({e}): use another folder") from None
    diffs = config_drift(recorded, cfg, free, free_groups)
    if diffs:
        raise ConfigError(f"{run_dir} was made under another config ({'; '.join(diffs)}): "
                          "resume it with its recorded settings, or use a new folder")


def resume_hint(cfg: Config, run_dir: str | Path) -> str:
    """The CLI command that resumes a run: ``envace-lite train --profile P --run-dir DIR``
    (with the run's own ``--set``/``--overrides``; ``DIR/config.json`` records them)."""
    return (f"envace-lite train --profile {cfg.profile} --run-dir {run_dir} (with the same "
            f"--set/--overrides; {Path(run_dir) / 'config.json'} records them)")
