"""Figures, and the one figure style: the course figures (notebooks 00-03) and the training
curves (notebooks 04 and 06). Each function takes results (a path, rows or a report) and returns a
Figure.

Nothing here calls ``plt.show()`` or sets a backend: figures are built with
``matplotlib.figure.Figure`` directly, so they work headless and display inline in notebooks.
One style for every figure lives in ``STYLE`` (with the colours of modes, roles and training
modes); the evaluation figures (the budget sweep, the fidelity audit, the ablation bars, the
cost of rehearsal) are in ``eval_figures.py`` and use the same style.

Usage::

    from envace_lite.course.plotting import plot_training_curves
    fig = plot_training_curves("runs/train/micro__s0__x", profile="micro", source="fresh")
    fig.savefig("curves.png")
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from envace_lite.paths import read_jsonl

STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "axes.grid": True,
    "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.frameon": False, "figure.dpi": 100, "text.usetex": False,
}
"""The one figure style (no LaTeX)."""
COLORS = {"parallel": "#1f77b4", "sequential": "#d62728", "none": "#555555",
          "held_out": "#1f77b4", "upper_bound": "#bbbbbb"}
"""Colours per rehearsal mode and per audit series."""


def json_or_value(obj: Any) -> Any:
    """``obj`` itself, or the JSON it names when it is a path (``str`` or ``Path``)."""
    if isinstance(obj, (str, Path)):
        return json.loads(Path(obj).read_text())
    return obj


# ---------------------------------------------------------------------------------------------
# Course figures (notebooks 00-03)
# ---------------------------------------------------------------------------------------------

ROLE_COLORS = {"act": "#1f77b4", "rehearse": "#ef6c00", "real": "#2e7d32", "plain": "#777777",
               "prompt": "#cfcfcf", "simulator": "#7b1fa2"}
"""Colours of the two roles, real observations and the plain-GRPO baseline (the viewer's too)."""


def plot_rollout_kinds() -> Figure:
    """Paper Fig. 1 as a diagram: where the observation of a tool call comes from.

    Three panels: a real-environment rollout (o_t from executing a_t), an external-simulator
    rollout (õ_t from another model) and an EnvACE rollout (ô_t from the same policy in its
    REHEARSE role, h_{t+1} = h_t ⊕ (a_t, ô_t)).
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    panels = [
        ("Real-environment rollout", "real environment\n(APIs, databases)", "o_t", "real",
         "executes a_t: real state changes,\ncost and risk per call"),
        ("External-simulator rollout", "simulator LLM\n(separate weights)", "õ_t", "simulator",
         "another model imagines o_t;\nthe policy never learns it"),
        ("EnvACE world rehearsal", "π_θ in role REHEARSE\n(same weights)", "ô_t", "rehearse",
         "the policy imagines ô_t itself;\nboth roles trained by role-wise GRPO"),
    ]
    with matplotlib.rc_context({**STYLE, "axes.grid": False}):
        fig = Figure(figsize=(11, 3.6))
        for k, (title, world, obs, color_key, note) in enumerate(panels):
            ax = fig.add_subplot(1, 3, k + 1)
            ax.set_xlim(0, 10)
            ax.set_ylim(0, 10)
            ax.axis("off")
            ax.set_title(title)
            boxes = [((0.5, 6.2), "π_θ in role ACT\nreads h_t", ROLE_COLORS["act"]),
                     ((5.5, 6.2), world, ROLE_COLORS[color_key])]
            for (x, y), text, color in boxes:
                ax.add_patch(FancyBboxPatch((x, y), 4, 2.6, boxstyle="round,pad=0.1",
                                            facecolor=color, alpha=0.18, edgecolor=color))
                ax.text(x + 2, y + 1.3, text, ha="center", va="center", fontsize=8.5)
            ax.add_patch(FancyArrowPatch((4.6, 8.0), (5.4, 8.0), arrowstyle="-|>",
                                         mutation_scale=12, color="#333333"))
            ax.text(5.0, 8.4, "a_t", ha="center", fontsize=9)
            ax.add_patch(FancyArrowPatch((7.5, 6.1), (2.5, 6.1), arrowstyle="-|>",
                                         mutation_scale=12, color=ROLE_COLORS[color_key],
                                         connectionstyle="arc3,rad=-0.45"))
            ax.text(5.0, 4.25, obs, ha="center", fontsize=10, color=ROLE_COLORS[color_key])
            ax.text(5.0, 3.0, "h_{t+1} = h_t ⊕ (a_t, " + obs + ")", ha="center", fontsize=8.5)
            ax.text(5.0, 0.8, note, ha="center", fontsize=8, color="#444444")
        fig.tight_layout()
    return fig


def plot_data_card(card: dict[str, Any] | str | Path) -> Figure:
    """Tasks and gold calls per suite and split, from ``data/card.json`` (``tasks.data_card``)."""
    card = json_or_value(card)
    suites = sorted(card)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(10, 3.4))
        for k, key in enumerate(("tasks", "gold_calls")):
            ax = fig.add_subplot(1, 2, k + 1)
            xs = range(len(suites))
            for j, (split, color) in enumerate((("train", "#1f77b4"), ("test", "#ef6c00"))):
                ax.bar([x + (j - 0.5) * 0.4 for x in xs],
                       [card[s].get(split, {}).get(key, 0) for s in suites], 0.4, color=color,
                       label=split)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(suites, fontsize=8, rotation=30, ha="right")
            ax.set_title(key.replace("_", " ") + " per suite (data/card.json)")
            ax.legend()
        fig.tight_layout()
    return fig


def plot_act_history(traj: Any, title: str | None = None) -> Figure:
    """The packed ACT history h of one trajectory as a strip of tokens.

    Grey: the initial prompt (task, tools); blue: tokens ACT sampled (``act_mask`` 1, trained);
    orange (rehearsed) or green (real): template glue and observations appended after each turn
    (``act_mask`` 0: context, never trained). Each blue-then-orange pair is one
    h_{t+1} = h_t ⊕ (a_t, ô_t).

    Args:
        traj: a ``types.Trajectory``.
        title: the axes title (default: the task id and mode).
    """
    from matplotlib.patches import Patch

    obs_color = ROLE_COLORS["real" if traj.mode == "real" else "rehearse"]
    segments = [(0, traj.act_prompt_len, ROLE_COLORS["prompt"])]
    ends = [traj.act_prompt_len] + [b for _, b in traj.act_spans]
    for (a, b), prev in zip(traj.act_spans, ends):
        if a > prev:
            segments.append((prev, a, obs_color))
        segments.append((a, b, ROLE_COLORS["act"]))
    if len(traj.act_ids) > ends[-1]:
        segments.append((ends[-1], len(traj.act_ids), obs_color))
    with matplotlib.rc_context({**STYLE, "axes.grid": False}):
        fig = Figure(figsize=(10, 2.3))
        ax = fig.add_subplot()
        for a, b, color in segments:
            ax.barh(0, b - a, left=a, height=0.5, color=color, edgecolor="white", linewidth=0.3)
        n = max(1, len(traj.act_ids))
        for t, (a, b) in enumerate(traj.act_spans):
            # a label near either end is aligned inwards, so that the figure edge never cuts it
            mid = (a + b) / 2
            ha = "right" if mid > 0.95 * n else "left" if mid < 0.05 * n else "center"
            ax.text(b if ha == "right" else a if ha == "left" else mid, 0.32, f"a_{t}", ha=ha,
                    va="bottom", fontsize=7)
        ax.set_ylim(-0.4, 1.1)
        ax.set_yticks([])
        ax.set_xlim(0, n)
        ax.set_xlabel("token position in the ACT history")
        ax.set_title(title or f"ACT history of {traj.task.id} ({traj.mode})")
        observed = "real o_t" if traj.mode == "real" else "ô_t"
        ax.legend(handles=[Patch(color=ROLE_COLORS["prompt"], label="prompt h_0"),
                           Patch(color=ROLE_COLORS["act"], label="ACT tokens a_t (trained)"),
                           Patch(color=obs_color, label=f"glue + {observed} (not trained)")],
                  loc="upper left", ncol=3, fontsize=8)
        fig.tight_layout()
    return fig


def plot_advantages(rows: list[dict[str, Any]] | Any, title: str | None = None) -> Figure:
    """Role-wise vs plain GRPO advantages of one task's K trajectories.

    Args:
        rows: one row per trajectory (a list of dicts or a DataFrame) with ``trajectory``,
            ``R``, ``plain`` (R_i − mean_i R_i), ``act`` and ``rehearse`` (R_i − μ_{x,r}; NaN or
            None when the trajectory has no output of that role).
        title: the axes title.
    """
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    xs = range(len(rows))
    series = [("plain", "plain GRPO: R_i − mean_i R_i"), ("act", "role-wise, ACT: R_i − μ_{x,act}"),
              ("rehearse", "role-wise, REHEARSE: R_i − μ_{x,rehearse}")]
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(7, 3.6))
        ax = fig.add_subplot()
        for j, (key, label) in enumerate(series):
            vals = [r.get(key) for r in rows]
            vals = [0.0 if v is None or math.isnan(float(v)) else float(v) for v in vals]
            ax.bar([x + (j - 1) * 0.27 for x in xs], vals, 0.27, label=label,
                   color=ROLE_COLORS[key])
        ax.axhline(0, color="#333333", lw=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"τ_{r['trajectory']}\nR={float(r['R']):.2f}" for r in rows])
        ax.set_ylabel("advantage A")
        ax.set_title(title or "Advantages on the same rewards")
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Training figures (notebooks 04 and 06)
# ---------------------------------------------------------------------------------------------

MODE_COLORS = {"shared": "#1f77b4", "per_role": "#ef6c00", "act_only": "#2e7d32",
               "act_only_real": "#7b1fa2", "base": "#777777"}
"""Colours of the training modes (paper Fig. 3's variants)."""
HELDOUT_SERIES = (("committed_reward", "held-out committed reward (real env, Non-TTS)", "#d62728",
                   "s"),
                  ("fidelity_exact", "held-out fidelity: exact ô = o", "#9467bd", "^"),
                  ("fidelity_error_agreement", "held-out fidelity: error agreement", "#8c564b",
                   "v"))
"""``(key, label, colour, marker)`` of the held-out points of ``plot_training_curves``."""


def metric_rows(metrics: Any) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``: from its path, its run dir, a list of rows or a DataFrame."""
    if hasattr(metrics, "to_dict"):
        return metrics.to_dict("records")
    if isinstance(metrics, (str, Path)):
        path = Path(metrics)
        path = path / "metrics.jsonl" if path.is_dir() else path
        return read_jsonl(path)
    return list(metrics)


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over rows that have a finite value."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is not None and isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def _smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (1: unchanged)."""
    if window <= 1:
        return list(ys)
    return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1])
            for i in range(len(ys))]


