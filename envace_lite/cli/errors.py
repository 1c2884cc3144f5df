"""How the ``envace-lite`` commands report a user mistake (``cli/main.py``, ``cli/data.py``).

A user mistake prints one line, ``error: ...``, and exits 2 before any run dir is created or model
loaded; a judge that does not answer exits 1 the same way; ``envace-lite --debug CMD ...``
(``STATE["debug"]``, set by the root callback) shows the traceback instead.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import typer

from envace_lite.config import Config, ConfigError, get_config

STATE: dict[str, Any] = {"debug": False, "run_folder": None}
"""``debug``: the root ``--debug`` flag of the running command; ``run_folder``: the folder
``make_run_folder`` gave it (None until then)."""


def user_errors(fn):
    """User mistakes (``ConfigError``) print one line and exit 2; a judge that does not answer
    (``judge.JudgeUnavailable``) exits 1; Ctrl-C prints one line saying what was kept and where
    (the run folder of ``make_run_folder``, or a series' pages) and exits 130; ``--debug``
    re-raises them with the traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        STATE["run_folder"] = None
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            if STATE["debug"]:
                raise
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:
            if STATE["debug"]:
                raise
            where = getattr(e, "folder", None) or STATE.get("run_folder")
            kept = (f"series.json and index.html written in {where}, notebook "
                    f"{e.notebook} marked interrupted" if hasattr(e, "notebook") else
                    f"what finished is kept in {where}" if where else
                    "what finished is kept in the command's run folder")
            typer.echo(f"interrupted: {kept}; rerun the same command to go on", err=True)
            raise typer.Exit(130) from None
        except RuntimeError as e:
            from envace_lite.core.judge import JudgeUnavailable

            if STATE["debug"] or not isinstance(e, JudgeUnavailable):
                raise
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def drill_errors(fn):
    """Drill commands: a bad input (``KeyError``, ``ValueError``, ``FileNotFoundError``) prints one
    line naming the valid choices and exits 2; ``--debug`` re-raises it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (KeyError, ValueError, FileNotFoundError) as e:
            if STATE["debug"]:
                raise
            typer.echo(f"error: {e.args[-1] if e.args else e}", err=True)
            raise typer.Exit(2) from None

    return wrapper


# ---------------------------------------------------------------------------------------------
# Checks every command runs before any work or run folder
# ---------------------------------------------------------------------------------------------
def config_for(profile: str, overrides: dict[str, Any]) -> Config:
    """``get_config(profile, overrides)``, with an invalid combination (``Config.finalize``'s
    ``ValueError``, e.g. ``grpo.act_only_baseline`` outside the act_only modes) as a
    ``ConfigError``: one line at the CLI."""
    try:
        return get_config(profile, overrides)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def existing_folder(path: str | Path, name: str, holds: str = "") -> Path:
    """``path`` as a ``Path`` when it is a folder (holding ``holds``, when given).

    Raises:
        ConfigError: the folder is absent, or lacks ``holds`` (one line naming the option).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{name} {path}: the folder is absent"
                          + (f" (so no {holds})" if holds else ""))
    if holds and not (folder / holds).exists():
        raise ConfigError(f"{name} {path}: the folder holds no {holds}")
    return folder


def checkpoint_option(path: str, cfg: Config, name: str, allow_mismatch: bool = False) -> None:
    """Check a checkpoint option before any work: the folder exists and was trained under
    ``cfg``'s profile and model (``paths.check_checkpoint``); ``""`` and ``base`` pass.

    Raises:
        ConfigError: the folder is absent, or trained under another profile or model (unless
            ``allow_mismatch``).
    """
    from envace_lite.paths import check_checkpoint

    if path and path != "base":
        check_checkpoint(path, cfg, allow_mismatch, name)


def check_run_suites(cfg: Config, heldout: bool) -> None:
    """The training suites (``grpo.suites``, train split) and, with ``heldout``, the held-out
    ones (``eval.suites`` at ``eval.split``), as ``eval`` checks them: before any run folder or
    model, so a mistake costs no warm start.

    Raises:
        ConfigError: an unknown suite or a split it lacks (``evaluate.check_suites``'s line).
    """
    from envace_lite.envs import list_tasks
    from envace_lite.pipelines.evaluate import check_suites

    try:
        for suite in cfg.grpo.suites:
            list_tasks(suite, "train")
    except KeyError as e:
        raise ConfigError(f"grpo.suites: {e.args[0] if e.args else e}") from None
    if heldout:
        check_suites(list(cfg.eval.suites), cfg.eval.split, cfg.eval.user_url)


def read_json_file(path: str | Path, name: str) -> Any:
    """The JSON value of the file an option names.

    Raises:
        ConfigError: the file is absent, unreadable, empty or not JSON (one line naming the
            option and the file).
    """
    import json

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{name} {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        what = "is empty" if not text.strip() else f"is not JSON ({e.msg}, line {e.lineno})"
        raise ConfigError(f"{name} {path} {what}") from None


def make_run_folder(out: str, command: str, profile: str, seed: int, root: str) -> Path:
    """The run folder: ``out`` (created when absent), or a new
    ``runs/<command>/<profile>__s<seed>__<time>/`` (``paths.new_run_dir``). Call it after every
    other check, so that a refused command leaves no folder behind.

    Raises:
        ConfigError: the folder cannot be created (a read-only runs folder, a file in the way).
    """
    from envace_lite.paths import new_run_dir

    try:
        if out:
            folder = Path(out)
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = new_run_dir(command, profile, seed, root)
        STATE["run_folder"] = str(folder)  # named by the Ctrl-C line (user_errors)
        return folder
    except OSError as e:
        import os

        where = out or f"under {os.environ.get('ENVACE_RUNS') or root}"
        raise ConfigError(f"cannot create the run folder {where}: {e.strerror or e}") from None


def probe_user(url: str, model: str) -> None:
    """One small chat completion to a USER endpoint, before any episode.

    Raises:
        ConfigError: the endpoint does not answer (names the URL).
    """
    from envace_lite.llm.endpoints import EndpointError, chat_completion

    try:
        chat_completion(url, model, [{"role": "user", "content": "ping"}], timeout=10.0)
    except EndpointError as e:
        raise ConfigError(f"the USER endpoint --user-url {url} does not answer ({e}); start "
                          "it, or use the -ticket suites") from None


__all__ = ["STATE", "checkpoint_option", "config_for", "drill_errors", "existing_folder",
           "make_run_folder", "probe_user", "user_errors"]
