"""The rehearsal fidelity audit (docs/design.md, "Our additions beyond the paper"): does ô_t agree
with the real o_t?

The paper never measures how often REHEARSE's observations match what the real environment
returns. Here, for held-out pairs (h_t, a_t) (the test split, or a v2 drills suite's held-out
slice: ``audit``'s ``split``):

1. **Pairs.** Two sources: ``gold`` (the benchmark's gold calls, replayed) and ``policy`` (the
   policy's own committed runs, ``execute.run_committed``). Each source is a list of events
   (an ACT reply with its calls, or a closing text), replayed on a **fresh** real env
   (``replay``): the real o_t of every call is the env's answer at exactly the state that the
   prefix built. Policy pairs compare the replayed o_t with the one seen in the run
   (``replay_mismatches``; the adapters are deterministic, so it should be 0). h_t is the
   conversation up to and including the ACT reply that holds a_t, as REHEARSE reads it.
   Terminal pseudo-tools (telecom ``done``) are never rehearsed, so they make no pair.
2. **Rehearse.** The policy writes ô_t with the REHEARSE prompt and grounding ``<unavailable>``
   (docs/design.md, "Grounding"), all pairs in one batch, with the eval decoding. With
   ``grounded``, the same pairs are rehearsed again with their task's grounding shown, as RL
   shows it with ``rollout.grounding_drop_p=0`` (``held_out_grounded``).
3. **Metrics** (``pair_metrics``, ``aggregate``):
   - exact match: equal JSON values when both parse as JSON, else equal stripped text;
   - JSON field precision and recall: both sides flattened to leaf fields (``fields``), a field
     matches when path and value agree; micro-averaged over pairs;
   - the error/no-error confusion matrix (real vs rehearsed ``Observation.error``);
   - state-changing calls only: the rehearsal *claims* the change when it reports no error; the
     real change is the adapter's ``state_changed`` (tau2: the DB hash moved);
   - the REHEARSE parse rate (outputs with a proper ``<execution_result>`` block).
4. **Grounded upper bound.** The same metrics on TRAIN-split gold pairs whose REHEARSE prompt
   carries the task's grounding (the real results of its gold calls, as in training). The
   grounding holds the answers, so this is only an upper bound, and it is labelled so.
5. **Slices**: by tool, suite, source and task success (the replayed episode's reward == 1).
6. **Error prediction** (``error_kind_report``, per source): each call gets an error kind from
   what the dialogue before it shows (``error_kind``: invalid arguments, a missing ``#``, a
   mis-copied id, an unknown id, or none of these); per kind, the error recall (real errors
   that REHEARSE predicted as errors) and the false-error rate (real successes it predicted as
   errors). A REHEARSE output that does not parse is no prediction: never a caught error, never
   a false one, counted apart. On the drills, the recall of each tier's decisive field
   (``DECISIVE_FIELDS``, e.g. a cancel's order ``status``) is reported too
   (``decisive_report``). With ``--source policy`` these are REHEARSE's predictions on the calls
   the policy itself makes on held-out tasks: what ``rehearsal.strategy="select"`` relies on.

The metrics and the error kinds live in ``pipelines/fidelity_metrics.py``; this module builds
the pairs, rehearses them and writes the report.

Usage::

    envace-lite fidelity --profile laptop --suite tau2-telecom --suite bfcl-base --limit 3
    from envace_lite.pipelines.fidelity import audit
    report = audit(("gen", "tok"), ["bfcl-base"], cfg, limit=2)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envace_lite.protocol.prompts import assistant_text, tool_response_message
from envace_lite.protocol.rehearse_prompt import rehearse_messages
from envace_lite.testtime.execute import run_committed
from envace_lite.testtime.episode import Episode
from envace_lite.config import Config, first_tasks
from envace_lite.envs import list_tasks, make_env
from envace_lite.llm.generation import chat_ids, token_counter
from envace_lite.pipelines.fidelity_metrics import (
    DECISIVE_FIELDS, aggregate, decisive_match, drill_tier, error_kind, pair_metrics,
    prediction_report, seen_before, sliced)
from envace_lite.progress import get_logger, progress
from envace_lite.core.rollout import rehearsal_observation
from envace_lite.types import DECODING, Observation, ToolCall

log = get_logger(__name__)

UPPER_BOUND_LABEL = ("UPPER BOUND ONLY: train-split gold pairs whose REHEARSE prompt holds the "
                     "task's grounding, i.e. the real results of its gold calls; not a fidelity "
                     "estimate")
SOURCES = ("gold", "policy")
"""Where pairs come from: the benchmark's gold calls, and the policy's own committed runs."""


@dataclass
class Pair:
    """One audited (h_t, a_t) with its real o_t and, once rehearsed, ô_t.

    Attributes:
        suite, task_id, source: where it comes from (``gold`` or ``policy``).
        call: a_t.
        history: h_t as plain messages (no system prompt), ending with the ACT reply.
        tools: the tool schemas visible at that point.
        real: o_t from the fresh-env replay.
        state_changing: ``env.is_state_changing(call.name)``.
        task_success: the replayed episode scored 1.0.
        grounding: the task's grounding (train pairs of the upper bound), else None.
        rehearsed: ô_t; parse_ok: the REHEARSE output had an ``<execution_result>`` block.
    """

    suite: str
    task_id: str
    source: str
    call: ToolCall
    history: list[dict[str, str]]
    tools: list[dict[str, Any]]
    real: Observation
    state_changing: bool
    task_success: bool = False
    grounding: list[dict[str, Any]] | None = None
    rehearsed: Observation | None = None
    parse_ok: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Events and replays
# ---------------------------------------------------------------------------------------------

def gold_events(env: Any) -> list[dict[str, Any]]:
    """The gold replay of ``env``'s task as events (what ``envs.base.replay_gold`` does)."""
    events: list[dict[str, Any]] = []
    for turn in env.gold_turns():
        for step in turn.steps:
            if step:
                events.append({"kind": "step", "calls": [c.to_dict() for c in step],
                               "text": assistant_text(step)})
        if turn.final_text is not None:
            events.append({"kind": "end_turn", "text": turn.final_text})
    return events


