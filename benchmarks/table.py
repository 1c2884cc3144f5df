"""The README's performance table, built from the JSON in ``benchmarks/results/``.

Every row names its figure, its value and the command that reproduces it (the ``command``
recorded in the JSON). Prints markdown.

Usage::

    python benchmarks/table.py                  # benchmarks/results/*.json
    python benchmarks/table.py --results DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import GPU_NOTE, RESULTS


def _rows(d: dict[str, Any]) -> list[tuple[str, str]]:
    """``(figure, value)`` pairs of one result file."""
    kind, prof = d["benchmark"], d.get("setup", {}).get("profile", "?")
    if kind == "rollout_throughput":
        e, n, s = d["engine"], d["naive"], d["setup"]
        where = f"{prof}, {s['trajectories']} traj × {s['max_turns']} turns"
        return [
            (f"rollout tokens/s, engine vs naive ({where})",
             f"{e['tokens_per_s']} vs {n['tokens_per_s']} (**{d['speedup_tokens_per_s']}×**)"
             + (f"; per CPU-second {d['speedup_tokens_per_cpu_s']}×"
                if "speedup_tokens_per_cpu_s" in d else "")
             + f"; naive played {s['naive_trajectories']} of {s['trajectories']}"),
            (f"rollout total (prompt + generated) tokens/s, engine vs naive ({prof})",
             f"{e['total_tokens_per_s']} vs {n['total_tokens_per_s']}"),
            (f"rollout prefill / decode tokens/s, engine vs naive ({prof})",
             f"prefill {e['prefill_tokens_per_s']:.0f} vs {n['prefill_tokens_per_s']:.0f} "
             f"({d['speedup_prefill']}×); decode {e['decode_tokens_per_s']} vs "
             f"{n['decode_tokens_per_s']} ({d['speedup_decode']}×)"),
            (f"rollout time split, engine ({prof}): prefill / decode / other s",
             f"{e['prefill_s']:.1f} / {e['decode_s']:.1f} / {e['other_s']:.1f} "
             f"(naive: {n['prefill_s']:.1f} / {n['decode_s']:.1f} / {n['other_s']:.1f})")
        ] + ([(f"rollout prefix cache, engine ({prof}): prompt ids reused / prefilled",
               f"{e['prefix_cache_reused_tokens']:.0f} / {e['prefix_cache_prefilled_tokens']:.0f}"
               f" (naive prefilled {n['prefill_tokens']:.0f} for {s['naive_trajectories']} "
               "trajectories)")] if "prefix_cache_reused_tokens" in e else [])
    if kind == "train_step":
        out = []
        for r in d["rows"]:
            p, o = r["packed"], r["per_output"]
            out.append((f"train step, {r['turns']} turns, K={r['k']} ({prof}): tokens packed vs "
                        "one row per output (all rows)",
                        f"{p['tokens']} vs {o['tokens']} ({r['tokens_ratio']}); fwd+bwd "
                        f"{p['fwd_bwd_s']} s vs {o['fwd_bwd_s']} s ({r['fwd_bwd_ratio']}); "
                        f"grad rel. diff {r['grad_rel_diff']:.1e}"))
            out.append((f"length bucketing, {r['turns']} turns ({prof}): packed fwd+bwd, "
                        "bucketed vs one padded forward",
                        f"{p['fwd_bwd_s']} s vs {r['packed_one_forward']['fwd_bwd_s']} s "
                        f"({r['bucketing_fwd_bwd_ratio']}); encoded tokens {p['encoded']} vs "
                        f"{p['padded']}; grad rel. diff {r['grad_rel_diff_bucketing']:.1e}"))
        return out
    if kind == "step_breakdown":
        m = d["mean"]
        return [(f"step breakdown ({prof}): generation / policy fwd+bwd / reward / rest s",
                 f"{m['generation_s']} / {m['policy_fwd_bwd_s']} / {m['reward_s']} / "
                 f"{m['rest_s']} of {m['total_s']}"),
                (f"bookkeeping ({prof}): rest per output row, share of step",
                 f"{m['rest_ms_per_output']} ms ({100 * m['rest_share']:.2f} %)"
                 + (f"; CPU time {m['rest_cpu_ms_per_output']} ms "
                    f"({100 * m['rest_cpu_share']:.2f} %)" if "rest_cpu_s" in m else "")
                 + f"; {m['outputs']:.0f} outputs, {m['rows']:.0f} rows, "
                 f"{d['setup'].get('policy', 'sampled')} policy, K={d['setup']['k']}")]
    if kind == "scaling":
        out = []
        for sweep, key in (("k", "k"), ("turns", "turns"), ("context", "filler")):
            pts = sorted((r for r in d["rows"] if r["sweep"] == sweep), key=lambda r: r[key])
            if pts:
                out.append((f"scaling ({prof}, plot `{d['plot']}`): step s / peak MiB vs {key}",
                            "; ".join(f"{key}={r[key]}: {r['step_s']} s / {r['peak_mib']:.0f}"
                                      for r in pts)))
        for name, f in d.get("fit", {}).items():
            if f["exponent"] is not None and f["x"] in ("step_tokens", "completion_tokens"):
                out.append((f"scaling ({prof}): exponent of step s against tokens, {name}",
                            f"{f['exponent']} ({f['points']} points)"))
        return out
    if kind == "vllm_backend":
        if "error" in d:
            return [("vLLM backend (CPU)", f"not measured: {d['error']}")]
        return [(f"vLLM backend ({prof}): engine on vLLM / raw LLM.generate / engine on HF "
                 "tokens/s", f"{d['engine_vllm']['tokens_per_s']} / "
                 f"{d['raw_vllm']['tokens_per_s']} / {d['engine_hf']['tokens_per_s']} "
                 f"(engine = **{100 * d['engine_share_of_raw']:.0f} %** of raw)")]
    if kind == "fuzz_protocol":
        s, t, e = d["seconds"], d["train"], d["eval"]
        toks = ", ".join(d["setup"]["tokenizers"])
        fuzzed = (f"{d['generated']['act']:,} + {d['generated']['rehearse']:,}, "
                  f"**{d['crashes']} crashes**; path {s['path_ms_per_example']} ms per example, "
                  f"{s['total']} s in all")
        fed = (f"train: steps {t.get('metrics_steps')}, {t['act_outputs_played']} ACT outputs; "
               f"eval: {e.get('rows_written')}/{e['rows_expected']} rows, "
               f"{e['act_outputs_played']} ACT outputs; "
               f"{'accepted' if d['accepted'] else 'NOT accepted'}")
        what = f"protocol fuzz (seed {d['seed']}, tokenizers {toks}): ACT + REHEARSE outputs"
        worst = (f"protocol fuzz: the {d['setup']['k']} worst through a scripted train and a "
                 "parallel-rehearsal eval")
        return [(what, fuzzed), (worst, fed)]
    return []


def markdown(results: str | Path = RESULTS) -> str:
    """The table for every ``*.json`` under ``results`` (sorted by file name)."""
    lines = ["| figure | value | command |", "|---|---|---|"]
    for path in sorted(Path(results).glob("*.json")):
        d = json.loads(path.read_text())
        for figure, value in _rows(d):
            lines.append(f"| {figure} | {value} | `{d.get('command', '')}` |")
    lines.append(f"| GPU | {GPU_NOTE} | — |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(RESULTS))
    print(markdown(p.parse_args().results))
