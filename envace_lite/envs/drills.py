"""Drill suites: small tool-use tasks generated from tau2's real retail and airline databases.

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
=============  =======  ==========================================================================

Every drill is a tau2 ``Task`` (``reward_basis`` DB + COMMUNICATE) scored by tau2's own evaluator
in the ``Tau2Env`` ticket protocol: the first text reply ends the episode. Every task names at
least one fact the user must be told (``communicate_info``: the status, cabin, destination, the
refusal's reason, or the outcome of the write), so a read-only task cannot be passed by doing
nothing (the DB check alone would pass it).

Split by entity: a user is in the test split iff ``sha1(user_id) / 2**160 < TEST_SHARE``; every
order and reservation belongs to one user, so no user, order or reservation of a test drill
appears in a train drill. Generation is deterministic by seed (phrasing, cancel reason, item to
return, email vs name-and-zip, the replacement flight, the order of the list); the split does not depend on the seed. One random
stream serves the whole generation, so ``generate`` with a subset of tiers phrases drills
differently from the registered suites (which use every tier).
A drill whose solver call fails, or whose request is ambiguous, is skipped with its reason
(``generate(...).skipped``); generation never aborts on one task.

Usage::

    from envace_lite.envs import list_tasks, make_env, replay_gold
    ids = list_tasks("tau2-retail-drills", "test")         # round-robin over tiers
    env = make_env("tau2-retail-drills", ids[0])
    replay_gold(env)                                          # (1.0, {...})
"""
from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from envace_lite.envs.base import GoldTurn
from envace_lite.envs.tau2 import (
    TICKET_INSTRUCTION,
    Tau2Env,
    Tau2Task,
    Tau2ToolCall,
    UserMessage,
    _domain_module,
    _tau2_constant,
)
from envace_lite.types import Observation, ToolCall

DRILL_SUITES: dict[str, str] = {"tau2-retail-drills": "retail", "tau2-airline-drills": "airline"}
"""Suite name -> tau2 domain."""

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
"""Bump when generation changes (part of the card)."""


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


