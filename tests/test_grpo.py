"""Tests of envace_lite.core.advantages and envace_lite.core.grpo: role-wise advantages, rows and weights,
the reference objective, and the TRL trainer.

Expected advantages are computed by hand in each test. The trainer tests use a tiny random Qwen3
(hidden 32, one layer, the real Qwen3 vocabulary) and hand-made trajectories built from real
token ids, so they need neither the rollout engine nor a generator.
"""
from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

from envace_lite.core.advantages import (
    flatten_outputs,
    loss_weights,
    output_logps,
    output_trajectories,
    rolewise_advantages,
    rolewise_grpo_loss,
    trajectory_advantages,
)
from envace_lite.config import get_config
from envace_lite.core.causal_forward import causal_layout, causal_layout_applies
from envace_lite.core.grpo import RoleWiseGRPOTrainer
from envace_lite.models.load import load_policy, qwen3_tokenizer
from envace_lite.core.rows import build_rows, collate_rows, output_lengths
from envace_lite.pipelines.train import grpo_args
from envace_lite.types import Output, Task, Trajectory

A, R = "act", "rehearse"


def close(got, want, tol=1e-6):
    return torch.allclose(got, torch.tensor(want, dtype=got.dtype), atol=tol, rtol=0)


# ---------------------------------------------------------------------------------------------
# rolewise_advantages: hand-computed cases
# ---------------------------------------------------------------------------------------------
def test_unequal_turn_counts_weigh_outputs_not_trajectories():
    # task x, K=2: trajectory 0 (R=1) has 3 ACT turns and 2 REHEARSE calls, trajectory 1 (R=0)
    # has 1 ACT turn and 1 call. μ_act = (1+1+1+0)/4 = 0.75; μ_reh = (1+1+0)/3 = 2/3.
    rewards = [1, 1, 1, 1, 1, 0, 0]
    roles = [A, R, A, R, A, A, R]
    adv = rolewise_advantages(rewards, ["x"] * 7, roles)
    third = 1 / 3
    assert close(adv, [0.25, third, 0.25, third, 0.25, -0.75, -2 * third])
    # a trajectory-level baseline (0.5) would have given ±0.5: the output count matters
    assert not close(adv, [0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -0.5])


def test_singleton_group_both_settings():
    # ACT has two outputs (0.8, 0.2 → μ 0.5); REHEARSE has one (0.8)
    rewards, roles = [0.8, 0.8, 0.2], [A, R, A]
    assert close(rolewise_advantages(rewards, ["y"] * 3, roles), [0.3, 0.0, -0.3])
    assert close(rolewise_advantages(rewards, ["y"] * 3, roles, singleton="none"),
                 [0.3, 0.8, -0.3])


def test_all_equal_rewards_give_zero_everywhere():
    adv = rolewise_advantages([0.4] * 6, ["x", "x", "x", "y", "y", "y"], [A, R, A, A, R, R])
    assert torch.equal(adv, torch.zeros(6))


def test_padding_entries_get_zero_and_do_not_count():
    # two padding entries with absurd rewards; the real ACT group is (1, 0) → μ 0.5
    rewards = [1.0, 99.0, 0.0, -99.0]
    valid = torch.tensor([True, False, True, False])
    adv = rolewise_advantages(rewards, ["x"] * 4, [A, A, A, R], valid)
    assert close(adv, [0.5, 0.0, -0.5, 0.0])


def task_(tid: str) -> Task:
    return Task(tid, "toy", "train", [], [], [[]], [[]], [[]], [[]])


def out_(role: str, empty: bool = False) -> Output:
    return Output(role, 0, [1], [2], "", empty=empty)


