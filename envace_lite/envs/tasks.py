"""Training and evaluation tasks: checklists from gold calls, grounding from real executions.

The paper trains on CM2, which cannot be downloaded here (docs/design.md, "Benchmarks and
training data"). We build
tasks from the benchmarks' own *train* splits instead (tau2's splits; our seeded BFCL split in
``data/bfcl_split.json``) and evaluate on the *test* splits only.

For each task this module:

1. replays the benchmark's gold calls once, offline, in the real environment (``Env.step``), and
   keeps every (call, real observation) pair as REHEARSE **grounding**;
2. builds one **checklist** per reference user turn (docs/design.md, "The checklist reward"):
   ``call`` items (tool + key arguments), ``observation`` items (key values of the real output),
   ``communicate`` items (tau2 ``communicate_info``) and, for a turn whose gold is empty
   (BFCL miss_func / miss_param), one ``no_call`` item of weight 1. Weights sum to 1 per turn;
3. flags gold calls that fail when replayed (``gold_call_error``). They are kept as they are and
   listed in the data card, never dropped or "fixed".

Derived task files are cached under ``ENVACE_CACHE/tasks`` (built on first use or with
``envace-lite data build``). No raw benchmark data is committed; ``data/card.json`` holds counts.

Usage::

    from envace_lite.envs.tasks import load_tasks
    tasks = load_tasks("bfcl-base", "train")
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envace_lite.envs import list_tasks, make_env
from envace_lite.paths import DATA_DIR, cache_dir
from envace_lite.types import ChecklistItem, Observation, Task, ToolCall

DATA_VERSION = 2
"""Bump when the derivation below changes; cached files of another version are rebuilt."""

KIND_SHARES = {"call": 0.6, "observation": 0.2, "communicate": 0.2}
"""Weight share of each item kind within a user turn, renormalised over the kinds present and
split equally among the items of a kind."""

MAX_OBSERVATION_VALUES = 3
"""Key values kept per ``observation`` item."""


def normalize(value: Any) -> Any:
    """JSON-normalise a value for comparison (docs/design.md, "The checklist reward"): tuples become
    lists, numbers that are whole become ints, dict keys are sorted by ``json.dumps``."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def key_values(content: str) -> list[str]:
    """Key values of a real tool output, used by ``observation`` checklist items.

    JSON outputs give their scalar leaves, identifiers first (values under keys ending in
    ``id``/``name``/``status``, any length up to 80), then numbers and other strings of 3..80
    characters; deduplicated, at most
    ``MAX_OBSERVATION_VALUES``. Non-JSON outputs give their first line when it is 3..80 chars.

    Args:
        content: the observation text.

    Returns:
        A list of strings, each of which must appear in a rehearsed observation for the item to
        pass.
    """
    try:
        data = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        line = content.strip().splitlines()[0] if content.strip() else ""
        return [line] if 3 <= len(line) <= 80 else []
    leaves: list[tuple[int, str]] = []

    def walk(obj: Any, key: str = "") -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, str(k))
        elif isinstance(obj, list):
            for v in obj[:5]:
                walk(v, key)
        elif isinstance(obj, bool) or obj is None:
            return
        else:
            text = str(obj)
            rank = 0 if key.lower().endswith(("id", "name", "status")) else 1
            short_ok = rank == 0 or isinstance(obj, (int, float))
            if (short_ok and 1 <= len(text) <= 80) or 3 <= len(text) <= 80:
                leaves.append((rank, text))

    walk(data)
    seen: list[str] = []
    for _, text in sorted(leaves, key=lambda t: t[0]):
        if text not in seen:
            seen.append(text)
    return seen[:MAX_OBSERVATION_VALUES]