def check_seed(seed: int) -> int:
    """Raise ``ValueError`` unless ``0 <= seed <= 2**31 - 1``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"drill seed {seed!r} out of range: use an integer in [0, {MAX_SEED}]")
    return seed


# ---------------------------------------------------------------------------------------------
# The scripted solver: every gold call runs in the real tau2 environment
# ---------------------------------------------------------------------------------------------
class _Skip(Exception):
    """A drill the solver cannot build; the message is the reason."""


class _Solver:
    """Runs calls in one real tau2 environment of ``domain``.

    Reads share the environment. A write runs inside ``scratch(...)``, which snapshots the
    objects the write may touch and puts them back after; ``generate`` checks at the end that the
    database hash equals the pristine one, so a leaked write cannot go unnoticed.
    """

    def __init__(self, domain: str) -> None:
        self.env = _domain_module(domain).get_environment()
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
            raise _Skip(f"solver call {name} failed: {o['content'][:120]}")
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


def _pick(rng: random.Random, options: list[str], **fmt: Any) -> str:
    return rng.choice(options).format(**fmt)


def _retail(solver: _Solver, rng: random.Random, tiers: tuple[str, ...]) -> Iterable[Any]:
    db = solver.db
    for oid in sorted(db.orders):
        order = db.orders[oid]
        bare = oid.lstrip("#")
        uid = order.user_id
        if "lookup" in tiers:
            yield _retail_lookup(solver, rng, oid, bare, uid)
        if "cancel" in tiers:
            yield _retail_cancel(solver, rng, oid, bare, uid)
        if "return" in tiers:
            yield _retail_return(solver, rng, oid, bare, uid)
    if "two_hop" in tiers:
        for uid in sorted(db.users):
            if len(db.users[uid].orders) == 1:
                yield _retail_two_hop(solver, rng, uid)


def _drill(tier: str, entity: str, domain: str, uid: str, **kw: Any) -> Drill:
    return Drill(id=f"{tier}:{entity}", domain=domain, tier=tier,
                 split="test" if test_user(uid) else "train", user_id=uid,
                 tools=list(TIER_TOOLS[(domain, tier)]), **kw)


def _retail_lookup(solver: _Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    message = _pick(rng, ["Hi! What is the status of my order {o}?",
                          "Can you tell me the current status of order {o}, please?",
                          "Hello, I'd like to know the status of my order {o}."], o=bare)
    try:
        c, o, order = solver.ok("get_order_details", order_id=oid)
    except _Skip as e:
        return ("lookup", bare, str(e))
    status = order["status"]
    return _drill("lookup", bare, "retail", uid, entities=[uid, oid], message=message, gold=[c],
                  observations=[o], communicate=[status],
                  final_text=f"Your order {oid} is {status}.")


def _retail_two_hop(solver: _Solver, rng: random.Random, uid: str) -> Any:
    user = solver.db.users[uid]
    by_email = rng.random() < 0.5
    try:
        if by_email:
            message = _pick(rng, ["Hi, my email is {e}. What is the status of my order?",
                                  ("Hello! I'm writing from {e}. Could you check the status of "
                                   "my order?")], e=user.email)
            c1, o1, found = solver.ok("find_user_id_by_email", email=user.email)
        else:
            n, z = user.name, user.address.zip
            message = _pick(rng, ["Hi, I'm {f} {l}, zip code {z}. What is the status of my order?",
                                  ("Hello, this is {f} {l} ({z}). Could you check the status of "
                                   "my order?")], f=n.first_name, l=n.last_name, z=z)
            c1, o1, found = solver.ok("find_user_id_by_name_zip", first_name=n.first_name,
                                      last_name=n.last_name, zip=z)
        if found != uid:
            raise _Skip(f"the {'email' if by_email else 'name and zip'} finds user {found}")
        c2, o2, details = solver.ok("get_user_details", user_id=uid)
        oid = details["orders"][0]
        c3, o3, order = solver.ok("get_order_details", order_id=oid)
    except _Skip as e:
        return ("two_hop", uid, str(e))
    status = order["status"]
    return _drill("two_hop", uid, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2, c3], observations=[o1, o2, o3], communicate=[status],
                  final_text=f"Your order {oid} is {status}.")


def _retail_cancel(solver: _Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    reason = rng.choice(["no longer needed", "ordered by mistake"])
    message = _pick(rng, ["Please cancel my order {o}, the reason is: {r}.",
                          "Hi, I want to cancel order {o} ({r})."], o=bare, r=reason)
    forbidden = {"name": "cancel_pending_order", "arguments": {"order_id": oid, "reason": reason}}
    try:
        c1, o1, order = solver.ok("get_order_details", order_id=oid)
        if order["status"] != "pending":
            status = order["status"]
            return _drill("cancel", bare, "retail", uid, entities=[uid, oid], message=message,
                          gold=[c1], observations=[o1], communicate=[status],
                          final_text=f"I'm sorry, order {oid} cannot be cancelled because it is "
                                     f"{status}.", forbidden=forbidden)
        with solver.scratch({"orders": [oid], "users": [uid]}):
            c2, o2, _ = solver.ok("cancel_pending_order", order_id=oid, reason=reason)
    except _Skip as e:
        return ("cancel", bare, str(e))
    return _drill("cancel", bare, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=["cancelled"],
                  final_text=f"Your order {oid} is now cancelled.", write_allowed=True)


def _retail_return(solver: _Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    order = solver.db.orders[oid]
    names = [it.name for it in order.items]
    unique = sorted({n for n in names if names.count(n) == 1})
    if not unique:
        return ("return", bare, "no item name is unique in the order")
    name = rng.choice(unique)
    item = next(it for it in order.items if it.name == name)
    pay = order.payment_history[0].payment_method_id if order.payment_history else None
    if pay is None:
        return ("return", bare, "the order has no payment")
    message = _pick(rng, [("I'd like to return the {n} from my order {o}, refunded to the "
                           "original payment method."),
                          ("Hi, please return the {n} of order {o}; refund the original payment "
                           "method.")], n=name.lower(), o=bare)
    args = {"order_id": oid, "item_ids": [item.item_id], "payment_method_id": pay}
    forbidden = {"name": "return_delivered_order_items", "arguments": args}
    try:
        c1, o1, details = solver.ok("get_order_details", order_id=oid)
        if details["status"] != "delivered":
            status = details["status"]
            return _drill("return", bare, "retail", uid, entities=[uid, oid], message=message,
                          gold=[c1], observations=[o1], communicate=[status],
                          final_text=f"I'm sorry, the items of order {oid} cannot be returned "
                                     f"because it is {status}.", forbidden=forbidden)
        with solver.scratch({"orders": [oid], "users": [uid]}):
            c2, o2, _ = solver.ok("return_delivered_order_items", **args)
    except _Skip as e:
        return ("return", bare, str(e))
    return _drill("return", bare, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=["return requested"],
                  final_text=f"The return of your {name.lower()} from order {oid} is return "
                             f"requested.", write_allowed=True)


def _airline(solver: _Solver, rng: random.Random, tiers: tuple[str, ...]) -> Iterable[Any]:
    db = solver.db
    for rid in sorted(db.reservations):
        res = db.reservations[rid]
        if "lookup" in tiers:
            yield _airline_lookup(solver, rng, rid, res.user_id)
        if "change" in tiers and len(res.flights) == 1:
            yield _airline_change(solver, rng, rid, res)
    if "two_hop" in tiers:
        for uid in sorted(db.users):
            if len(db.users[uid].reservations) == 1:
                yield _airline_two_hop(solver, rng, uid)


def _airline_lookup(solver: _Solver, rng: random.Random, rid: str, uid: str) -> Any:
    message = _pick(rng, ["Hi! Which cabin is my reservation {r} booked in?",
                          "Can you tell me the cabin class of reservation {r}?"], r=rid)
    try:
        c, o, res = solver.ok("get_reservation_details", reservation_id=rid)
    except _Skip as e:
        return ("lookup", rid, str(e))
    cabin = res["cabin"]
    return _drill("lookup", rid, "airline", uid, entities=[uid, rid], message=message, gold=[c],
                  observations=[o], communicate=[cabin],
                  final_text=f"Your reservation {rid} is booked in {cabin}.")


def _airline_two_hop(solver: _Solver, rng: random.Random, uid: str) -> Any:
    message = _pick(rng, ["Hi, my user id is {u}. Where is my reservation flying to?",
                          "Hello, user id {u} here. What is the destination of my reservation?"],
                    u=uid)
    try:
        c1, o1, user = solver.ok("get_user_details", user_id=uid)
        rid = user["reservations"][0]
        c2, o2, res = solver.ok("get_reservation_details", reservation_id=rid)
    except _Skip as e:
        return ("two_hop", uid, str(e))
    dest = res["destination"]
    return _drill("two_hop", uid, "airline", uid, entities=[uid, rid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=[dest],
                  final_text=f"Your reservation {rid} flies to {dest}.")


def _airline_change(solver: _Solver, rng: random.Random, rid: str, res: Any) -> Any:
    old = res.flights[0]
    uid = res.user_id
    if old.date <= AIRLINE_NOW:
        return ("change", rid, f"the flight has flown ({old.date} <= {AIRLINE_NOW})")
    seats = len(res.passengers)
    alts = []
    for fn in sorted(solver.db.flights):
        f = solver.db.flights[fn]
        if fn == old.flight_number or (f.origin, f.destination) != (old.origin, old.destination):
            continue
        day = f.dates.get(old.date)
        if day is not None and getattr(day, "status", "") == "available" and \
                day.available_seats[res.cabin] >= seats:
            alts.append(fn)
    if not alts:
        return ("change", rid, "no other available direct flight on the route that day")
    fn = rng.choice(alts)
    pay = res.payment_history[0].payment_id if res.payment_history else None
    if pay is None:
        return ("change", rid, "the reservation has no payment")
    message = _pick(rng, ["Please change my reservation {r} to flight {f} on {d}.",
                          "Hi, I need to move reservation {r} to flight {f} on {d}."],
                    r=rid, f=fn, d=old.date)
    args = {"reservation_id": rid, "cabin": res.cabin,
            "flights": [{"flight_number": fn, "date": old.date}], "payment_id": pay}
    forbidden = {"name": "update_reservation_flights", "arguments": args}
    try:
        c1, o1, _ = solver.ok("get_reservation_details", reservation_id=rid)
        if res.cabin == "basic_economy":
            return _drill("change", rid, "airline", uid, entities=[uid, rid], message=message,
                          gold=[c1], observations=[o1], communicate=["basic economy"],
                          final_text=f"I'm sorry, reservation {rid} is basic economy, and basic "
                                     f"economy flights cannot be modified.", forbidden=forbidden)
        with solver.scratch({"reservations": [rid], "users": [uid],
                             "flights": [fn, old.flight_number]}):
            c2, o2, _ = solver.ok("update_reservation_flights", **args)
    except _Skip as e:
        return ("change", rid, str(e))
    return _drill("change", rid, "airline", uid, entities=[uid, rid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=[fn],
                  final_text=f"Your reservation {rid} is now on flight {fn} on {old.date}.",
                  write_allowed=True)


def _round_robin(drills: list[Drill], tiers: tuple[str, ...], rng: random.Random) -> list[Drill]:
    by_tier = {t: [d for d in drills if d.tier == t] for t in tiers}
    for t in tiers:
        rng.shuffle(by_tier[t])
    return _interleave([d for t in tiers for d in by_tier[t]], tiers)


def generate(domain: str, seed: int = DEFAULT_SEED, tiers: Iterable[str] | None = None,
             count: int | None = None) -> Generation:
    """Generate the drills of one tau2 domain from its real database.

    Args:
        domain: ``retail`` or ``airline``.
        seed: phrasing, choices and list order (``0 <= seed <= 2**31 - 1``).
        tiers: a subset of ``TIERS[domain]`` (default all).
        count: keep at most this many drills per tier (``>= 1``; default all).

    Returns:
        A ``Generation``: drills in round-robin tier order (each tier shuffled by ``seed``), and
        the skipped ones with their reason.

    Raises:
        KeyError: unknown domain or tier (the message names the valid ones).
        ValueError: seed or count out of range.
        RuntimeError: a solver write leaked into the shared database (a bug, never bad input).
    """
    tiers = check_tiers(domain, tiers)
    check_seed(seed)
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"drill count {count!r} out of range: use an integer >= 1, or None")
    solver = _Solver(domain)
    pristine = solver.env.get_db_hash()
    rng = random.Random(f"drills:{domain}:{seed}")
    drills, skipped = [], []
    for out in (_retail if domain == "retail" else _airline)(solver, rng, tiers):
        if isinstance(out, Drill):
            drills.append(out)
        else:
            skipped.append({"tier": out[0], "entity": out[1], "reason": out[2]})
    if solver.env.get_db_hash() != pristine:
        raise RuntimeError(f"drill generation for {domain} changed the shared database")
    drills = _round_robin(drills, tiers, random.Random(f"order:{domain}:{seed}"))
    if count is not None:
        kept: dict[str, int] = {}
        drills = [d for d in drills if kept.setdefault(d.tier, 0) < count
                  and not kept.__setitem__(d.tier, kept[d.tier] + 1)]
    return Generation(domain=domain, seed=seed, drills=drills, skipped=skipped)


@cache
def _registered(domain: str) -> Generation:
    """The registered suite's generation (``DEFAULT_SEED``, all tiers), cached on disk."""
    from envace_lite.paths import cache_dir

    path = cache_dir("drills") / f"{domain}__v{GENERATOR_VERSION}__s{DEFAULT_SEED}.json"
    if path.exists():
        try:
            raw = json.loads(path.read_text())
            return Generation(domain=raw["domain"], seed=raw["seed"],
                              drills=[Drill(**d) for d in raw["drills"]], skipped=raw["skipped"])
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # a torn or stale cache file is rebuilt below
    gen = generate(domain, DEFAULT_SEED)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"domain": gen.domain, "seed": gen.seed, "skipped": gen.skipped,
                               "drills": [asdict(d) for d in gen.drills]}))
    tmp.replace(path)
    return gen


