"""Real benchmark environments behind one interface (docs/design.md, "Env" and "Benchmarks
and training data").

Suites (the name says the protocol):

=====================  =====================================================================
``tau2-telecom``       tau2 telecom, official solo mode, base task set (74 train / 40 test)
``tau2-retail``        tau2 retail with a USER endpoint (raises without one)
``tau2-airline``       tau2 airline with a USER endpoint (raises without one)
``tau2-retail-ticket`` NON-OFFICIAL: user instructions as the first message, no user simulator
``tau2-airline-ticket`` NON-OFFICIAL: likewise for airline
``bfcl-base``          BFCL v4 multi-turn base (scripted user turns, official checker)
``bfcl-miss_func``     BFCL v4 multi-turn, a function held out until a later turn
``bfcl-miss_param``    BFCL v4 multi-turn, a parameter withheld (the model should ask)
``bfcl-long_context``  BFCL v4 multi-turn with large distractor state
=====================  =====================================================================

A plugin serves more suites from its own module (``register_suites``; ``plugins.py`` imports
the plugins when a suite that no adapter serves is first asked for, ``all_suites`` lists them
all).

Usage::

    from envace_lite.envs import list_tasks, make_env
    env = make_env("bfcl-base", list_tasks("bfcl-base", "test")[0])
"""
from __future__ import annotations

from types import ModuleType

from envace_lite.envs.base import Env

TAU2_SUITES = (
    "tau2-telecom", "tau2-retail", "tau2-airline", "tau2-retail-ticket", "tau2-airline-ticket",
)
BFCL_SUITES = ("bfcl-base", "bfcl-miss_func", "bfcl-miss_param", "bfcl-long_context")
BUILTIN_SUITES = TAU2_SUITES + BFCL_SUITES
"""The suites of the built-in adapters (``tau2.py``, ``bfcl.py``)."""

_REGISTERED: dict[str, ModuleType] = {}
"""Suites a plugin registered (``register_suites``), in registration order."""


def register_suites(suites: tuple[str, ...] | list[str], module: ModuleType) -> None:
    """Serve ``suites`` from ``module``: its ``task_ids(suite, split)`` and ``make(suite, task_id,
    **kwargs)``, and optionally ``suite_tasks(suite, split, rendering)`` (ready ``Task`` objects,
    used by ``envs.tasks.load_tasks``), ``suite_card(suite)`` (extra data-card fields) and
    ``splits(suite)`` (splits beyond train, test and all)."""
    for suite in suites:
        _REGISTERED[suite] = module


def suite_module(suite: str) -> ModuleType:
    """The module that serves ``suite`` (built-in adapters, or one a plugin registered).

    Raises:
        KeyError: on an unknown suite.
    """
    if suite in TAU2_SUITES:
        from envace_lite.envs import tau2 as mod
    elif suite in BFCL_SUITES:
        from envace_lite.envs import bfcl as mod
    else:
        if suite not in _REGISTERED:
            from envace_lite.plugins import load_plugins

            load_plugins()
        if suite not in _REGISTERED:
            raise KeyError(f"unknown suite {suite!r}: choose one of {list(all_suites())}")
        mod = _REGISTERED[suite]
    return mod


def registered_suites() -> tuple[str, ...]:
    """The suites the plugins serve (``register_suites``), in registration order; the plugins
    are imported first (``plugins.load_plugins``)."""
    from envace_lite.plugins import load_plugins

    load_plugins()
    return tuple(_REGISTERED)


def all_suites() -> tuple[str, ...]:
    """Every suite: the built-in adapters' (``BUILTIN_SUITES``), then the plugins'
    (``registered_suites``)."""
    return BUILTIN_SUITES + tuple(s for s in registered_suites() if s not in BUILTIN_SUITES)


def list_tasks(suite: str, split: str) -> list[str]:
    """Task ids of ``suite`` in ``split`` (``train``, ``test`` or ``all``, or a split the suite's
    module lists in its optional ``splits(suite)``, e.g. a v2 drill suite's held-out slices), in a
    fixed order.

    Raises:
        KeyError: on an unknown suite or split.
    """
    if split not in ("train", "test", "all"):
        valid = getattr(suite_module(suite), "splits", lambda _: ())(suite)
        if split not in valid:
            raise KeyError(f"unknown split {split!r}: choose "
                           + (f"one of {list(valid)}" if valid else "train, test or all"))
    return suite_module(suite).task_ids(suite, split)


def make_env(suite: str, task_id: str, **kwargs) -> Env:
    """A fresh real environment for one task (call ``reset()`` to start an episode).

    Keyword arguments go to the adapter (e.g. ``user=`` for ``tau2-retail``/``tau2-airline``).

    Raises:
        KeyError: on an unknown suite or task id.
        RuntimeError: for ``tau2-retail``/``tau2-airline`` without a USER endpoint.
    """
    return suite_module(suite).make(suite, task_id, **kwargs)


__all__ = [
    "BFCL_SUITES",
    "BUILTIN_SUITES",
    "TAU2_SUITES",
    "all_suites",
    "list_tasks",
    "make_env",
    "register_suites",
    "registered_suites",
    "suite_module",
]
