"""The paper's test time (§2.3; docs/design.md, "Package layout").

- ``rehearsal``: private rehearsal, attempts → feedback → rehearsal memory m_x;
- ``turn_records``: a user turn's rehearsal record applied to its episode;
- ``episode``, ``execute``, ``gate``: committed execution with the memory, its episode state and
  its write gate;
- ``selection``, ``candidates``: rehearse, then select: the committed first call chosen among N
  attempts by REHEARSE's verdict and cheap checks (beyond the paper).
"""
