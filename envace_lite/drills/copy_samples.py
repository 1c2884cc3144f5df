"""The copy warm-up's samples: synthetic, entity-free copy exercises for the micro policy, a
study lever beyond the paper (``docs/drills.md``).

``copy_samples`` draws prompts and answers in the drills' own formats: a ticket naming an id and
the call that copies it, and (as levers) second calls that copy an id out of an observation
(``hops``), record copies (``records``) and people copies (``people``). No id is one of tau2's
(``tau2_ids``). ``copy_warmup.train_copy`` trains on them.
"""
from __future__ import annotations

import json
import random
import string
from typing import Any

from envace_lite.protocol.prompts import assistant_text, tool_response_message
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.types import Observation, ToolCall

_FIRST = ("alex", "bea", "cato", "dara", "eli", "faye", "gus", "hana", "ines", "jude", "kai",
          "lena", "milo", "nora", "otto", "pia", "quin", "rosa", "seb", "tova", "ugo", "vera")
_LAST = ("abe", "berg", "cruz", "dahl", "eze", "frost", "gale", "holm", "iver", "juno", "kerr",
         "lund", "mora", "nash", "orr", "pike", "quay", "rook", "sato", "tate", "ueda", "vance")
_CONSONANTS, _VOWELS = "bdfghklmnprstvz", "aeiou"
_PEOPLE_ASKS = ("Hi, I'm {f} {l}, zip code {z}. {q}", "Hello, this is {f} {l} ({z}). {q}",
                "My name is {f} {l} and my zip is {z}. {q}")
_EMAIL_ASKS = ("Hi, my email is {e}. {q}", "Hello! I'm writing from {e}. {q}")
_PEOPLE_QUESTIONS = ("Can you check my account?", "What do you see for me?",
                     "Please look me up.", "I have a question about my order.")


def syllable_name(rng: random.Random) -> str:
    """A random capitalized name of 2 or 3 consonant-vowel syllables (``Kavelo``): a person's
    name that no tau2 user has, in the shape a ticket writes it."""
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS)
                   for _ in range(rng.randint(2, 3))).capitalize()


def letters_name(rng: random.Random) -> str:
    """A random capitalized name of 4 to 7 letters, each drawn uniformly from ``a``-``z``
    (``Qzvkem``): unlike ``syllable_name``, no letter follows from the ones before it, so a
    policy that must write it has nothing to learn but to copy it."""
    letters = (rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 7)))
    return "".join(letters).capitalize()


_COPY_ASKS = (
    "Hi, what is the status of {what} {x}?", "I want to cancel {what} {x}, please.",
    "Please look up {what} {x} for me.", "Can you check {what} {x}?", "{what} {x} has a problem.",
    "My {what} is {x}. What do you see?", "Something is wrong with {x}.",
)


def _copy_id(rng: random.Random) -> tuple[str, str, str]:
    """One random id as ``(kind, as the user writes it, as the tool takes it)``, in the shapes
    tau2's retail and airline ids have (``#W`` + 7 digits, ``first_last_dddd``, 6 characters,
    an e-mail), drawn from name parts and digits that tau2's databases do not use together."""
    kind = rng.choice(("order_id", "order_id", "user_id", "reservation_id", "email"))
    if kind == "order_id":
        x = "W" + "".join(rng.choice("0123456789") for _ in range(7))
        return kind, x, "#" + x
    if kind == "user_id":
        x = f"{rng.choice(_FIRST)}_{rng.choice(_LAST)}_{rng.randint(1000, 9999)}"
        return kind, x, x
    if kind == "email":
        x = f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}{rng.randint(1000, 9999)}@example.com"
        return kind, x, x
    x = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6))
    return kind, x, x