def episode_events(ep: Episode) -> list[dict[str, Any]]:
    """A committed episode's events, with the ACT reply text and the observations it saw."""
    out = []
    for ev in ep.events:
        if ev["kind"] == "step":
            out.append({"kind": "step", "calls": ev["calls"], "seen": ev["observations"],
                        "text": ep.history[ev["history_len"] - 1]["content"]})
        else:
            out.append(dict(ev))
    return out


def replay(suite: str, task_id: str, events: list[dict[str, Any]], source: str,
           grounding: list[dict[str, Any]] | None = None) -> tuple[list[Pair], float, int]:
    """Replay ``events`` on a fresh env; one ``Pair`` per executed non-terminal call.

    Returns:
        ``(pairs, reward, mismatches)``: the replay's benchmark reward, and how many replayed
        observations differ from the ``seen`` ones recorded in the events (policy runs).
    """
    env = make_env(suite, task_id)
    try:
        messages = env.reset()
        history = [{"role": m["role"], "content": m["content"]}
                   for m in messages if m["role"] != "system"]
        pairs, mismatches = [], 0
        for ev in events:
            if env.done:
                break
            if ev["kind"] == "end_turn":
                history.append({"role": "assistant", "content": ev["text"]})
                history += [{"role": m["role"], "content": m["content"]}
                            for m in env.end_turn(ev["text"]) or []]
                continue
            calls = [ToolCall(c["name"], dict(c.get("arguments") or {}),
                              list(c.get("violations") or []), c.get("call_id", ""))
                     for c in ev["calls"]]
            tools = env.tool_schemas()
            history.append({"role": "assistant", "content": ev["text"]})
            h = list(history)
            observations = env.step(calls)
            for k, (c, o) in enumerate(zip(calls, observations)):
                seen = ev.get("seen")
                if seen is not None and k < len(seen) and seen[k]["content"] != o.content:
                    mismatches += 1
                if c.name in env.terminal_tools:
                    continue
                pairs.append(Pair(suite, task_id, source, c, h, tools, o,
                                  env.is_state_changing(c.name), grounding=grounding))
            if not env.done:
                history.append(tool_response_message(observations))
        reward, _ = env.score()
    finally:
        env.close()
    for p in pairs:
        p.task_success = reward == 1.0
    return pairs, float(reward), mismatches