@cache
def _by_id(domain: str) -> dict[str, Drill]:
    return {d.id: d for d in _registered(domain).drills}


def get_drill(suite: str, drill_id: str) -> Drill:
    """The registered drill ``drill_id`` of ``suite``.

    Raises:
        KeyError: unknown suite, or a drill id that does not exist (the message says how to list
            them and shows the id format).
    """
    domain = _suite_domain(suite)
    try:
        return _by_id(domain)[drill_id]
    except KeyError:
        tiers = "|".join(TIERS[domain])
        raise KeyError(f"unknown {suite} drill id {drill_id!r}: ids look like '<{tiers}>:<entity>'"
                       f"; list them with list_tasks({suite!r}, 'all')") from None


def _suite_domain(suite: str) -> str:
    if suite not in DRILL_SUITES:
        raise KeyError(f"unknown drill suite {suite!r}: choose one of {list(DRILL_SUITES)}")
    return DRILL_SUITES[suite]


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
class DrillEnv(Tau2Env):
    """One drill in tau2's environment (ticket protocol: the first text reply ends the episode).

    Only the tier's tools are shown; a call to any other tool is answered with an error and not
    executed. Execution, the DB hashes and scoring are ``Tau2Env``'s (tau2's own evaluator on the
    drill's ``Task``).
    """

    def __init__(self, suite: str, drill: Drill, max_steps: int = 100,
                 max_errors: int = 10) -> None:
        self.drill = drill
        super().__init__(suite, drill.id, max_steps=max_steps, max_errors=max_errors,
                         task=drill.tau2_task(), mode=(drill.domain, "ticket"))

    def _hash_key(self) -> tuple[str, bool, str]:
        """Every drill starts from the pristine database: one initial hash per domain."""
        return self.domain, False, "<pristine>"

    def system_prompt(self) -> str:
        """tau2's ``SYSTEM_PROMPT`` with our NON-OFFICIAL ``TICKET_INSTRUCTION`` and the domain
        policy, as for the ``-ticket`` suites."""
        return _system_prompt(self.domain)

    def reset(self) -> list[dict[str, Any]]:
        """A fresh tau2 environment; returns ``[system, user]`` (the drill's message)."""
        self._env = _domain_module(self.domain).get_environment()
        self.trajectory = [UserMessage(role="user", content=self.drill.message)]
        self.real_calls, self.done, self.termination = 0, False, None
        self._steps = self._errors = self._n = 0
        self._hash = None
        return [{"role": "system", "content": self.system_prompt()},
                {"role": "user", "content": self.drill.message}]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """tau2's OpenAI schemas of the tier's tools, in ``TIER_TOOLS`` order (fresh copies)."""
        return json.loads(json.dumps(_schemas(self.domain, tuple(self.drill.tools))))

    def step(self, calls: list[ToolCall]) -> list[Observation]:
        """``Tau2Env.step`` for the tier's tools; any other tool gets an error, unexecuted."""
        out: list[Observation] = []
        allowed = set(self.drill.tools)
        batch: list[ToolCall] = []

        def flush() -> None:
            if batch:
                out.extend(super(DrillEnv, self).step(list(batch)))
                batch.clear()

        for c in calls:
            if c.name in allowed or self.done:
                batch.append(c)
                continue
            flush()
            self.real_calls += 1
            self._errors += 1
            out.append(Observation(f"Error: unknown tool {c.name!r}; available: "
                                   f"{sorted(allowed)}", True))
            self._check_limits()
        flush()
        return out

    def gold_turns(self) -> list[GoldTurn]:
        """One turn: the solver's calls one per ACT reply, then its closing message."""
        return [GoldTurn([[ToolCall(g["name"], copy.deepcopy(g["arguments"]), call_id=f"gold_{i}")]
                          for i, g in enumerate(self.drill.gold)],
                         final_text=self.drill.final_text, communicate=list(self.drill.communicate),
                         failing=[], key_args=[None] * len(self.drill.gold))]

    def corrupted_turns(self) -> list[GoldTurn]:
        """The corrupted replay of a drill with a write: drop the decisive write (write drills),
        or perform the forbidden one and report success (refusal drills).

        Raises:
            ValueError: for a drill without a write request (nothing to corrupt).
        """
        d = self.drill
        calls = [ToolCall(g["name"], copy.deepcopy(g["arguments"]), call_id=f"gold_{i}")
                 for i, g in enumerate(d.gold)]
        if d.write_allowed:
            return [GoldTurn([[c] for c in calls[:-1]], final_text="I have taken care of it.")]
        if d.forbidden is not None:
            bad = ToolCall(d.forbidden["name"], copy.deepcopy(d.forbidden["arguments"]),
                           call_id="forbidden")
            return [GoldTurn([[c] for c in calls] + [[bad]],
                             final_text="Done: your request has been completed.")]
        raise ValueError(f"drill {d.id} has no write request to corrupt")


