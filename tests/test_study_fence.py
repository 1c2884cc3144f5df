"""The paper's mechanisms never read the drills study's levers (``config.StudyConfig``).

No module of ``envace_lite/core/`` or ``envace_lite/testtime/`` names ``cfg.study`` (or any
``.study.`` attribute) or imports ``envace_lite.drills``: each lever lives in ``drills/``, reads
its own ``study`` field, and reaches a mechanism through that mechanism's registry
(``drills/__init__.py`` registers it). A config of the paper (the ``study`` group at its
defaults) loads no plugin (``plugins.load_plugins_for``).
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "envace_lite"
MECHANISMS = ("core", "testtime")
"""The sub-packages of the paper's mechanisms that must not read the study's levers."""
STUDY = "envace_lite.drills"
READS_THE_STUDY = re.compile(r"cfg\.study|\.study\.")
"""``cfg.study`` or any ``.study.`` attribute chain, in code, strings or comments."""


def _imports(tree: ast.AST) -> list[list[str]]:
    """Per ``import`` or ``from ... import`` statement anywhere in ``tree`` (module level, inside
    functions, under ``TYPE_CHECKING``), the modules it may name: ``from a import b`` names
    ``a`` or ``a.b``. A relative import that leaves ``core`` or ``testtime`` (``..``) is taken
    from ``envace_lite``."""
    out: list[list[str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [[a.name] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level >= 2:
                base = "envace_lite" + (f".{base}" if base else "")
            out.append([base] + [f"{base}.{a.name}" for a in node.names])
    return out


def study_fence_breaches(package: Path = PACKAGE) -> list[str]:
    """``"path:line: text"`` for each line of a mechanism module that reads the study's group,
    and ``"path: imports envace_lite.drills..."`` for each import of the study."""
    found: list[str] = []
    for sub in MECHANISMS:
        for path in sorted((package / sub).rglob("*.py")):
            text = path.read_text()
            rel = path.relative_to(package.parent)
            for n, line in enumerate(text.splitlines(), 1):
                if READS_THE_STUDY.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
            for names in _imports(ast.parse(text, str(path))):
                study = [n for n in names if n == STUDY or n.startswith(STUDY + ".")]
                if study:
                    found.append(f"{rel}: imports {study[0]}")
    return found


def test_the_fence_check_sees_a_read_and_an_import(tmp_path):
    pkg = tmp_path / "envace_lite"
    for sub in (*MECHANISMS, "drills", "pipelines"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "core" / "ok.py").write_text('"""``study.world_rows`` is the study\'s."""\n'
                                        "from envace_lite.config import Config\n")
    (pkg / "pipelines" / "sft.py").write_text("n = cfg.study.world_rows\n")  # outside: allowed
    (pkg / "drills" / "lever.py").write_text("n = cfg.study.world_rows\n")
    assert study_fence_breaches(pkg) == []
    (pkg / "core" / "grpo.py").write_text("control = self.cfg.study.reward_control\n")
    (pkg / "testtime" / "rehearsal.py").write_text(
        "def f(c):\n    return c.study.memory_source\n")
    (pkg / "testtime" / "memory.py").write_text(
        "def f():\n    from envace_lite.drills.calls_memory import calls_memory\n")
    (pkg / "core" / "rows.py").write_text("from envace_lite import drills\n")
    assert study_fence_breaches(pkg) == [
        "envace_lite/core/grpo.py:1: control = self.cfg.study.reward_control",
        "envace_lite/core/rows.py: imports envace_lite.drills",
        "envace_lite/testtime/memory.py: imports envace_lite.drills.calls_memory",
        "envace_lite/testtime/rehearsal.py:2: return c.study.memory_source",
    ]


def test_core_and_testtime_never_read_the_study():
    found = study_fence_breaches()
    assert found == [], "the mechanisms read the drills study: " + "; ".join(found)


def test_a_config_of_the_paper_loads_no_plugin():
    code = ("import sys\n"
            "from envace_lite.config import get_config\n"
            "from envace_lite.plugins import load_plugins_for\n"
            "load_plugins_for(get_config('smoke'))\n"
            "assert 'envace_lite.drills' not in sys.modules, 'a paper config loaded the study'\n"
            "load_plugins_for(get_config('smoke', {'study.world_rows': 1}))\n"
            "assert 'envace_lite.drills' in sys.modules, 'a study config did not load it'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_the_levers_are_registered_with_the_mechanisms():
    """Each moved lever is served by its mechanism's registry, from ``drills/``."""
    from envace_lite.config import get_config
    from envace_lite.core.rewards import chosen_reward_controls
    from envace_lite.core.transcripts import extra_task_rows
    from envace_lite.drills import calls_memory, error_rows, reward_control, world_rows
    from envace_lite.envs import BUILTIN_SUITES, registered_suites
    from envace_lite.pipelines.sft import EXTRA_REHEARSE_TASKS
    from envace_lite.testtime.rehearsal import (
        PAPER_MEMORY_SOURCE, chosen_memory_writer, policy_memories)

    paper = get_config("smoke")
    study = get_config("smoke", {"study.memory_source": "calls",
                                 "study.reward_control": "shuffle"})
    assert extra_task_rows(study) == {"slip_rows": error_rows.slip_rows,
                                      "id_error_rows": error_rows.id_error_rows}
    assert EXTRA_REHEARSE_TASKS["world_rows"] == (world_rows.world_tasks,
                                                  world_rows.world_examples)
    assert chosen_memory_writer(paper) == (PAPER_MEMORY_SOURCE, policy_memories)
    assert chosen_memory_writer(study) == ("calls", calls_memory.write_calls_memories)
    assert chosen_reward_controls(paper) == []
    assert chosen_reward_controls(study) == [("shuffle", reward_control.shuffle_rewards)]
    drills = registered_suites()
    assert "tau2-retail-drills" in drills and not set(drills) & set(BUILTIN_SUITES)
