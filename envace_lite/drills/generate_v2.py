"""Drills v2 (retail): every drill asks for a fact that cannot be guessed and must be copied from
an observation: an order's total, an item's price, a tracking number or a payment method id.

What changes from v1 (``generate.py``, kept byte-reproducible):

=============  ==============================================================================
tier           the user asks ... and the reply must state (``Drill.communicate``)
=============  ==============================================================================
``lookup``     one fact of order ``W1234567`` (id without the ``#``): its total, the price of a
               named item, its tracking number, or its payment method id -> that fact
``two_hop``    the total, tracking number or payment method of "my order", given an email or a
               name and zip -> that fact (three reads: find the user, their order, the order)
``cancel``     to cancel an order and to say its total: ``pending`` -> cancel it, reply
               ``cancelled`` and the total; otherwise refuse, reply its status and the total
``return``     to return a named item and to say how much comes back: ``delivered`` -> return it
               to the original payment method, reply ``return requested`` and the item's price;
               otherwise refuse, reply the order's status and the item's price
=============  ==============================================================================

An amount is written as tau2's observation prints it (``json.dumps`` of the float, e.g.
``2577.53`` or ``25.5``). The messages name no status and no fact; the gold replies name exactly
one value of each kind they communicate, so they pass the drill-side check (``check.py``).

Usage::

    from envace_lite.drills.generate import generate
    gen = generate("retail", seed=0, version=2)
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

from envace_lite.drills.solver import Skip as _Skip
from envace_lite.drills.solver import Solver
from envace_lite.drills.solver import make_drill as _drill
from envace_lite.drills.solver import pick as _pick

FACT_KINDS = ("total", "price", "tracking", "payment")
"""The copyable facts a v2 read asks for (two-hop: all but ``price``)."""

_ASK = {
    "total": ["How much did I pay for my order {o}?", "Hi! What was the total of my order {o}?"],
    "price": ["How much did the {n} in my order {o} cost?",
              "Hi, what price did I pay for the {n} in order {o}?"],
    "tracking": ["What is the tracking number of my order {o}?",
                 "Hi! Could you give me the tracking number for order {o}?"],
    "payment": ["Which payment method did I use for my order {o}?",
                "Hello, what payment method was order {o} paid with?"],
}
_ASK_MINE = {
    "total": "What was the total of my order?",
    "tracking": "What is the tracking number of my order?",
    "payment": "Which payment method did I use for my order?",
}
_TELL = {
    "total": "You paid {v} for order {oid}.",
    "price": "That item of order {oid} cost {v}.",
    "tracking": "The tracking number of order {oid} is {v}.",
    "payment": "Order {oid} was paid with {v}.",
}


def amount_text(value: float) -> str:
    """An amount as tau2's retail observation prints it: ``json.dumps(2577.53) == "2577.53"``."""
    return json.dumps(value)


def _unique_items(order: Any) -> list[str]:
    names = [it.name for it in order.items]
    return sorted({n for n in names if names.count(n) == 1})


def _fact(order: Any, kind: str, name: str | None = None) -> str:
    if kind == "total":
        return amount_text(order.payment_history[0].amount)
    if kind == "payment":
        return order.payment_history[0].payment_method_id
    if kind == "tracking":
        return order.fulfillments[0].tracking_id[0]
    return amount_text(next(it.price for it in order.items if it.name == name))


def _unseen(value: str, *observations: dict[str, Any]) -> bool:
    """True when ``value`` is in none of the observations (the drill is skipped: a fact the
    reply must state has to be copyable from what the environment returned)."""
    return not any(value in o["content"] for o in observations)


def _kinds(order: Any, kinds: tuple[str, ...]) -> list[str]:
    return [k for k in kinds if (k != "tracking" or order.fulfillments)
            and (k != "price" or _unique_items(order))]


def retail_v2(solver: Solver, rng: random.Random, tiers: tuple[str, ...]) -> Iterable[Any]:
    """The v2 retail drills of ``tiers``, in v1's walk order (orders sorted, then users)."""
    db = solver.db
    for oid in sorted(db.orders):
        order = db.orders[oid]
        bare, uid = oid.lstrip("#"), order.user_id
        if not order.payment_history:
            for t in ("lookup", "cancel", "return"):
                if t in tiers:
                    yield (t, bare, "the order has no payment")
            continue
        if "lookup" in tiers:
            yield _lookup(solver, rng, oid, bare, uid)
        if "cancel" in tiers:
            yield _cancel(solver, rng, oid, bare, uid)
        if "return" in tiers:
            yield _return(solver, rng, oid, bare, uid)
    if "two_hop" in tiers:
        for uid in sorted(db.users):
            if len(db.users[uid].orders) == 1:
                yield _two_hop(solver, rng, uid)


