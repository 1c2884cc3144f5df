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
``tau2-retail-drills`` drills generated from tau2's retail DB: lookup, two-hop, rule-gated
                       cancel and return (``drills/suite.py``), scored by tau2's evaluator
``tau2-airline-drills`` likewise for airline: lookup, two-hop, basic-economy-gated change
``tau2-retail-drills-v2`` retail drills v2: every drill asks for a fact copied from an
                       observation; held-out slices ``validation`` and ``confirmation``
``tau2-retail-drills-v2-compact`` the same drills, records shown compact
                       (``drills/records.py``, a study lever)
=====================  =====================================================================

Usage::

    from envace_lite.envs import list_tasks, make_env
    env = make_env("bfcl-base", list_tasks("bfcl-base", "test")[0])
"""
from __future__ import annotations

from types import ModuleType

from envace_lite.envs.base import Env, GoldTurn, replay_gold

TAU2_SUITES = (
    "tau2-telecom", "tau2-retail", "tau2-airline", "tau2-retail-ticket", "tau2-airline-ticket",
)
BFCL_SUITES = ("bfcl-base", "bfcl-miss_func", "bfcl-miss_param", "bfcl-long_context")
DRILL_SUITES = ("tau2-retail-drills", "tau2-airline-drills", "tau2-retail-drills-v2",
                "tau2-retail-drills-v2-compact")
"""Suites the ``drills`` plugin registers (``plugins.py``) when first asked for."""
SUITES = TAU2_SUITES + BFCL_SUITES + DRILL_SUITES

_REGISTERED: dict[str, ModuleType] = {}


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
    elif suite in SUITES:
        if suite not in _REGISTERED:
            from envace_lite.plugins import load_plugins

            load_plugins()
        mod = _REGISTERED[suite]
    else:
        raise KeyError(f"unknown suite {suite!r}: choose one of {list(SUITES)}")
    return mod


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
    "DRILL_SUITES",
    "SUITES",
    "TAU2_SUITES",
    "Env",
    "GoldTurn",
    "list_tasks",
    "make_env",
    "register_suites",
    "replay_gold",
    "suite_module",
]
