"""What the course notebooks call: their opening cells, their exercises, their scripted policy.

Every notebook opens with the same four cells: title and goals, ``versions()``, the
``parameters`` cell, and a config cell that calls ``check_parameters`` (papermill only warns about a
misspelled parameter; this raises; ``check_params`` also checks each value against the type of its
default) and ``stage_dir`` (the notebook's output folder, with its
``config.json``). In their bodies notebooks use ``artifact`` (an earlier notebook's output, through
``artifacts_dir``), ``check_exercise`` (a check cell that never raises) and ``gold_script`` /
``gold_rollout``: a SCRIPTED policy that replays a task's gold calls through the real engine,
labelled as scripted wherever it is shown, because the small profiles' models make no tool calls
zero-shot. The headless runner of the whole series is ``envace_lite.notebooks``.

Usage (the config cell of a notebook)::

    from envace_lite.config import get_config
    from envace_lite.course import check_parameters, stage_dir
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
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace_lite.config import Config
from envace_lite.paths import REPO_ROOT, new_run_dir

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
    transformers and hub progress bars (the ~40 GGUF de-quantization bars of a SmolLM2 load)
    through their environment variables (set only when unset; nothing is imported, so the cell
    stays fast) and lowers the transformers, datasets and accelerate loggers to errors.
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
                        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
                        ("TOKENIZERS_PARALLELISM", "false"),
                        # tqdm bars that do not pass disable= themselves (the GGUF loader's);
                        # progress.progress passes it, so the course's own bars still show
                        ("TQDM_DISABLE", "1")):
        os.environ.setdefault(name, value)
    for name in ("transformers", "datasets", "accelerate", "trl", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
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
    Also calls ``quiet``: the filters for warnings that are not the student's business.
    """
    from importlib.metadata import PackageNotFoundError, version

    quiet()

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


def git_commit() -> str:
    """The checkout's short commit, with ``+dirty`` when it has changes ("unknown" outside git)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, text=True,
                             capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, text=True, capture_output=True, timeout=10,
                               check=False).stdout
        return sha + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    from envace_lite import protocol
    from envace_lite.transcripts import TERMINAL_CALLS, closing_text
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
            acts.append(protocol.assistant_text(calls))
            for p in reply:
                content = p["observation"]["content"] if world == "grounding" else "{}"
                if rename:
                    content = json.dumps({"error": f"Unknown tool: {rename}"})
                rehearse.append(protocol.rehearsal_text(content))
        if u == len(task.user_turns) - 1 and task.suite in TERMINAL_CALLS:
            acts.append(protocol.assistant_text([ToolCall(TERMINAL_CALLS[task.suite], {})]))
        else:
            acts.append(closing_text(task, u))
    return {"act": acts, "rehearse": rehearse or [protocol.rehearsal_text("{}")]}


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
    from envace_lite.generation import ScriptedGenerator
    from envace_lite.rollout import rollout

    texts = gold_script(task, **script)
    c = copy.deepcopy(cfg)
    c.rollout.max_new_tokens_act = c.rollout.max_new_tokens_rehearse = 4096
    c.rollout.max_turns, c.rollout.grounding_drop_p = len(texts["act"]), 0.0
    [traj] = rollout([task], ScriptedGenerator(texts, tokenizer), tokenizer, c, k=1, mode=mode)
    traj.index = index
    return traj


# ---------------------------------------------------------------------------------------------
# Shipped reference results and the paper's numbers (notebooks 04-07)
# ---------------------------------------------------------------------------------------------

REFERENCE_ROOT = REPO_ROOT / "data" / "reference_results"
"""Committed results of long runs, one folder per name, each with a ``meta.json``
(``{"profile", "seed", "commit", "command", "date", "source": "shipped", ...}``)."""


@dataclass
class Reference:
    """One folder of shipped reference results.

    Attributes:
        name: the folder name, e.g. ``micro_training``.
        path: the folder.
        meta: its ``meta.json`` (``{}`` when the file is missing).
    """

    name: str
    path: Path
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        """``shipped (<profile>, s<seed>, <commit>)``: what figure titles and tables say."""
        m = self.meta
        seed = m.get("seed")
        seeds = ",".join(map(str, seed)) if isinstance(seed, list) else seed
        return (f"shipped ({m.get('profile', '?')}, s{seeds if seeds is not None else '?'}, "
                f"{m.get('commit', '?')})")


def reference_results(name: str, root: str | Path | None = None) -> Reference | None:
    """The shipped results ``data/reference_results/<name>/``, or None when absent.

    Args:
        name: the folder, e.g. ``micro_training``, ``eval_real_cpu``, ``fidelity_real_cpu``.
        root: another root (tests); default ``REFERENCE_ROOT``.
    """
    path = Path(root or REFERENCE_ROOT) / name
    if not path.is_dir():
        return None
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return Reference(name, path, meta)


def training_runs(folder: str | Path) -> dict[str, dict[int, Path]]:
    """The ``<mode>_s<seed>/metrics.jsonl`` runs of a training-results folder.

    Returns:
        ``{mode: {seed: run dir}}``, modes and seeds sorted.
    """
    out: dict[str, dict[int, Path]] = {}
    for d in sorted(Path(folder).glob("*_s*")):
        mode, _, seed = d.name.rpartition("_s")
        if d.is_dir() and seed.isdigit() and (d / "metrics.jsonl").exists():
            out.setdefault(mode, {})[int(seed)] = d
    return {m: dict(sorted(v.items())) for m, v in sorted(out.items())}


def heldout_points(folder: str | Path, mode: str | None = None) -> list[dict[str, Any]]:
    """The held-out checkpoints of ``<folder>/heldout.json`` (``[]`` when absent).

    Args:
        mode: keep the points of this training mode (a point without ``mode`` counts as shared,
            and ``before_sft``/``after_sft`` points belong to every mode).
    """
    path = Path(folder) / "heldout.json"
    if not path.exists():
        return []
    points = json.loads(path.read_text()).get("checkpoints", [])
    if mode is None:
        return points
    return [p for p in points if p.get("mode", "shared") == mode
            or p.get("stage") in ("before_sft", "after_sft")]


def sweep_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``evaluate.budget_sweep``-shaped points from evaluation rows (one per configuration).

    Rows are grouped by (rehearsal mode, N, rehearsing policy); each group is summarized with
    ``tables.sweep_point``, so a results file written by ``evaluate``/``budget_sweep`` can be
    drawn by ``eval_figures.plot_budget_sweep`` without rerunning it.
    """
    from envace_lite.tables import sweep_point

    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        mode = r.get("rehearsal", "none")
        key = (mode, int(r.get("n", 0)) if mode != "none" else 0,
               r.get("rehearsal_policy", "") if mode != "none" else "")
        groups.setdefault(key, []).append(r)
    points = []
    for (mode, n, rpol), sub in groups.items():
        point = sweep_point(mode, n, sub)
        if rpol and rpol != sub[0].get("policy", ""):
            point["rehearsal_policy"] = rpol
        points.append(point)
    return points


