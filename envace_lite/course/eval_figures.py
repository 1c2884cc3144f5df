"""Evaluation figures: the rehearsal-budget sweep (paper Fig. 6), the fidelity audit, the ablation
bars (paper Fig. 3) and the cost of private rehearsal (notebooks 05-07). Each function takes results
(a path, rows or a report) and returns a Figure, in the one style of ``plotting.STYLE``.

Nothing here calls ``plt.show()`` or sets a backend (``matplotlib.figure.Figure`` directly).

Usage::

    from envace_lite.course.eval_figures import plot_budget_sweep
    fig = plot_budget_sweep(points)          # from evaluate.budget_sweep
    fig.savefig("sweep.png")
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from envace_lite.paths import read_jsonl
from envace_lite.course.plotting import COLORS, MODE_COLORS, ROLE_COLORS, STYLE, json_or_value

# ---------------------------------------------------------------------------------------------
# The budget sweep and the fidelity audit
# ---------------------------------------------------------------------------------------------

def plot_budget_sweep(points: list[dict[str, Any]] | str | Path, metric: str = "overall",
                      title: str = "Test-time rehearsal budget (paper Fig. 6)") -> Figure:
    """Score against the rehearsal budget N, one line per mode (and rehearsing policy).

    Args:
        points: ``evaluate.budget_sweep``'s points (or a JSON file of them); a ``mode="none"``
            point is drawn as a dashed Non-TTS line.
        metric: ``overall``, ``tau2``, ``bfcl`` or a suite name (from each point's ``suites``).
    """
    points = json_or_value(points)

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
    report = json_or_value(report)
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
# Ablation bars, fidelity per tool, the cost of rehearsal
# ---------------------------------------------------------------------------------------------

def plot_ablation(ours: dict[str, float | None], *, profile: str, source: str,
                  paper: dict[str, float] | None = None, ylabel: str = "score (%)",
                  errors: dict[str, float] | None = None,
                  title: str = "Ablation (paper Fig. 3 shape)") -> Figure:
    """Paper Fig. 3-style bars: one bar per method, ours beside the paper's (optional).

    Args:
        ours: ``{method: value in %}`` (None: not run, drawn as a gap with "n/a").
        profile, source: named in the title and the legend.
        paper: ``{method: value in %}`` from the paper, drawn as grey bars for the same methods
            (a different model and benchmark: context, not a target).
        ylabel: the y-axis label (say what the number is).
        errors: ``{method: half-width}`` error bars on ours (e.g. the spread across seeds).
        title: the axes title; the profile and source are appended.
    """
    methods = list(ours) + [m for m in (paper or {}) if m not in ours]
    xs = list(range(len(methods)))
    width = 0.4 if paper else 0.7
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(max(5.0, 1.3 * len(methods) + 2), 3.8))
        ax = fig.add_subplot()
        vals = [ours.get(m) for m in methods]
        shift = -width / 2 if paper else 0.0
        bars = ax.bar([x + shift for x in xs], [0.0 if v is None else v for v in vals], width,
                      color=[MODE_COLORS.get(m, "#1f77b4") for m in methods],
                      yerr=[(errors or {}).get(m, 0.0) for m in methods] if errors else None,
                      label=f"ours: {profile}, {source}")
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                    "n/a" if v is None else f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        if paper:
            pb = ax.bar([x + width / 2 for x in xs], [paper.get(m, 0.0) for m in methods], width,
                        color="#bbbbbb", label="paper (Qwen3-8B, τ²-Bench)")
            for b, m in zip(pb, methods):
                if m in paper:
                    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{paper[m]:.1f}",
                            ha="center", va="bottom", fontsize=8, color="#555555")
        ax.set_xticks(xs)
        ax.set_xticklabels(methods, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {profile} ({source})", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


def plot_fidelity_by_tool(report: dict[str, Any] | str | Path, *, profile: str, source: str,
                          metric: str = "exact_match", top: int = 12,
                          fallback: str = "exact_match") -> Figure:
    """Per-tool fidelity bars: ``metric`` of each tool's held-out pairs, with the pair counts.

    Args:
        report: ``fidelity.audit``'s report, or its JSON file.
        profile, source: named in the title.
        metric: a rate of ``fidelity_metrics.aggregate`` (``exact_match``, ``error_agreement``,
            ``field_recall`` ...).
        top: draw the tools with the most pairs, at most this many.
        fallback: drawn instead of ``metric`` when ``metric`` has one value on every bar (e.g.
            error agreement at 100 % because no pair has an error on either side); the title
            says so.
    """
    report = json_or_value(report)
    tools = report["held_out"]["slices"].get("tool", {})
    ranked = sorted(tools.items(), key=lambda kv: (-kv[1]["pairs"], kv[0]))[:top]
    upper = ((report.get("grounded_upper_bound") or {}).get("slices") or {}).get("tool", {})
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(max(5.0, 0.7 * len(ranked) + 2), 3.8))
        ax = fig.add_subplot()
        xs = list(range(len(ranked)))
        width = 0.4 if upper else 0.7
        vals = [100 * (m.get(metric) or 0.0) for _, m in ranked]
        note = ""
        if len(ranked) > 1 and len(set(vals)) == 1 and metric != fallback:
            # one value on every bar (error agreement is 100 % when no pair has an error on
            # either side) tells the tools nothing apart: draw the fallback metric instead
            note = f"; {metric} is {vals[0]:.0f} % on every tool, so {fallback} is drawn"
            metric = fallback
            vals = [100 * (m.get(metric) or 0.0) for _, m in ranked]
        bars = ax.bar([x - (width / 2 if upper else 0) for x in xs], vals, width,
                      color=COLORS["held_out"], label="held-out, <unavailable>")
        for b, (_, m) in zip(bars, ranked):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"n={m['pairs']}",
                    ha="center", va="bottom", fontsize=7)
        if upper:
            ax.bar([x + width / 2 for x in xs],
                   [100 * ((upper.get(t) or {}).get(metric) or 0.0) for t, _ in ranked], width,
                   color=COLORS["upper_bound"], label="grounded UPPER BOUND (train)")
        ax.set_xticks(xs)
        ax.set_xticklabels([t for t, _ in ranked], rotation=35, ha="right", fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(f"Fidelity per tool ({metric}), {profile} ({source}{note})", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


def plot_rehearsal_cost(rows: list[dict[str, Any]] | str | Path, *, profile: str,
                        source: str) -> Figure:
    """What private rehearsal costs per committed episode, by configuration (paper §2.3).

    Left: imagined calls (REHEARSE outputs), real calls of the committed run and real calls
    during rehearsal (always 0), summed per configuration. Right: generated rehearsal tokens and
    memory tokens. The point of the figure: rehearsal spends tokens, never real calls.

    Args:
        rows: ``run_committed``/``evaluate`` rows (or a ``results.jsonl`` path).
        profile, source: named in the title.
    """
    if isinstance(rows, (str, Path)):
        rows = read_jsonl(rows)
    labels: list[str] = []
    for r in rows:
        mode = r.get("rehearsal", "none")
        lab = "none" if mode == "none" else f"{mode} N={r.get('n', 0)}"
        if lab not in labels:
            labels.append(lab)

    def total(lab: str, key: str) -> float:
        return float(sum(r.get(key, 0) or 0 for r in rows
                         if (("none" if r.get("rehearsal", "none") == "none"
                              else f"{r['rehearsal']} N={r.get('n', 0)}") == lab)))

    xs = list(range(len(labels)))
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(10, 3.6))
        ax, tx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for j, (key, text, color) in enumerate((
                ("rehearse_outputs", "imagined calls (REHEARSE outputs)", ROLE_COLORS["rehearse"]),
                ("real_calls", "real calls (committed run)", ROLE_COLORS["real"]),
                ("rehearsal_real_calls", "real calls during rehearsal", "#c62828"))):
            vals = [total(lab, key) for lab in labels]
            bars = ax.bar([x + (j - 1) * 0.27 for x in xs], vals, 0.27, label=text, color=color)
            for b, v in zip(bars, vals):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{v:.0f}", ha="center",
                        va="bottom", fontsize=7)
        top = max([total(lab, k) for lab in labels
                   for k in ("rehearse_outputs", "real_calls", "rehearsal_real_calls")] + [0.0])
        ax.set_ylim(0, max(1.0, 1.15 * top))
        ax.set_xticks(xs)
        ax.set_xticklabels(labels)
        ax.set_ylabel(f"calls over {len(rows)} episodes")
        ax.set_title(f"Calls, {profile} ({source})", fontsize=10)
        ax.legend(fontsize=7)
        for j, (key, text, color) in enumerate((
                ("rehearsal_tokens", "rehearsal tokens (attempts, feedback, memory)",
                 ROLE_COLORS["rehearse"]),
                ("memory_tokens", "memory m_x tokens", ROLE_COLORS["simulator"]))):
            tx.bar([x + (j - 0.5) * 0.4 for x in xs], [total(lab, key) for lab in labels], 0.4,
                   label=text, color=color)
        tx.set_xticks(xs)
        tx.set_xticklabels(labels)
        tx.set_ylabel("generated tokens")
        tx.set_title(f"Tokens, {profile} ({source})", fontsize=10)
        tx.legend(fontsize=7)
        fig.tight_layout()
    return fig


__all__ = [
    "METRICS", "plot_ablation", "plot_budget_sweep", "plot_fidelity", "plot_fidelity_by_tool",
    "plot_rehearsal_cost",
]
