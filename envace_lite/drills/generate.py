"""Drill generation: a scripted solver runs every gold call in tau2's real retail or airline
environment and records tau2's real response (the tiers and records: ``spec.py``).

Generation is deterministic by seed (phrasing, cancel reason, item to return, email vs
name-and-zip, the replacement flight, the order of the list); the split does not depend on the
seed. One random stream serves the whole generation, so ``generate`` with a subset of tiers
phrases drills differently from the registered suites (which use every tier).
A drill whose solver call fails, or whose request is ambiguous, is skipped with its reason
(``generate(...).skipped``); generation never aborts on one task.

Usage::

    from envace_lite.drills.generate import generate, skipped_by_reason
    gen = generate("retail", seed=7, count=20)                # 20 drills per tier
    gen.counts(), skipped_by_reason(gen.skipped)
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from envace_lite.drills.spec import (
    AIRLINE_NOW,
    DEFAULT_SEED,
    GENERATOR_VERSION,
    TIERS,
    Drill,
    Generation,
    check_seed,
    check_tiers,
    check_version,
)
from envace_lite.drills.generate_v2 import retail_v2
from envace_lite.drills.solver import Skip as _Skip
from envace_lite.drills.solver import Solver
from envace_lite.drills.solver import make_drill as _drill
from envace_lite.drills.solver import pick as _pick


def _retail(solver: Solver, rng: random.Random, tiers: tuple[str, ...]) -> Iterable[Any]:
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


def _retail_lookup(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
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


def _retail_two_hop(solver: Solver, rng: random.Random, uid: str) -> Any:
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


def _retail_cancel(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
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


def _retail_return(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
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


def _airline(solver: Solver, rng: random.Random, tiers: tuple[str, ...]) -> Iterable[Any]:
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


def _airline_lookup(solver: Solver, rng: random.Random, rid: str, uid: str) -> Any:
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


def _airline_two_hop(solver: Solver, rng: random.Random, uid: str) -> Any:
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


def _airline_change(solver: Solver, rng: random.Random, rid: str, res: Any) -> Any:
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


def _interleave(drills: list[Drill], tiers: tuple[str, ...]) -> list[Drill]:
    by_tier = {t: [d for d in drills if d.tier == t] for t in tiers}
    out: list[Drill] = []
    for i in range(max((len(v) for v in by_tier.values()), default=0)):
        out += [by_tier[t][i] for t in tiers if i < len(by_tier[t])]
    return out


def generate(domain: str, seed: int = DEFAULT_SEED, tiers: Iterable[str] | None = None,
             count: int | None = None, version: int = GENERATOR_VERSION) -> Generation:
    """Generate the drills of one tau2 domain from its real database.

    Args:
        domain: ``retail`` or ``airline``.
        seed: phrasing, choices and list order (``0 <= seed <= 2**31 - 1``).
        tiers: a subset of ``TIERS[domain]`` (default all).
        count: keep at most this many drills per tier (``>= 1``; default all).
        version: the generator version (``spec.GENERATOR_VERSIONS``): 1 (this module's tiers,
            byte-reproducible) or 2 (retail only: every drill asks for a fact copied from an
            observation, ``generate_v2.py``).

    Returns:
        A ``Generation``: drills in round-robin tier order (each tier shuffled by ``seed``), and
        the skipped ones with their reason.

    Raises:
        KeyError: unknown domain, tier or version (the message names the valid ones).
        ValueError: seed or count out of range.
        RuntimeError: a solver write leaked into the shared database (a bug, never bad input).
    """
    check_version(version, domain if domain in TIERS else None)
    tiers = check_tiers(domain, tiers)
    check_seed(seed)
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"drill count {count!r} out of range: use an integer >= 1, or none for "
                         "every drill (the CLI: omit --count)")
    solver = Solver(domain)
    pristine = solver.env.get_db_hash()
    tag = f"{domain}:{seed}" if version == 1 else f"{domain}:v{version}:{seed}"
    rng = random.Random(f"drills:{tag}")
    walk = retail_v2 if version == 2 else _retail if domain == "retail" else _airline
    drills, skipped = [], []
    for out in walk(solver, rng, tiers):
        if isinstance(out, Drill):
            drills.append(out)
        else:
            skipped.append({"tier": out[0], "entity": out[1], "reason": out[2]})
    if solver.env.get_db_hash() != pristine:
        raise RuntimeError(f"drill generation for {domain} changed the shared database")
    drills = _round_robin(drills, tiers, random.Random(f"order:{tag}"))
    if count is not None:
        kept: dict[str, int] = {}
        drills = [d for d in drills if kept.setdefault(d.tier, 0) < count
                  and not kept.__setitem__(d.tier, kept[d.tier] + 1)]
    return Generation(domain=domain, seed=seed, drills=drills, skipped=skipped)


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


__all__ = [
    "generate",
    "skip_reason_kind",
    "skipped_by_reason",
]
