"""Copy rows: extra warm-start ACT transcripts of the SFT drills with fresh ids and amounts
(beyond the paper).

What it changes with respect to the paper: the warm start's ACT rows also hold
``study.copy_rows`` copies of each SFT drill in which every id and asked amount is replaced by a
fresh random one of the same shape, consistently in the ticket, the calls, the records and the
closing reply. The policy so sees many more copies of exactly what the drills ask (an id from
the ticket into a call, the id of a record into the write after it, a fact out of a record into
the reply) in the drills' own tokens, without a task that RL or evaluation uses. The copies are
never executed: their observations are the drill's real ones, rewritten.

What is replaced (entity-free: no new id is one of tau2's, ``copy_samples.tau2_ids``):

- order ids ``W`` + 7 digits (with or without ``#``), user ids ``name_name_NNNN``, payment
  method ids (``gift_card_``/``credit_card_``/``paypal_`` + 7 digits), 10-digit item and
  product ids and 12-digit tracking numbers found in the drill's calls and observations;
- each communicated amount (``123.45``), in the reply and as the record's number (``123.45`` or
  ``123.4``), by a random amount with the same count of integer digits and a non-zero last
  cent digit (so that its JSON number and its text agree).

With ``study.copy_people``, the copy's user also gets a fresh first and last name (random
syllables, ``copy_samples.syllable_name``; with ``study.copy_names=letters``, random letters,
``copy_samples.letters_name``; with ``study.copy_names=sft_users``, a first and a last name
drawn apart from the SFT drills' own users, ``user_names``), zip (5 digits) and e-mail
(``first.last`` + digits ``@example.com``), and its user id is made of the new names
(``first_last_NNNN``): what a two-hop drill's first two calls copy.
``study.copy_rows_two_hop`` adds more copies of each two-hop drill, the tier with the fewest.

The system prompt and tool schemas are left as they are. Reached through
``pipelines.sft.register_extra_sft_tasks`` (``drills/__init__.py``).

Usage::

    from envace_lite.drills.copy_rows import fresh_copy
    fresh_copy(task, random.Random(0), forbidden=frozenset())
"""
from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

from envace_lite.config import Config, ConfigError
from envace_lite.drills.copy_samples import letters_name, syllable_name
from envace_lite.types import Task

NameDraw = Callable[[random.Random], tuple[str, str]]
"""What makes a copy's new ``(first, last)`` name from the copy's random draw."""


def name_draw(make: Callable[[random.Random], str]) -> NameDraw:
    """A ``NameDraw`` whose first and last names are each made by ``make``
    (``copy_samples.syllable_name`` or ``copy_samples.letters_name``)."""
    return lambda rng: (make(rng), make(rng))


ID_PATTERNS: tuple[tuple[str, str], ...] = (
    ("order", r"(?<![A-Za-z0-9])W\d{7}(?!\d)"),
    ("user", r"\b[a-z]+_[a-z]+_\d{4}\b"),
    ("payment", r"\b(?:gift_card|credit_card|paypal)_\d{7}\b"),
    ("tracking", r"(?<!\d)\d{12}(?!\d)"),
    ("item", r"(?<!\d)\d{10}(?!\d)"),
)
"""The id kinds replaced, with their patterns (searched in the calls and observations)."""

AMOUNT = re.compile(r"^\d+\.\d{2}$")
EMAIL = re.compile(r"\b[a-z]+\.[a-z]+\d+@example\.com\b")


def _people(source: str, zips: list[str], rng: random.Random, taken: set[str], draw: NameDraw
            ) -> tuple[dict[str, str], dict[str, str]]:
    """``(ids, words)``: fresh user ids and e-mails (replaced as they are), and fresh names
    (made by ``draw``) and zips (replaced as whole words) for every user id and e-mail of
    ``source``."""
    ids, words = {}, {}
    for old in dict.fromkeys(re.findall(ID_PATTERNS[1][1], source)):
        first, last = old.split("_")[:2]
        while True:
            new_first, new_last = draw(rng)
            new = f"{new_first.lower()}_{new_last.lower()}_{rng.randrange(10**4):04d}"
            if new not in taken:
                break
        taken.add(new)
        ids[old] = new
        words[first.capitalize()], words[last.capitalize()] = new_first, new_last
        for email in dict.fromkeys(EMAIL.findall(source)):
            if email.startswith(f"{first}.{last}"):
                digits = len(email.split("@")[0]) - len(f"{first}.{last}")
                ids[email] = (f"{new_first.lower()}.{new_last.lower()}"
                              f"{rng.randrange(10**digits):0{digits}d}@example.com")
    for z in dict.fromkeys(zips):
        words[z] = f"{rng.randrange(10**5):05d}"
    return ids, words


def _fresh(kind: str, old: str, rng: random.Random, taken: set[str]) -> str:
    while True:
        if kind == "user":
            new = old[:-4] + f"{rng.randrange(10**4):04d}"
        elif kind == "payment":
            new = old[:-7] + f"{rng.randrange(10**7):07d}"
        elif kind == "order":
            new = "W" + f"{rng.randrange(10**7):07d}"
        else:
            new = f"{rng.randrange(10 ** (len(old) - 1), 10 ** len(old))}"
        if new != old and new not in taken and ("#" + new) not in taken:
            taken.add(new)
            return new


def _amount(old: str, rng: random.Random) -> str:
    whole = old.split(".")[0]
    low = 10 ** (len(whole) - 1) if len(whole) > 1 else 0
    return f"{rng.randrange(low, 10 ** len(whole))}.{rng.randrange(10)}{rng.randrange(1, 10)}"


