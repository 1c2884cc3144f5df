"""The drills: a CPU-scale reproduction study on short real tau2 tasks (``docs/drills.md``).

Beyond the paper and outside its mechanisms: no module outside it and the command line imports
this package (``tests/test_imports.py``), and ``core`` and ``testtime`` never read its ``study``
group (``tests/test_study_fence.py``). Importing it registers what it adds to their registries
(``plugins.py`` imports it when a name is first asked for, or for a config that sets ``study``):

- the drill suites ``tau2-retail-drills``, ``tau2-airline-drills`` (generator v1) and
  ``tau2-retail-drills-v2`` (``suite.py``) with ``envs.register_suites``;
- the micro bases of ``study.pretrain`` that are trained on first use (the copy warm-up's
  levers and domain pretraining, ``copy_warmup.py``, ``pretrain.py``) with
  ``models.micro.register_base``; the ``drills`` profile's own copy warm-up is the shipped base
  (``models.micro_base``), which ``copy_warmup.build_base`` rebuilds;
- the shuffled-reward control of ``study.reward_control`` (``reward_control.py``) with
  ``core.rewards.register_reward_control``;
- the warm start's extra rows: the copy rows of ``study.copy_rows`` (``copy_rows.py``) with
  ``pipelines.sft.register_extra_sft_tasks``, the error rows of ``study.error_rows`` and
  ``study.error_kinds`` (``error_rows.py``) with ``core.transcripts.register_extra_task_rows``,
  and the world rows of ``study.world_rows`` (``world_rows.py``) with
  ``pipelines.sft.register_extra_rehearse_tasks``;
- the calls memory of ``study.memory_source="calls"`` (``calls_memory.py``) with
  ``testtime.rehearsal.register_memory_writer``.

Each lever reads its own ``study`` field and does nothing at its default.

Modules: ``spec`` (what a drill is, tiers, split rule, generator versions), ``solver`` (the
scripted solver), ``generate`` (``generate``; the v1 tiers) and ``generate_v2`` (the v2 tiers),
``slices`` (v2's held-out slices), ``check`` (v2's drill-side reply check), ``suite`` (the
registered suites and ``DrillEnv``), ``baselines`` (scripted players), ``record`` (what a shipped
result explains), ``copy_samples`` (the copy warm-up's samples), ``copy_warmup`` and ``pretrain``
(the pretrained micro bases),
``reward_control`` (the shuffled-reward control), ``copy_rows``, ``error_rows`` and
``world_rows`` (the warm start's extra rows), ``calls_memory`` (the rule-built rehearsal memory),
``report`` (held-out tables and figures).
"""
from __future__ import annotations


def _register() -> None:
    """Register the drills' suites, bases, control, rows and memory writer (the list above).
    The imports are local, so the package re-exports none of the names it registers with."""
    from envace_lite.core.rewards import register_reward_control
    from envace_lite.core.task_split import register_scenario_suite
    from envace_lite.core.transcripts import register_extra_task_rows
    from envace_lite.drills import (
        calls_memory, copy_rows, copy_warmup, error_rows, pretrain, reward_control, suite,
        world_rows)
    from envace_lite.drills.records import COMPACT_SUITES
    from envace_lite.drills.spec import TIERS
    from envace_lite.envs import register_suites
    from envace_lite.models.micro import register_base
    from envace_lite.pipelines.sft import register_extra_rehearse_tasks, register_extra_sft_tasks
    from envace_lite.testtime.rehearsal import register_memory_writer

    register_suites(tuple(suite.DRILL_DOMAINS), suite)
    register_base(copy_warmup.COPY_PRETRAINS, copy_warmup.copy_base)
    register_base(tuple(TIERS), pretrain.pretrained_base, corpus=pretrain.pretrain_corpus)
    register_reward_control(reward_control.CONTROL, reward_control.shuffle_rewards,
                            chosen=reward_control.chosen)
    register_extra_sft_tasks("copy_rows", copy_rows.copy_tasks)
    register_extra_task_rows("slip_rows", error_rows.slip_rows)  # slips first, then id errors
    register_extra_task_rows("id_error_rows", error_rows.id_error_rows)
    register_extra_rehearse_tasks("world_rows", world_rows.world_tasks, world_rows.world_examples)
    register_memory_writer(calls_memory.MEMORY_SOURCE, calls_memory.write_calls_memories,
                           chosen=calls_memory.chosen)
    for compact, base in COMPACT_SUITES.items():  # same drills, same SFT/RL halves
        register_scenario_suite(compact, base)


_register()