PAPER = {
    "source": "EnvACE (arXiv 2608.06197), §3.2-3.3",
    # Fig. 3: tau2-Bench Avg. (%), Qwen3 base / +GRPO / per-role policy / EnvACE (shared)
    "fig3": {"Qwen3-8B": {"base": 30.0, "GRPO": 31.2, "per_role": 35.5, "shared": 36.7},
             "Qwen3-1.7B": {"base": 10.4, "GRPO": 14.7, "per_role": 14.0, "shared": 15.3}},
    # Fig. 5: tau2-Bench offline score (0-1) of EnvACE-8B during training, by step (approximate)
    "fig5": {50: 0.30, 200: 0.36, 250: 0.341, 400: 0.335, 470: 0.367},
    # Table 3 (N = 2, Qwen3-8B): tau2 Avg., BFCL multi-turn Avg., Overall (%)
    "table3": {"Non-TTS": (31.4, 41.9, 36.7),
               "parallel, Base rehearsal": (32.2, 41.4, 36.8),
               "parallel, EnvACE rehearsal": (38.0, 43.9, 40.9),
               "sequential, Base rehearsal": (31.0, 38.8, 34.9),
               "sequential, EnvACE rehearsal": (34.8, 42.3, 38.5)},
    # Fig. 6: BFCL multi-turn (%) against N = 1, 2, 3 (EnvACE rehearsal; Base only where given)
    "fig6": {"parallel": {1: 42.12, 2: 43.88, 3: 39.00},
             "sequential": {1: 40.12, 2: 42.25, 3: 39.00},
             "parallel (Base)": {2: 41.42, 3: 37.12},
             "sequential (Base)": {2: 38.75, 3: 36.62}},
}
"""The paper's numbers that notebooks 04-07 set beside ours (different model, data, compute)."""


__all__ = [
    "NOTEBOOKS_DIR",
    "PAPER",
    "REFERENCE_ROOT",
    "Reference",
    "artifact",
    "check_exercise",
    "check_param_type",
    "check_parameters",
    "check_params",
    "git_commit",
    "gold_rollout",
    "gold_script",
    "heldout_points",
    "parameters_of",
    "reference_results",
    "runs_root",
    "stage_dir",
    "sweep_points",
    "training_runs",
    "versions",
]
