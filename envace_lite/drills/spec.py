"""What a drill is: the tiers, the tools each shows, the split rule, and the ``Drill`` record.

The real benchmarks are too hard for a few-million-parameter policy trained for a few CPU minutes,
so every held-out number on them is 0. The drills keep what is real (tau2's databases, tools,
policies, error messages and evaluator) and make the tasks short and shaped like the paper's case
studies (paper §4.4, Fig. 7 and Fig. 8):

=============  =======  ==========================================================================
tier           domain   the user asks ... (the gold a scripted solver executed in the real env)
=============  =======  ==========================================================================
``lookup``     retail   the status of order ``W1234567``, written without the ``#`` the tool needs
                        (Fig. 7: ``get_order_details("W1234567")`` gets tau2's real
                        ``Error: Order not found``) -> ``get_order_details("#W1234567")``
``two_hop``    retail   the status of "my order", given an email or a name and zip: find the user,
                        read their (only) order id, read the order
``cancel``     retail   to cancel an order: allowed only if it is ``pending`` (hidden in the DB);
                        otherwise refuse, say why (its status), write nothing
``return``     retail   to return one item: allowed only if the order is ``delivered``; refund to
                        the original payment method, read from the order
``lookup``     airline  the cabin of reservation ``ABC123``
``two_hop``    airline  the destination of "my reservation", given a user id
``change``     airline  to move a one-way reservation to another flight on the same route and day:
                        refused when it is basic economy (Fig. 8), else
                        ``update_reservation_flights`` with the reservation's own payment id

That table is generator v1 (``GENERATOR_VERSION``). Generator v2 (``generate_v2.py``, retail
only) keeps the tiers and asks every drill for a fact copied from an observation (a total, a
price, a tracking number, a payment method id) beside the status (``GENERATOR_VERSIONS``).

Every drill is a tau2 ``Task`` (``reward_basis`` DB + COMMUNICATE) scored by tau2's own evaluator
in the ``Tau2Env`` ticket protocol: the first text reply ends the episode. Every task names at
least one fact the user must be told (``communicate_info``: the status, cabin, destination, the
refusal's reason, or the outcome of the write), so a read-only task cannot be passed by doing
nothing (the DB check alone would pass it).

Split by entity: a user is in the test split iff ``sha1(user_id) / 2**160 < TEST_SHARE``; every
order and reservation belongs to one user, so no user, order or reservation of a test drill
appears in a train drill. The split does not depend on the generation seed.

The drill layers, bottom up: this file (the records), ``solver.py`` and ``generate.py`` (the
scripted solver that generates drills in the real environment), ``suite.py`` (the registered
suites and their ``DrillEnv``), ``baselines.py`` (scripted policies scored on the suites).

Usage::

    from envace_lite.drills.spec import TIERS, test_user
    TIERS["retail"]                                           # ("lookup", "two_hop", ...)
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tau2.data_model.tasks import Task as Tau2Task

TIERS: dict[str, tuple[str, ...]] = {
    "retail": ("lookup", "two_hop", "cancel", "return"),
    "airline": ("lookup", "two_hop", "change"),
}
"""The tiers of each domain, in round-robin order."""

TIER_TOOLS: dict[tuple[str, str], tuple[str, ...]] = {
    ("retail", "lookup"): ("get_order_details",),
    ("retail", "two_hop"): ("find_user_id_by_email", "find_user_id_by_name_zip",
                            "get_user_details", "get_order_details"),
    ("retail", "cancel"): ("get_order_details", "cancel_pending_order"),
    ("retail", "return"): ("get_order_details", "return_delivered_order_items"),
    ("airline", "lookup"): ("get_reservation_details",),
    ("airline", "two_hop"): ("get_user_details", "get_reservation_details"),
    ("airline", "change"): ("get_reservation_details", "update_reservation_flights"),
}
"""The tool subset shown in each tier (tau2's own schemas)."""

TEST_SHARE = 0.2
"""Share of users (and so of their orders and reservations) in the test split."""

DEFAULT_SEED = 0
"""The seed the registered suites are generated with."""

MAX_SEED = 2**31 - 1

AIRLINE_NOW = "2024-05-15"
"""tau2's airline policy: "The current time is 2024-05-15 15:00:00 EST"; earlier flights have
flown and cannot be changed."""

GENERATOR_VERSION = 1
"""The version the v1 suites (``tau2-retail-drills``, ``tau2-airline-drills``) are generated with;
their drills are byte-reproducible (``tests/test_drills_v2.py`` pins their sha256)."""

GENERATOR_VERSIONS: dict[int, tuple[str, ...]] = {1: ("retail", "airline"), 2: ("retail",)}
"""Generator version -> the domains it generates. v2 (``generate_v2.py``): every drill asks for a
fact that must be copied from an observation; retail only."""

@dataclass
class Drill:
    """One generated drill.

    Attributes:
        id: ``"<tier>:<entity>"``, e.g. ``"cancel:W2611340"`` (unique within a domain).
        domain: ``retail`` or ``airline``.
        tier: a key of ``TIERS[domain]``.
        split: ``train`` or ``test`` (by user, see the module docstring).
        user_id: the tau2 user who owns every entity of the drill.
        entities: the ids the drill touches (user, orders, reservations).
        message: the user's first (and only) message.
        tools: tool names shown (``TIER_TOOLS``).
        gold: the solver's calls, ``[{"name", "arguments"}]``, in order.
        observations: tau2's real response to each gold call, ``[{"content", "error"}]``.
        communicate: what the user must be told (tau2 ``communicate_info``).
        final_text: the solver's closing message (holds every ``communicate`` string).
        write_allowed: the gold performs a write (the hidden rule allows it).
        forbidden: for a refusal drill, the write the rule forbids (the corrupted replay and the
            "always write" baseline perform it); ``None`` for drills without a write request.
    """

    id: str
    domain: str
    tier: str
    split: str
    user_id: str
    entities: list[str]
    message: str
    tools: list[str]
    gold: list[dict[str, Any]]
    observations: list[dict[str, Any]]
    communicate: list[str]
    final_text: str
    write_allowed: bool = False
    forbidden: dict[str, Any] | None = None

    def tau2_task(self) -> Tau2Task:
        """The drill as a tau2 ``Task``: the message as ``user_scenario.instructions``, the gold as
        ``evaluation_criteria.actions``, ``communicate_info``, ``reward_basis`` DB + COMMUNICATE."""
        return Tau2Task.model_validate({
            "id": self.id,
            "description": {"purpose": f"envace-lite drill ({self.domain}, {self.tier})"},
            "user_scenario": {"instructions": self.message},
            "evaluation_criteria": {
                "actions": [{"action_id": f"gold_{i}", "name": g["name"],
                             "arguments": g["arguments"], "requestor": "assistant"}
                            for i, g in enumerate(self.gold)],
                "communicate_info": list(self.communicate),
                "reward_basis": ["DB", "COMMUNICATE"],
            },
        })


@dataclass
class Generation:
    """What ``generate`` returns: the drills, and the ones skipped with their reasons."""

    domain: str
    seed: int
    drills: list[Drill]
    skipped: list[dict[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{tier: {"train": n, "test": n, "write": n, "refuse": n}}``."""
        out: dict[str, dict[str, int]] = {t: {"train": 0, "test": 0, "write": 0, "refuse": 0}
                                          for t in TIERS[self.domain]}
        for d in self.drills:
            c = out[d.tier]
            c[d.split] += 1
            c["write"] += int(d.write_allowed)
            c["refuse"] += int(d.forbidden is not None)
        return out


def test_user(user_id: str) -> bool:
    """The split rule: ``sha1(user_id) / 2**160 < TEST_SHARE``."""
    return int(hashlib.sha1(user_id.encode()).hexdigest(), 16) / 2**160 < TEST_SHARE


def check_domain(domain: str) -> None:
    """Raise ``KeyError`` naming the valid domains."""
    if domain not in TIERS:
        raise KeyError(f"unknown drill domain {domain!r}: choose one of {sorted(TIERS)}")


def check_tiers(domain: str, tiers: Iterable[str] | None) -> tuple[str, ...]:
    """The requested tiers, validated; ``None`` means all. Raises ``KeyError`` naming them."""
    check_domain(domain)
    if tiers is None:
        return TIERS[domain]
    tiers = tuple(tiers)
    bad = [t for t in tiers if t not in TIERS[domain]]
    if bad or not tiers:
        raise KeyError(f"unknown {domain} drill tier {bad[0] if bad else ''!r}: choose from "
                       f"{list(TIERS[domain])}")
    return tiers


def check_version(version: int, domain: str | None = None) -> int:
    """Raise ``KeyError`` naming the valid generator versions (and, with ``domain``, the versions
    that generate it)."""
    if version not in GENERATOR_VERSIONS or isinstance(version, bool):
        raise KeyError(f"unknown drill generator version {version!r}: choose one of "
                       f"{list(GENERATOR_VERSIONS)}")
    if domain is not None and domain not in GENERATOR_VERSIONS[version]:
        have = [v for v, doms in GENERATOR_VERSIONS.items() if domain in doms]
        raise KeyError(f"drill generator version {version} has no {domain} drills: choose version "
                       f"{' or '.join(map(str, have))} for {domain}, or domain "
                       f"{' or '.join(GENERATOR_VERSIONS[version])}")
    return version


def check_seed(seed: int) -> int:
    """Raise ``ValueError`` unless ``0 <= seed <= 2**31 - 1``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"drill seed {seed!r} out of range: use an integer in [0, {MAX_SEED}]")
    return seed


__all__ = [
    "AIRLINE_NOW",
    "DEFAULT_SEED",
    "GENERATOR_VERSION",
    "GENERATOR_VERSIONS",
    "TEST_SHARE",
    "TIERS",
    "TIER_TOOLS",
    "Drill",
    "Generation",
    "check_domain",
    "check_seed",
    "check_tiers",
    "check_version",
    "test_user",
]
