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
                       cancel and return (``drills.py``), scored by tau2's evaluator
``tau2-airline-drills`` likewise for airline: lookup, two-hop, basic-economy-gated change
=====================  =====================================================================

Usage::

    from envace_lite.envs import list_tasks, make_env
    env = make_env("bfcl-base", list_tasks("bfcl-base", "test")[0])
"""
from __future__ import annotations

from envace_lite.envs.base import Env, GoldTurn, replay_gold

TAU2_SUITES = (
    "tau2-telecom", "tau2-retail", "tau2-airline", "tau2-retail-ticket", "tau2-airline-ticket",
)
BFCL_SUITES = ("bfcl-base", "bfcl-miss_func", "bfcl-miss_param", "bfcl-long_context")
DRILL_SUITES = ("tau2-retail-drills", "tau2-airline-drills")
SUITES = TAU2_SUITES + BFCL_SUITES + DRILL_SUITES


def _module(suite: str):
    if suite in TAU2_SUITES:
        from envace_lite.envs import tau2 as mod
    elif suite in BFCL_SUITES:
        from envace_lite.envs import bfcl as mod
    elif suite in DRILL_SUITES:
        from envace_lite.envs import drills as mod
    else:
        raise KeyError(f"unknown suite {suite!r}: choose one of {list(SUITES)}")
    return mod


def list_tasks(suite: str, split: str) -> list[str]:
    """Task ids of ``suite`` in ``split`` (``train``, ``test`` or ``all``), in a fixed order.

    Raises:
        KeyError: on an unknown suite or split.
    """
    if split not in ("train", "test", "all"):
        raise KeyError(f"unknown split {split!r}: choose train, test or all")
    return _module(suite).task_ids(suite, split)


def make_env(suite: str, task_id: str, **kwargs) -> Env:
    """A fresh real environment for one task (call ``reset()`` to start an episode).

    Keyword arguments go to the adapter (e.g. ``user=`` for ``tau2-retail``/``tau2-airline``).

    Raises:
        KeyError: on an unknown suite or task id.
        RuntimeError: for ``tau2-retail``/``tau2-airline`` without a USER endpoint.
    """
    return _module(suite).make(suite, task_id, **kwargs)


__all__ = [
    "BFCL_SUITES",
    "DRILL_SUITES",
    "SUITES",
    "TAU2_SUITES",
    "Env",
    "GoldTurn",
    "list_tasks",
    "make_env",
    "replay_gold",
]
