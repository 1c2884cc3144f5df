"""BFCL v4 multi-turn as an ``Env``: real backends, BFCL's checker, a safe call path
(docs/design.md, "Benchmarks and training data").

Four suites, one per BFCL v4 multi-turn category (200 entries each, 1-8 scripted user turns):
``bfcl-base``, ``bfcl-miss_func``, ``bfcl-miss_param`` and ``bfcl-long_context``. Everything is
loaded from the installed ``bfcl_eval`` wheel at run time; nothing of BFCL is committed here except
our own seeded split, ``data/bfcl_split.json`` (by entry index, shared by all four categories,
because index ``i`` is the same scenario in every category).

The parts that matter:

* **Execution** goes through ``execute_multi_turn_func_call``, which runs call strings with Python
  ``eval``. No model text ever reaches it: ``step`` whitelists the function name against the entry's
  docs, checks the argument names against the schema, accepts only JSON values, and renders the
  string itself, ``name(k=repr(v),...)``, exactly as BFCL's ``convert_to_function_call`` would.
* **Scoring** is ``multi_turn_checker`` on the recorded ``decoded`` structure (turns -> steps ->
  call strings), under a fresh run name; the turn-count guard comes from BFCL's ``eval_runner``.
* **Instance cache.** The executor keeps backends in its module globals under
  ``f"{run_name}_{entry_id}_{Class}_instance"``. Every episode gets a fresh ``envace_<uuid>`` run
  name, and ``close()`` / ``score()`` delete every global with that prefix (checker namespaces too).

Regenerate the split, or replay the gold calls of all 800 tasks (about 6 s)::

    python -m envace_lite.envs.bfcl --write-split
    python -m envace_lite.envs.bfcl
"""
from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import os
import random
import sys
import uuid
from typing import Any

from envace_lite.envs.base import Env, GoldTurn
from envace_lite.paths import DATA_DIR, cache_dir
from envace_lite.envs.bfcl_schema import is_json_value, render_call, to_openai_tool
from envace_lite.protocol.json_text import MAX_ARG_DEPTH
from envace_lite.types import Observation, ToolCall

# Importing bfcl_eval's loaders creates result/, score/ and .file_locks/ under BFCL_PROJECT_ROOT,
# which defaults to site-packages. Point it at our cache before the first bfcl_eval import.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache_dir("bfcl")))

from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    MAXIMUM_STEP_LIMIT,
)
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

CATEGORIES = {
    "bfcl-base": "multi_turn_base",
    "bfcl-miss_func": "multi_turn_miss_func",
    "bfcl-miss_param": "multi_turn_miss_param",
    "bfcl-long_context": "multi_turn_long_context",
}
"""Suite name -> BFCL test category (also the prefix of its entry ids, ``multi_turn_base_17``)."""

N_ENTRIES = 200
SPLIT_FILE = DATA_DIR / "bfcl_split.json"
RUN_PREFIX = "envace_"
"""Prefix of every run name this module gives the executor (see ``cached_instances``)."""

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the provided functions. "
    "You may call several functions in one reply; their results are returned to you. When the "
    "current request is done, answer the user in plain text. If no function can do what is "
    "asked, or the request lacks a value that a function needs, say so instead of guessing."
)
"""A neutral instruction: BFCL's FC mode sends no system prompt; the last sentence paraphrases
the task line of BFCL's prompting-mode ``_DEFAULT_SYSTEM_PROMPT``."""

