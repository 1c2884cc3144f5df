"""The paper's tables from evaluation rows: Avg@k per suite with a 95 % interval, benchmark
averages, Table 3, the rehearsal-usage table, the Fig. 6 sweep points and the per-task table.

Every function here reads rows (``evaluate.evaluate`` returns them; ``DIR/results.jsonl`` holds
them, one per finished episode) and computes nothing from a model. Aggregates follow the paper's
shapes (Table 3; paper §3.1):

- per suite (a tau2 domain or a BFCL category): **Avg@k**, the mean over the k repeats of the
  repeat's pass rate (the mean reward; both benchmarks' rewards are 0/1), with a 95 % confidence
  interval across tasks (normal approximation on each task's mean over repeats; ``ci95``);
- per benchmark: ``Avg.``, the unweighted mean of its suites' Avg@k;
- ``Overall``: the mean of the benchmark Avg.s (Table 3: tau2 and BFCL multi-turn).

An episode that ended in an error (``is_error``: an exception, a USER endpoint that
failed, a crashed scoring) is neither a success nor a failure: it is left out of every Avg@k and
counted apart (``errors``), and the tables show that count.

``write_summary`` writes ``DIR/summary.json`` (per configuration: the aggregates, Table 3, and
``usage_table``) and ``DIR/results.md``.

Usage::

    from envace_lite.pipelines.run_records import read_rows
    from envace_lite.pipelines.tables import summarize_runs, table3
    print(table3(summarize_runs(read_rows("runs/eval/par2/results.jsonl"))))
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

BENCHMARKS = {
    "tau2": ("tau2-airline", "tau2-retail", "tau2-telecom"),
    "bfcl": ("bfcl-base", "bfcl-miss_func", "bfcl-miss_param", "bfcl-long_context"),
}
"""Table 3's column groups, in the paper's order."""
TICKET = {"tau2-airline": "tau2-airline-ticket", "tau2-retail": "tau2-retail-ticket"}
"""The NON-OFFICIAL stand-ins of the USER-endpoint suites; tables mark them with ``*``."""
LABELS = {"tau2-airline": "Airline", "tau2-retail": "Retail", "tau2-telecom": "Telecom",
          "bfcl-base": "Base", "bfcl-miss_func": "Miss Func.", "bfcl-miss_param": "Miss Param.",
          "bfcl-long_context": "Long Context"}
Z95 = 1.959963984540054
"""The two-sided 95 % normal quantile."""


# ---------------------------------------------------------------------------------------------
# Aggregates in the paper's shapes
# ---------------------------------------------------------------------------------------------

def benchmark_of(suite: str) -> str:
    """``tau2``, ``bfcl``, or ``drills`` (generated from tau2's databases: never part of the
    paper's tau2 average or Overall)."""
    if suite.endswith("-drills"):
        return "drills"
    return "tau2" if suite.startswith("tau2-") else "bfcl"


def ci95(values: list[float]) -> tuple[float, float] | None:
    """A 95 % normal-approximation interval of the mean, clipped to [0, 1]; None below 2 values.

    ``mean ± 1.96 · s / sqrt(T)`` with ``s`` the sample standard deviation (ddof 1).
    """
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    half = Z95 * sd / math.sqrt(len(values))
    return max(0.0, m - half), min(1.0, m + half)


def config_label(row: dict[str, Any]) -> str:
    """``none``, ``parallel/N=2`` or ``parallel/N=2/rehearsal=base`` (the rehearsing policy is
    named when it differs from the acting one); a strategy other than the paper's memory is
    named after N: ``parallel/N=2/select`` (``selection.py``)."""
    mode = row.get("rehearsal", "none")
    if mode == "none":
        return "none"
    label = f"{mode}/N={row.get('n', 0)}"
    if row.get("strategy", "memory") not in ("", "memory"):
        label += f"/{row['strategy']}"
    rp = row.get("rehearsal_policy", "")
    return label + (f"/rehearsal={rp}" if rp and rp != row.get("policy", "") else "")


def is_error(row: dict[str, Any]) -> bool:
    """Whether a row's episode ended in an error rather than an outcome: ``error`` is set (an
    exception ended it, ``stop_reason="error"``) or its scoring crashed (``details.score_error``).
    Such rows are excluded from pass@k and counted apart (``summarize``)."""
    details = row.get("details")
    return bool(row.get("error")) or (isinstance(details, dict) and "score_error" in details)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate the rows of ONE configuration (see the module docstring).

    Error rows (``is_error``) are left out of every rate and counted in ``errors``; a suite
    whose every row is an error has ``avg_at_k`` None and no benchmark average.

    Returns:
        ``{"suites": {suite: {"avg_at_k", "k", "tasks", "episodes", "errors", "ci95",
        "per_repeat", "official"}}, "benchmarks": {"tau2"|"bfcl": {"avg", "suites"}},
        "overall", "overall_over", "episodes", "errors", "rehearsal_real_calls", "real_calls",
        "share_rehearsed", "share_real_call"}``. ``episodes`` counts scored rows (not errors);
        ``share_rehearsed`` is the share of them with at least one REHEARSE output,
        ``share_real_call`` with at least one real call.
    """
    out: dict[str, Any] = {"suites": {}, "benchmarks": {}}
    errors = [r for r in rows if is_error(r)]
    for suite in dict.fromkeys(r["suite"] for r in rows):
        sub = [r for r in rows if r["suite"] == suite and not is_error(r)]
        repeats = sorted({int(r["repeat"]) for r in sub})
        per_repeat = [sum(r["reward"] for r in sub if int(r["repeat"]) == k)
                      / sum(1 for r in sub if int(r["repeat"]) == k) for k in repeats]
        tasks: dict[str, list[float]] = {}
        for r in sub:
            tasks.setdefault(str(r["task_id"]), []).append(float(r["reward"]))
        task_means = [sum(v) / len(v) for v in tasks.values()]
        out["suites"][suite] = {
            "avg_at_k": sum(per_repeat) / len(per_repeat) if per_repeat else None,
            "k": len(repeats), "tasks": len(tasks), "episodes": len(sub),
            "errors": sum(r["suite"] == suite for r in errors), "ci95": ci95(task_means),
            "per_repeat": per_repeat,
            "official": suite not in TICKET.values() and benchmark_of(suite) != "drills"}
    for bench in BENCHMARKS:
        suites = [s for s in out["suites"] if benchmark_of(s) == bench
                  and out["suites"][s]["avg_at_k"] is not None]
        if suites:
            out["benchmarks"][bench] = {
                "avg": sum(out["suites"][s]["avg_at_k"] for s in suites) / len(suites),
                "suites": suites}
    avgs = [b["avg"] for b in out["benchmarks"].values()]
    out["overall"] = sum(avgs) / len(avgs) if avgs else None
    out["overall_over"] = list(out["benchmarks"])
    out["errors"] = len(errors)
    rows = [r for r in rows if not is_error(r)]
    out["episodes"] = len(rows)
    out["real_calls"] = sum(r.get("real_calls", 0) for r in rows)
    out["rehearsal_real_calls"] = sum(r.get("rehearsal_real_calls", 0) for r in rows)
    out["share_rehearsed"] = sum(r.get("rehearse_outputs", 0) > 0 for r in rows) / max(1, len(rows))
    out["share_real_call"] = sum(r.get("real_calls", 0) > 0 for r in rows) / max(1, len(rows))
    return out


def summarize_runs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``summarize`` per configuration (``config_label``), in order of first appearance.

    Rows of one label made under different result configs (a folder reused with
    ``force_new_config``) are kept apart: such labels get ``@<config_hash>``."""
    hashes: dict[str, set] = {}
    for r in rows:
        hashes.setdefault(config_label(r), set()).add(r.get("config_hash", ""))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = config_label(r)
        if len(hashes[label]) > 1:
            label += f"@{r.get('config_hash', '') or 'unhashed'}"
        groups.setdefault(label, []).append(r)
    return {label: summarize(sub) for label, sub in groups.items()}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def table3(summaries: dict[str, dict[str, Any]]) -> str:
    """A Markdown table in Table 3's shape: one line per configuration, percentages.

    Columns: Airline, Retail, Telecom, Avg. (tau2); Base, Miss Func., Miss Param., Long Context,
    Avg. (BFCL multi-turn); Overall. A NON-OFFICIAL ``-ticket`` suite fills its domain's column
    with a ``*``; a suite not run shows ``–``.
    """
    cols = [LABELS[s] for s in BENCHMARKS["tau2"]] + ["τ² Avg."] + \
        [LABELS[s] for s in BENCHMARKS["bfcl"]] + ["BFCL Avg.", "Overall"]
    lines = ["| Method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label, summ in summaries.items():
        cells = []
        for bench, suites in BENCHMARKS.items():
            for s in suites:
                if s in summ["suites"]:
                    cells.append(_pct(summ["suites"][s]["avg_at_k"]))
                elif TICKET.get(s) in summ["suites"]:
                    cells.append(_pct(summ["suites"][TICKET[s]]["avg_at_k"]) + "*")
                else:
                    cells.append("–")
            cells.append(_pct(summ["benchmarks"].get(bench, {}).get("avg")))
        cells.append(_pct(summ["overall"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any(TICKET.get(s) in summ["suites"] for summ in summaries.values() for s in TICKET):
        lines.append("\n\\* NON-OFFICIAL ticket protocol (no USER simulator); not comparable "
                     "with the paper.")
    return "\n".join(lines)


def usage_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Per configuration: scored episodes, episode errors (left out of every rate), the share
    with at least one REHEARSE output, the share with at least one real call, and the real
    calls made during rehearsal (must be 0)."""
    header = ("| Method | episodes | errors | ≥1 REHEARSE output | ≥1 real call | real calls | "
              "real calls during rehearsal |")
    lines = [header, "|---" * 7 + "|"]
    for label, s in summaries.items():
        lines.append(f"| {label} | {s['episodes']} | {s.get('errors', 0)} | "
                     f"{_pct(s['share_rehearsed'])} % | "
                     f"{_pct(s['share_real_call'])} % | {s['real_calls']} | "
                     f"{s['rehearsal_real_calls']} |")
    return "\n".join(lines)


def write_summary(out: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``out/summary.json`` (``summarize_runs``) and ``out/results.md``; return the json."""
    summaries = summarize_runs(rows)
    path = out / "summary.json"
    path.write_text(json.dumps({"configs": summaries, "table3": table3(summaries),
                                "usage": usage_table(summaries)}, indent=1))
    (out / "results.md").write_text(format_table(rows) + "\n\n" + table3(summaries) + "\n\n"
                                    + usage_table(summaries) + "\n")
    return path


def sweep_point(mode: str, n: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One Fig. 6 point from the rows of one configuration: ``{"mode", "n", "overall", "tau2",
    "bfcl", "suites": {suite: avg_at_k}, "episodes"}`` (aggregates from ``summarize``)."""
    s = summarize(rows)
    return {"mode": mode, "n": n, "overall": s["overall"],
            "tau2": s["benchmarks"].get("tau2", {}).get("avg"),
            "bfcl": s["benchmarks"].get("bfcl", {}).get("avg"),
            "suites": {x: v["avg_at_k"] for x, v in s["suites"].items()},
            "episodes": s["episodes"]}


# ---------------------------------------------------------------------------------------------
# Per-task tables
# ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ("suite", "task_id", "repeat", "rehearsal", "reward", "turns", "tool_calls",
                 "real_calls", "gated_calls", "parse_errors", "stop_reason", "seconds")


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the per-task rows, then one summary line per suite and configuration.

    A suite in which the policy made no tool call at all says so explicitly (the zero-shot
    SmolLM2 case: without a warm start it answers in text, and every reward is 0).
    """
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]

    def cell(r: dict[str, Any], c: str) -> str:
        if c == "reward":
            return f"{r[c]:.3f}"
        if c == "rehearsal":
            return config_label(r)
        text = str(r.get(c, ""))  # telecom ids run to 200 characters: keep the head and the tail
        return text if len(text) <= 48 else f"{text[:30]}…{text[-17:]}"

    for r in rows:
        lines.append("| " + " | ".join(cell(r, c) for c in TABLE_COLUMNS) + " |")
    lines.append("")
    for (suite, label) in dict.fromkeys((r["suite"], config_label(r)) for r in rows):
        every = [r for r in rows if r["suite"] == suite and config_label(r) == label]
        sub = [r for r in every if not is_error(r)]
        errors = len(every) - len(sub)
        calls = sum(r["tool_calls"] for r in sub)
        note = " — the policy made NO tool call (expected zero-shot; see the warm start)" \
            if calls == 0 and sub else ""
        rate = (f"pass@1 {sum(r['reward'] for r in sub) / len(sub):.3f} over {len(sub)} "
                "episodes" if sub else "pass@1 – (no scored episode)")
        lines.append(f"- {suite} [{label}]: {rate}, {errors} episode errors (not counted), "
                     f"{calls} tool calls, {sum(r['real_calls'] for r in sub)} real executions, "
                     f"{sum(r.get('rehearsal_real_calls', 0) for r in sub)} during rehearsal"
                     f"{note}")
    return "\n".join(lines)


__all__ = [
    "BENCHMARKS",
    "LABELS",
    "TABLE_COLUMNS",
    "TICKET",
    "benchmark_of",
    "ci95",
    "config_label",
    "format_table",
    "is_error",
    "summarize",
    "summarize_runs",
    "sweep_point",
    "table3",
    "usage_table",
    "write_summary",
]
