"""Figures: each function takes results (a path, rows or a report) and returns a Figure.

Nothing here calls ``plt.show()`` or sets a backend (STYLE rules 6-7): figures are built with
``matplotlib.figure.Figure`` directly, so they work headless and display inline in notebooks.
One style for every figure lives in ``STYLE``.

Usage::

    from envace_lite.plotting import plot_budget_sweep
    fig = plot_budget_sweep(points)          # from evaluate.budget_sweep
    fig.savefig("sweep.png")
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "axes.grid": True,
    "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "legend.frameon": False, "figure.dpi": 100, "text.usetex": False,
}
"""The one figure style (no LaTeX)."""
COLORS = {"parallel": "#1f77b4", "sequential": "#d62728", "none": "#555555",
          "held_out": "#1f77b4", "upper_bound": "#bbbbbb"}
"""Colours per rehearsal mode and per audit series."""


def _load(obj: Any) -> Any:
    if isinstance(obj, (str, Path)):
        return json.loads(Path(obj).read_text())
    return obj


def plot_budget_sweep(points: list[dict[str, Any]] | str | Path, metric: str = "overall",
                      title: str = "Test-time rehearsal budget (paper Fig. 6)") -> Figure:
    """Score against the rehearsal budget N, one line per mode (and rehearsing policy).

    Args:
        points: ``evaluate.budget_sweep``'s points (or a JSON file of them); a ``mode="none"``
            point is drawn as a dashed Non-TTS line.
        metric: ``overall``, ``tau2``, ``bfcl`` or a suite name (from each point's ``suites``).
    """
    points = _load(points)

    def value(p: dict[str, Any]) -> float | None:
        v = p.get(metric) if metric in ("overall", "tau2", "bfcl") else p["suites"].get(metric)
        return None if v is None else 100 * v

    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(5, 3.5))
        ax = fig.add_subplot()
        lines: dict[str, list[tuple[int, float]]] = {}
        for p in points:
            v = value(p)
            if v is None:
                continue
            if p["mode"] == "none":
                ax.axhline(v, ls="--", color=COLORS["none"], label="Non-TTS")
                continue
            name = p["mode"] + (f" ({p['rehearsal_policy']})" if p.get("rehearsal_policy") else "")
            lines.setdefault(name, []).append((p["n"], v))
        for name, xy in lines.items():
            xy.sort()
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name,
                    color=COLORS.get(name.split()[0]))
        ns = sorted({p["n"] for p in points if p["mode"] != "none"})
        ax.set_xticks(ns or [1])
        ax.set_xlabel("rehearsals per user turn N")
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
    return fig


METRICS = ("exact_match", "field_precision", "field_recall", "error_agreement", "parse_rate")
"""The bars of ``plot_fidelity`` (fractions in the report)."""


def plot_fidelity(report: dict[str, Any] | str | Path) -> Figure:
    """The fidelity audit: held-out metrics beside the grounded upper bound, and the error
    confusion matrix of the held-out pairs.

    Args:
        report: ``fidelity.audit``'s report, or its JSON file.
    """
    report = _load(report)
    held = report["held_out"]["overall"]
    upper = (report.get("grounded_upper_bound") or {}).get("overall")
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(9, 3.5))
        ax, cm = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        metrics = list(METRICS) + ["state_change"]
        xs = range(len(metrics))

        def vals(m: dict[str, Any]) -> list[float]:
            out = [m.get(k) for k in METRICS] + [m["state_change"]["agreement"]]
            return [0.0 if v is None else 100 * v for v in out]

        width = 0.4 if upper else 0.8
        ax.bar([x - (width / 2 if upper else 0) for x in xs], vals(held), width,
               color=COLORS["held_out"], label=f"held-out, <unavailable> ({held['pairs']} pairs)")
        if upper:
            ax.bar([x + width / 2 for x in xs], vals(upper), width, color=COLORS["upper_bound"],
                   label=f"grounded UPPER BOUND ({upper['pairs']} train pairs)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([m.replace("_", "\n") for m in metrics], fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_title("REHEARSE vs real observations")
        ax.legend(fontsize=8)
        conf = held["confusion"]
        grid = [[conf["real_error"]["rehearsed_error"], conf["real_error"]["rehearsed_ok"]],
                [conf["real_ok"]["rehearsed_error"], conf["real_ok"]["rehearsed_ok"]]]
        cm.imshow(grid, cmap="Blues", vmin=0)
        top = max(max(r) for r in grid) or 1
        for i in range(2):
            for j in range(2):
                cm.text(j, i, str(grid[i][j]), ha="center", va="center",
                        color="white" if grid[i][j] > top / 2 else "black")
        cm.set_xticks([0, 1])
        cm.set_xticklabels(["rehearsed error", "rehearsed ok"])
        cm.set_yticks([0, 1])
        cm.set_yticklabels(["real error", "real ok"])
        cm.grid(False)
        cm.set_title("error / no-error (held-out)")
        fig.tight_layout()
    return fig


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
    """Tasks and gold calls per suite and split, from ``data/card.json`` (``data.data_card``)."""
    card = _load(card)
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
        traj: a ``rollout.Trajectory``.
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
        for t, (a, b) in enumerate(traj.act_spans):
            ax.text((a + b) / 2, 0.32, f"a_{t}", ha="center", va="bottom", fontsize=7)
        ax.set_ylim(-0.4, 1.1)
        ax.set_yticks([])
        ax.set_xlim(0, len(traj.act_ids))
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


__all__ = [
    "COLORS", "ROLE_COLORS", "STYLE", "plot_act_history", "plot_advantages", "plot_budget_sweep",
    "plot_data_card", "plot_fidelity", "plot_rollout_kinds",
]