def test_masked_judge_failure_and_empty_penalty_through_flatten_outputs():
    # trajectory 0: R=1, outputs act, rehearse, act(empty → R - 0.1 = 0.9; it was REPLACED by
    # -0.1 before: the official EnvACE reference subtracts the penalty from R); trajectory 1:
    # R=0.5 with act, rehearse; trajectory 2: the judge failed (reward None) → masked.
    t0 = Trajectory(task_("x"), 0, outputs=[out_(A), out_(R), out_(A, empty=True)], reward=1.0)
    t1 = Trajectory(task_("x"), 1, outputs=[out_(A), out_(R)], reward=0.5)
    t2 = Trajectory(task_("x"), 2, outputs=[out_(A), out_(R)], reward=None, reward_valid=False)
    rewards, task_ids, roles, valid = flatten_outputs([t0, t1, t2], penalty=-0.1)
    assert close(rewards, [1.0, 1.0, 0.9, 0.5, 0.5, 0.0, 0.0])
    assert valid.tolist() == [True] * 5 + [False] * 2
    assert roles == [A, R, A, A, R, A, R] and set(task_ids) == {("toy", "x")}
    adv = rolewise_advantages(rewards, task_ids, roles, valid)
    # μ_act = (1 + 0.9 + 0.5)/3 = 0.8; μ_reh = (1 + 0.5)/2 = 0.75
    assert close(adv, [0.2, 0.25, 0.1, -0.3, -0.25, 0.0, 0.0])


def test_two_tasks_interleaved_in_one_batch():
    # a and b alternate; each (task, role) group is centred on its own
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.3, 0.5, 0.7]
    tasks = ["a", "b", "a", "b", "a", "b", "a", "b"]
    roles = [A, A, A, A, R, R, R, R]
    adv = rolewise_advantages(rewards, tasks, roles)
    # a/act (1, 0) μ .5; b/act (0, 1) μ .5; a/reh (.5, .5) μ .5; b/reh (.3, .7) μ .5
    assert close(adv, [0.5, -0.5, -0.5, 0.5, 0.0, -0.2, 0.0, 0.2])


def test_scale_std_divides_by_the_unbiased_group_std():
    # (1, 0, 0): μ 1/3, unbiased std sqrt(((2/3)² + 2(1/3)²)/2) = sqrt(1/3)
    adv = rolewise_advantages([1.0, 0.0, 0.0, 0.2], ["x"] * 4, [A, A, A, R], scale_std=True)
    s = (1 / 3) ** 0.5
    assert close(adv, [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0], tol=1e-5)


def test_trajectory_baseline_is_one_mean_over_trajectories():
    # task x, K=2: trajectory 0 (R=1) has 3 ACT outputs, trajectory 1 (R=0) has 1.
    # plain GRPO: μ_x = (1 + 0)/2 = 0.5 → +0.5 for each output of τ0, -0.5 for τ1;
    # the output-weighted baseline: μ = (1+1+1+0)/4 = 0.75 → +0.25 / -0.75
    rewards, traj = [1.0, 1.0, 1.0, 0.0], [0, 0, 0, 1]
    returns, tasks = [1.0, 1.0, 1.0, 0.0], ["x"] * 4
    assert close(trajectory_advantages(rewards, traj, returns, tasks), [0.5, 0.5, 0.5, -0.5])
    assert close(rolewise_advantages(rewards, tasks, [A] * 4), [0.25, 0.25, 0.25, -0.75])
    # an empty output of τ0 (reward 1 - 0.1 = 0.9) is measured against the same μ_x = 0.5;
    # an invalid output gets 0, and a trajectory with no valid output leaves the mean
    got = trajectory_advantages([1.0, 0.9, 0.0, 0.3], [0, 0, 1, 2], [1.0, 1.0, 0.0, 0.3],
                                ["x"] * 4, [True, True, True, False])
    assert close(got, [0.5, 0.4, -0.5, 0.0])
    # a task with one trajectory: μ = R (A = 0) or, with singleton="none", μ = 0
    assert close(trajectory_advantages([0.7], [0], [0.7], ["y"]), [0.0])
    assert close(trajectory_advantages([0.7], [0], [0.7], ["y"], singleton="none"), [0.7])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="one entry per output"):
        rolewise_advantages([1.0, 0.0], ["x"], [A, A])
    with pytest.raises(ValueError, match="roles"):
        rolewise_advantages([1.0], ["x"], ["user"])