# ---------------------------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------------------------

def rehearse_pairs(pairs: list[Pair], generator: Any, tokenizer: Any, cfg: Config) -> None:
    """Write ô_t for every pair in one batch (grounding: the pair's, else ``<unavailable>``)."""
    if not pairs:
        return
    rc = cfg.rollout
    count = token_counter(tokenizer)
    prompt_ids = [chat_ids(tokenizer, rehearse_messages(
        p.tools, p.grounding, p.history, p.call, count, rc.max_prompt_tokens,
        rc.rendering).messages) for p in pairs]
    temperature, top_p = DECODING[cfg.eval.decoding]
    outs = generator.generate(prompt_ids, role="rehearse", max_new_tokens=rc.max_new_tokens_rehearse,
                              temperature=temperature, top_p=top_p)
    for p, out in zip(pairs, outs):
        p.rehearsed, parsed = rehearsal_observation(out.text)
        p.parse_ok = parsed.ok
        p.metrics = pair_metrics(p.rehearsed, p.real, p.state_changing)


def record(p: Pair) -> dict[str, Any]:
    """A JSON-serialisable per-pair record: the slices' keys, the metrics, the call's error kind
    (``error_kind``), REHEARSE's ``prediction`` (``error`` | ``ok``, or ``none`` when its output
    did not parse), the drill ``tier`` and, where ``DECISIVE_FIELDS`` names one, the
    ``decisive_field`` and whether the rehearsal recalled it (``decisive``, None otherwise)."""
    tier = drill_tier(p.suite, p.task_id)
    name = DECISIVE_FIELDS.get((tier, p.call.name))
    rehearsed = p.rehearsed.content if p.rehearsed else ""
    return {"suite": p.suite, "task_id": p.task_id, "source": p.source, "tool": p.call.name,
            "task_success": "success" if p.task_success else "failure",
            "state_changing": p.state_changing, "parse_ok": p.parse_ok,
            "kind": error_kind(p.call, seen_before(p.history)),
            "prediction": ("error" if p.rehearsed.error else "ok")
            if p.parse_ok and p.rehearsed is not None else "none",
            "tier": tier, "decisive_field": name or "",
            "decisive": decisive_match(rehearsed, p.real.content, name) if name else None,
            "real": p.real.content[:300], "rehearsed": rehearsed[:300], **p.metrics}