def copy_samples(n: int, seed: int, forbidden: frozenset[str] = frozenset(),
                 hops: bool = False, records: bool = False, people: bool = False,
                 names: tuple[list[str], list[str]] | None = None
                 ) -> list[tuple[list[dict[str, str]], str]]:
    """``n`` chat samples ``(messages, answer)`` that can only be answered by copying.

    Half are calls: the user's message names one id among 0-2 distractor ids, and the answer is
    ``<tool_call>{"name": "lookup", "arguments": {<kind>: <id as the tool takes it>}}</tool_call>``
    (an order id gains its ``#``, as tau2's tools need). The other half are reports: a
    ``<tool_response>`` record of random fields, and the answer names the asked field's value.
    No tau2 tool name, entity or policy text appears; ids in ``forbidden`` (e.g. every id in
    tau2's databases) are redrawn.

    With ``hops`` (``study.pretrain="copy_hops"``), about a fifth of the samples (22 % of the
    shipped warm-up's; a draw of 1/3, less the linked ids of the same kind) are second calls, made
    after a first ``lookup`` and its ``<tool_response>``: an ``update`` of the id the user
    named (the write after a read: copy from the message, past a record full of other values), or
    a ``lookup`` of the id the record links to (the second hop: copy from the tool response).
    These are the two copies the drills' writes and two-hop tier need and the plain warm-up never
    shows (``docs/results-log.md``, "Why RL has nothing to reinforce"). Without ``hops`` the samples
    are exactly those of the plain warm-up.

    Args:
        n: samples (>= 1). seed: ``random.Random(seed)``, so the same seed gives the same samples.
        forbidden: strings no sample may contain as its id.
        hops: add the second-call samples.
        records: (``study.pretrain="copy_records"``) about a third of the samples become record
            copies (``_record_sample``): one to three reference calls with their results, then a
            current call equal to one of them, answered with that reference's result verbatim in
            ``<execution_result>`` tags. This is REHEARSE's use of its grounding ("if a
            reference call matches the current call, reuse its result"), entity-free.
        people: (``study.pretrain="copy_people"``) about a third of the samples become people
            copies (``_people_sample``): a ticket names a person (first and last name and zip,
            or an e-mail) and the answer is a ``find`` call with them; or, after that call and
            its tool response (a user id), a ``lookup`` of that user id. This is the first two
            calls of a two-hop drill, on random syllable names (``syllable_name``).
        names: with ``people``, ``(first names, last names)`` to draw the people's names from
            (``study.pretrain_names=sft_users``) instead of syllables.

    Returns:
        A list of ``(messages, answer)``: one user message, or with ``hops`` for a second call,
        ``[user, assistant (the first call), user (its tool response)]``.
    """
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        kind, said, arg = _copy_id(rng)
        if said in forbidden or arg in forbidden:
            continue
        what = {"order_id": "order", "user_id": "user id", "reservation_id": "reservation",
                "email": "email"}[kind]
        if people and rng.random() < 1 / 3:
            sample = _people_sample(rng, forbidden, names)
            if sample is not None:
                out.append(sample)
            continue
        if records and rng.random() < 1 / 3:
            sample = _record_sample(rng, kind, forbidden)
            if sample is not None:
                out.append(sample)
            continue
        if hops and rng.random() < 1 / 3:
            sample = _hop_sample(rng, kind, said, arg, what, forbidden)
            if sample is not None:
                out.append(sample)
            continue
        if rng.random() < 0.5:
            noise = " ".join(f"(old ref {_copy_id(rng)[1]})" for _ in range(rng.randint(0, 2)))
            text = (noise + " " + rng.choice(_COPY_ASKS).format(what=what, x=said)).strip()
            answer = _call("lookup", {kind: arg})
        else:
            fields = rng.sample(("status", "city", "cabin", "color", "size", "origin", "method"), 3)
            values = [rng.choice(("pending", "delivered", "processed", "cancelled", "business",
                                  "economy", "red", "blue", "large", "small", "paypal",
                                  "credit_card", "Boston", "Denver", "Austin", "Miami")) for _ in fields]
            record = {kind: arg, **dict(zip(fields, values))}
            ask = rng.randrange(len(fields) + 1)
            name, value = ([kind] + fields)[ask], ([arg] + values)[ask]
            text = (f"<tool_response>\n{json.dumps(record)}\n</tool_response>\n"
                    f"What is the {name}?")
            answer = f"The {name} is {value}."
        out.append(([{"role": "user", "content": text}], answer))
    return out


