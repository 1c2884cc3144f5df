"""The paper's mechanisms (docs/design.md).

- ``engine``: ``run_turns``, the one ACT loop every episode runs;
- ``rollout``: world rehearsal, the ACT/REHEARSE alternation h_{t+1} = h_t ⊕ (a_t, ô_t) (§2.1);
- ``rewards``: the checklist judge of both roles;
- ``advantages``: role-wise group advantages and the loss weights (Eq. 4-6);
- ``rows``, ``grpo``: packed training rows and ``RoleWiseGRPOTrainer`` on TRL;
- ``transcripts``: the two-role warm-start rows;
- ``rehearsal``: private rehearsal, attempts → feedback → rehearsal memory m_x (§2.3);
- ``selection``: rehearse, then select: the committed first call chosen among N attempts by
  REHEARSE's verdict and cheap checks (beyond the paper);
- ``execute``, ``gate``: committed execution with the memory, and its write gate.
"""
