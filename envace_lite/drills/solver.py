"""The scripted solver the drill generators share (``generate.py`` for v1, ``generate_v2.py``):
every gold call runs in one real tau2 environment and records tau2's real response.

Usage::

    from envace_lite.drills.solver import Solver
    solver = Solver("retail")
    call, observation, order = solver.ok("get_order_details", order_id="#W1006327")
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any

from tau2.data_model.message import ToolCall as Tau2ToolCall

from envace_lite.drills.spec import TIER_TOOLS, Drill, test_user
from envace_lite.envs.tau2 import new_environment


# ---------------------------------------------------------------------------------------------
# The scripted solver: every gold call runs in the real tau2 environment
# ---------------------------------------------------------------------------------------------
class Skip(Exception):
    """A drill the solver cannot build; the message is the reason."""


class Solver:
    """Runs calls in one real tau2 environment of ``domain``.

    Reads share the environment. A write runs inside ``scratch(...)``, which snapshots the
    objects the write may touch and puts them back after; ``generate`` checks at the end that the
    database hash equals the pristine one, so a leaked write cannot go unnoticed.
    """

    def __init__(self, domain: str) -> None:
        self.env = new_environment(domain)
        self.db = self.env.tools.db
        self.n = 0

    def call(self, name: str, **arguments: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        self.n += 1
        msg = self.env.get_response(Tau2ToolCall(id=f"solver_{self.n}", name=name,
                                                 arguments=arguments, requestor="assistant"))
        return ({"name": name, "arguments": copy.deepcopy(arguments)},
                {"content": msg.content or "", "error": bool(msg.error)})

    def ok(self, name: str, **arguments: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """A call that must succeed; returns ``(call, observation, parsed JSON or text)``."""
        c, o = self.call(name, **arguments)
        if o["error"]:
            raise Skip(f"solver call {name} failed: {o['content'][:120]}")
        try:
            value = json.loads(o["content"])
        except json.JSONDecodeError:
            value = o["content"]
        return c, o, value

    def scratch(self, tables: dict[str, list[str]]) -> Any:
        solver = self

        class _Scratch:
            def __enter__(self_inner):
                self_inner.saved = {t: {k: copy.deepcopy(getattr(solver.db, t)[k]) for k in keys}
                                    for t, keys in tables.items()}

            def __exit__(self_inner, *exc):
                for t, objs in self_inner.saved.items():
                    getattr(solver.db, t).update(objs)
                return False

        return _Scratch()


def pick(rng: random.Random, options: list[str], **fmt: Any) -> str:
    """One of ``options``, drawn with ``rng`` and formatted with ``fmt``."""
    return rng.choice(options).format(**fmt)


def make_drill(tier: str, entity: str, domain: str, uid: str, **kw: Any) -> Drill:
    """A ``Drill`` of ``tier`` on ``entity`` (id ``"<tier>:<entity>"``), split by its user
    (``spec.test_user``), showing the tier's tools (``spec.TIER_TOOLS``)."""
    return Drill(id=f"{tier}:{entity}", domain=domain, tier=tier,
                 split="test" if test_user(uid) else "train", user_id=uid,
                 tools=list(TIER_TOOLS[(domain, tier)]), **kw)


__all__ = ["Skip", "Solver", "make_drill", "pick"]