def collect_pairs(suites: list[str], split: str, limit: int, sources: tuple[str, ...],
                  policy: tuple[Any, Any] | None = None, cfg: Config | None = None,
                  grounded: bool = False,
                  exclude: frozenset[str] = frozenset()) -> tuple[list[Pair], int]:
    """Pairs of the first ``limit`` tasks of each suite's ``split``, from each source.

    ``policy`` source: committed runs of ``policy = (generator, tokenizer)`` under ``cfg``.
    ``grounded``: attach each task's grounding (``tasks.load_tasks``) to its gold pairs.
    ``exclude``: task ids passed over before the first ``limit`` are taken.
    Returns ``(pairs, replay_mismatches)``. ``limit`` 0 means every task.

    Raises:
        ConfigError: a negative ``limit``, before any env or model runs.
    """
    first_tasks([], limit)
    pairs, mismatches = [], 0
    shown = bool(cfg and cfg.run.progress)  # bars: tasks done, rate and time left
    for suite in suites:
        ids = first_tasks([i for i in list_tasks(suite, split) if i not in exclude], limit)
        if "gold" in sources:
            ground = task_grounding(suite, split, set(ids), 0 if exclude else limit) \
                if grounded else {}
            for tid in progress(ids, enabled=shown, desc=f"{suite} gold pairs", unit="task"):
                env = make_env(suite, tid)
                events = gold_events(env)
                env.close()
                got, _, _ = replay(suite, tid, events, "gold", ground.get(tid))
                pairs += got
        if "policy" in sources:
            if policy is None or cfg is None:
                raise ValueError("the policy source needs policy=(generator, tokenizer) and cfg")
            episodes = []
            for tid in ids:
                env = make_env(suite, tid)
                episodes.append(Episode(suite, tid, 0, env, env.reset()))
            with progress(total=len(episodes), enabled=shown, desc=f"{suite} policy episodes",
                          unit="episode") as bar:
                run_committed(policy[0], policy[1], episodes, cfg, on_row=lambda _: bar.update(1))
            for ep in episodes:
                got, _, bad = replay(suite, ep.task_id, episode_events(ep), "policy")
                pairs += got
                mismatches += bad
    return pairs, mismatches


