"""Optional sub-packages that extend the package's registries when first asked for.

A plugin is a sub-package whose import registers what it adds: environment suites
(``envs.register_suites``) and micro base checkpoints (``models.micro.register_base``). The
registries call ``load_plugins`` only when a name is not registered yet, so the paper's
mechanisms (``core``, ``envs``, ``models``) never import a plugin's code (``tests/test_imports.py``
checks it). ``drills`` (the CPU-scale study of ``docs/drills.md``) is the one plugin.
"""
from __future__ import annotations

import importlib

PLUGINS = ("envace_lite.drills",)
"""Sub-packages imported, in order, by ``load_plugins``."""


def load_plugins() -> None:
    """Import every module in ``PLUGINS`` (each registers its suites and bases on import)."""
    for name in PLUGINS:
        importlib.import_module(name)


__all__ = ["PLUGINS", "load_plugins"]
