"""Role-wise GRPO's objective (paper §2.2): advantages per (task, role), loss weights, the loss.

This module is the algorithm, as tensors; ``grpo.py`` is how TRL's trainer runs it.

* ``flatten_outputs`` lists every output y_{i,m} of a batch of scored trajectories once, with its
  reward (the trajectory's R_i after the per-output empty penalty), task and role.
* ``rolewise_advantages``: A_{i,m} = R_i − μ_{x,r}, μ_{x,r} the mean reward over the outputs of
  role r for task x (paper Eq. 4–5).
* ``loss_weights``: the per-token weight that makes TRL's ``dapo`` token sum equal the chosen
  aggregation (``output_mean``: the mean over outputs of each output's token mean;
  ``token_mean``: the plain token mean).
* ``rolewise_grpo_loss``: the objective itself, written out on one log-prob tensor per output:
  PPO's clipped surrogate, TRL's KL estimator with weight β, and the aggregation. The trainer
  computes the same number on packed, padded rows; ``tests/test_grpo.py`` checks the two agree
  (loss within 1e-6, gradient within 1e-5) for ``shared``, ``per_role``, ``output_mean`` and
  ``token_mean``. See ``docs/design.md``, "The role-wise GRPO objective".
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from envace_lite.progress import get_logger
from envace_lite.types import AGGREGATIONS, ROLES, Trajectory

log = get_logger(__name__)


def rolewise_advantages(rewards: torch.Tensor | Sequence[float], task_ids: Sequence[Hashable],
                        roles: Sequence[str], valid: torch.Tensor | Sequence[bool] | None = None, *,
                        singleton: str = "self", scale_std: bool = False,
                        eps: float = 1e-6) -> torch.Tensor:
    """A_{i,m} = R_i − μ_{x,r}: role-wise GRPO advantages, one per output (paper §2.2).

    The group G_{x,r} holds every valid output of role r for task x, across the task's K
    trajectories; μ_{x,r} is the mean reward over those *outputs* (not trajectories), so a longer
    trajectory weighs more. Mean-only by default, as in the paper's equations.

    ==========  =========  =====================================================================
    argument    shape      meaning
    ==========  =========  =====================================================================
    rewards     (N,)       the output's reward: its trajectory's R_i after any per-output penalty
    task_ids    N          hashable task keys x
    roles       N          ``"act"`` or ``"rehearse"``
    valid       (N,) bool  False: padding or a masked judge failure; A = 0, not in any mean
    returns     (N,)       A, float, same dtype as ``rewards`` (float32 for lists)
    ==========  =========  =====================================================================

    Args:
        singleton: a group with one valid output. ``"self"``: μ = R, so A = 0 (the paper's formula,
            the default). ``"none"``: no baseline, A = R (the reference code).
        scale_std: divide each group's centred rewards by the group's std (unbiased, as TRL and
            verl compute it) + ``eps``. Off by default (paper: mean-only).
        eps: added to the std when ``scale_std``.

    Raises:
        ValueError: on mismatched lengths, an unknown role or an unknown ``singleton``.
    """
    r = torch.as_tensor(rewards)
    r = r.float() if not torch.is_floating_point(r) else r
    n = r.shape[0]
    v = torch.ones(n, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    if len(task_ids) != n or len(roles) != n or v.shape[0] != n:
        raise ValueError(f"rewards ({n}), task_ids ({len(task_ids)}), roles ({len(roles)}) and "
                         f"valid ({v.shape[0]}) must have one entry per output")
    if singleton not in ("self", "none"):
        raise ValueError(f"singleton={singleton!r}: use 'self' (paper, A=0) or 'none' (A=R)")
    groups: dict[tuple[Hashable, str], list[int]] = defaultdict(list)
    for i, (task, role) in enumerate(zip(task_ids, roles)):
        if role not in ROLES:
            raise ValueError(f"roles[{i}]={role!r}: expected one of {ROLES}")
        if v[i]:
            groups[(task, role)].append(i)
    adv = torch.zeros_like(r)
    for idx in groups.values():
        g = r[idx]
        if len(idx) == 1:
            adv[idx] = 0.0 if singleton == "self" else g
            continue
        centred = g - g.mean()
        adv[idx] = centred / (g.std() + eps) if scale_std else centred
    return adv


def flatten_outputs(trajs: Sequence[Trajectory], penalty: float
                    ) -> tuple[torch.Tensor, list[tuple[str, str]], list[str], torch.Tensor]:
    """One entry per output, in trajectory order then generation order.

    Args:
        trajs: scored trajectories (``reward`` set by ``rewards.score_trajectories``).
        penalty: ``cfg.grpo.empty_output_penalty``; an empty output gets R_i − |penalty|
            (``rewards.output_rewards``), applied before the baseline.

    Returns:
        ``(rewards (N,), task_ids N × (suite, id), roles N, valid (N,) bool)``. ``valid`` is
        ``rewards.output_valid``: False for every output of a judge-failed trajectory (reward 0
        placeholder) and for REHEARSE outputs of the frozen simulator. A trajectory whose reward
        is NaN, infinite or past ``rewards.REWARD_LIMIT`` (set by anything but
        ``score_trajectories``, which refuses one) is masked the same way, with a logged
        error: a NaN in a group would make every advantage of the group NaN.
    """
    from envace_lite.core.rewards import output_rewards, output_valid, usable_reward

    rewards, task_ids, roles, valid = [], [], [], []
    for traj in trajs:
        if traj.reward_valid and traj.reward is not None and not usable_reward(traj.reward):
            log.error("%s #%d: reward %r is not finite in float32 (|R| past REWARD_LIMIT); its "
                      "outputs are masked (zero advantage, out of the loss)", traj.task.id,
                      traj.index, traj.reward)
            rewards += [0.0] * len(traj.outputs)
            valid += [False] * len(traj.outputs)
        else:
            rewards += output_rewards(traj, penalty)
            valid += output_valid(traj)
        task_ids += [(traj.task.suite, traj.task.id)] * len(traj.outputs)
        roles += [o.role for o in traj.outputs]
    return (torch.tensor(rewards, dtype=torch.float32), task_ids, roles,
            torch.tensor(valid, dtype=torch.bool))


def output_trajectories(trajs: Sequence[Trajectory]) -> tuple[list[tuple[str, str, int]],
                                                             torch.Tensor]:
    """Each output's trajectory, in ``flatten_outputs`` order: ``(keys N, returns (N,))``.

    ``keys[o]`` is ``(suite, task id, trajectory index)``; ``returns[o]`` is that trajectory's
    reward R_i (0.0 for a judge failure, which ``flatten_outputs`` marks invalid anyway).
    """
    keys, returns = [], []
    for traj in trajs:
        n = len(traj.outputs)
        keys += [(traj.task.suite, traj.task.id, traj.index)] * n
        r = float(traj.reward or 0.0)
        returns += [r if math.isfinite(r) else 0.0] * n  # flatten_outputs masks it anyway
    return keys, torch.tensor(returns, dtype=torch.float32)


def trajectory_advantages(rewards: torch.Tensor | Sequence[float],
                          trajectory_ids: Sequence[Hashable],
                          returns: torch.Tensor | Sequence[float],
                          task_ids: Sequence[Hashable],
                          valid: torch.Tensor | Sequence[bool] | None = None, *,
                          singleton: str = "self", scale_std: bool = False,
                          eps: float = 1e-6) -> torch.Tensor:
    """Plain GRPO: A_{i,m} = r_{i,m} − μ_x, μ_x one mean over the task's *trajectories*.

    μ_x is the mean of R_i over the distinct trajectories of task x that have a valid output,
    each counted once however many outputs it has (GRPO's group of K completions). Every output
    of trajectory i then gets its own reward r_{i,m} (R_i, or R_i − |p| when empty) minus μ_x.
    The ``act_only`` ablation's ``grpo.act_only_baseline="trajectories"``; ``rolewise_advantages``
    is the output-weighted default.

    ==============  =========  ============================================================
    argument        shape      meaning
    ==============  =========  ============================================================
    rewards         (N,)       the output's reward (``flatten_outputs``)
    trajectory_ids  N          the output's trajectory key (``output_trajectories``)
    returns         (N,)       the output's trajectory reward R_i
    task_ids        N          hashable task keys x
    valid           (N,) bool  False: not trained; A = 0, its trajectory not counted for it
    returns         (N,)       A, float
    ==============  =========  ============================================================

    Args:
        singleton: a task with one valid trajectory: ``"self"`` (μ = R_i), ``"none"`` (μ = 0).
        scale_std: divide by the std (unbiased) of the task's trajectory rewards + ``eps``.

    Raises:
        ValueError: on mismatched lengths or an unknown ``singleton``.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    ret = torch.as_tensor(returns, dtype=torch.float32)
    n = r.shape[0]
    v = torch.ones(n, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    if not (len(trajectory_ids) == len(task_ids) == ret.shape[0] == v.shape[0] == n):
        raise ValueError(f"rewards ({n}), trajectory_ids ({len(trajectory_ids)}), returns "
                         f"({ret.shape[0]}), task_ids ({len(task_ids)}) and valid ({v.shape[0]}) "
                         "must have one entry per output")
    if singleton not in ("self", "none"):
        raise ValueError(f"singleton={singleton!r}: use 'self' (μ = R) or 'none' (μ = 0)")
    per_task: dict[Hashable, dict[Hashable, float]] = defaultdict(dict)
    for i in range(n):
        if v[i]:
            per_task[task_ids[i]][trajectory_ids[i]] = float(ret[i])
    adv = torch.zeros_like(r)
    for i in range(n):
        if not v[i]:
            continue
        g = torch.tensor(list(per_task[task_ids[i]].values()))
        if g.numel() == 1:
            mu, sd = (g[0] if singleton == "self" else 0.0), 1.0
        else:
            mu, sd = g.mean(), (g.std() + eps if scale_std else 1.0)
        adv[i] = (r[i] - mu) / sd
    return adv


def loss_weights(lengths: torch.Tensor, trained: torch.Tensor, aggregation: str,
                 total_tokens: float | None = None, total_outputs: float | None = None
                 ) -> torch.Tensor:
    """Per-output token weight w_o, shape (N,): the loss is Σ_tokens w·ℓ / T under ``dapo``.

    ``token_mean``: w = 1 for trained outputs (plain dapo). ``output_mean``: w = T/(M·L_o), so
    Σ_t w·ℓ / T = (1/M) Σ_o mean_{t∈o} ℓ. Untrained or empty outputs get 0.

    Args:
        lengths: (N,) trained tokens per output.
        trained: (N,) bool, the outputs that enter the loss.
        aggregation: ``output_mean`` or ``token_mean``.
        total_tokens, total_outputs: T and M across all ranks (default: local sums).
    """
    live = trained & (lengths > 0)
    if aggregation == "token_mean":
        return live.float()
    if aggregation != "output_mean":
        raise ValueError(f"aggregation={aggregation!r}: use 'output_mean' or 'token_mean'")
    t = float(lengths[live].sum()) if total_tokens is None else float(total_tokens)
    m = float(live.sum()) if total_outputs is None else float(total_outputs)
    w = torch.zeros(lengths.shape[0], dtype=torch.float32)
    w[live] = t / (m * lengths[live].float())
    return w


def output_logps(model: Any, prompt_ids: Sequence[int], ids: Sequence[int],
                 temperature: float = 1.0) -> torch.Tensor:
    """log π_θ(y_t | prompt, y_<t) of each token of one output, shape (L,) float64, with grad.

    One plain, unpadded forward of ``prompt_ids + ids``; the logits are divided by
    ``temperature`` first, as TRL does when it scores completions (``GRPOConfig.temperature``).

    Raises:
        ValueError: ``prompt_ids`` is empty (the first output token would have no context).
    """
    if not prompt_ids:
        raise ValueError("output_logps needs a non-empty prompt")
    full = torch.tensor([list(prompt_ids) + list(ids)], device=model.device)
    p = len(prompt_ids)
    logits = model(input_ids=full).logits[0, p - 1:-1].double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, full[0, p:, None])[:, 0]


def rolewise_grpo_loss(logps: Sequence[torch.Tensor], advantages: torch.Tensor,
                       roles: Sequence[str], trained: torch.Tensor, *,
                       aggregation: str = "output_mean", per_role: bool = False,
                       beta: float = 0.0, ref_logps: Sequence[torch.Tensor] | None = None,
                       old_logps: Sequence[torch.Tensor] | None = None,
                       epsilon: float = 0.2, epsilon_high: float | None = None) -> torch.Tensor:
    """The role-wise GRPO objective on one log-prob tensor per output (paper §2.2, Eq. 6).

    Per token t of output o, with ratio ρ = exp(log π_θ − log π_old)::

        ℓ_t = −min(ρ·A_o, clip(ρ, 1−ε, 1+ε_high)·A_o) + β·(exp(q − lp) − (q − lp) − 1)

    where q is the reference policy's log-prob (TRL's k3 KL estimator). ``output_mean``:
    L = (1/M) Σ_o mean_t ℓ_t over the M trained, non-empty outputs (GRPO's 1/G Σ 1/|o| Σ_t);
    ``token_mean``: L = Σ_o Σ_t ℓ_t / T over their T tokens. ``per_role``: the ACT and REHEARSE
    outputs are two objectives, each aggregated on its own, and L is their sum (paper Fig. 3's
    separate policies). With ``old_logps`` None the rollout's policy is the current one
    (``num_iterations=1``): ρ = 1 in value, and only its gradient counts.

    ===========  ===========  ================================================================
    argument     shape        meaning
    ===========  ===========  ================================================================
    logps        N × (L_o,)   per-token log π_θ of each output, differentiable
    advantages   (N,)         A_o (``rolewise_advantages``)
    roles        N            ``"act"`` or ``"rehearse"``
    trained      (N,) bool    the outputs in the loss
    ref_logps    N × (L_o,)   per-token log π_ref; needed when ``beta`` != 0
    old_logps    N × (L_o,)   per-token log π_old; default ``logps`` detached
    returns      ()           the scalar loss, dtype of ``logps``
    ===========  ===========  ================================================================

    Raises:
        ValueError: an unknown ``aggregation``, mismatched lengths, or ``beta`` != 0 without
            ``ref_logps``.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r}: use one of {AGGREGATIONS}")
    n = len(logps)
    if advantages.shape[0] != n or len(roles) != n or trained.shape[0] != n:
        raise ValueError(f"logps ({n}), advantages ({advantages.shape[0]}), roles ({len(roles)}) "
                         f"and trained ({trained.shape[0]}) must have one entry per output")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps (the reference policy's per-token log-probs)")
    high = epsilon if epsilon_high is None else epsilon_high
    groups = [[o for o in range(n) if roles[o] == r] for r in ROLES] if per_role \
        else [list(range(n))]
    total = torch.zeros((), dtype=logps[0].dtype if n else torch.float32)
    for group in groups:
        live = [o for o in group if bool(trained[o]) and logps[o].numel() > 0]
        per_output = []
        for o in live:
            lp = logps[o]
            old = lp.detach() if old_logps is None else old_logps[o].to(lp)
            ratio = torch.exp(lp - old)
            a = float(advantages[o])
            loss_t = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + high) * a)
            if beta != 0.0:
                d = ref_logps[o].to(lp) - lp
                loss_t = loss_t + beta * (torch.exp(d) - d - 1)
            per_output.append(loss_t)
        if not per_output:
            continue
        if aggregation == "output_mean":
            total = total + torch.stack([t.mean() for t in per_output]).mean()
        else:
            total = total + torch.cat(per_output).sum() / sum(t.numel() for t in per_output)
    return total
