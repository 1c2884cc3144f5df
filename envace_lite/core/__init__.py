"""The paper's training mechanisms (docs/design.md); test time lives in ``envace_lite.testtime``.

- ``engine``: ``run_turns``, the one ACT loop every episode runs;
- ``rollout``: world rehearsal, the ACT/REHEARSE alternation h_{t+1} = h_t ⊕ (a_t, ô_t) (§2.1);
- ``rewards``: the checklist judge of both roles;
- ``advantages``: role-wise group advantages and the loss weights (Eq. 4-6);
- ``rows``, ``grpo``: packed training rows and ``RoleWiseGRPOTrainer`` on TRL, with
  ``causal_forward`` (its forward in length buckets) and ``per_role_policy`` (per_role's second
  policy's optimizer, clipping and checkpoint);
- ``transcripts``: the two-role warm-start rows;
"""
