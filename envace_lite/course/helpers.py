"""What the course notebooks call: their opening cells, their exercises, their scripted policy.

Every notebook opens with the same four cells: title and goals, ``versions()``, the
``parameters`` cell, and a config cell that calls ``check_parameters`` (papermill only warns about a
misspelled parameter; this raises; ``check_params`` also checks each value against the type of its
default) and ``stage_dir`` (the notebook's output folder, with its
``config.json``). In their bodies notebooks use ``artifact`` (an earlier notebook's output, through
``artifacts_dir``), ``check_exercise`` (a check cell that never raises) and ``gold_script`` /
``gold_rollout``: a SCRIPTED policy that replays a task's gold calls through the real engine,
labelled as scripted wherever it is shown, because the small profiles' models make no tool calls
zero-shot. The headless runner of the whole series is ``envace_lite.course.series``.

Usage (the config cell of a notebook)::

    from envace_lite.config import get_config
    from envace_lite.course.helpers import check_parameters, stage_dir
    check_parameters(globals(), ["profile", "seed", "run_dir", "artifacts_dir"])
    cfg = get_config(profile, {"run.seed": seed})
    run_dir = stage_dir(run_dir, "02_act_and_rehearse", cfg)
"""
from __future__ import annotations

import ast
import copy
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace_lite.config import Config
from envace_lite.paths import REPO_ROOT, git_commit, new_run_dir

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
"""The committed notebooks (the series runner's default source)."""

_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}
_LITERALS = (str, int, float, bool, list, dict, tuple, type(None))


NOT_THE_STUDENTS_BUSINESS = (
    ("ignore", FutureWarning, r"(transformers|trl|peft|accelerate|datasets)(\.|$)"),
    ("ignore", DeprecationWarning, r"(transformers|trl|peft|accelerate|datasets|jupyter_client)(\.|$)"),
    ("ignore", UserWarning, r"(trl|peft|accelerate)(\.|$)"),
    ("ignore", UserWarning, r"torch\.(utils|autograd)(\.|$)"),
)
"""``(action, category, module regex)`` warning filters installed by ``quiet``: deprecation
notices and internal hints of the libraries under the course (about their own upcoming API
changes, not about the student's code). Warnings raised by the course's own code still show."""


