"""How the ``envace-lite`` commands report a user mistake (``cli/main.py``, ``cli/data.py``).

A user mistake prints one line, ``error: ...``, and exits 2 before any run dir is created or model
loaded; a judge that does not answer exits 1 the same way; ``envace-lite --debug CMD ...``
(``STATE["debug"]``, set by the root callback) shows the traceback instead.
"""
from __future__ import annotations

import functools

import typer

from envace_lite.config import ConfigError

STATE = {"debug": False}
"""``debug``: the root ``--debug`` flag of the running command."""


def user_errors(fn):
    """User mistakes (``ConfigError``) print one line and exit 2; a judge that does not answer
    (``judge.JudgeUnavailable``) exits 1; ``--debug`` re-raises both with the traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            if STATE["debug"]:
                raise
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
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


__all__ = ["STATE", "drill_errors", "user_errors"]