WRITE_FUNCTIONS: dict[str, frozenset[str]] = {
    "GorillaFileSystem": frozenset({"mkdir", "touch", "echo", "mv", "cp", "rm", "rmdir"}),
    "MathAPI": frozenset(),
    "MessageAPI": frozenset({"message_login", "send_message", "delete_message", "add_contact"}),
    "TwitterAPI": frozenset({"authenticate_twitter", "post_tweet", "retweet", "comment",
                             "mention", "follow_user", "unfollow_user"}),
    "TicketAPI": frozenset({"create_ticket", "close_ticket", "resolve_ticket", "edit_ticket",
                            "ticket_login", "logout"}),
    "TradingBot": frozenset({"place_order", "cancel_order", "fund_account", "withdraw_funds",
                             "add_to_watchlist", "remove_stock_from_watchlist",
                             "trading_login", "trading_logout"}),
    "TravelAPI": frozenset({"authenticate_travel", "register_credit_card", "book_flight",
                            "cancel_booking", "purchase_insurance", "set_budget_limit"}),
    "VehicleControlAPI": frozenset({"startEngine", "fillFuelTank", "lockDoors",
                                    "adjustClimateControl", "setHeadlights",
                                    "activateParkingBrake", "pressBrakePedal",
                                    "releaseBrakePedal", "setCruiseControl", "set_navigation"}),
}
"""Per backend class, the functions that can change a *public* attribute, i.e. the state that
BFCL's ``state_checker`` compares (``vars(instance)`` without ``_`` names). Read off the backend
sources: direct ``self.x = ...`` / ``self.x.append(...)``, and writes through an alias (``mention``
extends a tweet's list; ``close_ticket``/``resolve_ticket``/``edit_ticket`` edit the dict that
``_find_ticket`` returns; ``echo`` writes a file only when ``file_name`` is given). Logins count:
their flags are public. Not writes: ``cd`` (moves the private ``_current_dir``), ``get_flight_cost``
(fills the private ``_flight_cost_lookup``), and read-only getters that copy before decorating
(``get_stock_info``, ``get_order_details``, ``get_watchlist`` in long_context mode)."""
_WRITE_NAMES = frozenset().union(*WRITE_FUNCTIONS.values())

# ---------------------------------------------------------------------------- split and data
def make_split(seed: int = 0, n_test: int = 50) -> dict[str, Any]:
    """The seeded split by entry index, shared by all four categories (``data/bfcl_split.json``)."""
    order = list(range(N_ENTRIES))
    random.Random(seed).shuffle(order)
    return {"seed": seed,
            "method": f"random.Random(seed).shuffle(range({N_ENTRIES})); the first {n_test} "
                      "indices are test, the rest train; index i of every multi_turn category "
                      "goes to the same split (the categories share scenarios by index)",
            "test_indices": sorted(order[:n_test]), "train_indices": sorted(order[n_test:])}


def write_split(seed: int = 0) -> None:
    """Write ``make_split(seed)`` to ``SPLIT_FILE``, one key per line."""
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in make_split(seed).items())
    SPLIT_FILE.write_text("{\n" + body + "\n}\n")


@functools.lru_cache(maxsize=1)
def load_split() -> dict[str, Any]:
    """The committed split (``data/bfcl_split.json``)."""
    return json.loads(SPLIT_FILE.read_text())


def _category(suite: str) -> str:
    if suite not in CATEGORIES:
        raise KeyError(f"unknown BFCL suite {suite!r}: choose one of {list(CATEGORIES)}")
    return CATEGORIES[suite]


@functools.cache
def _load(category: str) -> tuple[dict[str, dict], dict[str, list[list[str]]]]:
    """BFCL's own loaders: entries by id (``function`` docs attached, miss_func held-out docs moved
    to ``missed_function[turn]``) and ground truth (call strings per turn) by id. Read-only."""
    entries = {e["id"]: e for e in load_dataset_entry(category)}
    truth = {g["id"]: g["ground_truth"] for g in load_ground_truth_entry(category)}
    return entries, truth


def task_ids(suite: str, split: str) -> list[str]:
    """BFCL entry ids of ``suite`` in ``split`` (``train``/``test``/``all``), ordered by index."""
    cat = _category(suite)
    if split == "all":
        idx = range(N_ENTRIES)
    elif split in ("train", "test"):
        idx = load_split()[f"{split}_indices"]
    else:
        raise KeyError(f"unknown split {split!r}: choose train, test or all")
    return [f"{cat}_{i}" for i in idx]