def people_samples(n: int, seed: int, forbidden: frozenset[str] = frozenset(),
                   names: tuple[list[str], list[str]] | None = None
                   ) -> list[tuple[list[dict[str, str]], str]]:
    """``n`` people copies only (``_people_sample``), the samples of the copy warm-up's people
    stage (``study.pretrain_people_steps``, ``copy_warmup.train_people``).

    Args:
        n: how many samples.
        seed: the draw's seed (the same seed gives the same samples).
        forbidden: ids that no sample may hold (``tau2_ids``).
        names: ``(first names, last names)`` to draw from, or None for syllable names.

    Returns:
        ``n`` samples ``(messages, answer)``, in these shares on average: a ``find`` call from a
        ticket with a name and zip (1/4), from a ticket with an e-mail (1/4), and a ``lookup``
        of the user id that the find call's response returns (1/2).
    """
    rng = random.Random(seed)
    out: list[tuple[list[dict[str, str]], str]] = []
    while len(out) < n:
        sample = _people_sample(rng, forbidden, names)
        if sample is not None:
            out.append(sample)
    return out


def _people_sample(rng: random.Random, forbidden: frozenset[str],
                   names: tuple[list[str], list[str]] | None = None
                   ) -> tuple[list[dict[str, str]], str] | None:
    """One people copy of ``copy_samples(people=True)``, named from ``names`` (first names, last
    names) or with syllables; None when the user id drawn is forbidden (the caller draws
    again)."""
    if names:
        first, last = rng.choice(names[0]), rng.choice(names[1])
    else:
        first, last = syllable_name(rng), syllable_name(rng)
    uid = f"{first.lower()}_{last.lower()}_{rng.randint(1000, 9999)}"
    if uid in forbidden:
        return None
    q = rng.choice(_PEOPLE_QUESTIONS)
    if rng.random() < 0.5:
        z = f"{rng.randrange(10 ** 5):05d}"
        text = rng.choice(_PEOPLE_ASKS).format(f=first, l=last, z=z, q=q)
        find = _call("find", {"first_name": first, "last_name": last, "zip": z})
    else:
        email = f"{first.lower()}.{last.lower()}{rng.randint(1000, 9999)}@example.com"
        if email in forbidden:
            return None
        text = rng.choice(_EMAIL_ASKS).format(e=email, q=q)
        find = _call("find", {"email": email})
    user = {"role": "user", "content": text}
    if rng.random() < 0.5:
        return [user], find
    return ([user, {"role": "assistant", "content": find},
             tool_response_message([Observation(uid)])], _call("lookup", {"user_id": uid}))


_HOP_WRITES = ("Please change {what} {x}.", "I want to update {what} {x}.",
               "Hi, make the change on {what} {x}, please.")
_HOP_LINKS = ("Find the {link} linked to {what} {x}.", "Which {link} belongs to {what} {x}?")


def _call(name: str, arguments: dict[str, Any]) -> str:
    """An ACT output of one call, as the transcripts write it (``prompts.assistant_text``)."""
    return assistant_text([ToolCall(name, arguments)])


