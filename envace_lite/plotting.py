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
        cm.imshow(grid, cmap="Blues")
        for i in range(2):
            for j in range(2):
                cm.text(j, i, str(grid[i][j]), ha="center", va="center")
        cm.set_xticks([0, 1])
        cm.set_xticklabels(["rehearsed error", "rehearsed ok"])
        cm.set_yticks([0, 1])
        cm.set_yticklabels(["real error", "real ok"])
        cm.grid(False)
        cm.set_title("error / no-error (held-out)")
        fig.tight_layout()
    return fig


__all__ = ["COLORS", "STYLE", "plot_budget_sweep", "plot_fidelity"]
