"""What you just saw: a notebook's closing table, every answer computed from its run's values.

A notebook ends with a few questions about what its own run did. The answers are composed here
from the values the notebook printed above them (the rows of its runs, its counters, its
checks), never written in advance, so that no line claims an event the run did not have: a tool
call, an imagined observation, a memory, a success. ``what_you_saw`` shows the table, never cut;
``rehearsal_lines`` (notebook 05) and ``training_lines`` (notebook 04) compose the answers that
depend on what the model did.

Usage (the closing cell of notebook 05)::

    from envace_lite.course.summaries import rehearsal_lines, what_you_saw
    saw = rehearsal_lines(rows, runs, baseline="none (N = 0)")
    what_you_saw(saw)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Rows = Sequence[Mapping[str, Any]]


def what_you_saw(rows: list[tuple[str, str]]) -> None:
    """Show a notebook's closing "What you just saw" table: one row per question, with the
    answer this run computed, never cut (``display.max_colwidth`` off, so the HTML hand-out
    carries every character).

    Args:
        rows: ``(question, answer in this run)`` pairs.
    """
    import pandas as pd
    from IPython.display import display

    table = pd.DataFrame(rows, columns=["question", "this run"]).set_index("question")
    with pd.option_context("display.max_colwidth", None):
        display(table)


def _total(rows: Rows, key: str) -> float:
    return sum(float(r.get(key) or 0) for r in rows)


def _mean(rows: Rows, key: str) -> float:
    return _total(rows, key) / len(rows) if rows else 0.0


def rehearsal_lines(committed: Mapping[str, Rows], curve: Mapping[str, Rows], *,
                    baseline: str, min_tasks: int = 20) -> list[tuple[str, str]]:
    """The answers of notebook 05's "What you just saw", from the rows of its own runs.

    Args:
        committed: ``{mode: rows}`` of ``run_committed`` with the paper's memory (``parallel``,
            ``sequential``) and without rehearsal (``none``); one row per episode, with the keys
            ``reward``, ``tool_calls``, ``real_calls``, ``failed_real_calls``,
            ``rehearsal_real_calls``, ``rehearse_outputs`` (imagined observations) and
            ``memory_tokens``. The first three answers read these rows only.
        curve: ``{configuration label: rows}`` of the select curve and its controls (section 7),
            with ``reward``, ``failed_real_calls``, ``generated_tokens`` and
            ``rehearsal_real_calls``; the last four answers read these rows only.
        baseline: the label of N = 0 in ``curve``.
        min_tasks: below this many tasks per configuration the table says the run is a picture
            of the mechanism, not a measurement.

    Returns:
        ``(question, answer)`` pairs. Success is the mean committed reward per episode; a count
        is a sum over the episodes of the rows it reads.

    Raises:
        KeyError: ``baseline`` is not in ``curve``, or ``none`` is not in ``committed``.
    """
    every = [r for rs in committed.values() for r in rs]
    leaked, real = _total(every, "rehearsal_real_calls"), _total(every, "real_calls")
    calls, failed = _total(every, "tool_calls"), _total(every, "failed_real_calls")
    imagined = _total(every, "rehearse_outputs")
    lines = [("Did an imagined attempt reach the real environment?",
              f"no: 0 real calls during rehearsal; all {real:.0f} real calls came from the "
              "committed runs" if not leaked else
              f"YES: {leaked:.0f} real calls during rehearsal, a defect (rehearsal must never "
              "execute)")]
    if calls == 0 and imagined == 0:
        lines.append(("Did the policy call tools, and did REHEARSE imagine their results?",
                      "no: no committed run made a tool call and no attempt imagined an "
                      "observation (every reply was text or did not parse), so rehearsal had "
                      "no call to check and selection nothing to tell apart"))
    else:
        lines.append(("Did the policy call tools, and did REHEARSE imagine their results?",
                      f"yes: {calls:.0f} tool calls in the committed runs ({failed:.0f} of them "
                      f"failed), {imagined:.0f} imagined observations in the attempts"))
    none = _mean(committed["none"], "reward")
    modes = {m: _mean(rs, "reward") for m, rs in committed.items() if m != "none"}
    memories = sum(float(r.get("memory_tokens") or 0) > 0 for m, rs in committed.items()
                   if m != "none" for r in rs)
    n_mem = sum(len(rs) for m, rs in committed.items() if m != "none")
    higher = [m for m, v in modes.items() if v > none]
    lower = [m for m, v in modes.items() if v < none]
    verdict = ("higher with " + " and ".join(higher) if higher and not lower else
               "lower with " + " and ".join(lower) if lower and not higher else
               "higher with " + " and ".join(higher) + ", lower with " + " and ".join(lower)
               if higher else "the same with and without rehearsal")
    lines.append(("Did rehearsal with the paper's memory change the committed reward?",
                  f"none {none:.2f}, " + ", ".join(f"{m} {v:.2f}" for m, v in modes.items())
                  + f": {verdict}; a non-empty memory in {memories} of {n_mem} rehearsed "
                    "episodes"))
    success = {label: _mean(rs, "reward") for label, rs in curve.items()}
    base = success[baseline]
    best = max(success.values())
    tops = [label for label, v in success.items() if v == best and label != baseline]
    if best == 0:
        answer = "none: every configuration, N = 0 included, scored 0.00 on all its episodes"
    elif best == base:
        answer = (f"none beat N = 0 ({base:.2f})" + (f"; {', '.join(tops)} tied it" if tops
                                                     else ""))
    else:
        answer = f"{', '.join(tops)}: {best:.2f} against {base:.2f} at N = 0"
    lines.append(("Which configuration of the select curve succeeded most?", answer))
    fails = {label: _mean(rs, "failed_real_calls") for label, rs in curve.items()}
    others = {label: v for label, v in fails.items() if label != baseline}
    low = min(others.values()) if others else None
    lines.append(("Did choosing among imagined attempts cut the failed real calls?",
                  f"N = 0: {fails[baseline]:.2f} failed real calls per episode; "
                  + ("no other configuration ran" if low is None else
                     "no configuration had fewer" if low >= fails[baseline] else
                     f"fewest with rehearsal: {low:.2f} ("
                     + ", ".join(label for label, v in others.items() if v == low) + ")")))
    cost = {label: _mean(rs, "generated_tokens") for label, rs in curve.items()}
    dearest = max(cost, key=lambda label: cost[label])
    leaked_curve = _total([r for rs in curve.values() for r in rs], "rehearsal_real_calls")
    lines.append(("What did rehearsal cost?",
                  f"{cost[baseline]:.0f} generated tokens per episode at N = 0, up to "
                  f"{cost[dearest]:.0f} ({dearest}); "
                  + ("no real call" if not leaked_curve else
                     f"and {leaked_curve:.0f} real calls during rehearsal, a defect")))
    tasks = len(curve[baseline])
    lines.append(("Is this a measurement of rehearsal's effect?",
                  f"no: {tasks} task(s), one run each, a picture of the mechanism; the measured "
                  "numbers are in docs/rehearsal.md" if tasks < min_tasks else
                  f"{tasks} tasks, one run each: read paired intervals before calling a "
                  "difference an effect"))
    return lines


def training_lines(*, loss_gap: float, grad_gap: float, moved: Sequence[tuple[float, float]],
                   gain: float, own: Rows, model: str,
                   mode_rewards: Mapping[str, float] | None) -> list[tuple[str, str]]:
    """The answers of notebook 04's "What you just saw", from its own checks and runs.

    Args:
        loss_gap, grad_gap: |hand loss − trainer loss| and the max gradient gap over the
            gradient norm, from the build-check cell.
        moved: ``(advantage A, Δ mean log-prob)`` of each output after the hand optimizer step.
        gain: Σ A·Δ over those outputs (the objective's first-order change).
        own: the metrics rows of the profile's own run (``read_metrics``), with
            ``nonzero_adv_group_frac``, ``reward/mean``, ``tool_calls``, ``rehearse/outputs``
            and ``real_calls``.
        model: the own run's model name.
        mode_rewards: the mean training reward per mode of the comparison, or None when skipped.

    Returns:
        ``(question, answer)`` pairs.
    """
    with_sign = sum((d > 0) == (a > 0) for a, d in moved if a != 0)
    signed = sum(a != 0 for a, _ in moved)
    signal = [float(r.get("nonzero_adv_group_frac") or 0) for r in own]
    calls, imagined = _total(own, "tool_calls"), _total(own, "rehearse/outputs")
    rewards = [float(r.get("reward/mean") or 0) for r in own]
    lines = [
        ("Does the hand loss and gradient equal the TRL trainer's?",
         f"loss gap {loss_gap:.1e}, gradient gap {grad_gap:.1e}: "
         + ("equal (< 1e-5): the trainer computes exactly the loss written above"
            if loss_gap < 1e-5 and grad_gap < 1e-5 else "NOT equal (over 1e-5)")),
        ("Did one optimizer step move each output with the sign of its advantage?",
         f"{with_sign} of {signed} outputs with A ≠ 0 moved with its sign; Σ A·Δ log-prob "
         + ("rose" if gain > 0 else "did not rise") + f" by {gain:.1e}"),
        (f"Did the profile's own run ({model}, {len(own)} steps) call tools?",
         "no: its rollouts made no tool call, so REHEARSE imagined nothing" if not calls else
         f"yes: {calls:.0f} tool calls, {imagined:.0f} imagined observations, "
         f"{_total(own, 'real_calls'):.0f} real calls"),
        ("Did it have a learning signal?",
         (f"yes, on {sum(s > 0 for s in signal)} of {len(signal)} steps: rewards differed "
          "inside a group" if any(s > 0 for s in signal) else
          f"no: every trajectory of a task got the same reward on all {len(signal)} steps, so "
          "every advantage and the loss were 0; a small model needs the warm start")
         + (f"; training reward {min(rewards):.2f} to {max(rewards):.2f}" if rewards else "")),
        ("The modes under one budget",
         "skipped" if not mode_rewards else
         ", ".join(f"{m}: {v:.3f}" for m, v in mode_rewards.items())
         + ": a few fresh steps on one seed, noise rather than a ranking; the shipped curves "
           "compare them"),
    ]
    return lines


__all__ = ["rehearsal_lines", "training_lines", "what_you_saw"]