# ---------------------------------------------------------------------------------------------
# Rows and weights
# ---------------------------------------------------------------------------------------------
def test_loss_weights_by_hand():
    lengths = torch.tensor([2, 4, 3, 0])
    trained = torch.tensor([True, True, False, True])
    # trained non-empty outputs: lengths 2 and 4 → T = 6, M = 2
    assert loss_weights(lengths, trained, "token_mean").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert loss_weights(lengths, trained, "output_mean").tolist() == [1.5, 0.75, 0.0, 0.0]
    # T and M across ranks: T = 12, M = 3 → 12/(3·2), 12/(3·4)
    assert loss_weights(lengths, trained, "output_mean", 12, 3).tolist() == [2.0, 1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


def make_traj(tok, task: Task, index: int, turns, reward, valid: bool = True) -> Trajectory:
    """A packed trajectory from texts: turns = [(act_text, [rehearse_text, ...]), ...]."""
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    prompt = enc(f"<|im_start|>user\nsolve {task.id}<|im_end|>\n<|im_start|>assistant\n")
    ids, mask, outputs, spans = list(prompt), [0] * len(prompt), [], []
    for t, (act, rehearsals) in enumerate(turns):
        a = enc(act) + [eot]
        outputs.append(Output(A, t, list(ids), a, act, parse_kind="calls", empty=not act))
        spans.append((len(ids), len(ids) + len(a)))
        ids, mask = ids + a, mask + [1] * len(a)
        for j, r in enumerate(rehearsals):
            rp = enc(f"<|im_start|>system\nRehearse.<|im_end|>\n<|im_start|>user\n{act}"
                     f"<|im_end|>\n<|im_start|>assistant\n")
            outputs.append(Output(R, t, rp, enc(r) + [eot], r, call_index=j, parse_kind="ok"))
        glue = enc("\n<|im_start|>user\n<tool_response>" + "|".join(rehearsals)
                   + "</tool_response><|im_end|>\n<|im_start|>assistant\n")
        ids, mask = ids + glue, mask + [0] * len(glue)
    return Trajectory(task, index, ids, mask, len(prompt), outputs, reward=reward,
                      reward_valid=valid, act_spans=spans, turns=len(turns))


def test_packed_rows_own_exactly_the_act_tokens(tok):
    tr = make_traj(tok, task_("x"), 0, [("call a", ["res 1", "res 2"]), ("done", [])], 1.0)
    packed, per_output = build_rows([tr]), build_rows([tr], "per_output")
    assert packed.role == [0, 1, 1] and per_output.role == [0, 1, 1, 0]
    acts = [o for o in tr.outputs if o.role == A]
    owner = packed.owner[0]
    assert [k for k in owner if k >= 0] == [0] * len(acts[0].ids) + [3] * len(acts[1].ids)
    assert sum(len(c) for c in packed.completion_ids) < sum(
        len(p) + len(c) for p, c in zip(per_output.prompt_ids, per_output.completion_ids))
    assert output_lengths(packed, 4).tolist() == [len(o.ids) for o in tr.outputs]
    batch = collate_rows(packed, torch.tensor([0.5, -1.0, 2.0, 0.25]), torch.ones(4),
                         tok.pad_token_id, n_rows=4)
    assert batch["row_role"].tolist() == [0, 1, 1, -1]
    assert batch["advantages"].shape == batch["tool_mask"].shape
    assert float(batch["tool_mask"][0].sum()) == len(acts[0].ids) + len(acts[1].ids)
    assert float(batch["advantages"][0].sum()) == 0.5 * len(acts[0].ids) + 0.25 * len(acts[1].ids)
    assert float(batch["tool_mask"][3].abs().sum()) == 0.0  # the padding row
    bad = make_traj(tok, task_("x"), 0, [("call a", [])], 1.0)
    bad.act_ids[bad.act_spans[0][0]] += 1
    with pytest.raises(ValueError, match="verbatim"):
        build_rows([bad])


# ---------------------------------------------------------------------------------------------
# The trainer on the tiny model
# ---------------------------------------------------------------------------------------------
TINY = {"model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 4,
        "model.intermediate_size": 64}


def tiny_trainer(tmp_path, trajs_by_task, *, mode="shared", aggregation="output_mean", ga=1,
                 lora_r=0, beta=0.0, **over):
    """A trainer whose rollouts are ``trajs_by_task`` ({task id: K trajectories})."""
    tasks = [ts[0].task for ts in trajs_by_task.values()]
    k = len(tasks and trajs_by_task[tasks[0].id])
    cfg = get_config("smoke", {**TINY, "grpo.mode": mode, "grpo.aggregation": aggregation,
                               "grpo.gradient_accumulation_steps": ga, "grpo.beta": beta,
                               "grpo.num_generations": k, "grpo.prompts_per_step": len(tasks),
                               "model.lora_r": lora_r, "model.lora_target_modules": ["q_proj"],
                               **over})
    model, tokenizer = load_policy(cfg, train=True)
    trainer = RoleWiseGRPOTrainer(
        model, tokenizer, tasks, cfg, grpo_args(cfg, tmp_path),
        rollout_fn=lambda ts, k_, step: [tr for t in ts for tr in trajs_by_task[t.id]])
    trainer.current_gradient_accumulation_steps = ga
    inputs = [{"task_index": i} for i in range(len(tasks)) for _ in range(k)]
    return trainer, model, inputs


def reference_loss(models, trajs, rec, aggregation, *, per_role=False, beta=0.0, ref=None):
    """``advantages.rolewise_grpo_loss`` on one unpadded row per output; ``models[role]`` scores
    each role's outputs, ``ref`` (a model) gives the KL reference log-probs."""
    flat = [o for tr in trajs for o in tr.outputs]
    logps = [output_logps(models[o.role], o.prompt_ids, o.ids) if o.ids
             else torch.zeros(0, dtype=torch.float64) for o in flat]
    ref_logps = None
    if beta:
        with torch.no_grad():
            ref_logps = [output_logps(ref, o.prompt_ids, o.ids) if o.ids
                         else torch.zeros(0, dtype=torch.float64) for o in flat]
    return rolewise_grpo_loss(logps, rec.advantages, [o.role for o in flat], rec.trained,
                              aggregation=aggregation, per_role=per_role, beta=beta,
                              ref_logps=ref_logps)


def test_rolewise_grpo_loss_by_hand():
    # two ACT outputs (A = +1, lengths 2 and 1) and one REHEARSE output (A = -0.5, length 1);
    # log-probs at the rollout policy (ratio 1): each token's surrogate loss is -A.
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5]), torch.tensor([-3.0])]
    adv, roles = torch.tensor([1.0, 1.0, -0.5]), [A, A, R]
    trained = torch.tensor([True, True, True])
    # output_mean: mean over outputs of token means: (-1 - 1 + 0.5)/3 = -0.5
    assert abs(float(rolewise_grpo_loss(lp, adv, roles, trained)) + 0.5) < 1e-12
    # token_mean: (-1 - 1 - 1 + 0.5)/4 = -0.625
    assert abs(float(rolewise_grpo_loss(lp, adv, roles, trained, aggregation="token_mean"))
               + 0.625) < 1e-12
    # per_role: ACT (-1 + -1)/2 = -1, REHEARSE 0.5 → -0.5 (output_mean)
    assert abs(float(rolewise_grpo_loss(lp, adv, roles, trained, per_role=True)) + 0.5) < 1e-12
    # KL: reference log-prob q = lp + log 2 on the REHEARSE token only: exp(log 2) - log 2 - 1
    ref = [lp[0], lp[1], lp[2] + torch.log(torch.tensor(2.0))]
    kl = 2 - float(torch.log(torch.tensor(2.0))) - 1
    got = rolewise_grpo_loss(lp, adv, roles, trained, beta=0.1, ref_logps=ref)
    assert abs(float(got) - (-0.5 + 0.1 * kl / 3)) < 1e-7
    # the clip: old log-probs 0.5 lower → ratio e^0.5 ≈ 1.65; with A > 0 the clipped 1.2 wins
    old = [t - 0.5 for t in lp]
    got = rolewise_grpo_loss(lp[:1], adv[:1], roles[:1], trained[:1], old_logps=old[:1])
    assert abs(float(got) + 1.2) < 1e-7
    with pytest.raises(ValueError, match="ref_logps"):
        rolewise_grpo_loss(lp, adv, roles, trained, beta=0.1)