@cache
def _system_prompt(domain: str) -> str:
    policy = _domain_module(domain).get_environment().get_policy()
    return _tau2_constant("agent.llm_agent", "SYSTEM_PROMPT").format(
        agent_instruction=TICKET_INSTRUCTION, domain_policy=policy)


@cache
def _schemas(domain: str, names: tuple[str, ...]) -> list[dict[str, Any]]:
    env = _domain_module(domain).get_environment()
    by_name = {t.name: t.openai_schema for t in env.get_tools()}
    return [by_name[n] for n in names]


# ---------------------------------------------------------------------------------------------
# Scripted baselines (the "cannot be gamed" check)
# ---------------------------------------------------------------------------------------------
BASELINES = ("do_nothing", "always_refuse", "always_write", "guess_commonest")
"""Scripted policies reported on the held-out drills (this repository's target: each under 35 %).
``guess_commonest`` measures the one way left to game the score: naming, without any call, the
tier's most common fact among the TRAIN drills (e.g. ``delivered``)."""


@cache
def commonest_fact(domain: str, tier: str) -> str:
    """The most common ``communicate[0]`` among the train drills of a tier (ties: alphabetical)."""
    counts: dict[str, int] = {}
    for d in _registered(domain).drills:
        if d.split == "train" and d.tier == tier:
            counts[d.communicate[0]] = counts.get(d.communicate[0], 0) + 1
    return min(counts, key=lambda k: (-counts[k], k)) if counts else ""


