"""Optional sub-packages that extend the package's registries when first asked for.

A plugin is a sub-package whose import registers what it adds: environment suites
(``envs.register_suites``) and micro base checkpoints (``models.micro.register_base``). The
registries call ``load_plugins`` only when a name is not registered yet, and
``load_plugins_for`` only for a config that sets the config group a plugin owns
(``PLUGIN_GROUPS``), so the paper's mechanisms (``core``, ``envs``, ``models``, ``testtime``)
never import a plugin's code (``tests/test_imports.py`` checks it) and a config of the paper's
runs none of it. ``drills`` (the CPU-scale study of ``docs/drills.md``, group ``study``) is the
one plugin.
"""
from __future__ import annotations

import importlib
from typing import Any

PLUGINS = ("envace_lite.drills",)
"""Sub-packages imported, in order, by ``load_plugins``."""

PLUGIN_GROUPS = {"envace_lite.drills": "study"}
"""The config group each plugin owns (``config.StudyConfig``: the drills study's levers)."""


def load_plugins() -> None:
    """Import every module in ``PLUGINS`` (each registers its suites and bases on import)."""
    for name in PLUGINS:
        importlib.import_module(name)


def load_plugins_for(cfg: Any) -> None:
    """Import every plugin whose config group (``PLUGIN_GROUPS``) ``cfg`` sets away from its
    defaults, so that the levers it registers (row builders, a reward control, a memory writer)
    are there to read their own settings. A config at every plugin group's defaults (a run of
    the paper) imports none."""
    for name, group in PLUGIN_GROUPS.items():
        value = getattr(cfg, group)
        if value != type(value)():
            importlib.import_module(name)


__all__ = ["PLUGINS", "PLUGIN_GROUPS", "load_plugins", "load_plugins_for"]
