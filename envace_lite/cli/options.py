"""Command-line options as the runs take them: a config, and a notebook series' parameters.

``resolve_config`` is the one way an entry point turns ``--profile``, ``--overrides`` files,
``--set`` items and its own flags into a finalized ``Config`` (the ``envace-lite`` commands of
``cli/main.py`` and ``scaled/launch.py``). ``parse_notebook_params`` turns the notebooks
command's ``-p`` items into what ``course.series.run_series`` takes.

Usage::

    from envace_lite.cli.options import parse_notebook_params, resolve_config

    cfg = resolve_config("smoke", ["scaled/overrides/reference.yaml"], ["grpo.beta=0.25"],
                         extra={"run.seed": 0}, final={"grpo.steps": 3})
    parse_notebook_params(["suite=bfcl-base", "02:task_index=3"])
    # {"suite": "bfcl-base", "02": {"task_index": 3}}
"""
from __future__ import annotations

import json
from typing import Any

from envace_lite.cli.errors import config_for
from envace_lite.config import Config, ConfigError, parse_overrides


def parse_notebook_params(items: list[str]) -> dict[str, Any]:
    """The notebooks command's ``-p`` items as ``run_series`` takes them: ``name=value`` for every
    notebook that declares ``name``, ``NN:name=value`` for notebook NN only (``{"NN": {name:
    value}}``). The value is read as JSON, else kept as text; the notebooks' declared types check
    it (``series_params.check_series_params``).

    Raises:
        ConfigError: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: use name=value or NN:name=value")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        nb, colon, name = key.partition(":")
        if colon:
            out.setdefault(nb, {})[name] = parsed
        else:
            out[key] = parsed
    return out


def resolve_config(profile: str, files: list[str], sets: list[str],
                   extra: dict[str, Any] | None = None,
                   final: dict[str, Any] | None = None) -> Config:
    """The one way an entry point turns its options into a config (``cli`` and ``scaled/``).

    Overrides apply in this order, later ones winning: each file of ``files``
    (``config.load_overrides``: YAML/JSON of ``group.field: value``), then ``extra`` (e.g.
    ``{"run.seed": 0}``), then the ``--set group.field=value`` strings of ``sets``, then
    ``final`` (flags that win over ``--set``, e.g. the CLI's ``--mode`` and ``--steps``).

    Returns:
        ``get_config(profile, overrides)``, finalized.

    Raises:
        ConfigError: an unreadable overrides file, or a ``--set`` item that is malformed, names
        an unknown key or has a value of the wrong type or range (``config.parse_overrides``).
        ConfigError: an invalid combination (``Config.finalize``'s ``ValueError``, one line at
            the CLI).
    """
    from envace_lite.config import load_overrides

    overrides: dict[str, Any] = {}
    for f in files:
        try:
            overrides |= load_overrides(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--overrides {f}: {e}") from None
    overrides |= extra or {}
    overrides |= parse_overrides(sets)
    overrides |= final or {}
    return config_for(profile, overrides)