def baseline_turns(drill: Drill, kind: str) -> list[GoldTurn]:
    """The calls and closing text of a scripted baseline on ``drill``.

    ``do_nothing``: no call, "Thank you for reaching out." ``always_refuse``: no call, a polite
    refusal. ``always_write``: the solver's reads, then the requested write whatever the rule
    says (the gold write, or the forbidden one), and a confirmation naming the write's outcome
    (``cancelled``, ``return requested`` or the new flight); on a drill without a write request
    it makes no call and says "Done." ``guess_commonest``: no call, "It is <the tier's commonest
    train fact>." (``commonest_fact``).

    Raises:
        KeyError: an unknown ``kind`` (the message names ``BASELINES``).
    """
    if kind not in BASELINES:
        raise KeyError(f"unknown baseline {kind!r}: choose one of {list(BASELINES)}")
    if kind == "do_nothing":
        return [GoldTurn([], final_text="Thank you for reaching out.")]
    if kind == "always_refuse":
        return [GoldTurn([], final_text="I'm sorry, but I cannot help with this request.")]
    if kind == "guess_commonest":
        return [GoldTurn([], final_text=f"It is {commonest_fact(drill.domain, drill.tier)}.")]
    reads = [g for g in drill.gold if g["name"] in TIER_TOOLS[(drill.domain, drill.tier)][:1]]
    if drill.write_allowed:
        write, outcome = drill.gold[-1], drill.communicate[0]
    elif drill.forbidden is not None:
        write = drill.forbidden
        outcome = {"cancel_pending_order": "cancelled",
                   "return_delivered_order_items": "return requested"}.get(
            write["name"], str(write["arguments"].get("flights", [{}])[0].get("flight_number")))
    else:
        return [GoldTurn([], final_text="Done.")]
    steps = [[ToolCall(g["name"], copy.deepcopy(g["arguments"]))] for g in reads + [write]]
    return [GoldTurn(steps, final_text=f"Done: your request is complete ({outcome}).")]


