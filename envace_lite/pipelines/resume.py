"""Resuming a training run: which checkpoint it continues from, and under which settings.

A run dir's ``checkpoints/checkpoint-<step>`` folders are complete once their
``trainer_state.json`` (which HF writes last) parses; ``last_checkpoint`` finds the newest one and
can remove the incomplete ones a kill during a save left behind. A resumed run must keep every
setting that changes what training computes (``config_drift``, ``check_resume_config``; the
fields in ``RESUME_FREE`` and the groups in ``RESUME_FREE_GROUPS`` may change).
``resume_hint`` is the CLI command that resumes a stopped run. ``relocate`` points a moved
experiment folder's training record at its own warm start, so that the resume check does not
refuse it. ``check_warmstart_folder`` says whether a warm-start folder (its ``CHECKPOINT``) is
finished, and refuses one of another command or config. ``train.py``, ``sft.py`` and
``learning_curve.py`` call them; import them from here.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from envace_lite.config import Config, ConfigError
from envace_lite.progress import get_logger

log = get_logger(__name__)

CHECKPOINTS = "checkpoints"
"""The folder of a run dir that holds its ``checkpoint-<step>`` folders."""

CHECKPOINT = "checkpoint"
"""Run-dir subfolder of the warm-start policy (a full model + tokenizer; pass it as
``model.checkpoint``)."""


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
RESUME_FREE = ("grpo.steps", "grpo.save_every", "run.progress", "run.runs_root",
               "study.memory_source")
"""Fields a resumed run may change: a longer run, its checkpoint cadence, progress bars, the
runs root and who writes the test-time rehearsal memory. The ``eval`` and ``rehearsal`` groups
(test-time settings training never reads) may change too; every other field changes what
training computes."""
RESUME_FREE_GROUPS = ("eval", "rehearsal")
"""Groups a resumed run may change (see ``RESUME_FREE``)."""


def config_drift(recorded: dict[str, Any], cfg: Config,
                 free: tuple[str, ...] = RESUME_FREE,
                 free_groups: tuple[str, ...] = RESUME_FREE_GROUPS) -> list[str]:
    """``key: recorded -> now`` for each field of a recorded ``config.json`` that differs from
    ``cfg`` and changes results (outside ``free`` and ``free_groups``); ``profile`` included."""
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


def relocate(run_dir: Path, checkpoint: str) -> bool:
    """Point a moved experiment's training record at its own warm start.

    An experiment folder that was copied or moved holds, in ``train/config.json``, the absolute
    path of its warm-start checkpoint at the old place; the training resume would refuse that as
    another config. When the recorded path is gone, ends as ``checkpoint`` does, and
    ``checkpoint`` is the folder's own (inside the experiment folder, ``run_dir``'s parent), it
    is rewritten to ``checkpoint``, with a warning (``learning_curve.run_experiment`` calls it
    before it resumes training).

    Args:
        run_dir: the experiment's training run dir (``<experiment>/train``).
        checkpoint: the warm-start checkpoint the experiment trains from now.

    Returns:
        True when the record was rewritten.
    """
    path = run_dir / "config.json"
    if not path.exists():
        return False
    try:
        recorded = json.loads(path.read_text())
        old = recorded["model"]["checkpoint"]
    except (ValueError, KeyError, TypeError):
        return False  # the training resume check names what is wrong with it
    mine = Path(checkpoint).resolve().is_relative_to(run_dir.parent.resolve())
    if (not old or old == checkpoint or Path(old).exists() or not mine
            or Path(old).parts[-2:] != Path(checkpoint).parts[-2:]):
        return False  # an outside warm start (--warmstart DIR) is never rewritten
    recorded["model"]["checkpoint"] = checkpoint
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(recorded, indent=2, sort_keys=True))
    tmp.replace(path)
    log.warning("%s: the experiment folder was moved; its training record now names the warm "
                "start at %s (was %s)", run_dir, checkpoint, old)
    return True


WARMSTART_FREE = ("run.progress", "run.runs_root", "study.reward_control", "study.memory_source")
"""Fields a warm start never reads: RL's reward control and the test-time memory source (with
progress bars and the runs root)."""

WARMSTART_FREE_GROUPS = ("eval", "rehearsal", "grpo")
"""Groups a warm start never reads (``grpo.suites`` aside, which names its tasks): a rerun into a
warm-start folder may change them."""


def check_warmstart_folder(run_dir: str | Path, cfg: Config) -> bool:
    """Whether ``run_dir`` holds this warm start finished; refuse what it must not overwrite.

    Returns:
        True when the folder holds a finished warm start of the same config (its
        ``summary.json`` and checkpoint): nothing is to be done. False for an absent or empty
        folder, or an unfinished warm start of the same config (it is started again).

    Raises:
        ConfigError: the folder holds another command's run (a ``train`` run's checkpoints or
            metrics, an evaluation's rows, an experiment's points), or a warm start made under
            a config that changes its result (each field named, as ``check_resume_config``).
    """
    folder = Path(run_dir)
    if not folder.is_dir():
        return False
    other = [f"{name}: {what}" for name, what in (
        ("checkpoints", "a train run's checkpoints"), ("results.jsonl", "an evaluation's rows"),
        ("warmstart", "an experiment's warm start")) if (folder / name).exists()]
    summary = folder / "summary.json"
    if not other and summary.exists():
        try:
            if "sft" not in json.loads(summary.read_text()):
                other = ["summary.json: not a warm start's"]
        except ValueError:
            other = ["summary.json: not JSON"]
    if not other and (folder / "metrics.jsonl").exists() and any(
            '"step"' in line for line in (folder / "metrics.jsonl").read_text().splitlines()):
        other = ["metrics.jsonl: a train run's steps"]
    if other:
        raise ConfigError(f"{folder} holds another command's run ({', '.join(other)}): a warm "
                          "start would overwrite it; use a new --run-dir")
    check_resume_config(folder, cfg, WARMSTART_FREE, WARMSTART_FREE_GROUPS)
    recorded = folder / "config.json"
    if recorded.exists():
        old = json.loads(recorded.read_text()).get("grpo", {}).get("suites")
        if old is not None and list(old) != list(cfg.grpo.suites):
            raise ConfigError(f"{folder} was made under another config (grpo.suites: {old!r} -> "
                              f"{list(cfg.grpo.suites)!r}): use a new --run-dir")
    return summary.exists() and (folder / CHECKPOINT / "config.json").exists()
