"""Scaling: one GRPO step's wall time and peak memory as K, turns and context grow.

Each point is one training step of ``step_breakdown.run`` with the scripted policy
(``train_step.scripted_policy`` on one BFCL base task: every trajectory reaches exactly
``turns`` turns, so the sizes are exact and generation costs nothing), in a **fresh process**:
peak memory is the process's high-water mark (``VmHWM``), which only grows. Three sweeps share
one base point:

* ``k``: trajectories per task (the GRPO group), turns and context at the base;
* ``turns``: ACT turns (each adds an ACT completion to the packed row and a REHEARSE row);
* ``context``: ``filler`` words added to every observation, so each turn's ACT context grows.

Each process runs ``--steps`` steps (default 2) and keeps the last (the first allocates and
warms threads).
Writes ``benchmarks/results/scaling_<profile>.json`` and ``scaling_<profile>.png``.

Usage::

    python benchmarks/scaling.py --profile smoke --k 2 4 --turns 1 3 6 --filler 0 400 --steps 1
    python benchmarks/scaling.py --profile laptop --k 2 4 --turns 1 3
    python benchmarks/scaling.py --point 4 3 0 --profile smoke   # one point, JSON on stdout
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, command_line, machine_info, write_json

BASE = {"k": 2, "turns": 3, "filler": 0}
"""The point every sweep passes through."""


def one_point(profile: str, k: int, turns: int, filler: int, quick: bool = False,
              steps: int = 2) -> dict[str, Any]:
    """``steps`` scripted steps in this process; the last step's figures and the peak memory.

    Returns:
        ``{"k", "turns", "filler", "step_s", "policy_fwd_bwd_s", "rest_s", "rows", "outputs",
        "rss_after_load_mib", "peak_mib"}`` (seconds; MiB).
    """
    from benchmarks import common, step_breakdown

    overrides = {"rollout.max_turns": turns, "grpo.num_generations": k,
                 "grpo.prompts_per_step": 1, "rollout.grounding_drop_p": 0.0,
                 "rollout.max_prompt_tokens": 200000, "model.context_window": 200000,
                 "rollout.max_new_tokens_act": 128,  # the scripted texts are cut to the budget
                 "rollout.max_new_tokens_rehearse": 128 + 4 * filler,  # micro: 3 ids a word
                 **(common.QUICK if quick else {})}
    common.policy(common.bench_config(profile, overrides), train=True)
    loaded = common._vmhwm_mib()
    d = step_breakdown.run(profile, steps, overrides, quick=quick, scripted=True, filler=filler)
    last = d["steps"][-1]
    return {"k": k, "turns": turns, "filler": filler, "step_s": last["total_s"],
            "policy_fwd_bwd_s": last["policy_fwd_bwd_s"], "rest_s": last["rest_s"],
            "rows": last["rows"], "outputs": last["outputs"],
            "step_tokens": last["step_tokens"], "padded_tokens": last["padded_tokens"],
            "completion_tokens": last["completion_tokens"],
            "rss_after_load_mib": round(loaded, 1), "peak_mib": round(common._vmhwm_mib(), 1)}


def fit_exponent(rows: list[dict[str, Any]], x: str = "step_tokens",
                 y: str = "step_s") -> dict[str, Any]:
    """Least-squares fit of ``log y = log c + b log x`` over the distinct points of ``rows``.

    ``b`` is the exponent of step time against tokens per step: 1 is linear, 2 quadratic.

    Returns:
        ``{"exponent": b, "points": n, "x": x, "y": y}``; ``exponent`` is None with fewer than 2
        distinct ``x`` values.
    Raises:
        ValueError: a point whose ``x`` or ``y`` is not positive.
    """
    import numpy as np

    pts = sorted({(r[x], r[y]) for r in rows})
    if any(a <= 0 or b <= 0 for a, b in pts):
        raise ValueError(f"{x} and {y} must be positive: {pts}")
    if len({a for a, _ in pts}) < 2:
        return {"exponent": None, "points": len(pts), "x": x, "y": y}
    b = float(np.polyfit(np.log([a for a, _ in pts]), np.log([b for _, b in pts]), 1)[0])
    return {"exponent": round(b, 4), "points": len(pts), "x": x, "y": y}


def sweep_points(ks: list[int], turns: list[int], fillers: list[int]) -> list[tuple[str, dict]]:
    """``(sweep, point)`` pairs: each axis varied with the others at ``BASE``."""
    pts = [("k", BASE | {"k": v}) for v in ks]
    pts += [("turns", BASE | {"turns": v}) for v in turns]
    pts += [("context", BASE | {"filler": v}) for v in fillers]
    return pts


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Step time and peak memory per sweep, one column per axis; a PNG under 200 kB."""
    from matplotlib.figure import Figure  # no pyplot: no backend, no global state

    axes_of = {"k": ("k", "K (trajectories per task)"), "turns": ("turns", "ACT turns"),
               "context": ("filler", "words added per observation")}
    fig = Figure(figsize=(9, 5), dpi=80)
    axs = fig.subplots(2, 3, sharey="row")
    for j, (sweep, (key, label)) in enumerate(axes_of.items()):
        pts = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: r[key])
        xs = [r[key] for r in pts]
        axs[0, j].plot(xs, [r["step_s"] for r in pts], "o-", label="step")
        axs[0, j].plot(xs, [r["policy_fwd_bwd_s"] for r in pts], "s--", label="policy fwd+bwd")
        axs[1, j].plot(xs, [r["peak_mib"] for r in pts], "o-", label="peak RSS")
        axs[1, j].plot(xs, [r["rss_after_load_mib"] for r in pts], ":", label="after load")
        axs[1, j].set_xlabel(label)
    axs[0, 0].set_ylabel("seconds")
    axs[1, 0].set_ylabel("MiB")
    axs[0, 0].legend(fontsize=8)
    axs[1, 0].legend(fontsize=8)
    fig.suptitle(f"one scripted GRPO step; base K={BASE['k']}, turns={BASE['turns']}, "
                 f"filler={BASE['filler']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every point in its own process, write the JSON and the PNG; returns the payload."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="smoke", choices=["smoke", "drills", "laptop"])
    p.add_argument("--out", default=None, help="JSON path; the PNG goes next to it")
    p.add_argument("--quick", action="store_true", help="tiny model, two points (the tests)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--turns", type=int, nargs="+", default=[1, 3, 6])
    p.add_argument("--filler", type=int, nargs="+", default=[0, 100, 400])
    p.add_argument("--steps", type=int, default=2, help="steps per point; the last is kept")
    p.add_argument("--point", type=int, nargs=3, metavar=("K", "TURNS", "FILLER"),
                   help="measure one point here and print its JSON (used by the sweep)")
    a = p.parse_args(argv)
    if a.point:
        row = one_point(a.profile, *a.point, quick=a.quick, steps=a.steps)
        print("POINT " + json.dumps(row), flush=True)
        return row
    if a.quick:
        a.k, a.turns, a.filler = [BASE["k"]], [BASE["turns"]], [BASE["filler"]]
    rows, measured = [], {}
    for sweep, pt in sweep_points(a.k, a.turns, a.filler):
        key = (pt["k"], pt["turns"], pt["filler"])
        if key not in measured:  # the base point is in every sweep: measured once
            cmd = [sys.executable, str(Path(__file__).resolve()), "--profile", a.profile,
                   "--steps", str(a.steps), "--point", *map(str, key)]
            done = subprocess.run(cmd + (["--quick"] if a.quick else []), cwd=ROOT,
                                  capture_output=True, text=True, check=False)
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("POINT ")]
            if done.returncode or not line:
                raise RuntimeError(f"point {pt} failed:\n{done.stderr[-2000:]}")
            measured[key] = json.loads(line[-1][6:])
        rows.append({"sweep": sweep} | measured[key])
        print(rows[-1], flush=True)
    out = Path(a.out) if a.out else RESULTS / f"scaling_{a.profile}{'_quick' if a.quick else ''}.json"
    png = plot(rows, out.with_suffix(".png"))
    payload = {"benchmark": "scaling", "command": command_line("scaling.py", argv),
               "machine": machine_info(), "rows": rows, "plot": png.name,
               "fit": {f"{name}, against {x}": fit_exponent(
                           [r for r in rows if name == "all points" or r["sweep"] == name], x)
                       for x in ("step_tokens", "padded_tokens", "completion_tokens")
                       for name in ("all points", "k", "turns", "context")},
               "setup": {"profile": a.profile, "base": BASE, "steps_per_point": a.steps,
                         "kept": "the last step", "policy": "scripted (train_step.scripted_policy)",
                         "task": "bfcl-base (the first train task)", "memory": "VmHWM"}}
    write_json(out, payload)
    print(out, png, f"{png.stat().st_size / 1024:.0f} kB")
    return payload


if __name__ == "__main__":
    main()