def play(env: DrillEnv, turns: list[GoldTurn]) -> tuple[float, dict[str, Any]]:
    """Play scripted ``turns`` in ``env`` (reset here) and score with tau2's evaluator."""
    env.reset()
    for turn in turns:
        for s in turn.steps:
            env.step(list(s))
            if env.done:
                break
        if not env.done and turn.final_text is not None:
            env.end_turn(turn.final_text)
    return env.score()


# ---------------------------------------------------------------------------------------------
# Registry hooks and derived tasks
# ---------------------------------------------------------------------------------------------
def task_ids(suite: str, split: str) -> list[str]:
    """Drill ids of ``suite`` in ``split`` (``train``, ``test``, ``all``), round-robin over tiers.

    Raises:
        KeyError: unknown suite or split.
    """
    domain = _suite_domain(suite)
    if split not in ("train", "test", "all"):
        raise KeyError(f"unknown split {split!r}: choose train, test or all")
    # the split keeps the order of the whole list (round-robin over tiers, then filtered), so
    # the first N test drills mix the tiers; shipped results name the drills they used
    return [d.id for d in _registered(domain).drills if split == "all" or d.split == split]


def _interleave(drills: list[Drill], tiers: tuple[str, ...]) -> list[Drill]:
    by_tier = {t: [d for d in drills if d.tier == t] for t in tiers}
    out: list[Drill] = []
    for i in range(max((len(v) for v in by_tier.values()), default=0)):
        out += [by_tier[t][i] for t in tiers if i < len(by_tier[t])]
    return out