def build_checklist(
    calls: list[ToolCall],
    observations: list[Observation],
    key_args: list[list[str] | None],
    communicate: list[str],
) -> list[ChecklistItem]:
    """The checklist of one reference user turn (docs/design.md, "The checklist reward").

    Args:
        calls: the turn's gold calls, flattened, terminal pseudo-tools excluded.
        observations: the real observation of each gold call (same length as ``calls``).
        key_args: per call, the compared argument names, or ``None`` for all.
        communicate: strings the final answer must contain.

    Returns:
        Items whose weights sum to 1. A turn with no gold call and nothing to communicate gets one
        ``no_call`` item of weight 1.
    """
    groups: dict[str, list[ChecklistItem]] = {"call": [], "observation": [], "communicate": []}
    for call, obs, names in zip(calls, observations, key_args):
        args = call.arguments if names is None else {k: call.arguments.get(k) for k in names}
        groups["call"].append(ChecklistItem(
            kind="call", tool=call.name, key_args=normalize(args), required_for_next_turn=True,
        ))
        values = [] if obs.error else key_values(obs.content)
        if values:
            groups["observation"].append(ChecklistItem(
                kind="observation", tool=call.name, key_args=normalize(args), expected=values,
            ))
    for info in communicate:
        groups["communicate"].append(ChecklistItem(kind="communicate", expected=str(info)))
    present = {k: v for k, v in groups.items() if v}
    if not present:
        return [ChecklistItem(kind="no_call", weight=1.0, required_for_next_turn=True)]
    total = sum(KIND_SHARES[k] for k in present)
    items: list[ChecklistItem] = []
    for kind, group in present.items():
        for item in group:
            item.weight = KIND_SHARES[kind] / total / len(group)
            items.append(item)
    return items


def build_task(suite: str, task_id: str, split: str, rendering: str = "compact") -> Task:
    """Build one ``Task`` by replaying its gold calls in a real environment.

    Args:
        suite: a suite name from ``envace_lite.envs.all_suites()`` (use a ``-ticket`` suite for tau2
            retail and airline: training never uses a user simulator).
        task_id: the benchmark's task id.
        split: ``train`` or ``test`` (recorded on the task).
        rendering: ``compact`` or ``full`` (recorded; rendering happens in ``protocol``).

    Returns:
        The task, with ``flags`` holding ``gold_call_error:<turn>:<index>:<tool>`` for each gold call
        whose real observation is an error.
    """
    env = make_env(suite, task_id)
    try:
        messages = env.reset()
        tools = env.tool_schemas()
        turns = env.gold_turns()
        user_turns: list[list[dict[str, Any]]] = [[m for m in messages if m["role"] == "user"]]
        checklist, grounding, gold, flags = [], [], [], []
        for ti, turn in enumerate(turns):
            calls, observations = [], []
            for step in turn.steps:
                real = [c for c in step if c.name not in env.terminal_tools]
                if real:
                    observations.extend(env.step(real))
                    calls.extend(real)
            names = list(turn.key_args) or [None] * len(turn.calls)
            names = [n for c, n in zip(turn.calls, names) if c.name not in env.terminal_tools]
            names += [None] * (len(calls) - len(names))
            for ci, (c, o) in enumerate(zip(calls, observations)):
                if o.error:
                    flags.append(f"gold_call_error:{ti}:{ci}:{c.name}")
            checklist.append(build_checklist(calls, observations, names, turn.communicate))
            grounding.append([{"call": c.to_dict(), "observation": o.to_dict()}
                              for c, o in zip(calls, observations)])
            gold.append([c.to_dict() for c in calls])
            if turn.final_text is not None and ti + 1 < len(turns):
                nxt = env.end_turn(turn.final_text)
                user_turns.append([m for m in (nxt or []) if m["role"] == "user"])
        return Task(
            id=task_id, suite=suite, split=split, messages=messages, tools=tools,
            user_turns=user_turns, checklist=checklist, grounding=grounding, gold_calls=gold,
            rendering=rendering, flags=flags,
        )
    finally:
        env.close()


def _cache_path(suite: str, split: str, rendering: str) -> Path:
    return cache_dir("tasks", f"v{DATA_VERSION}") / f"{suite}__{split}__{rendering}.jsonl"