def make(suite: str, task_id: str) -> BfclEnv:
    """A fresh ``BfclEnv`` for one entry. Raises ``KeyError`` on an unknown suite or id."""
    if task_id not in _load(_category(suite))[0]:
        raise KeyError(f"unknown task id {task_id!r} for {suite}: see task_ids({suite!r}, 'all')")
    return BfclEnv(suite, task_id)


# ---------------------------------------------------------------------------- schemas and calls
@functools.cache
def _methods(cls_name: str) -> dict[str, tuple[str, ...]]:
    """Public methods of a backend class (those the executor maps) -> parameter names in order."""
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
    return {n: tuple(p for p in inspect.signature(f).parameters if p != "self")
            for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


def parse_call(text: str, cls_of: dict[str, str]) -> ToolCall:
    """Parse one BFCL ground-truth call string with ``ast`` (never ``eval``) into a ``ToolCall``.

    Positional arguments (40 gold calls per category, e.g. ``cd('archives')``) become keywords by
    the backend method's signature. Raises ``ValueError`` on anything but ``name(literals)``.
    """
    node = ast.parse(text, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in cls_of):
        raise ValueError(f"not a call of a known function: {text!r}")
    names = _methods(cls_of[node.func.id])[node.func.id]
    if len(node.args) > len(names):
        raise ValueError(f"too many positional arguments in {text!r}")
    args = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
    if not is_json_value(args):
        raise ValueError(f"non-JSON literal in gold call {text!r}")
    return ToolCall(node.func.id, args)


def cached_instances(prefix: str = RUN_PREFIX) -> list[str]:
    """Backend instances in the executor's module-global cache whose name starts with ``prefix``."""
    return [k for k in vars(multi_turn_utils) if k.startswith(prefix) and k.endswith("_instance")]


def _drop_instances(run_name: str) -> None:
    """Delete every cached instance of ``run_name`` (live, ``_eval`` and ``_ground_truth_eval``)."""
    for key in cached_instances(run_name + "_"):
        vars(multi_turn_utils).pop(key, None)


def _new_run_name(tag: str) -> str:
    return f"{RUN_PREFIX}{tag}{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------- the environment
class BfclEnv(Env):
    """One BFCL v4 multi-turn entry, executed on BFCL's backends and scored by BFCL's checker.

    Attributes:
        entry: BFCL's entry (read-only; ``function`` holds the docs visible at turn 0).
        ground_truth: gold call strings, one list per user turn.
        turn: index of the current user turn.
        decoded: the checker input so far: closed turns -> steps -> executed call strings.
        force_terminated: a turn went past ``MAXIMUM_STEP_LIMIT`` steps (BFCL's ``force_quit``).
    """

    def __init__(self, suite: str, task_id: str) -> None:
        super().__init__()
        self.suite, self.task_id = suite, task_id
        self.category = _category(suite)
        entries, truth = _load(self.category)
        self.entry, self.ground_truth = entries[task_id], truth[task_id]
        self.long_context = "long_context" in self.category
        self._held_out = {int(t): docs for t, docs in self.entry.get("missed_function", {}).items()}
        all_docs = list(self.entry["function"]) + [d for ds in self._held_out.values() for d in ds]
        self._docs = {d["name"]: d for d in all_docs}  # whitelist: every doc (miss_func_49 quirk)
        self._cls_of = {f: c for c in self.entry["involved_classes"] for f in _methods(c)}
        self._run: str | None = None

    # -- episode
    def reset(self) -> list[dict[str, Any]]:
        """Fresh backends (a new run name) and the system + first user messages."""
        self.close()
        self._run = _new_run_name("")
        self.real_calls, self.done, self.force_terminated = 0, False, False
        self.turn, self._steps_in_turn = 0, 0
        self.decoded: list[list[list[str]]] = []
        self._current: list[list[str]] = []
        self.final_texts: list[str] = []
        self._visible = [d["name"] for d in self.entry["function"]]
        return ([{"role": "system", "content": SYSTEM_PROMPT}]
                + copy.deepcopy(self.entry["question"][0]))

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI tools visible now; miss_func adds the held-out ones at their turn."""
        self._require_reset()
        return [to_openai_tool(self._docs[n]) for n in self._visible]

    def _reject(self, call: ToolCall) -> str | None:
        """Why ``call`` must not be executed (an error text), or ``None`` when it is safe."""
        if not isinstance(call.name, str) or call.name not in self._docs:
            return f"Error during execution: function {call.name!r} is not available"
        if not isinstance(call.arguments, dict):
            return f"Error during execution: arguments of {call.name}() must be a JSON object"
        allowed = self._docs[call.name]["parameters"].get("properties", {})
        unknown = sorted(k for k in call.arguments if k not in allowed)
        if unknown:
            return (f"Error during execution: {call.name}() got unexpected keyword argument(s) "
                    f"{unknown}")
        bad = sorted(k for k, v in call.arguments.items() if not is_json_value(v))
        if bad:
            return (f"Error during execution: argument(s) {bad} of {call.name}() are not JSON "
                    f"values nested at most {MAX_ARG_DEPTH} deep")
        return None

    def step(self, calls: list[ToolCall]) -> list[Observation]:
        """Execute one ACT reply's calls (parallel, in order) on the live backends.

        Rejected calls (unknown function or argument names, non-JSON values) get the adapter's
        error observation; they are neither executed, nor counted, nor recorded for the checker.
        Every non-empty step counts toward ``MAXIMUM_STEP_LIMIT`` (rejected calls included, as
        BFCL's runner counts every model query); like that runner, the step that goes past the
        limit still executes, then the episode is force-terminated (``done``, turn closed).

        ``call.violations`` are not consulted: type errors and missing arguments are answered
        by BFCL's backend itself, as in the official runner.

        Returns:
            One ``Observation`` per call; ``error`` when the result starts with "Error during
            execution"; ``state_changed`` for a write function (``WRITE_FUNCTIONS``) that did
            not raise (by name: a soft ``{"error": ...}`` answer of a write still says True).
        """
        self._require_reset()
        if self.done:
            raise RuntimeError(f"{self.task_id}: the episode is over; call reset() first")
        if not calls:
            return []
        reasons = [self._reject(c) for c in calls]
        strings = [render_call(c.name, c.arguments) for c, r in zip(calls, reasons) if r is None]
        results: list[str] = []
        if strings:
            results, _ = multi_turn_utils.execute_multi_turn_func_call(
                strings, self.entry["initial_config"], self.entry["involved_classes"],
                self._run, self.task_id, long_context=self.long_context)
            self._current.append(strings)
            self.real_calls += len(strings)
        it = iter(results)
        obs = []
        for call, reason in zip(calls, reasons):
            if reason is not None:
                obs.append(Observation(reason, error=True))
                continue
            out = next(it)
            err = out.startswith("Error during execution")
            obs.append(Observation(out, error=err,
                                   state_changed=self.is_state_changing(call.name) and not err))
        self._steps_in_turn += 1
        if self._steps_in_turn > MAXIMUM_STEP_LIMIT:
            self.force_terminated = True
            self._close_turn()
            self.done = True
        return obs

    def _close_turn(self) -> None:
        self.decoded.append(self._current)
        self._current, self._steps_in_turn = [], 0
        self.turn += 1

    def end_turn(self, text: str) -> list[dict[str, Any]] | None:
        """Close the user turn with ``text``; the next user messages, or ``None`` at the end.

        For miss_func's empty question turn the held-out docs join the tool list and the user
        message is BFCL's ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``.
        """
        self._require_reset()
        if self.done:
            return None
        self.final_texts.append(text)
        self._close_turn()
        if self.turn >= len(self.ground_truth):
            self.done = True
            return None
        if self.turn in self._held_out:
            self._visible += [d["name"] for d in self._held_out[self.turn]]
            return [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        return copy.deepcopy(self.entry["question"][self.turn])

    def score(self) -> tuple[float, dict[str, Any]]:
        """BFCL's ``multi_turn_checker`` verdict, 1.0 or 0.0, with its error type in ``details``.

        An unfinished turn counts as recorded. When fewer turns than the ground truth were
        recorded, the verdict is BFCL's ``multi_turn:force_terminated`` (0.0); the checker still
        runs on the turns padded with empty ones and its result is reported as ``padded_check``.
        """
        self._require_reset()
        decoded = self.decoded + ([] if self.done else [self._current])
        n_gt = len(self.ground_truth)
        padded = decoded + [[] for _ in range(n_gt - len(decoded))]
        run = _new_run_name("score_")
        try:
            res = multi_turn_checker(padded, self.ground_truth, self.entry, self.category, run)
        finally:
            _drop_instances(run)
            if self.done:
                self.close()
        check = {"valid": bool(res["valid"]), "error_type": res.get("error_type"),
                 "error_message": res.get("error_message")}
        if "differences" in res.get("details", {}):
            check["differences"] = sorted(res["details"]["differences"])
        if "missing_items" in res.get("details", {}):
            check["missing_items"] = list(res["details"]["missing_items"])
        details = {"turns_recorded": len(decoded), "turns_expected": n_gt,
                   "force_terminated": self.force_terminated, "real_calls": self.real_calls,
                   "decoded": decoded}
        if len(decoded) != n_gt:
            details.update(valid=False, error_type="multi_turn:force_terminated",
                           error_message=f"{len(decoded)} of {n_gt} turns recorded",
                           padded_check=check)
            return 0.0, details
        details.update(check)
        return (1.0 if check["valid"] else 0.0), details

    def gold_turns(self) -> list[GoldTurn]:
        """Gold calls per user turn: one parallel step per turn (``[]`` for empty-gold turns)."""
        return copy.deepcopy(_gold_turns(self.suite, self.task_id))

    def is_state_changing(self, name: str) -> bool:
        """True when ``name`` can change checker-visible state (``WRITE_FUNCTIONS``)."""
        return name in _WRITE_NAMES

    def close(self) -> None:
        """Drop this episode's backends from the executor's global cache. Idempotent."""
        if self._run is not None:
            _drop_instances(self._run)

    def _require_reset(self) -> None:
        if self._run is None:
            raise RuntimeError(f"{self.task_id}: call reset() before using the environment")


@functools.cache
def _gold_turns(suite: str, task_id: str) -> list[GoldTurn]:
    """Parse the gold calls and replay them once (own run name) to find the failing ones."""
    env = BfclEnv(suite, task_id)
    run = _new_run_name("gold_")
    turns = []
    try:
        for ti, strings in enumerate(env.ground_truth):
            calls = [parse_call(s, env._cls_of) for s in strings]
            for k, c in enumerate(calls):
                c.call_id = f"call_{ti}_{k}"
            results, _ = multi_turn_utils.execute_multi_turn_func_call(
                [render_call(c.name, c.arguments) for c in calls], env.entry["initial_config"],
                env.entry["involved_classes"], run, task_id, long_context=env.long_context)
            failing = [k for k, r in enumerate(results) if r.startswith("Error during execution")]
            turns.append(GoldTurn(steps=[calls] if calls else [], failing=failing,
                                  key_args=[None] * len(calls)))  # BFCL compares every keyword
    finally:
        _drop_instances(run)
    return turns


def main(argv: list[str]) -> None:
    """``--write-split``: rewrite ``data/bfcl_split.json``; otherwise replay every task's gold."""
    if "--write-split" in argv:
        write_split(0)
        print(f"wrote {SPLIT_FILE}")
        return
    from envace_lite.envs.base import replay_gold

    for suite in CATEGORIES:
        scores = [replay_gold(make(suite, t))[0] for t in task_ids(suite, "all")]
        print(f"{suite}: gold replay {sum(scores):.0f}/{len(scores)}")


if __name__ == "__main__":
    main(sys.argv[1:])