def six_trajs(tok):
    x, y = task_("x"), task_("y")
    return {
        "x": [make_traj(tok, x, 0, [("cd docs", ["ok"])], 1.0),
            make_traj(tok, x, 1, [("ls", ["a b", "c"]), ("cat a", ["text of a"])], 0.25),
            make_traj(tok, x, 2, [("mkdir t", ["done"]), ("mv a t", ["moved"]), ("", [])], 0.5)],
        "y": [make_traj(tok, y, 0, [("pwd", ["/home"])], 0.75),
            make_traj(tok, y, 1, [("rm b", ["removed"])], None, valid=False),  # judge failed
            make_traj(tok, y, 2, [("echo hi", ["hi"])], 0.0)],
    }


def _nudge(model, seed):
    """Move the trainable weights off the frozen copy, so that the KL term is not zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("mode", ["shared", "per_role"])
@pytest.mark.parametrize("aggregation", ["output_mean", "token_mean"])
@pytest.mark.parametrize("causal_rows", [True, False])
def test_trainer_loss_and_gradient_equal_rolewise_grpo_loss(tok, tmp_path, mode, aggregation,
                                                            causal_rows):
    trajs = six_trajs(tok)
    beta = 0.04
    trainer, model, inputs = tiny_trainer(tmp_path, trajs, mode=mode, aggregation=aggregation,
                                          ga=2, beta=beta)
    trainer.causal_rows = causal_rows  # both bucket layouts (and the KL reference forward)
    _nudge(model, 1)
    models = {A: model, R: model}
    if mode == "per_role":
        _nudge(trainer.rehearse_model, 2)
        models[R] = trainer.rehearse_model
    params = [p for m in {id(m): m for m in models.values()}.values()
              for p in m.parameters() if p.requires_grad]

    def grad():
        return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                          for p in params])

    batch = trainer._generate_and_score_completions(inputs)
    rec = trainer.last_record
    for p in params:
        p.grad = None
    got_loss = 0.0
    for chunk in split_tensor_dict(shuffle_sequence_dict(batch), 2):  # two accumulation steps
        loss = trainer.compute_loss(model, chunk)
        loss.backward()
        got_loss += float(loss.detach())
    got = grad()
    for p in params:
        p.grad = None
    want_loss = reference_loss(models, [t for ts in trajs.values() for t in ts], rec, aggregation,
                               per_role=mode == "per_role", beta=beta, ref=trainer.frozen_model)
    want_loss.backward()
    want = grad()
    assert want.norm() > 0 and abs(float(want_loss)) > 0
    assert abs(got_loss - float(want_loss)) < 1e-6
    assert float((got - want).abs().max() / want.norm()) < 1e-5


def test_causal_layout_by_hand():
    # TRL's layout, P = 3, C = 3: row 0 prompt [5, 6] completion [7]; row 1 prompt [1, 2, 3]
    # completion [4, 8, 9]; 0 is padding
    ids = torch.tensor([[0, 5, 6, 7, 0, 0], [1, 2, 3, 4, 8, 9]])
    got, labels = causal_layout(ids, 3, torch.tensor([2, 3]), torch.tensor([1, 3]), pad_id=0)
    assert got.tolist() == [[5, 6, 7, 0, 0, 0], [1, 2, 3, 4, 8, 9]]
    assert labels.tolist() == [[-100, -100, 7, -100, -100, -100], [-100, -100, -100, 4, 8, 9]]
    # the layout it assumes: prompts zeros then ones (at least one), completions ones then zeros
    pm, cm = torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([[1, 0, 0], [1, 1, 1]])
    assert causal_layout_applies(pm, cm)
    assert not causal_layout_applies(torch.tensor([[0, 0, 0], [1, 1, 1]]), cm)  # empty prompt
    assert not causal_layout_applies(torch.tensor([[1, 0, 1], [1, 1, 1]]), cm)  # a hole
    assert not causal_layout_applies(pm, torch.tensor([[0, 1, 0], [1, 1, 1]]))  # a hole


def _logps(trainer, model, batch, **kw):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    return trainer._get_per_token_logps_and_entropies(model, ids, att,
                                                      batch["completion_ids"].shape[1], **kw)


def test_causal_rows_logps_equal_trl_layout_and_zero_past_each_completion(tok, tmp_path,
                                                                         monkeypatch):
    trainer, model, inputs = tiny_trainer(tmp_path, six_trajs(tok), ga=1)
    _nudge(model, 3)
    batch = trainer._generate_and_score_completions(inputs)
    calls = []
    inner = trainer._causal_bucket
    monkeypatch.setattr(trainer, "_causal_bucket",
                        lambda *a, **k: calls.append(len(a[1])) or inner(*a, **k))
    out = {}
    for causal, size in ((True, None), (True, 1), (False, None)):
        trainer.causal_rows = causal
        out[causal, size] = _logps(trainer, model, batch, batch_size=size, compute_entropy=True)
    # every row went through the causal path in both causal runs, none in TRL's layout
    assert sum(calls) == 2 * len(batch["row_role"])
    cm = batch["completion_mask"].bool()
    for key in ((True, None), (True, 1)):
        for k in (0, 1):  # log-probs, entropies: equal on real tokens, 0 past each completion
            assert torch.allclose(out[key][k][cm], out[False, None][k][cm], atol=1e-5)
            assert float(out[key][k][~cm].abs().sum()) == 0.0
    assert float(out[True, None][0][cm].abs().min()) > 0  # real tokens were scored
    # a batch outside the layout it assumes (a hole in a completion's mask) takes TRL's layout
    calls.clear()
    trainer.causal_rows = True
    holed = dict(batch, completion_mask=batch["completion_mask"].clone())
    holed["completion_mask"][0, 1] = 0
    lp, _, _ = _logps(trainer, model, holed)
    assert calls == [] and lp.shape == out[False, None][0].shape
    # a model on another attention implementation than SDPA takes TRL's layout too
    monkeypatch.setattr(model.config, "_attn_implementation", "eager")
    lp, _, _ = _logps(trainer, model, batch)
    assert calls == [] and torch.allclose(lp[cm], out[False, None][0][cm], atol=1e-5)


def test_packed_rows_count_and_padding(tok, tmp_path):
    trainer, _model, inputs = tiny_trainer(tmp_path, six_trajs(tok), ga=2)
    trainer._generate_and_score_completions(inputs)
    rec = trainer.last_record
    # x: 2 + 4 + 3 rows; y: 2 + 2 + 2, less the 2 of the masked trajectory → 13, padded to 14
    assert rec.rows == 13 and rec.pad_rows == 1
    assert rec.advantages.abs().sum() > 0


def test_act_only_trajectory_baseline_in_the_trainer(tok, tmp_path):
    # task x: τ0 R=1 with two ACT turns, τ1 R=0 with one. Only ACT is trained (act_only).
    x = task_("x")
    trajs = {"x": [make_traj(tok, x, 0, [("ls", ["a"]), ("cat a", ["text"])], 1.0),
                   make_traj(tok, x, 1, [("pwd", ["/"])], 0.0)]}
    for baseline, want in (("trajectories", [0.5, 0.0, 0.5, 0.0, -0.5, 0.0]),
                           ("outputs", [1 / 3, 0.0, 1 / 3, 0.0, -2 / 3, 0.0])):
        trainer, _model, inputs = tiny_trainer(tmp_path / baseline, trajs, mode="act_only_real",
                                               **{"grpo.act_only_baseline": baseline})
        trainer._generate_and_score_completions(inputs)
        # outputs: act, rehearse, act, rehearse (τ0), act, rehearse (τ1); REHEARSE untrained → 0
        assert close(trainer.last_record.advantages, want)
    keys, returns = output_trajectories(trajs["x"])
    assert keys == [("toy", "x", 0)] * 4 + [("toy", "x", 1)] * 2
    assert returns.tolist() == [1.0] * 4 + [0.0] * 2


def rehearse_only(batch):
    """The REHEARSE rows of a trainer batch (a batch with no ACT row at all)."""
    keep = batch["row_role"] == 1
    n = batch["row_role"].shape[0]
    sub = {k: (v[keep] if v.dim() > 0 and v.shape[0] == n else v) for k, v in batch.items()}
    sub["num_items_act"] = torch.tensor(0.0)
    return sub


def one_step(trainer, model, batch):
    trainer.create_optimizer()
    model.zero_grad()
    trainer.compute_loss(model, batch).backward()
    trainer._clip_grad_norm(model)
    trainer.optimizer.step()


def two_trajs(tok):
    x = task_("x")
    return {"x": [make_traj(tok, x, 0, [("cd docs", ["ok", "fine"])], 1.0),
                make_traj(tok, x, 1, [("ls", ["nothing here"])], 0.0)]}


@pytest.mark.parametrize("lora_r", [0, 4])
def test_per_role_rehearse_batch_leaves_the_act_policy_bitwise_unchanged(tok, tmp_path, lora_r):
    trainer, model, inputs = tiny_trainer(tmp_path, two_trajs(tok), mode="per_role",
                                          lora_r=lora_r)
    batch = rehearse_only(trainer._generate_and_score_completions(inputs))
    assert batch["row_role"].tolist() == [1, 1, 1] and batch["advantages"].abs().sum() > 0
    act = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    reh = {n: p.detach().clone() for n, p in trainer.rehearse_model.named_parameters()
           if p.requires_grad}
    assert act.keys() == reh.keys() and all(torch.equal(act[n], reh[n]) for n in act)  # same init
    one_step(trainer, model, batch)
    assert all(torch.equal(p, act[n]) for n, p in model.named_parameters() if p.requires_grad)
    assert any(not torch.equal(p, reh[n]) for n, p in trainer.rehearse_model.named_parameters()
               if p.requires_grad)
    assert trainer.role_grad_norms["act"] == 0.0 < trainer.role_grad_norms["rehearse"]


def test_shared_rehearse_batch_changes_the_act_prompt_logits(tok, tmp_path):
    trajs = two_trajs(tok)
    trainer, model, inputs = tiny_trainer(tmp_path, trajs, beta=1e-4)
    batch = rehearse_only(trainer._generate_and_score_completions(inputs))
    act_prompt = torch.tensor([next(iter(trajs.values()))[0].act_ids])
    with torch.no_grad():
        before = model(input_ids=act_prompt).logits
    one_step(trainer, model, batch)
    with torch.no_grad():
        after = model(input_ids=act_prompt).logits
    assert float((after - before).abs().max()) > 0


def test_per_role_checkpoint_restores_the_rehearse_policy(tok, tmp_path):
    trainer, model, _ = tiny_trainer(tmp_path / "a", two_trajs(tok), mode="per_role", lora_r=4)
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trained = [p for p in trainer.rehearse_model.parameters() if p.requires_grad]
    with torch.no_grad():
        for p in trained:
            p.add_(0.5)
    trainer.state.global_step = 1
    trainer._save_checkpoint(model, None)
    fresh, _, _ = tiny_trainer(tmp_path / "b", two_trajs(tok), mode="per_role", lora_r=4)
    again = [p for p in fresh.rehearse_model.parameters() if p.requires_grad]
    assert not any(torch.equal(a, b) for a, b in zip(trained, again))
    fresh._load_from_checkpoint(str(tmp_path / "a" / "checkpoint-1"))
    assert all(torch.equal(a, b) for a, b in zip(trained, again))


@pytest.mark.parametrize("control", ["none", "shuffle"])
def test_score_applies_the_reward_control_after_the_judge(tok, tmp_path, monkeypatch, control):
    # the judge is stubbed to give task x the rewards 1, 0.25, 0.5 and task y 0.75, (masked), 0;
    # "shuffle" must then permute them inside each task, seeded run.seed * 100_003 + step
    import envace_lite.core.rewards as rewards_mod
    from envace_lite.drills.reward_control import shuffle_rewards

    trajs = six_trajs(tok)
    judged = {("x", 0): 1.0, ("x", 1): 0.25, ("x", 2): 0.5, ("y", 0): 0.75, ("y", 2): 0.0}

    def fake_judge(ts, judge):
        for t in ts:
            t.reward = judged.get((t.task.id, t.index))
            t.reward_valid = t.reward is not None

    monkeypatch.setattr(rewards_mod, "score_trajectories", fake_judge)
    trainer, _model, _inputs = tiny_trainer(tmp_path, trajs, **{"study.reward_control": control})
    flat = [t for ts in trajs.values() for t in ts]
    for t in flat:
        t.reward = -1.0  # stale: the judge must overwrite every one
    trainer._score(flat, step=3)
    got = {(t.task.id, t.index): t.reward for t in flat}
    if control == "none":
        assert got == {**judged, ("y", 1): None}
        return
    want = [t for ts in six_trajs(tok).values() for t in ts]
    fake_judge(want, None)
    shuffle_rewards(want, trainer.cfg.run.seed * 100_003 + 3)
    assert got == {(t.task.id, t.index): t.reward for t in want}
    assert got[("y", 1)] is None
    assert got != {**judged, ("y", 1): None}  # this seed moves 3 of the 5 valid rewards
    assert sorted(got[("x", i)] for i in range(3)) == [0.25, 0.5, 1.0]
    assert sorted(got[("y", i)] for i in (0, 2)) == [0.0, 0.75]
    assert all(t.reward_details["shuffled_from"] == judged[(t.task.id, t.index)]
               for t in flat if t.reward_valid)
