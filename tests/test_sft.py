"""Warm-start transcripts and SFT: train split only, real observations, rollout formats.

Default tier: offline, CPU. The end-to-end test runs the smoke profile's whole warm-start path
(transcripts → SFT 2 steps → checkpoint → load_policy → generation → committed execution).
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from envace_lite import protocol
from envace_lite.protocol.prompts import assistant_text
from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import ConfigError, get_config
from envace_lite.envs.tasks import load_tasks
from envace_lite.envs import list_tasks, make_env
from envace_lite.llm.generation import HFGenerator, chat_ids
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.core.rollout import rollout
from envace_lite.pipelines.resume import CHECKPOINT
from envace_lite.pipelines.sft import sft_rows, warmstart
from envace_lite.core.task_split import split_sft_rl, training_tasks, truncate_user_turns
from envace_lite.core.transcripts import build_transcripts, encode_act, encode_rehearse
from envace_lite.types import Task, ToolCall


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def _cfg(**overrides):
    return get_config("smoke", {"warmstart.max_user_turns": 2, "warmstart.sft_share": 0.5,
                                "rollout.max_turns": 12, **overrides})


def test_transcripts_hold_only_train_split_tasks():
    cfg = _cfg()
    for purpose in ("sft", "rl"):
        tasks = training_tasks(cfg, purpose)
        assert tasks and {t.split for t in tasks} == {"train"}
        assert {t.id for t in tasks} <= set(list_tasks("bfcl-base", "train"))
        assert not {t.id for t in tasks} & set(list_tasks("bfcl-base", "test"))
    ts = build_transcripts(training_tasks(cfg, "sft"), cfg)
    assert {a.task_id for a in ts.act} <= set(list_tasks("bfcl-base", "train"))
    assert {r.task_id for r in ts.rehearse} <= {a.task_id for a in ts.act}
    with pytest.raises(ValueError, match="train-split tasks only"):
        build_transcripts(load_tasks("bfcl-base", "test", limit=1), cfg)


def test_sft_and_rl_tasks_are_disjoint_and_cover_the_train_split():
    cfg = _cfg()
    sft, rl = training_tasks(cfg, "sft"), training_tasks(cfg, "rl")
    assert not {t.id for t in sft} & {t.id for t in rl}
    assert len(sft) + len(rl) == len(list_tasks("bfcl-base", "train"))
    assert 0.35 < len(sft) / (len(sft) + len(rl)) < 0.65
    # one BFCL scenario (entry index) lands on one side whatever its category
    stub = lambda suite, i: Task(f"multi_turn_{suite[5:]}_{i}", suite, "train", [], [], [], [],
                                 [], [])
    base = [stub("bfcl-base", i) for i in range(40)]
    miss = [stub("bfcl-miss_func", i) for i in range(40)]
    s1, _ = split_sft_rl(base, 0.5)
    s2, _ = split_sft_rl(miss, 0.5)
    assert [t.id.rsplit("_", 1)[1] for t in s1] == [t.id.rsplit("_", 1)[1] for t in s2]


def _replay_observations(task: Task) -> list[str]:
    """Execute the task's gold calls in a fresh real env, grouped as the adapters' gold does."""
    env = make_env(task.suite, task.id)
    out = []
    try:
        env.reset()
        for u, turn in enumerate(task.gold_calls):
            calls = [ToolCall(c["name"], c["arguments"]) for c in turn]
            groups = [calls] if task.suite.startswith("bfcl-") else [[c] for c in calls]
            for group in groups:
                out += [o.content for o in env.step(group)] if group else []
            if u + 1 < len(task.gold_calls):
                env.end_turn("Done.")
    finally:
        env.close()
    return out


@pytest.mark.parametrize("suite,n", [("bfcl-base", 3), ("tau2-telecom", 1)])
def test_every_rehearse_target_is_the_real_environment_output(suite, n):
    cfg = _cfg(**{"grpo.suites": [suite]})
    tasks = training_tasks(cfg, "sft")[:n]
    ts = build_transcripts(tasks, cfg)
    for task in tasks:
        targets = [r.target for r in ts.rehearse if r.task_id == task.id]
        real = _replay_observations(task)
        assert targets and targets == [rehearsal_text(c) for c in real]


def test_failing_gold_calls_keep_their_error_observation_and_are_counted():
    cfg = get_config("smoke", {"grpo.suites": ["tau2-retail-ticket"]})
    tasks = [t for t in load_tasks("tau2-retail-ticket", "train") if t.flags][:3]
    ts = build_transcripts(tasks, cfg)
    flagged = sum(f.startswith("gold_call_error:") for t in tasks for f in t.flags)
    assert flagged > 0 and ts.stats["gold_call_errors"] == ts.stats["flagged_gold_calls"] == flagged
    errors = [r for r in ts.rehearse if r.observation["error"]]
    assert len(errors) == flagged
    for r in errors:
        assert r.target == rehearsal_text(r.observation["content"])
        assert protocol.parse_rehearsal(r.target).is_error


def test_truncate_user_turns_keeps_the_first_turns():
    task = next(t for t in load_tasks("bfcl-base", "train") if len(t.user_turns) >= 3)
    cut = truncate_user_turns(task, 2)
    assert len(cut.user_turns) == len(cut.checklist) == len(cut.grounding) == 2
    assert cut.gold_calls == task.gold_calls[:2] and len(task.user_turns) >= 3


def test_transcripts_are_token_for_token_what_rollout_packs(tok):
    """A rollout whose scripted outputs are the gold texts rebuilds the SFT rows exactly: the
    packed ACT ids and loss mask, and every REHEARSE prompt (the same grounding draw)."""
    cfg = _cfg(**{"rollout.grounding_drop_p": 0.5, "rollout.max_new_tokens_act": 512,
                  "rollout.max_new_tokens_rehearse": 512})  # the scripted texts are not cut
    seen = set()
    for seed, task in enumerate(training_tasks(cfg, "sft")[:3]):
        ts = build_transcripts([task], cfg, tok, seed=seed)  # Random(0) draws gold, Random(1) none
        [act], reh = ts.act, ts.rehearse
        gen = ScriptedGenerator({"act": act.outputs, "rehearse": [r.target for r in reh]}, tok)
        [traj] = rollout([task], gen, tok, cfg, k=1, seed=seed)
        assert traj.stop_reason == "final_answer" and traj.grounding == reh[0].grounding
        seen.add(traj.grounding)
        assert (traj.act_ids, traj.act_mask) == encode_act(act, tok)
        outs = [o for o in traj.outputs if o.role == "rehearse"]
        assert [o.prompt_ids for o in outs] == [
            encode_rehearse(r, tok)[0][:len(o.prompt_ids)] for r, o in zip(reh, outs)]
        assert [o.ids for o in outs] == [
            encode_rehearse(r, tok)[0][len(o.prompt_ids):] for r, o in zip(reh, outs)]
    assert seen == {"gold", "none"}


def test_sft_rows_respect_the_budget_and_skip_long_rows(tok):
    cfg = _cfg()
    ts = build_transcripts(training_tasks(cfg, "sft")[:6], cfg, tok)
    rows, stats = sft_rows(ts, tok, max_length=3000, token_budget=12_000, seed=0)
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in rows) <= 12_000
    assert stats["rows_too_long"] == sum(
        1 for a in ts.act if len(encode_act(a, tok)[0]) > 3000) + sum(
        1 for r in ts.rehearse if len(encode_rehearse(r, tok)[0]) > 3000)
    for r in rows:
        assert len(r["input_ids"]) == len(r["completion_mask"]) and 0 < sum(r["completion_mask"])
        assert r["completion_mask"][0] == 0  # prompts never carry loss


def test_smoke_warm_start_end_to_end(tmp_path):
    """transcripts → SFT (1 step) → checkpoint → load_policy → generation → committed run."""
    from envace_lite.pipelines.evaluate import evaluate_suites

    cfg = get_config("smoke", {"warmstart.eval_first_turns": 2})
    run = warmstart(cfg, tmp_path / "ws")
    summary = (run / "summary.json").read_text()
    assert '"steps": 1' in summary and '"first_turn_after"' in summary
    ckpt = run / CHECKPOINT
    assert (ckpt / "config.json").exists() and (ckpt / "tokenizer_config.json").exists()
    cfg2 = get_config("smoke", {"model.checkpoint": str(ckpt), "eval.limit": 1,
                                "eval.max_turns": 1, "rollout.max_new_tokens_act": 8})
    model, tok = load_policy(cfg2)
    [out] = HFGenerator(model, tok).generate(
        [chat_ids(tok, [{"role": "user", "content": "hi"}])], "act", 4, 0.0, 1.0)
    assert len(out.ids) <= 4
    [row] = evaluate_suites(HFGenerator(model, tok), tok, cfg2, ["bfcl-base"])
    assert row["turns"] == 1
    trainable, _ = load_policy(cfg2, train=True)
    assert trainable.training



def test_warm_start_with_world_rows_adds_the_grounded_rehearse_rows(tmp_path):
    """``study.world_rows``: the rows of ``world_examples(world_tasks(cfg))`` join SFT."""
    import json

    from envace_lite.drills.world_rows import world_examples, world_tasks

    cfg = get_config("smoke", {"study.world_rows": 2, "warmstart.eval_first_turns": 0})
    world = world_tasks(cfg)
    expected = world_examples(world, cfg, load_policy(cfg)[1])
    run = warmstart(cfg, tmp_path / "ws", measure=False)
    summary = json.loads((run / "summary.json").read_text())
    extra = summary["world_rows"]
    assert extra["tasks"] == 2 and extra["act_rows"] == 0
    assert extra["rehearse_rows"] + extra["rows_too_long"] == len(expected) > 0
    assert summary["sft"]["steps"] == 1 and (run / CHECKPOINT / "config.json").exists()

# ---------------------------------------------------------------------------------------------
# Beyond the paper: memory transcripts and the Fig. 7 slip rows of the warm start
# ---------------------------------------------------------------------------------------------

def _drill_tasks(n=None):
    cfg = get_config("drills", {"warmstart.sft_share": 0.08})
    tasks = training_tasks(cfg, "sft")
    return cfg, tasks if n is None else tasks[:n]


def test_memory_transcript_is_what_a_ticket_memory_looks_like_at_test_time():
    from envace_lite.protocol import prompts
    from envace_lite.core.transcripts import approx_tokens, memory_transcript, task_transcripts
    cfg, tasks = _drill_tasks()
    task = next(t for t in tasks if t.id.startswith("lookup:"))
    order = "#" + task.id.split(":")[1]
    act, _ = task_transcripts(task, cfg, approx_tokens, True)
    mem = memory_transcript(act, task)
    call = assistant_text([ToolCall("get_order_details", {"order_id": order})])
    assert act.outputs[0] == call and mem.outputs == act.outputs and mem.glue == act.glue
    expected = prompts.memory_message(f"{prompts.CALLS_MEMORY_HEADER}\n{call.strip()}")["content"]
    assert mem.prompt[-1]["content"] == f"{act.prompt[-1]['content']}\n\n{expected}"
    assert mem.prompt[:-1] == act.prompt[:-1] and expected not in act.prompt[-1]["content"]
    # an ACT transcript that starts with a text answer has nothing to remember
    failed = copy.deepcopy(task)
    failed.grounding[0][0]["observation"]["error"] = True  # a gold call that got an error
    assert memory_transcript(act, failed) is None


def test_slip_example_is_the_real_error_of_the_id_without_its_hash():
    from envace_lite.core.transcripts import approx_tokens
    from envace_lite.drills.error_rows import slip_example
    cfg, tasks = _drill_tasks()
    task = next(t for t in tasks if t.id.startswith("lookup:"))
    ex = slip_example(task, cfg, approx_tokens, False)
    assert ex.call == {"name": "get_order_details", "arguments": {"order_id": task.id.split(":")[1]}}
    assert ex.observation == {"content": "Error: Order not found", "error": True,
                              "state_changed": False}
    assert ex.target == rehearsal_text("Error: Order not found")
    assert ex.grounding == "none"
    # the REHEARSE prompt ends with the slipped call, as the rollout would ask it
    assert task.id.split(":")[1] in ex.messages[-1]["content"]
    two_hop = next(t for t in tasks if t.id.startswith("two_hop:"))  # first call: find the user
    assert slip_example(two_hop, cfg, approx_tokens, True) is None


def test_build_transcripts_adds_memory_and_slip_rows_when_asked():
    from envace_lite.core.transcripts import build_transcripts
    cfg, tasks = _drill_tasks(12)
    plain = build_transcripts(tasks, cfg)
    cfg.warmstart.memory_share, cfg.study.error_rows = 1.0, True
    more = build_transcripts(tasks, cfg)
    calls_first = sum(1 for a in plain.act if a.outputs[0].lstrip().startswith("<tool_call>"))
    hashed = sum(1 for t in tasks if any(str(v).startswith("#") for v in
                                         t.grounding[0][0]["call"]["arguments"].values()))
    assert more.stats["memory_transcripts"] == calls_first == len(more.act) - len(plain.act)
    assert more.stats["slip_rows"] == hashed == len(more.rehearse) - len(plain.rehearse)
    assert hashed > 0 and more.stats["gold_call_errors"] == plain.stats["gold_call_errors"]
    # the gold's own rows are unchanged (a memory transcript follows its task's own; slip rows
    # come last); the counts are the gold's
    memory_open = "[Private rehearsal memory"
    assert [a for a in more.act if memory_open not in a.prompt[-1]["content"]] == plain.act
    assert more.rehearse[:len(plain.rehearse)] == plain.rehearse
    assert (more.stats["act_outputs"], more.stats["rehearse_examples"]) == (
        plain.stats["act_outputs"], plain.stats["rehearse_examples"])
    assert all(r.observation["error"] for r in more.rehearse[len(plain.rehearse):])


def test_world_rows_are_grounded_rehearse_rows_of_rl_drills():
    from envace_lite.drills.world_rows import world_examples, world_tasks
    cfg, sft = _drill_tasks()
    cfg.study.world_rows = 6
    world = world_tasks(cfg)
    rl_ids = [t.id for t in training_tasks(cfg, "rl")]
    assert len(world) == 6 and {t.id for t in world} <= set(rl_ids)
    assert not {t.id for t in world} & {t.id for t in sft}  # never an SFT task
    assert [t.id for t in world_tasks(cfg)] == [t.id for t in world]  # seeded draw
    cfg.run.seed = 1
    assert [t.id for t in world_tasks(cfg)] != [t.id for t in world]
    exs = world_examples(world, cfg)
    # one row per gold call, every one grounded, the target being that call's real result; a
    # task's first call has the shortest prompt, so its reference block is never trimmed and
    # holds that result verbatim
    assert len(exs) == sum(len(pairs) for t in world for pairs in t.grounding)
    for ex in exs:
        assert ex.grounding == "gold" and ex.target == rehearsal_text(
            ex.observation["content"])
    firsts = [next(ex for ex in exs if ex.task_id == t.id) for t in world]
    assert all(ex.observation["content"] in ex.messages[-1]["content"] for ex in firsts)
    look = next(t for t in world_tasks(get_config("drills", {"study.world_rows": 200}))
                if t.id.startswith("lookup:"))
    (row,) = world_examples([look], cfg)  # a lookup drill makes one call: its order's record
    assert (row.call["name"], row.call["arguments"]) == (
        "get_order_details", {"order_id": "#" + look.id.split(":")[1]})
    assert f'"order_id": "#{look.id.split(":")[1]}"' in row.observation["content"]
    cfg.study.world_rows = len(rl_ids) + 1
    with pytest.raises(ConfigError, match=f"has {len(rl_ids)} tasks; use at most {len(rl_ids)}"):
        world_tasks(cfg)


def test_warm_start_with_every_row_too_long_is_one_line(tmp_path, monkeypatch):
    """``warmstart.max_length`` below every row: one line naming the shortest row, exit 2 (TRL's
    SFTTrainer would stop on the empty dataset with a bare StopIteration)."""
    from typer.testing import CliRunner

    from envace_lite.cli.main import app
    from envace_lite.pipelines.sft import check_rows

    monkeypatch.setenv("ENVACE_RUNS", str(tmp_path))
    res = CliRunner().invoke(app, ["warmstart", "--profile", "smoke", "--set",
                                   "warmstart.max_length=10", "--set",
                                   "warmstart.eval_first_turns=0"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and "warmstart.max_length=10: all " in lines[0]
    assert "set warmstart.max_length >= " in lines[0]
    stats = {"rows_kept": 0, "rows_built": 3, "rows_too_long": 3, "shortest_row": 1500,
             "max_length": 10, "token_budget": 0}
    with pytest.raises(ValueError, match=r"all 3 SFT rows are longer \(the shortest has 1500"):
        check_rows(stats)
    with pytest.raises(ValueError, match="token_budget=5: no SFT row fits"):
        check_rows({**stats, "rows_too_long": 1, "token_budget": 5})
    check_rows({**stats, "rows_kept": 1})  # rows to train on: no error


def test_causal_attention_drops_only_masks_padded_at_the_end():
    from envace_lite.core.rows import padded_at_end_only
    from envace_lite.pipelines.sft import causal_attention

    assert padded_at_end_only(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not padded_at_end_only(torch.tensor([[0, 1, 1], [1, 1, 1]]))  # left padding
    assert not padded_at_end_only(torch.tensor([[1, 0, 1], [1, 1, 1]]))  # a hole
    assert not padded_at_end_only(torch.tensor([[0, 0, 0], [1, 1, 1]]))  # an empty row
    assert padded_at_end_only(torch.tensor([[0, 0, 0], [1, 1, 0]]), empty_rows=True)
    assert not padded_at_end_only(torch.tensor([[0, 0, 1], [1, 1, 0]]), empty_rows=True)
    model, _ = load_policy(get_config("smoke", {"model.hidden_size": 32, "model.num_layers": 1,
                                                "model.num_heads": 4,
                                                "model.intermediate_size": 64}))
    seen = []  # the mask the first decoder layer gets: a 4-D mask, or None (causal kernel)
    spy = model.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True)
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    end, left = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), torch.tensor([[0, 1, 1, 1], [1] * 4])
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=end).logits
        with causal_attention(model):
            fast = model(input_ids=ids, attention_mask=end).logits
            model(input_ids=ids, attention_mask=left)
        model(input_ids=ids, attention_mask=end)  # the hook is gone on exit
    spy.remove()
    assert [m is None for m in seen] == [False, True, False, False]

    class Headless(torch.nn.Module):  # a model that is its own backbone
        base_model_prefix = ""
        base_model = property(lambda self: self)

    with pytest.raises(ValueError, match="no backbone module"):
        with causal_attention(Headless()):
            pass
    assert torch.allclose(plain[end.bool()], fast[end.bool()], atol=1e-5)


def test_sft_losses_equal_with_and_without_the_padding_mask(tmp_path):
    from envace_lite.pipelines.sft import run_sft

    cfg = get_config("smoke", {"model.hidden_size": 32, "model.num_layers": 1,
                               "model.num_heads": 4, "model.intermediate_size": 64,
                               "warmstart.epochs": 1.0, "warmstart.batch_size": 4,
                               "warmstart.logging_steps": 1, "warmstart.max_steps": 2})
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(10, 5000, (n,), generator=g).tolist(),
             "completion_mask": [0] * (n // 2) + [1] * (n - n // 2)}
            for n in (6, 9, 14, 20, 7, 11, 16, 25)]
    got, masks = {}, {}
    for causal in (True, False):
        model, tok = load_policy(cfg, train=True)
        seen = []  # the mask the first decoder layer gets: None when the backbone had none
        spy = model.model.layers[0].register_forward_pre_hook(
            lambda m, a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True)
        out = run_sft(model, tok, rows, cfg, tmp_path / str(causal), causal=causal)
        spy.remove()
        got[causal], masks[causal] = [r["loss"] for r in out["log"]], seen
    assert masks[True] and all(m is None for m in masks[True])  # every batch: padded at the end
    assert masks[False] and all(m is not None for m in masks[False])
    assert out["steps"] == 2 and len(got[True]) == 2 and all(x > 0 for x in got[True])
    assert got[True] == pytest.approx(got[False], rel=1e-5)