def plot_training_curves(metrics: Any, heldout: list[dict[str, Any]] | None = None, *,
                         profile: str, source: str, mode: str = "shared", smooth: int = 1,
                         diagnostics: bool = True) -> Figure:
    """Paper Fig. 5-style: the training-task reward per step, with held-out points on the same axes.

    Left axes: ``reward/mean`` of each step's rollouts, i.e. the checklist reward of TRAINING
    tasks under rehearsal (ô from REHEARSE, nothing executed); optionally smoothed. The held-out
    checkpoints (``heldout``: ``{"stage", "step", "committed_reward", "fidelity_exact",
    "fidelity_error_agreement"}``, e.g. ``micro_training/heldout.json``'s ``checkpoints``) are
    drawn on the SAME axes, one labelled series per quantity, each point annotated with its stage.
    Right axes (``diagnostics``): ACT's parse-error rate and the share of (task, role) groups with a
    non-zero advantage (the learning signal).

    Args:
        metrics: a run dir, a ``metrics.jsonl`` path, its rows or a DataFrame.
        heldout: held-out checkpoint points (None: none drawn).
        profile, source: named in the title, e.g. ``"micro"`` and ``"shipped (micro, s0, 1a2b3c4)"``
            or ``"fresh"``.
        mode: the training mode, named in the legend.
        smooth: moving-average window of the reward curve (the raw points are drawn faintly).
        diagnostics: add the right-hand diagnostics axes.
    """
    rows = metric_rows(metrics)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(11 if diagnostics else 6.5, 4.4))
        ax = fig.add_subplot(1, 2 if diagnostics else 1, 1)
        xs, ys = _series(rows, "reward/mean")
        color = MODE_COLORS.get(mode, "#1f77b4")
        if smooth > 1 and ys:
            ax.plot(xs, ys, color=color, alpha=0.25, lw=0.8)
        label = (f"{mode}: training-task reward under rehearsal"
                 + (f" (moving avg {smooth})" if smooth > 1 else ""))
        ax.plot(xs, _smooth(ys, smooth), color=color, lw=1.8, label=label)
        for key, text, col, marker in HELDOUT_SERIES:
            pts = sorted((float(c["step"]), float(c[key]), c.get("stage", "")
                          + (f" ({c['errors']} errors apart)" if c.get("errors") else ""))
                         for c in heldout or [] if c.get(key) is not None)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", marker=marker, color=col,
                    label=text)
            if key == "committed_reward":
                # stages at one step (before and after SFT are both step 0) are stacked, not
                # drawn over each other
                seen: dict[float, int] = {}
                for x, y, stage in pts:
                    k = seen[x] = seen.get(x, -1) + 1
                    ax.annotate(stage.replace("_", " "), (x, y), textcoords="offset points",
                                xytext=(4, 6 + 10 * k), fontsize=7, color=col)
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("reward / agreement (0-1)")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"Training curve, {profile} ({source})")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        if diagnostics:
            dx = fig.add_subplot(1, 2, 2)
            for key, text, col in (("act/parse_error_rate", "ACT parse-error rate", "#c62828"),
                                   ("rehearse/parse_error_rate", "REHEARSE parse-error rate",
                                    "#ef6c00"),
                                   ("nonzero_adv_group_frac", "groups with A ≠ 0", "#2e7d32")):
                x, y = _series(rows, key)
                if y:
                    dx.plot(x, _smooth(y, smooth), label=text, color=col)
            dx.set_ylim(-0.05, 1.05)
            dx.set_xlabel("GRPO step")
            dx.xaxis.set_major_locator(MaxNLocator(integer=True))
            dx.set_title(f"Diagnostics, {mode} ({source})")
            dx.legend(fontsize=7)
        fig.tight_layout()
    return fig