def fresh_copy(task: Task, rng: random.Random, forbidden: frozenset[str] = frozenset(),
               k: int = 0, people: bool = False,
               draw: NameDraw | None = None) -> Task:
    """``task`` with fresh ids and amounts (see the module docstring), id ``<id>~copy<k>``.

    Args:
        task: a drill task (``drills.suite.suite_tasks``).
        rng: the draw of the new values.
        forbidden: ids no new value may equal (tau2's own).
        k: the copy's index (in its id).
        people: also fresh names, zips and e-mails, and user ids made of the new names.
        draw: with ``people``, what makes the new first and last name (None: random
            syllables, ``name_draw(copy_samples.syllable_name)``).

    Returns:
        A new ``Task``; ``task`` is left as it is.
    """
    d = task.to_dict()
    parts = {k: d[k] for k in ("user_turns", "checklist", "grounding", "gold_calls")}
    parts["message"] = [m for m in d["messages"] if m.get("role") != "system"]
    source = json.dumps([d["grounding"], d["gold_calls"]])
    taken = set(forbidden)
    mapping: dict[str, str] = {}
    words: dict[str, str] = {}
    if people:
        zips = [str(c["arguments"]["zip"]) for turn in d["gold_calls"] for c in turn
                if "zip" in c.get("arguments", {})]
        mapping, words = _people(source, zips, rng, taken, draw or name_draw(syllable_name))
    for kind, pattern in ID_PATTERNS:
        for old in dict.fromkeys(re.findall(pattern, source)):
            if old not in mapping and not any(old in k for k in mapping):
                mapping[old] = _fresh(kind, old, rng, taken)
    amounts = {}
    for turn in task.checklist:
        for item in turn:
            if item.kind == "communicate" and AMOUNT.match(str(item.expected)):
                amounts[str(item.expected)] = _amount(str(item.expected), rng)
    text = json.dumps(parts)
    if mapping:
        text = re.sub("|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)),
                      lambda m: mapping[m.group(0)], text)
    if words:
        text = re.sub(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(w) for w in words)
                      + r")(?![A-Za-z0-9])", lambda m: words[m.group(0)], text)
    for old, new in amounts.items():
        for form in dict.fromkeys((old, repr(float(old)))):  # the reply's and the record's
            text = re.sub(rf"(?<![\d.]){re.escape(form)}(?![\d])", new, text)
    new_parts = json.loads(text)
    system = [m for m in d["messages"] if m.get("role") == "system"]
    out = {**d, **{k: new_parts[k] for k in ("user_turns", "checklist", "grounding",
                                             "gold_calls")},
           "messages": system + new_parts["message"], "id": f"{task.id}~copy{k}"}
    return Task.from_dict(out)


def copy_tasks(tasks: list[Task], cfg: Config) -> list[Task]:
    """``cfg.study.copy_rows`` fresh copies of each of ``tasks`` (the SFT drills), and
    ``cfg.study.copy_rows_two_hop`` more of each two-hop drill, seeded by the run seed and the
    task id; none when ``copy_rows`` is 0 or the tasks are not drills. ``cfg.study.copy_people``
    gives the copies fresh names, zips and e-mails too; ``cfg.study.copy_names`` says how the
    names are made: random syllables, random letters (``letters``) or drawn from those of
    ``tasks``' own users (``sft_users``, ``user_names``).

    Registered as an extra warm-start task builder (``pipelines.sft.register_extra_sft_tasks``):
    the warm start takes their ACT transcripts only.

    Raises:
        ConfigError: ``copy_names=sft_users`` with drills that name no user id.
    """
    n = cfg.study.copy_rows
    if n <= 0:
        return []
    from envace_lite.drills.copy_samples import tau2_ids
    from envace_lite.drills.suite import DRILL_DOMAINS

    drills = [t for t in tasks if t.suite in DRILL_DOMAINS]
    if not drills:
        return []
    forbidden = tau2_ids()
    draw = name_draw(letters_name if cfg.study.copy_names == "letters" else syllable_name)
    if cfg.study.copy_people and cfg.study.copy_names == "sft_users":
        try:
            firsts, lasts = user_names(drills)
        except ValueError as e:
            raise ConfigError(f"study.copy_names=sft_users: {e}") from None

        def draw(rng: random.Random) -> tuple[str, str]:
            return rng.choice(firsts), rng.choice(lasts)
    out = []
    for task in drills:
        extra = cfg.study.copy_rows_two_hop if task.id.partition(":")[0] == "two_hop" else 0
        for k in range(n + extra):
            rng = random.Random(f"{cfg.run.seed}:{task.suite}:{task.id}:{k}")
            out.append(fresh_copy(task, rng, forbidden, k, cfg.study.copy_people, draw))
    return out


def user_names(tasks: list[Task]) -> tuple[list[str], list[str]]:
    """``(first names, last names)``: the sorted, distinct, capitalized name parts of the user
    ids (``first_last_NNNN``) in ``tasks``' gold calls and grounding, as a ticket writes them.

    Raises:
        ValueError: when no task names a user id.
    """
    firsts, lasts = set(), set()
    for task in tasks:
        d = task.to_dict()
        for uid in re.findall(ID_PATTERNS[1][1], json.dumps([d["grounding"], d["gold_calls"]])):
            first, last = uid.split("_")[:2]
            firsts.add(first.capitalize())
            lasts.add(last.capitalize())
    if not firsts:
        raise ValueError("no user id in the tasks: no names to draw from")
    return sorted(firsts), sorted(lasts)


__all__ = ["AMOUNT", "EMAIL", "ID_PATTERNS", "NameDraw", "copy_tasks", "fresh_copy", "name_draw",
           "user_names"]