def _lookup(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    order = solver.db.orders[oid]
    kind = rng.choice(_kinds(order, FACT_KINDS))
    name = rng.choice(_unique_items(order)) if kind == "price" else None
    message = _pick(rng, _ASK[kind], o=bare, n=(name or "").lower())
    try:
        c, o, _ = solver.ok("get_order_details", order_id=oid)
    except _Skip as e:
        return ("lookup", bare, str(e))
    value = _fact(order, kind, name)
    if _unseen(value, o):
        return ("lookup", bare, "the fact is not in the observation")
    return _drill("lookup", bare, "retail", uid, entities=[uid, oid], message=message, gold=[c],
                  observations=[o], communicate=[value],
                  final_text=_TELL[kind].format(oid=oid, v=value))


def _two_hop(solver: Solver, rng: random.Random, uid: str) -> Any:
    user = solver.db.users[uid]
    oid = user.orders[0]
    order = solver.db.orders[oid]
    if not order.payment_history:
        return ("two_hop", uid, "the order has no payment")
    kind = rng.choice(_kinds(order, ("total", "tracking", "payment")))
    by_email = rng.random() < 0.5
    try:
        if by_email:
            message = _pick(rng, ["Hi, my email is {e}. {q}", "Hello! I'm writing from {e}. {q}"],
                            e=user.email, q=_ASK_MINE[kind])
            c1, o1, found = solver.ok("find_user_id_by_email", email=user.email)
        else:
            n, z = user.name, user.address.zip
            message = _pick(rng, ["Hi, I'm {f} {l}, zip code {z}. {q}",
                                  "Hello, this is {f} {l} ({z}). {q}"],
                            f=n.first_name, l=n.last_name, z=z, q=_ASK_MINE[kind])
            c1, o1, found = solver.ok("find_user_id_by_name_zip", first_name=n.first_name,
                                      last_name=n.last_name, zip=z)
        if found != uid:
            raise _Skip(f"the {'email' if by_email else 'name and zip'} finds user {found}")
        c2, o2, details = solver.ok("get_user_details", user_id=uid)
        c3, o3, _ = solver.ok("get_order_details", order_id=details["orders"][0])
    except _Skip as e:
        return ("two_hop", uid, str(e))
    value = _fact(order, kind)
    if _unseen(value, o3):
        return ("two_hop", uid, "the fact is not in the observation")
    return _drill("two_hop", uid, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2, c3], observations=[o1, o2, o3], communicate=[value],
                  final_text=_TELL[kind].format(oid=oid, v=value))


def _cancel(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    reason = rng.choice(["no longer needed", "ordered by mistake"])
    message = _pick(rng, ["Please cancel my order {o}, the reason is: {r}. What was its total?",
                          "Hi, I want to cancel order {o} ({r}); please also tell me its total."],
                    o=bare, r=reason)
    forbidden = {"name": "cancel_pending_order", "arguments": {"order_id": oid, "reason": reason}}
    total = _fact(solver.db.orders[oid], "total")
    try:
        c1, o1, order = solver.ok("get_order_details", order_id=oid)
        if _unseen(total, o1):
            raise _Skip("the fact is not in the observation")
        if order["status"] != "pending":
            status = order["status"]
            return _drill("cancel", bare, "retail", uid, entities=[uid, oid], message=message,
                          gold=[c1], observations=[o1], communicate=[status, total],
                          final_text=f"I'm sorry, I can't cancel order {oid}: it is {status}. "
                                     f"Its total was {total}.", forbidden=forbidden)
        with solver.scratch({"orders": [oid], "users": [uid]}):
            c2, o2, _ = solver.ok("cancel_pending_order", order_id=oid, reason=reason)
    except _Skip as e:
        return ("cancel", bare, str(e))
    return _drill("cancel", bare, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=["cancelled", total],
                  final_text=f"Your order {oid} is now cancelled; its total of {total} will be "
                             f"refunded.", write_allowed=True)


def _return(solver: Solver, rng: random.Random, oid: str, bare: str, uid: str) -> Any:
    order = solver.db.orders[oid]
    unique = _unique_items(order)
    if not unique:
        return ("return", bare, "no item name is unique in the order")
    name = rng.choice(unique)
    item = next(it for it in order.items if it.name == name)
    pay = order.payment_history[0].payment_method_id
    price = amount_text(item.price)
    message = _pick(rng, [("I'd like to return the {n} from my order {o}, refunded to the "
                           "original payment method. How much will I get back?"),
                          ("Hi, please return the {n} of order {o}; refund the original payment "
                           "method and tell me the amount.")], n=name.lower(), o=bare)
    args = {"order_id": oid, "item_ids": [item.item_id], "payment_method_id": pay}
    forbidden = {"name": "return_delivered_order_items", "arguments": args}
    try:
        c1, o1, details = solver.ok("get_order_details", order_id=oid)
        if _unseen(price, o1):
            raise _Skip("the fact is not in the observation")
        if details["status"] != "delivered":
            status = details["status"]
            return _drill("return", bare, "retail", uid, entities=[uid, oid], message=message,
                          gold=[c1], observations=[o1], communicate=[status, price],
                          final_text=f"I'm sorry, I can't return that item: order {oid} is "
                                     f"{status}. It cost {price}.", forbidden=forbidden)
        with solver.scratch({"orders": [oid], "users": [uid]}):
            c2, o2, _ = solver.ok("return_delivered_order_items", **args)
    except _Skip as e:
        return ("return", bare, str(e))
    return _drill("return", bare, "retail", uid, entities=[uid, oid], message=message,
                  gold=[c1, c2], observations=[o1, o2], communicate=["return requested", price],
                  final_text=f"The return of that item from order {oid} is now return requested; "
                             f"{price} will be refunded.", write_allowed=True)


__all__ = ["FACT_KINDS", "amount_text", "retail_v2"]