def _hop_sample(rng: random.Random, kind: str, said: str, arg: str, what: str,
                forbidden: frozenset[str]) -> tuple[list[dict[str, str]], str] | None:
    """One second-call sample of ``copy_samples(hops=True)``; None when the linked id drawn is
    forbidden or of the same kind (the caller draws again)."""
    link_kind, _, link = _copy_id(rng)
    if link in forbidden or link_kind == kind or link_kind == "email":
        return None
    fields = rng.sample(("status", "city", "cabin", "color", "size", "origin", "method"), 2)
    values = [rng.choice(("pending", "delivered", "processed", "cancelled", "economy", "red",
                          "large", "paypal", "Boston", "Miami")) for _ in fields]
    record = {kind: arg, **dict(zip(fields, values)), link_kind + "s": [link]}
    noise = " ".join(f"(old ref {_copy_id(rng)[1]})" for _ in range(rng.randint(0, 1)))
    if rng.random() < 0.5:
        ask, answer = rng.choice(_HOP_WRITES), _call("update", {kind: arg})
    else:
        ask, answer = rng.choice(_HOP_LINKS), _call("lookup", {link_kind: link})
    link_what = link_kind.replace("_id", "").replace("_", " ")
    text = (noise + " " + ask.format(what=what, x=said, link=link_what)).strip()
    return ([{"role": "user", "content": text},
             {"role": "assistant", "content": _call("lookup", {kind: arg})},
             tool_response_message([Observation(json.dumps(record))])], answer)


_REC_KEYS = ("status", "city", "cabin", "color", "size", "origin", "method", "zip", "state",
             "brand", "level", "source", "country", "note")
_REC_WORDS = ("pending", "delivered", "processed", "cancelled", "business", "economy", "red",
              "blue", "large", "small", "paypal", "credit_card", "gift_card", "Boston", "Denver",
              "Austin", "Miami", "maple", "steel", "glass", "USA", "TX", "CA", "plain")


def _record(rng: random.Random, kind: str, arg: str) -> dict[str, Any]:
    """A random record for ``_record_sample``: the id, 4-8 fields of words or digits, and 0-3
    items (a name, a 10-digit item id, a price), in a random field order."""
    fields: list[tuple[str, Any]] = [(kind, arg)]
    for key in rng.sample(_REC_KEYS, rng.randint(4, 8)):
        fields.append((key, rng.choice(_REC_WORDS) if rng.random() < 0.6 else
                       "".join(rng.choice("0123456789") for _ in range(rng.randint(4, 8)))))
    items = [{"name": rng.choice(_REC_WORDS), "item_id": "".join(rng.choice("0123456789")
                                                                  for _ in range(10)),
              "price": round(rng.uniform(5, 900), 2)} for _ in range(rng.randint(0, 3))]
    if items:
        fields.insert(rng.randint(1, len(fields)), ("items", items))
    return dict(fields)


def _record_sample(rng: random.Random, kind: str, forbidden: frozenset[str]
                   ) -> tuple[list[dict[str, str]], str] | None:
    """One record copy of ``copy_samples(records=True)``; None when an id drawn is forbidden or
    repeated (the caller draws again)."""
    refs = []
    for _ in range(rng.randint(1, 3)):
        while True:
            k, said, arg = _copy_id(rng)
            if k == kind:
                break
        if said in forbidden or arg in forbidden or any(arg == a for a, _ in refs):
            return None
        refs.append((arg, _record(rng, kind, arg)))
    target, record = refs[rng.randrange(len(refs))]
    blocks = "\n".join(f"{_call('lookup', {kind: a})}\n{rehearsal_text(json.dumps(r))}"
                       for a, r in refs)
    text = (f"Reference calls and their results:\n{blocks}\n\nCurrent call:\n"
            f"{_call('lookup', {kind: target})}")
    return [{"role": "user", "content": text}], rehearsal_text(json.dumps(record))


def tau2_ids() -> frozenset[str]:
    """Every user, order and reservation id and e-mail in tau2's retail and airline databases
    (with and without an order id's ``#``): the ids ``copy_samples`` must not produce."""
    from envace_lite.drills.solver import Solver

    ids: set[str] = set()
    for domain in ("retail", "airline"):
        db = Solver(domain).db
        ids.update(db.users)
        ids.update(u.email for u in db.users.values() if getattr(u, "email", None))
        for table in ("orders", "reservations"):
            for k in getattr(db, table, {}) or {}:
                ids.update((k, k.lstrip("#")))
    return frozenset(ids)

__all__ = ["copy_samples", "letters_name", "people_samples", "syllable_name", "tau2_ids"]