def load_tasks(
    suite: str, split: str, rendering: str = "compact", limit: int = 0, rebuild: bool = False,
) -> list[Task]:
    """Tasks of ``suite``/``split``, built on first use and cached as JSONL.

    Args:
        suite: suite name. ``tau2-retail``/``tau2-airline`` map to their ``-ticket`` variants here,
            because building tasks needs no user simulator (the official protocol is used only in
            evaluation).
        split: ``train``, ``test`` or ``all``.
        rendering: recorded on each task.
        limit: keep the first ``limit`` tasks (0 keeps all; negative: ``ConfigError``). The cache
            holds the full split.
        rebuild: ignore the cache.
    """
    from envace_lite.config import first_tasks
    from envace_lite.envs import suite_module

    first_tasks([], limit)  # a negative limit is refused before any task is built
    ready = getattr(suite_module(suite), "suite_tasks", None)
    if ready is not None:  # a registered suite that builds its own tasks (the drills)
        return first_tasks(ready(suite, split, rendering), limit)
    build_suite = {"tau2-retail": "tau2-retail-ticket",
                   "tau2-airline": "tau2-airline-ticket"}.get(suite, suite)
    path = _cache_path(build_suite, split, rendering)
    if path.exists() and not rebuild:
        tasks = [Task.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    else:
        ids = list_tasks(build_suite, split)
        splits = {"train": set(list_tasks(build_suite, "train"))} if split == "all" else {}
        tasks = [
            build_task(build_suite, tid,
                       split if split != "all" else ("train" if tid in splits["train"] else "test"),
                       rendering)
            for tid in ids
        ]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(json.dumps(t.to_dict()) for t in tasks))
        tmp.replace(path)
    return first_tasks(tasks, limit)


def data_card(suites: list[str]) -> dict[str, Any]:
    """Counts per suite and split, gold-call errors, and a fingerprint of each task list.

    Returns:
        ``{suite: {split: {"tasks", "user_turns", "gold_calls", "checklist_items",
        "gold_call_errors": [flags...], "ids_sha1"}}}``; written to ``data/card.json``.
    """
    card: dict[str, Any] = {}
    for suite in suites:
        card[suite] = {}
        for split in ("train", "test"):
            tasks = load_tasks(suite, split)
            card[suite][split] = {
                "tasks": len(tasks),
                "user_turns": sum(len(t.checklist) for t in tasks),
                "gold_calls": sum(len(g) for t in tasks for g in t.gold_calls),
                "checklist_items": sum(len(c) for t in tasks for c in t.checklist),
                "gold_call_errors": [f"{t.id}:{f}" for t in tasks for f in t.flags
                                     if f.startswith("gold_call_error")],
                "ids_sha1": hashlib.sha1(
                    "\n".join(t.id for t in tasks).encode()).hexdigest()[:12],
            }
        from envace_lite.envs import suite_module

        extra = getattr(suite_module(suite), "suite_card", None)
        if extra is not None:  # a registered suite's own fields (the drills: generator, seed, ...)
            card[suite]["generation"] = extra(suite)
    return card


def write_data_card(suites: list[str], path: Path | None = None) -> Path:
    """Write ``data_card(suites)`` as JSON (default ``data/card.json``) and return the path."""
    path = path or DATA_DIR / "card.json"
    path.write_text(json.dumps(data_card(suites), indent=1, sort_keys=True) + "\n")
    return path


def checklist_weights_ok(task: Task, tol: float = 1e-9) -> bool:
    """True when every user turn's checklist weights sum to 1 (a data invariant)."""
    return all(abs(sum(i.weight for i in turn) - 1.0) <= tol for turn in task.checklist)


__all__ = [
    "build_checklist",
    "build_task",
    "checklist_weights_ok",
    "data_card",
    "key_values",
    "load_tasks",
    "normalize",
    "write_data_card",
]
