"""envace-lite: a notebook-first reproduction of EnvACE (arXiv 2608.06197).

One policy plays ACT (emit a tool call) and REHEARSE (write the observation that call would get);
role-wise GRPO trains both roles; private rehearsal precedes one committed execution at test time.
"""
__version__ = "0.1.0"
