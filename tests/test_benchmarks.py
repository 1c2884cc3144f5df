"""Tests of benchmarks/: the counting helpers by hand, and a quick-size run of each script.

Speed is never asserted (tests/README.md): the scripts' ``--quick`` runs check that they run
end to end on the tiny Qwen3 and toy tasks and that their JSON holds consistent counts.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fuzz_protocol, rollout_throughput, scaling, step_breakdown, table, train_step
from benchmarks.common import RESULTS, ForwardTimer
from envace_lite.core.rows import length_buckets


def test_length_buckets_by_hand():
    # rows (prompt, completion): two packed ACT rows (10, 90), (12, 88) and three REHEARSE rows
    # (95, 5), (100, 4), (30, 2). Sorted by length: (30,2) 32, (100,4)/(95,5) 100..104, ACT 100.
    p, c = [10, 12, 95, 100, 30], [90, 88, 5, 4, 2]
    buckets = length_buckets(p, c, slack=0.25)
    assert sorted(i for b in buckets for i in b) == [0, 1, 2, 3, 4]
    # (30,2) alone: adding (95,5) would encode 2 × 100 = 200 > 1.25 × 132
    assert buckets[0] == [4]
    # ACT and REHEARSE never share a bucket: 2 × (95 + 90) = 370 > 1.25 × 200
    for b in buckets:
        assert len({c[i] > 50 for i in b}) == 1
    encoded = sum(len(b) * (max(p[i] for i in b) + max(c[i] for i in b)) for b in buckets)
    assert encoded < 5 * (100 + 90)  # one padded batch: 5 rows × (max prompt + max completion)
    assert length_buckets([3, 3], [2, 2], slack=0.0) == [[0, 1]]  # equal rows: one bucket
    # contiguous (the causal_rows layout): width = the longest row. Order 4, 0, 1, 2, 3 (by
    # length, then prompt); (30,2) alone: 2 × 100 = 200 > 1.25 × 132; then the four rows of
    # length 100–104 share one bucket: 4 × 104 = 416 ≤ 1.25 × 404, ACT and REHEARSE together
    assert length_buckets(p, c, slack=0.25, contiguous=True) == [[4], [0, 1, 2, 3]]


def test_batch_tokens_by_hand():
    # two rows: prompt 3 + completion 2, and prompt 1 + completion 4; one padding row
    batch = {"prompt_mask": torch.tensor([[1, 1, 1], [0, 0, 1], [0, 0, 1]]),
             "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]),
             "tool_mask": torch.tensor([[1.0, 1.0, 0, 0], [0, 2.0, 0, 0.5], [0, 0, 0, 0]]),
             "row_role": torch.tensor([0, 1, -1])}
    got = train_step.batch_tokens(batch, buckets=[[0], [1], [2]])
    assert got == {"rows": 2, "tokens": 10, "trained": 4, "padded": 21, "encoded": 5 + 5 + 2}
    assert train_step.batch_tokens(batch)["encoded"] == 21
    # the causal_rows layout: a forward is as wide as its longest row, 5 for rows 0 and 1 together
    # (3 + 2 and 1 + 4), where TRL's layout needs 3 + 4
    assert train_step.batch_tokens(batch, [[0, 1], [2]], contiguous=True)["encoded"] == 2 * 5 + 2
    assert train_step.batch_tokens(batch, [[0, 1], [2]])["encoded"] == 2 * 7 + 2


def test_forward_timer_counts_prefill_and_decode():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2)).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with ForwardTimer(model) as timer:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
    # one prefill of 3 + 5 real tokens in a 2 × 5 batch, then 3 decode steps of 2 rows
    assert (timer.prefill_tokens, timer.prefill_padded) == (8, 10)
    assert (timer.decode_steps, timer.decode_rows) == (3, 6)
    assert timer.prefill_s > 0 and timer.decode_s > 0


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


def test_rollout_throughput_quick(out):
    d = rollout_throughput.main(["--profile", "smoke", "--quick", "--out", str(out / "rt.json")])
    assert json.loads((out / "rt.json").read_text())["benchmark"] == "rollout_throughput"
    eng, naive = d["engine"], d["naive"]
    # greedy, the same two toy tasks: both variants generate the same outputs
    assert d["same_outputs"] == "2/2" and eng["generated_tokens"] == naive["generated_tokens"]
    # the engine sends each turn's prompts in one call; the naive loop one prompt per call
    assert naive["generate_calls"] == naive["outputs"] == eng["outputs"] > eng["generate_calls"]
    assert eng["prefill_padded_tokens"] >= eng["prefill_tokens"] > 0
    assert naive["prefill_padded_tokens"] == naive["prefill_tokens"]  # batch of one: no padding
    assert d["machine"]["cpu_count"] >= 1 and d["command"].startswith("python benchmarks/")


def test_train_step_quick(out):
    d = train_step.main(["--profile", "smoke", "--quick", "--out", str(out / "ts.json")])
    [row] = d["rows"]
    packed, per_output = row["packed"], row["per_output"]
    # K=2 trajectories × 2 turns × (1 ACT + 1 REHEARSE): 8 outputs; packed: 2 ACT + 4 REHEARSE
    assert (packed["rows"], per_output["rows"]) == (6, 8)
    assert packed["trained"] == per_output["trained"] > 0  # the same trained tokens
    assert packed["tokens"] < per_output["tokens"]
    assert row["grad_rel_diff"] < 1e-5 and row["grad_rel_diff_reference"] < 1e-5
    assert row["grad_rel_diff_bucketing"] < 1e-5 and row["grad_norm"] > 0


def test_step_breakdown_quick(out):
    d = step_breakdown.main(["--profile", "smoke", "--quick", "--out", str(out / "sb.json")])
    [step] = d["steps"]
    parts = ("generation_s", "reward_s", "reference_forward_s", "policy_fwd_bwd_s",
             "optimizer_s", "rest_s")
    assert sum(step[k] for k in parts) == pytest.approx(step["total_s"], abs=2e-3)
    assert step["generation_s"] > 0 and step["policy_fwd_bwd_s"] > 0 and step["outputs"] >= 2
    # rest_s is rounded to 0.1 ms and rest_ms_per_output to 0.01 ms, so they can disagree by at
    # most 0.05 ms / outputs + 0.005 ms (a flat 0.02 failed at 2 outputs: 1.97 vs 1.95)
    assert abs(step["rest_ms_per_output"] - 1000 * step["rest_s"] / step["outputs"]) <= (
        0.05 / step["outputs"] + 0.005 + 1e-9)


def test_step_breakdown_scripted_quick(out):
    d = step_breakdown.main(["--profile", "smoke", "--quick", "--scripted", "--k", "2",
                             "--out", str(out / "sb_scripted.json")])
    [step] = d["steps"]
    # K=2 scripted trajectories × 2 turns × (1 ACT + 1 REHEARSE); packed: 2 ACT + 4 REHEARSE rows
    assert (step["outputs"], step["rows"], step["turns_mean"]) == (8, 6, 2.0)
    assert d["setup"]["policy"].startswith("scripted")


def test_scaling_plot_by_hand(tmp_path):
    rows = [{"sweep": s, "k": k, "turns": 3, "filler": f, "step_s": 1.0 + k, "rows": 4,
             "policy_fwd_bwd_s": 0.5 * k, "rss_after_load_mib": 500.0, "peak_mib": 600.0 + k}
            for s, k, f in (("k", 2, 0), ("k", 4, 0), ("turns", 4, 0), ("context", 4, 0),
                            ("context", 4, 200))]
    png = scaling.plot(rows, tmp_path / "s.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 200_000
    # the base point is shared by every sweep
    pts = scaling.sweep_points([2, 4], [3], [0])
    assert [s for s, _ in pts] == ["k", "k", "turns", "context"] and pts[0][1] == scaling.BASE


def test_scaling_exponent_by_hand():
    # y = 3 x: exponent 1; y = x^2 / 100: exponent 2 (log-log slope, by hand)
    lin = [{"step_tokens": x, "step_s": 3.0 * x} for x in (100, 200, 400)]
    assert scaling.fit_exponent(lin)["exponent"] == 1.0
    quad = [{"step_tokens": x, "step_s": x * x / 100} for x in (100, 200, 400)]
    assert scaling.fit_exponent(quad) == {"exponent": 2.0, "points": 3, "x": "step_tokens",
                                          "y": "step_s"}
    # (100, 1), (400, 4), (100, 1) again: two distinct points, slope log 4 / log 4 = 1
    assert scaling.fit_exponent([{"step_tokens": 100, "step_s": 1.0}] * 2
                                + [{"step_tokens": 400, "step_s": 4.0}])["points"] == 2
    assert scaling.fit_exponent([{"step_tokens": 100, "step_s": 1.0}])["exponent"] is None
    with pytest.raises(ValueError):
        scaling.fit_exponent([{"step_tokens": 0, "step_s": 1.0}, {"step_tokens": 2, "step_s": 1}])


def test_table_reads_the_json():
    # the committed results: the quick runs above may sit on another xdist worker's ``out``
    md = table.markdown(RESULTS)
    assert md.startswith("| figure |") and "python benchmarks/train_step.py" in md
    assert "rollout" in md and "packed" in md


def test_fuzz_worst_and_violation_kinds_by_hand():
    from envace_lite.protocol.fuzz import encodable, nesting_depth

    assert (nesting_depth("[[]"), nesting_depth("]["), nesting_depth('{"a": [{"b": 1}]}')) == (
        2, 1, 3)
    assert encodable("é🌧") and not encodable("a\ud800")
    assert fuzz_protocol.violation_kind("duplicate key 'name' in the call JSON") == "duplicate_key"
    assert fuzz_protocol.violation_kind("arguments dropped: nested more than 32 levels deep") \
        == "arguments_dropped"
    assert fuzz_protocol.violation_kind("name: a lone surrogate (not valid UTF-8) was escaped "
                                        "as text") == "lone_surrogate_escaped"
    assert fuzz_protocol.violation_kind("unknown tool 'x' (not among the 3 available tools)") \
        == "unknown_tool"
    assert fuzz_protocol.violation_kind("arguments.folder: 3 is not of type 'string'") == "schema"
    # per criterion the top 1: "zz" the only output with calls, "aaaa" the longest, "[[[" the
    # deepest, "b" has the most tokens, "\ud800x" the only unencodable one; a crash comes first
    w = fuzz_protocol.Worst(per=1)
    for text, tokens, crash, calls in (("aaaa", 1, "", False), ("[[[", 2, "", False),
                                       ("b", 9, "", False), ("\ud800x", 1, "", False),
                                       ("zz", 0, "", True), ("c", 0, "parse: X", False)):
        w.add(text, tokens, crash, calls)
    picked = w.pick(9)
    assert [(p["text"], p["why"]) for p in picked] == [
        ("c", ["crash"]), ("zz", ["calls"]), ("aaaa", ["chars"]), ("[[[", ["depth"]),
        ("b", ["tokens"]), ("\ud800x", ["unencodable"])]
    assert [p["text"] for p in w.pick(2)] == ["c", "zz"]
    w2 = fuzz_protocol.Worst(per=2)  # one output tops two criteria: listed once, both reasons
    for text, tokens in (("[[[[[[", 1), ("xy", 0)):
        w2.add(text, tokens, "")
    assert [(p["text"], p["why"]) for p in w2.pick(4)] == [
        ("[[[[[[", ["chars", "depth", "tokens"]), ("xy", ["chars", "depth", "tokens"])]


def test_fuzz_protocol_quick(out):
    d = fuzz_protocol.main(["--quick", "--out", str(out / "fz.json")])
    n = d["setup"]["n"]
    assert d["generated"] == {"act": n, "rehearse": n} and d["crashes"] == 0
    # every example has exactly one outcome per role
    assert sum(d["outcomes"]["act"].values()) == sum(d["outcomes"]["rehearse"].values()) == n
    assert 0 < len(d["worst"]["act"]) <= d["setup"]["k"]
    assert d["train"]["all_rows_written"] and d["train"]["metrics_steps"] == [1, 2]
    assert d["eval"]["all_rows_written"]
    assert d["eval"]["rows_written"] == d["eval"]["rows_expected"] == d["setup"]["eval_tasks"]
    assert d["accepted"] and d["command"].startswith("python benchmarks/fuzz_protocol.py")