def quiet() -> None:
    """Filter the warnings and loading bars that are not the student's business, in one place.

    Installs ``NOT_THE_STUDENTS_BUSINESS`` (``warnings.filterwarnings``), turns off the
    transformers, hub and datasets progress bars (the ~40 GGUF de-quantization bars of a SmolLM2
    load, the dataset bars of an SFT)
    through their environment variables (set only when unset; nothing is imported, so the cell
    stays fast), lowers the transformers, datasets and accelerate loggers to errors and the
    package's own to warnings (``progress.quiet_logs``).
    ``versions()`` calls it, so the second cell of every notebook does it. Idempotent; never
    raises.
    """
    import logging
    import sys
    import warnings

    for action, category, module in NOT_THE_STUDENTS_BUSINESS:
        warnings.filterwarnings(action, category=category, module=module)
    warnings.filterwarnings("ignore", message=r"IProgress not found")  # tqdm's text fallback
    # read by transformers and huggingface_hub when they are imported (later, in the notebook)
    for name, value in (("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),  # TRL's dataset bars (SFT)
                        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
                        ("TOKENIZERS_PARALLELISM", "false"),
                        # tqdm bars that do not pass disable= themselves (the GGUF loader's);
                        # progress.progress passes it, so the course's own bars still show
                        ("TQDM_DISABLE", "1")):
        os.environ.setdefault(name, value)
    for name in ("transformers", "datasets", "accelerate", "trl", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from envace_lite.progress import quiet_logs

    quiet_logs()  # the package's own INFO lines (loading, rollouts, training steps)
    if "transformers" in sys.modules:  # already imported: switch its bars off directly
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except Exception:  # noqa: BLE001, S110 (an API change: the bars stay, nothing breaks)
            pass


def versions() -> None:
    """Print the versions, the commit and the machine a notebook ran on (the second cell).

    Package versions come from their metadata, so this cell does not pay for importing them.
    Also calls ``quiet``: the filters for warnings that are not the student's business; and
    shows every table cell whole from here on (pandas' ``display.max_colwidth`` off: its default
    cuts a cell at 50 characters, in the HTML hand-out too).
    """
    from importlib.metadata import PackageNotFoundError, version

    import pandas as pd

    quiet()
    pd.set_option("display.max_colwidth", None)

    import torch

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    rows = [("python", platform.python_version()), ("torch", torch.__version__)]
    rows += [(name, v(name)) for name in ("transformers", "trl", "peft", "papermill")]
    rows += [("envace-lite", f"{v('envace-lite')} @ {git_commit()}"),
             ("machine", (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
                          f"torch threads {torch.get_num_threads()}, "
                          f"CUDA {'yes' if torch.cuda.is_available() else 'no'}"))]
    for name, value in rows:
        print(f"{name:<13}{value}")


def check_parameters(namespace: dict[str, Any], names: list[str] | tuple[str, ...]) -> dict:
    """Raise on a parameter the notebook does not declare (papermill only warns).

    A papermill parameter is injected as a global holding a plain literal. Any such global that is
    public and not in ``names`` is a misspelled or foreign parameter. The cells before the config
    cell must therefore bind no public literal globals of their own.

    Args:
        namespace: the notebook's ``globals()``.
        names: the names the ``parameters`` cell declares.

    Returns:
        ``{name: value}`` of the declared parameters.

    Raises:
        KeyError: an unknown or a missing parameter, naming the declared ones.
    """
    unknown = sorted(k for k, v in namespace.items()
                     if not k.startswith("_") and k not in _IPYTHON_NAMES and k not in names
                     and isinstance(v, _LITERALS))
    if unknown:
        raise KeyError(f"unknown notebook parameter(s) {unknown}: this notebook takes "
                       f"{list(names)} (papermill only warns about misspelled -p names)")
    missing = [n for n in names if n not in namespace]
    if missing:
        raise KeyError(f"parameter(s) {missing} are not set: run the parameters cell first")
    return {n: namespace[n] for n in names}


def check_param_type(name: str, value: Any, default: Any) -> Any:
    """Check one notebook parameter against the type of its default in the ``parameters`` cell.

    An ``int`` default takes an int (never a bool), a ``float`` default an int or a float, a
    ``str``/``bool``/``list``/``dict`` default the same type; a ``None`` default anything.

    Returns:
        ``value``.

    Raises:
        ConfigError: one line naming the parameter, the value and the expected type (a ``KeyError``
            and a ``ValueError``), e.g. ``notebook parameter task_index='abc': expected int``.
    """
    from envace_lite.config import ConfigError

    if default is None:
        return value
    kind = type(default)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ConfigError(f"notebook parameter {name}={value!r}: expected {kind.__name__} "
                          f"(its default is {default!r})")
    return value


def parameters_of(nb: Any) -> dict[str, Any]:
    """The defaults of a notebook's ``parameters`` cell (a path or a NotebookNode).

    Raises:
        ValueError: the notebook has no, or more than one, ``parameters`` cell.
    """
    import nbformat

    if not hasattr(nb, "cells"):
        nb = nbformat.read(str(nb), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"expected exactly one 'parameters' cell, found {len(cells)}")
    out = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            out[node.targets[0].id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = ast.literal_eval(node.value)
    return out


def check_params(namespace: dict[str, Any], notebook: str) -> dict[str, Any]:
    """The parameters cell's check: names (``check_parameters``) and types, in one call.

    The declared names and their types come from the committed notebook's own ``parameters``
    cell (``parameters_of``): each value must have its default's type
    (``check_param_type``). A notebook's config cell calls
    ``check_params(globals(), "02_act_and_rehearse")`` in place of ``check_parameters``.

    Args:
        namespace: the notebook's ``globals()``.
        notebook: the notebook's stem, e.g. ``"02_act_and_rehearse"`` (under ``notebooks/``).

    Returns:
        ``{name: value}`` of the declared parameters.

    Raises:
        KeyError: an unknown or a missing parameter (as ``check_parameters``), or an unknown
            notebook.
        ConfigError: a parameter of the wrong type (also a ``KeyError``).
    """
    path = NOTEBOOKS_DIR / f"{notebook}.ipynb"
    if not path.exists():
        raise KeyError(f"no notebook {notebook!r} in {NOTEBOOKS_DIR.name}/")
    defaults = parameters_of(path)
    values = check_parameters(namespace, list(defaults))
    for name, value in values.items():
        check_param_type(name, value, defaults[name])
    return values


def runs_root() -> Path:
    """Root of run dirs for notebooks: ``ENVACE_RUNS``, else ``runs/`` at the checkout root
    (a notebook's working directory is ``notebooks/``, so a relative root would land there)."""
    return Path(os.environ.get("ENVACE_RUNS") or REPO_ROOT / "runs")


def model_folder(model_dir: str) -> dict[str, Any]:
    """Config overrides that load the policy from a local model folder, a notebook's
    ``model_dir`` parameter: ``model.kind="hub"``, ``model.name=model_dir`` (``from_pretrained``
    reads a folder as it reads a hub name) and ``model.device="auto"`` (CUDA when there is one);
    the profile's other settings (dtype, LoRA, rendering, caps) stay. "" gives no override.

    Raises:
        ConfigError: ``model_dir`` is not a folder holding ``config.json``.
    """
    if not model_dir:
        return {}
    from envace_lite.config import ConfigError

    if not (Path(model_dir) / "config.json").is_file():
        raise ConfigError(f"model_dir={model_dir!r}: expected a model folder holding "
                          "config.json (save_pretrained, or a downloaded hub snapshot)")
    return {"model.kind": "hub", "model.name": str(model_dir), "model.device": "auto"}


def output_caps(cfg: Config, new_tokens: int) -> dict[str, Any]:
    """The classroom cap on output length, as config overrides (the notebooks' ``new_tokens``).

    REHEARSE, FEEDBACK and MEMORY outputs get at most ``new_tokens`` tokens; ACT keeps at least
    48 (room for a lookup call) and never more than ``cfg``'s own cap. ``new_tokens`` 0: no
    override, the profile's caps.

    Returns:
        ``{"rollout.max_new_tokens_rehearse", "rehearsal.max_new_tokens_feedback",
        "rehearsal.memory_max_tokens", "rollout.max_new_tokens_act"}`` or ``{}``.
    """
    if not new_tokens:
        return {}
    return {"rollout.max_new_tokens_rehearse": new_tokens,
            "rehearsal.max_new_tokens_feedback": new_tokens,
            "rehearsal.memory_max_tokens": new_tokens,
            "rollout.max_new_tokens_act": min(cfg.rollout.max_new_tokens_act,
                                              max(new_tokens, 48))}


def stage_dir(run_dir: str, stage: str, cfg: Config) -> Path:
    """The notebook's output folder: ``run_dir`` when given (the series runner passes one), else a
    new ``runs/notebooks/<profile>__s<seed>__<time>/<stage>/``. Writes ``config.json`` there."""
    path = Path(run_dir) if run_dir else (
        new_run_dir("notebooks", cfg.profile, cfg.run.seed, str(runs_root())) / stage)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save(path)
    return path


def artifact(artifacts_dir: str, stage: str, name: str) -> Path | None:
    """``<artifacts_dir>/<stage>/<name>`` if an earlier notebook wrote it, else None."""
    if not artifacts_dir:
        return None
    path = Path(artifacts_dir) / stage / name
    return path if path.exists() else None


def check_exercise(title: str, test: Callable[[], Any]) -> None:
    """Run an exercise check and print ``solved``, ``wrong: ...`` or ``not attempted``; never raise.

    Args:
        title: e.g. "Exercise 1".
        test: returns True (solved), None (not attempted), False or a message (wrong); raising
            ``NotImplementedError`` means not attempted, any other exception means wrong.
    """
    try:
        ok = test()
    except NotImplementedError:
        ok = None
    except Exception as e:  # noqa: BLE001 (a check cell must never raise)
        ok = f"your code raised {type(e).__name__}: {e}"
    if ok is None:
        status = "not attempted (replace the NotImplementedError / None placeholder)"
    elif ok is True:
        status = "solved"
    else:
        status = "wrong" + (f": {ok}" if isinstance(ok, str) else "")
    print(f"{title}: {status}")


def gold_script(task: Any, *, user_turns: int | None = None, world: str = "grounding",
                rename: str | None = None) -> dict[str, list[str]]:
    """ACT and REHEARSE texts that replay a task's gold calls, for ``ScriptedGenerator`` (k=1).

    This is a SCRIPTED policy, not a model: notebooks use it to show what a competent rollout
    looks like, because the small profiles' models make no tool calls zero-shot (docs/design.md,
    "Machine facts").

    Args:
        task: a ``Task`` (its ``grounding`` holds each gold call with its real observation).
        user_turns: play the gold of the first N user turns, then answer the next one in text
            without calls (None: every turn).
        world: ``grounding`` (REHEARSE writes the real observation: a perfect world model) or
            ``blank`` (REHEARSE writes ``{}`` for every call).
        rename: replace the name of every call with this one (an unknown tool); REHEARSE then
            reports the error a faithful world model would report.

    Returns:
        ``{"act": [...], "rehearse": [...]}`` in generation order.
    """
    from envace_lite.protocol.prompts import assistant_text
    from envace_lite.protocol.rehearse_prompt import rehearsal_text
    from envace_lite.core.transcripts import TERMINAL_CALLS, closing_text
    from envace_lite.types import ToolCall

    if world not in ("grounding", "blank"):
        raise ValueError(f"world={world!r}: use 'grounding' or 'blank'")
    n = len(task.user_turns) if user_turns is None else user_turns
    acts, rehearse = [], []
    for u in range(len(task.user_turns)):
        if u >= n:
            acts.append("I could not finish this request.")
            break
        pairs = task.grounding[u]
        replies = [pairs] if task.suite.startswith("bfcl-") else [[p] for p in pairs]
        for reply in (r for r in replies if r):
            calls = [ToolCall(rename or p["call"]["name"], p["call"]["arguments"]) for p in reply]
            acts.append(assistant_text(calls))
            for p in reply:
                content = p["observation"]["content"] if world == "grounding" else "{}"
                if rename:
                    content = json.dumps({"error": f"Unknown tool: {rename}"})
                rehearse.append(rehearsal_text(content))
        if u == len(task.user_turns) - 1 and task.suite in TERMINAL_CALLS:
            acts.append(assistant_text([ToolCall(TERMINAL_CALLS[task.suite], {})]))
        else:
            acts.append(closing_text(task, u))
    return {"act": acts, "rehearse": rehearse or [rehearsal_text("{}")]}


def gold_rollout(task: Any, tokenizer: Any, cfg: Config, *, mode: str = "rehearse",
                 index: int = 0, **script: Any) -> Any:
    """One trajectory of the scripted gold policy (``gold_script``) through the real engine.

    The config is copied with the generation caps raised (scripted texts are not sampled, so the
    profile's small caps would only cut them), ``max_turns`` set to the script's length and no
    grounding drop. Everything else (parsing, REHEARSE prompts, packing, gated user replay, real
    execution in ``mode="real"``) is the engine's own.

    Args:
        task: the task x.
        tokenizer: the policy's tokenizer (chat template and glue).
        cfg: the run config (not modified).
        mode: ``rehearse`` (the script also plays REHEARSE) or ``real`` (``env.step`` answers).
        index: recorded as ``Trajectory.index`` (its place in a group of K).
        **script: passed to ``gold_script``.
    """
    from envace_lite.llm.scripted import ScriptedGenerator
    from envace_lite.core.rollout import rollout

    texts = gold_script(task, **script)
    c = copy.deepcopy(cfg)
    c.rollout.max_new_tokens_act = c.rollout.max_new_tokens_rehearse = 4096
    c.rollout.max_turns, c.rollout.grounding_drop_p = len(texts["act"]), 0.0
    [traj] = rollout([task], ScriptedGenerator(texts, tokenizer), tokenizer, c, k=1, mode=mode)
    traj.index = index
    return traj


__all__ = [
    "NOTEBOOKS_DIR",
    "artifact",
    "check_exercise",
    "check_param_type",
    "check_parameters",
    "check_params",
    "gold_rollout",
    "gold_script",
    "parameters_of",
    "runs_root",
    "stage_dir",
    "versions",
]