def plot_mode_curves(runs: dict[str, list[Any]], *, profile: str, source: str,
                     metric: str = "reward/mean", smooth: int = 1) -> Figure:
    """One curve per training mode: the mean over seeds with a min-max band.

    Args:
        runs: ``{mode: [metrics of seed 0, metrics of seed 1, ...]}``; each item is anything
            ``metric_rows`` reads. Seeds are aligned by step (a step missing in a seed is left out
            of that step's mean).
        profile, source: named in the title.
        metric: the ``metrics.jsonl`` key drawn.
        smooth: moving-average window, applied per seed before averaging.
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(6.5, 3.8))
        ax = fig.add_subplot()
        for mode, seeds in runs.items():
            per_step: dict[float, list[float]] = {}
            for m in seeds:
                xs, ys = _series(metric_rows(m), metric)
                for x, y in zip(xs, _smooth(ys, smooth)):
                    per_step.setdefault(x, []).append(y)
            if not per_step:
                continue
            steps = sorted(per_step)
            mean = [sum(per_step[s]) / len(per_step[s]) for s in steps]
            color = MODE_COLORS.get(mode)
            n = len(seeds)
            ax.plot(steps, mean, color=color, lw=1.8,
                    label=f"{mode} (mean of {n} seed{'s' if n != 1 else ''})")
            if n > 1:
                ax.fill_between(steps, [min(per_step[s]) for s in steps],
                                [max(per_step[s]) for s in steps], color=color, alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} by mode, {profile} ({source}); band: min-max over seeds",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


__all__ = [
    "COLORS", "HELDOUT_SERIES", "MODE_COLORS", "ROLE_COLORS", "STYLE", "metric_rows",
    "plot_act_history", "plot_advantages", "plot_data_card", "plot_mode_curves",
    "plot_rollout_kinds", "plot_training_curves",
]
