"""The parameters of a notebook series: checked before any kernel starts, then injected.

Every notebook of a series declares its parameters in its ``parameters`` cell
(``helpers.parameters_of``). The runner sets four of them (``RUNNER_PARAMS``); ``-p`` items set
the rest, shared (every notebook that declares the name) or per notebook (``{"02": {...}}``).
``check_series_params`` refuses, in one line each, whatever papermill would only warn about or a
kernel would fail on late: an unknown name, a runner parameter, a value of the wrong type, a
folder that does not exist, a suite, split or task index that does not exist.
``notebook_parameters`` is what papermill then injects into one notebook
(``series.run_series``).

Usage::

    from envace_lite.course.series import discover, select
    from envace_lite.course.series_params import check_series_params, notebook_parameters

    paths = select(discover(), ["02"])
    extra = {"suite": "bfcl-base", "02": {"task_index": 3}}
    check_series_params(paths, extra)            # ConfigError, one line, on a bad item
    params = notebook_parameters(paths[0], {"profile": "smoke", "seed": 0}, extra)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from envace_lite.config import ConfigError
from envace_lite.course.helpers import check_param_type, parameters_of

RUNNER_PARAMS = ("profile", "seed", "run_dir", "artifacts_dir")
"""Parameters the runner sets for every notebook (``--profile``, ``--seed``, ``--out``)."""

FOLDER_PARAMS = ("train_run_dir", "checkpoint", "model_dir")
"""Notebook parameters that name an existing folder when not empty."""


def _per_notebook(key: str, value: Any) -> bool:
    return isinstance(value, dict) and re.fullmatch(r"\d\d(_\w+)?", key) is not None


def _check_folder(stem: str, name: str, value: Any) -> None:
    if name in FOLDER_PARAMS and isinstance(value, str) and value and not Path(value).is_dir():
        raise ConfigError(f"notebook {stem} parameter {name}={value!r}: no such folder")


SUITE_PARAMS = ("suite", "tau2_suite", "bfcl_suite", "suites", "eval_suites", "drill_suite")
"""Notebook parameters that name suites (comma-separated where plural)."""


def _check_tasks(stem: str, params: dict[str, Any], changed: set[str]) -> None:
    """The suites, split and task index one notebook will read, when the series changed any of
    them: each suite registered, the split one it has, the index inside every suite's split."""
    if not changed & {*SUITE_PARAMS, "split", "task_index"}:
        return
    from envace_lite.envs import list_tasks

    suites = [x.strip() for name in SUITE_PARAMS if isinstance(params.get(name), str)
              for x in params[name].split(",") if x.strip()]
    split = params.get("split", "test")
    sizes = {}
    for suite in suites:
        try:
            sizes[suite] = len(list_tasks(suite, split))
        except KeyError as e:
            which = ", ".join(sorted(changed & {*SUITE_PARAMS, "split"})) or "suite"
            raise ConfigError(f"notebook {stem} parameter {which}: "
                              f"{e.args[0] if e.args else e}") from None
    index = params.get("task_index")
    if isinstance(index, int) and sizes and not -min(sizes.values()) <= index < min(sizes.values()):
        raise ConfigError(f"notebook {stem} parameter task_index={index}: the {split} split has "
                          + ", ".join(f"{n} tasks in {s}" for s, n in sizes.items())
                          + f"; use 0 to {min(sizes.values()) - 1}")


def check_series_params(paths: list[Path], extra: dict[str, Any]) -> None:
    """Check every parameter of a series against every selected notebook's ``parameters`` cell,
    before any kernel starts (papermill itself only warns about an unknown name).

    ``extra`` holds shared parameters (``{"suite": "bfcl-base"}``: every notebook that declares
    it) and per-notebook ones (``{"02": {"task_id": "..."}}``).

    Raises:
        ConfigError: one line each: a per-notebook key for a notebook outside the series; a name
            that notebook does not declare (naming the ones it does); a shared name no selected
            notebook declares (naming the shared ones); a runner parameter (``profile``, ``seed``,
            ``run_dir``, ``artifacts_dir``: the CLI's options set them); a value of the wrong
            type (``course.check_param_type``); a folder parameter (``FOLDER_PARAMS``) naming no
            folder; a suite (``SUITE_PARAMS``) or split that is not registered, or a
            ``task_index`` outside the split (``_check_tasks``).
    """
    declared = {p.stem: parameters_of(p) for p in paths}
    changed: dict[str, dict[str, Any]] = {}
    for key, value in extra.items():
        if _per_notebook(key, value):
            stems = [s for s in declared if s == key or s.startswith(f"{key}_")]
            if not stems:
                raise ConfigError(f"-p {key}:...: notebook {key} is not in this series "
                                  f"({', '.join(declared)})")
            items = [(s, name, v) for s in stems for name, v in value.items()]
        else:
            stems = [s for s in declared if key in declared[s]]
            if key in RUNNER_PARAMS:
                raise ConfigError(f"-p {key}: set by the runner; use --profile, --seed or --out")
            if not stems:
                shared = sorted({n for d in declared.values() for n in d} - set(RUNNER_PARAMS))
                raise ConfigError(f"no notebook of this series takes a parameter {key!r}: "
                                  f"they take {', '.join(shared)}")
            items = [(s, key, value) for s in stems]
        for stem, name, v in items:
            if name in RUNNER_PARAMS:
                raise ConfigError(f"-p {key}:{name}: set by the runner; use --profile, --seed "
                                  "or --out")
            if name not in declared[stem]:
                takes = [n for n in declared[stem] if n not in RUNNER_PARAMS]
                raise ConfigError(f"notebook {stem} has no parameter {name!r}: it takes "
                                  f"{', '.join(takes) or 'nothing else'}")
            check_param_type(name, v, declared[stem][name])
            _check_folder(stem, name, v)
            changed.setdefault(stem, {})[name] = v
    for stem, values in changed.items():  # suites, split and index: what the kernel would read
        _check_tasks(stem, {**declared[stem], **values}, set(values))


def notebook_parameters(path: Path, base: dict[str, Any], extra: dict[str, Any]
                        ) -> dict[str, Any]:
    """The parameters papermill injects into one notebook: the runner's, then the shared ones it
    declares, then its own (``check_series_params`` has checked them all).

    Args:
        path: the committed notebook.
        base: the runner's parameters (``RUNNER_PARAMS``).
        extra: the series' ``-p`` items, shared and per notebook (as ``check_series_params``).

    Returns:
        ``{name: value}``: ``base``, updated with the items of ``extra`` this notebook takes, in
        ``extra``'s order.
    """
    declared = parameters_of(path)
    params = dict(base)
    for key, value in extra.items():
        if _per_notebook(key, value):
            if path.stem == key or path.stem.startswith(f"{key}_"):
                params.update(value)
        elif key in declared:
            params[key] = value
    return params