def task_grounding(suite: str, split: str, ids: set[str],
                   limit: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``{task id: grounding}`` for the ``ids`` among the first ``limit`` tasks (0: all) of
    ``suite``/``split`` (``envs.tasks.load_tasks``): every (call, observation) pair of the
    task's gold calls, all user turns, as REHEARSE's grounding holds them."""
    from envace_lite.envs.tasks import load_tasks

    return {t.id: [g for turn in t.grounding for g in turn]
            for t in load_tasks(suite, split, limit=limit) if t.id in ids}


def with_task_grounding(pairs: list[Pair], split: str) -> list[Pair]:
    """Fresh copies of ``pairs`` (not yet rehearsed) whose grounding is their task's
    (``task_grounding`` of the pair's suite and ``split``). The pairs themselves are left as
    they are."""
    ground = {(suite, tid): g for suite in dict.fromkeys(p.suite for p in pairs)
              for tid, g in task_grounding(suite, split, {p.task_id for p in pairs
                                                          if p.suite == suite}).items()}
    return [replace(p, grounding=ground[(p.suite, p.task_id)], rehearsed=None, parse_ok=False,
                    metrics={}) for p in pairs]


def audit(policy: tuple[Any, Any], suites: list[str], cfg: Config, limit: int = 3,
          sources: tuple[str, ...] = ("gold", "policy"), upper_bound: bool = True,
          out: str | Path | None = None, split: str = "test",
          grounded: bool = False) -> dict[str, Any]:
    """The fidelity audit of ``policy = (generator, tokenizer)`` on held-out pairs.

    Args:
        policy: the rehearsing (and, for the ``policy`` source, acting) policy.
        suites: suites (tau2 telecom / ``-ticket`` suites and BFCL; the USER-endpoint suites
            cannot be replayed without their simulator).
        cfg: run config (rendering, budgets, ``eval.decoding`` and ``eval.max_turns``).
        limit: tasks per suite and split (0 = all; negative: ``ConfigError``).
        sources: ``gold`` and/or ``policy`` (held-out pairs, of ``split``).
        upper_bound: also run the grounded upper bound on train-split gold pairs, and the same
            pairs again with ``<unavailable>`` in place of the grounding, so that the difference
            is what REHEARSE takes from the real results in its prompt. It passes over the
            tasks whose REHEARSE rows the warm start trained on beyond its SFT split
            (``sft.extra_rehearse_tasks``: the drills study's ``study.world_rows``), so that it
            measures the reuse of a reference, not the recall of a trained record.
        out: a folder for ``fidelity.json`` (``write_report``).
        split: where the held-out pairs come from: ``test``, or on a v2 drills suite one of its
            held-out slices (``validation`` to tune on, ``confirmation`` for claims;
            ``drills.slices``). An unknown split raises ``KeyError`` when the ids are listed.
        grounded: also rehearse every held-out pair again with its task's grounding in the
            prompt (the real results of the task's gold calls, all user turns: what REHEARSE
            sees during RL with ``rollout.grounding_drop_p=0``), reported as
            ``held_out_grounded``. The policy's own calls are then judged with the real
            results of the gold calls in view, which is what a world model is given in RL.

    Returns:
        ``{"held_out": {"grounding": "none", "overall", "slices", "error_prediction"
        (``prediction_report``)}, "grounded_upper_bound":
        {"label", "grounding": "gold", "excluded_world_tasks", "overall", "slices",
        "same_pairs_without_grounding"} | None, "held_out_grounded": {"grounding": "gold",
        "overall", "slices", "error_prediction", "records"} | None, "replay_mismatches",
        "records", "config"}``.
    """
    gen, tok = policy
    pairs, mismatches = collect_pairs(suites, split, limit, sources, policy, cfg)
    rehearse_pairs(pairs, gen, tok, cfg)
    records = [record(p) for p in pairs]
    report: dict[str, Any] = {
        "config": {"suites": suites, "limit": limit, "sources": list(sources), "split": split,
                   "grounded": grounded, "decoding": cfg.eval.decoding,
                   "rendering": cfg.rollout.rendering},
        "held_out": {"grounding": "none", "overall": aggregate(records),
                     "slices": sliced(records), "error_prediction": prediction_report(records)},
        "held_out_grounded": None, "grounded_upper_bound": None,
        "replay_mismatches": mismatches, "records": records}
    if grounded:
        shown = with_task_grounding(pairs, split)
        rehearse_pairs(shown, gen, tok, cfg)
        recs = [record(p) for p in shown]
        report["held_out_grounded"] = {
            "grounding": "gold", "overall": aggregate(recs), "slices": sliced(recs),
            "error_prediction": prediction_report(recs), "records": recs}
    if upper_bound:
        from envace_lite.pipelines.sft import extra_rehearse_tasks

        seen = frozenset(t.id for ts in extra_rehearse_tasks(cfg).values() for t in ts)
        train, _ = collect_pairs(suites, "train", limit, ("gold",), grounded=True, exclude=seen)
        bare = [replace(p, grounding=None) for p in train]
        rehearse_pairs(train, gen, tok, cfg)
        rehearse_pairs(bare, gen, tok, cfg)
        recs = [record(p) for p in train]
        report["grounded_upper_bound"] = {
            "label": UPPER_BOUND_LABEL, "grounding": "gold", "excluded_world_tasks": len(seen),
            "overall": aggregate(recs), "slices": sliced(recs),
            # the same pairs with <unavailable>: what the grounding itself adds
            "same_pairs_without_grounding": aggregate([record(p) for p in bare])}
    log.info("fidelity: %d held-out pairs, exact %.3f; replay mismatches %d", len(records),
             report["held_out"]["overall"]["exact_match"] or 0.0, mismatches)
    if out is not None:
        write_report(report, Path(out))
    return report


def write_report(report: dict[str, Any], out: Path) -> Path:
    """``out/fidelity.json`` (the caller draws ``fidelity.png``: ``eval_figures.plot_fidelity``).

    Returns:
        The path of ``fidelity.json``.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fidelity.json"
    path.write_text(json.dumps(report, indent=1))
    return path


__all__ = [
    "SOURCES",
    "UPPER_BOUND_LABEL",
    "Pair",
    "audit",
    "collect_pairs",
    "episode_events",
    "gold_events",
    "record",
    "rehearse_pairs",
    "replay",
    "task_grounding",
    "with_task_grounding",
    "write_report",
]
