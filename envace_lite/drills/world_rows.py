"""World rows add to the paper's warm start the grounded REHEARSE rows of RL-split train tasks
(``study.world_rows``; beyond the paper), to teach REHEARSE to reuse a matching reference result
(``docs/design.md``).

The paper's warm start trains on the SFT split only; these rows come from tasks that RL trains
on, with loss on the observation only, so ACT never trains on those tasks' gold calls.
``drills/__init__.py`` registers ``world_tasks`` and ``world_examples`` as the extra warm-start
REHEARSE rows ``world_rows`` with ``pipelines.sft.register_extra_rehearse_tasks``; the warm
start adds them after its budgeted rows, and the fidelity audit's grounded upper bound passes
over their tasks (``sft.extra_rehearse_tasks``).

Usage::

    from envace_lite.drills.world_rows import world_examples, world_tasks
    rows = world_examples(world_tasks(cfg), cfg, tokenizer)
"""
from __future__ import annotations

import random
from typing import Any

from envace_lite.config import Config, ConfigError
from envace_lite.core.task_split import require_train, training_tasks
from envace_lite.core.transcripts import (
    RehearseExample,
    approx_tokens,
    task_transcripts,
)
from envace_lite.llm.generation import token_counter
from envace_lite.types import Task


def world_tasks(cfg: Config) -> list[Task]:
    """The RL-split train tasks whose grounded REHEARSE rows join the warm start
    (``study.world_rows``; beyond the paper): ``training_tasks(cfg, "rl")`` shuffled with
    ``random.Random(f"world:{run.seed}")``, the first ``world_rows`` of them.

    Raises:
        ConfigError: ``world_rows`` exceeds the RL-split task count (the message names both;
            the CLI prints it as one line).
    """
    n = cfg.study.world_rows
    tasks = training_tasks(cfg, "rl") if n else []
    if n > len(tasks):
        raise ConfigError(f"study.world_rows={n}: the RL split of {cfg.grpo.suites} has "
                         f"{len(tasks)} tasks; use at most {len(tasks)}")
    random.Random(f"world:{cfg.run.seed}").shuffle(tasks)
    return tasks[:n]


def world_examples(tasks: list[Task], cfg: Config,
                   tokenizer: Any = None) -> list[RehearseExample]:
    """REHEARSE rows of ``tasks``, each with its task's grounding in the prompt
    (``task_transcripts(..., gold=True)``): one row per gold call, whose target is that call's
    real result, which the prompt's reference block also holds. No ACT rows, no grounding drop.
    ``tokenizer`` counts prompt tokens for trimming (``approx_tokens`` when None).

    Source: beyond the paper (``study.world_rows``). The grounded REHEARSE prompt is the
    reference code's, which the paper's equation does not have (``docs/design.md``, decision 5).
    """
    require_train(tasks)
    count = approx_tokens if tokenizer is None else token_counter(tokenizer)
    return [ex for t in tasks for ex in task_transcripts(t, cfg, count, gold=True)[1]]


__all__ = ["world_examples", "world_tasks"]