def make(suite: str, task_id: str, **kwargs: Any) -> DrillEnv:
    """A ``DrillEnv`` for one registered drill (call ``reset()`` to start).

    Raises:
        KeyError: unknown suite or drill id.
    """
    kwargs.pop("user", None)  # the ticket protocol has no user simulator
    return DrillEnv(suite, get_drill(suite, task_id), **kwargs)


def drill_prompt(suite: str, drill_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(messages, tool schemas)`` a drill's episode starts with (what ``DrillEnv.reset`` and
    ``tool_schemas`` return), without building an environment.

    Raises:
        KeyError: unknown suite or drill id.
    """
    d = get_drill(suite, drill_id)
    messages = [{"role": "system", "content": _system_prompt(d.domain)},
                {"role": "user", "content": d.message}]
    return messages, json.loads(json.dumps(_schemas(d.domain, tuple(d.tools))))


def skip_reason_kind(reason: str) -> str:
    """A skip reason without its specifics (dates, ids), for counting."""
    return reason.split(":")[0].split(" (")[0]


def skipped_by_reason(skipped: list[dict[str, str]]) -> dict[str, int]:
    """``{"<tier>: <reason kind>": count}`` of skipped drills (``Generation.skipped``)."""
    reasons: dict[str, int] = {}
    for sk in skipped:
        key = f"{sk['tier']}: {skip_reason_kind(sk['reason'])}"
        reasons[key] = reasons.get(key, 0) + 1
    return reasons


def card(domain: str) -> dict[str, Any]:
    """The data card entry of a domain's registered drills: generator, seed, tiers, counts, the
    split rule, and every skipped drill with its reason."""
    gen = _registered(domain)
    return {
        "generator": f"envace_lite.envs.drills.generate v{GENERATOR_VERSION}",
        "seed": gen.seed, "tiers": list(TIERS[domain]), "counts": gen.counts(),
        "tasks": len(gen.drills),
        "split_rule": f"by user: test iff sha1(user_id)/2**160 < {TEST_SHARE}",
        "skipped": len(gen.skipped), "skipped_by_reason": skipped_by_reason(gen.skipped),
        "skipped_ids": gen.skipped,
    }


__all__ = [
    "BASELINES",
    "DRILL_SUITES",
    "TIERS",
    "Drill",
    "DrillEnv",
    "Generation",
    "baseline_turns",
    "card",
    "drill_prompt",
    "generate",
    "get_drill",
    "make",
    "play",
    "skipped_by_reason",
    "task_ids",
    "test_user",
]
