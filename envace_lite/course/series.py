"""The notebook course, headless: run every notebook in order into one series run dir.

``run_series`` executes ``notebooks/NN_topic.ipynb`` in order with papermill (kernel ``python3``,
a per-cell timeout and a wall-clock bound per notebook) into ONE series run dir (docs/design.md,
"Profiles and runs")::

    runs/notebooks/<profile>__s<seed>__<time>/
        index.html                      links every executed notebook, its HTML export, figures
        series.json                     status, wall time and failing cell of each notebook
        00_tour/00_tour.ipynb           the executed notebook (outputs kept)
        00_tour/00_tour.html            its HTML export, for instructors
        00_tour/parameters.json         the parameters papermill injected
        00_tour/config.json, *.png      written by the notebook itself into its ``run_dir``
        01_tools_environments_tasks/...

Every notebook gets ``profile``, ``seed``, ``run_dir`` (its own folder) and ``artifacts_dir`` (the
series dir, so a later notebook reads what earlier ones wrote, e.g.
``helpers.artifact(artifacts_dir, "02_act_and_rehearse", "outputs.jsonl")``). Opened alone, a
notebook has ``artifacts_dir = ""`` and runs the minimal upstream step itself.

A failed cell stops the series with ``NotebookFailed`` naming the notebook and the cell (its index
in the committed notebook), and keeps what already ran: the failed notebook is saved with its error
and the index page marks it. So does a notebook that runs past its wall-clock bound.

What the notebooks themselves call (their opening cells, exercise checks, the scripted gold
policy) lives in ``envace_lite.course.helpers``; the HTML exports and the index page are written
by ``series_pages.py``. Every ``-p`` parameter is checked against the selected
notebooks before any kernel starts (``series_params.py``).

Usage::

    envace-lite notebooks --profile smoke                 # what CI executes
    envace-lite notebooks --profile laptop --only 00,02
    from envace_lite.course.series import run_series
    series_dir = run_series("smoke", notebooks=["00", "01"])
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from envace_lite.config import ConfigError, check_profile
from envace_lite.course.helpers import NOTEBOOKS_DIR, runs_root
from envace_lite.course.series_pages import export_html, write_index
from envace_lite.course.series_params import check_series_params, notebook_parameters
from envace_lite.course.timings import code_sha256
from envace_lite.paths import REPO_ROOT, git_commit, new_run_dir
from envace_lite.profiles import OFFLINE_PROFILES
from envace_lite.progress import get_logger

log = get_logger(__name__)

"""The committed notebooks (``NN_topic.ipynb``) and ``solutions/``."""

TIMEOUTS = {"smoke": (300, 600), "micro": (1800, 3600), "laptop": (1800, 3600),
            "colab": (7200, 14400), "gpu": (7200, 14400), "scaled": (7200, 14400)}
"""Per profile: (seconds per cell, wall-clock seconds per notebook)."""

FINISHED = "every cell has run: closing the kernel and saving"
"""The section ``running_cell`` names once no cell is left to run."""

PAPERMILL_TAGS = ("injected-parameters", "papermill-error-cell-tag")
"""Cells that papermill adds to an executed notebook (not in the committed one)."""


class NotebookFailed(RuntimeError):
    """A notebook of the series failed (a cell raised, or it ran past its wall-clock bound).

    Attributes:
        notebook: the notebook's stem, e.g. ``02_act_and_rehearse``.
        cell: the index of the failing cell in the committed notebook (None if unknown).
        series_dir: the series run dir; everything that ran is kept there.
    """

    def __init__(self, message: str, notebook: str, cell: int | None, series_dir: Path) -> None:
        super().__init__(message)
        self.notebook, self.cell, self.series_dir = notebook, cell, series_dir


# ---------------------------------------------------------------------------------------------
# The series runner
# ---------------------------------------------------------------------------------------------

def discover(source_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The committed notebooks ``NN_topic.ipynb`` of ``source_dir``, in order."""
    return sorted(p for p in Path(source_dir).glob("[0-9][0-9]_*.ipynb"))


def select(paths: list[Path], only: list[str] | None) -> list[Path]:
    """The notebooks of ``paths`` that ``only`` names (prefixes such as ``02`` or stems), in
    order; all of them when ``only`` is empty.

    Raises:
        ConfigError: a name that matches no notebook, naming the notebooks there are.
    """
    if not only:
        return paths
    hit = lambda p, o: p.stem == o or p.stem.startswith(f"{o}_")  # noqa: E731
    missing = [o for o in only if not any(hit(p, o) for p in paths)]
    if missing:
        raise ConfigError(f"--only: no notebook matches {missing}: choose from "
                          f"{', '.join(p.stem for p in paths)}")
    return [p for p in paths if any(hit(p, o) for o in only)]


def machine_paths(series: Path) -> list[tuple[str, str]]:
    """``(absolute path, what a hand-out shows instead)``, longest first: the series dir (its
    name), the repository (``.``), the Python prefix (``<python>``) and the home folder (``~``)."""
    pairs = {str(Path(series).resolve()): Path(series).name, str(Path(series)): Path(series).name,
             str(REPO_ROOT): ".", sys.prefix: "<python>", sys.base_prefix: "<python>",
             str(Path.home()): "~"}
    return sorted(((k, v) for k, v in pairs.items() if len(k) > 1), key=lambda kv: -len(kv[0]))


def scrub_paths(executed: Path, series: Path) -> int:
    """Replace the machine's absolute paths (``machine_paths``) in the outputs of an executed
    notebook, in the cell papermill injected and in papermill's metadata, in place, so that
    neither it nor its HTML export shows them. The committed cells' sources are kept.

    Returns:
        The number of outputs changed.
    """
    import nbformat

    pairs = machine_paths(series)

    def clean(text: str) -> str:
        for old, new in pairs:
            text = text.replace(old, new)
        return text

    nb = nbformat.read(str(executed), as_version=4)
    changed = 0
    if "papermill" in nb.metadata:  # input/output paths and the injected parameters
        nb.metadata["papermill"] = json.loads(clean(json.dumps(nb.metadata["papermill"])))
    for cell in nb.cells:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = clean(cell.source)
        for out in cell.get("outputs", []):
            before = json.dumps(out)
            if "text" in out:
                out["text"] = clean(out["text"] if isinstance(out["text"], str)
                                    else "".join(out["text"]))
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in out.get("data", {}):
                    v = out["data"][mime]
                    out["data"][mime] = clean(v if isinstance(v, str) else "".join(v))
            if "traceback" in out:
                out["traceback"] = [clean(t) for t in out["traceback"]]
            if "evalue" in out:
                out["evalue"] = clean(out["evalue"])
            changed += json.dumps(out) != before
    nbformat.write(nb, str(executed))
    return changed


def _failure(executed: Path) -> tuple[int | None, str]:
    """(index in the committed notebook, description) of the failing or unfinished cell."""
    import nbformat

    if not executed.exists():
        return None, "the executed notebook was not written"
    try:
        nb = nbformat.read(str(executed), as_version=4)
    except Exception as e:  # noqa: BLE001 (a notebook cut short while being written)
        return None, f"the executed notebook cannot be read: {e}"
    index = -1
    running = None
    for cell in nb.cells:
        if set(cell.get("metadata", {}).get("tags", [])) & set(PAPERMILL_TAGS):
            continue
        index += 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return index, (f"In [{cell.get('execution_count')}]: "
                               f"{out.get('ename')}: {out.get('evalue')}")
        if running is None and cell.get("metadata", {}).get("papermill", {}).get(
                "status") == "running":
            running = index
    return running, "no error output recorded"


def _env(profile: str) -> dict[str, str]:
    env = dict(os.environ)
    if profile in OFFLINE_PROFILES:
        env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see the Makefile
    if env.get("MPLBACKEND", "").lower() == "agg":
        log.warning("MPLBACKEND=Agg drops notebook figures; unset for the notebook kernels")
        env.pop("MPLBACKEND")
    return env


def _stop(proc: subprocess.Popen) -> None:
    """End papermill (SIGINT lets it shut its kernel down), then anything of it still alive."""
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 (psutil missing or the process already gone)
        family = []
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for p in [proc, *family]:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()


PROGRESS_EVERY = 15.0
"""Seconds between two live progress lines of a running notebook (``run_notebook``)."""


def running_cell(executed: Path) -> tuple[int, int, str] | None:
    """``(1-based code cell now running, code cells, its section)`` of a notebook papermill is
    executing; the section is the last markdown heading above that cell ("" before any).

    papermill saves the output notebook after each cell with a ``papermill.status`` per cell;
    the first cell marked ``running`` (or, between two saves, the first ``pending`` one) is the
    current one. When none is left, every cell has run: ``(code cells, code cells, FINISHED)``
    while papermill closes the kernel and saves. None while the file is missing or half-written.
    """
    try:
        cells = json.loads(executed.read_text())["cells"]
        code = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    status = [cells[i].get("metadata", {}).get("papermill", {}).get("status") for i in code]
    for wanted in ("running", "pending"):
        if wanted in status:
            k = status.index(wanted)
            section = ""
            for c in cells[:code[k]]:
                text = "".join(c.get("source", "")) if c.get("cell_type") == "markdown" else ""
                if text.startswith("#"):
                    section = text.splitlines()[0].lstrip("#").strip()
            return k + 1, len(code), section
    return (len(code), len(code), FINISHED) if code and all(status) else None


def _report_progress(name: str, executed: Path, start: float, shown: Any) -> Any:
    """Log one live line (notebook, section, cell, elapsed time); returns what was shown."""
    cell = running_cell(executed)
    elapsed = time.perf_counter() - start
    where = (f"\"{cell[2]}\", cell {cell[0]}/{cell[1]}" if cell and cell[2]
             else f"cell {cell[0]}/{cell[1]}" if cell else "starting the kernel")
    log.info("notebook %s: %s, %.0f s elapsed", name, where, elapsed)
    return cell


def run_notebook(src: Path, stage: Path, params: dict[str, Any], cell_timeout: int,
                 timeout: int, profile: str) -> dict[str, Any]:
    """Execute one notebook into ``stage``; return its record (never raises on a failed cell).

    While it runs, one log line every ``PROGRESS_EVERY`` seconds names the notebook, the code cell
    it is executing and the elapsed time, so a long cell never looks like a hang."""
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "parameters.json").write_text(json.dumps(params, indent=1))
    executed = stage / src.name
    cmd = [sys.executable, "-m", "papermill", str(src), str(executed),
           "-f", str(stage / "parameters.json"), "-k", "python3", "--cwd", str(src.parent),
           "--execution-timeout", str(cell_timeout), "--no-progress-bar"]
    start = time.perf_counter()
    with open(stage / "papermill.log", "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=_env(profile),
                                start_new_session=True)
        rc, timed_out, shown = None, False, None
        try:
            while rc is None:
                left = timeout - (time.perf_counter() - start)
                try:
                    rc = proc.wait(timeout=max(0.1, min(PROGRESS_EVERY, left)))
                except subprocess.TimeoutExpired:
                    if time.perf_counter() - start >= timeout:
                        _stop(proc)
                        rc, timed_out = -1, True
                        break
                    shown = _report_progress(src.stem, executed, start, shown)
        except BaseException:  # Ctrl-C: papermill is in its own session, so it missed it
            _stop(proc)
            raise
    record = {"name": src.stem, "seconds": round(time.perf_counter() - start, 1),
              "notebook": executed.name, "status": "ok", "cell": None, "error": "",
              "code_sha256": code_sha256(src)}
    if timed_out or rc != 0:
        cell, what = _failure(executed)
        record.update(status="timeout" if timed_out else "failed", cell=cell, error=(
            f"ran past its wall-clock bound of {timeout} s (cell {cell})" if timed_out
            else what))
    if executed.exists():
        scrub_paths(executed, stage.parent)
        record["html"] = export_html(executed).name
    record["figures"] = sorted(p.name for p in stage.iterdir()
                               if p.suffix.lower() in (".png", ".svg", ".jpg"))
    return record


class SeriesInterrupted(KeyboardInterrupt):
    """Ctrl-C during a series: ``series.json`` and ``index.html`` were written, the notebook
    that ran marked ``interrupted``; ``folder`` is the series dir."""

    def __init__(self, folder: Path, notebook: str) -> None:
        super().__init__(f"the series in {folder} was interrupted at notebook {notebook}")
        self.folder, self.notebook = folder, notebook


def check_series_folder(out: Path, profile: str, force: bool = False) -> None:
    """Refuse an ``--out`` that holds what a series would overwrite or mix with its own.

    A folder holding a series of another profile, a finished series (every notebook ``ok``), an
    unreadable ``series.json`` or other files is refused unless ``force``; an absent or empty
    folder, or an unfinished series of the same profile (it is run again), is taken.

    Raises:
        ConfigError: one line naming the folder, what it holds and ``--force``.
    """
    if force or not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: a file, not a folder")
    meta_path = out / "series.json"
    if not meta_path.exists():
        if any(out.iterdir()):
            raise ConfigError(f"--out {out} holds files of something else than a series: use "
                              "another --out, or --force to write into it")
        return
    try:
        meta = json.loads(meta_path.read_text())
        stages, had = meta["stages"], meta["profile"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--out {out}: its series.json is unreadable: use another --out, or "
                          "--force to overwrite it") from None
    if had != profile:
        raise ConfigError(f"--out {out} holds a series of profile {had!r}, not {profile!r}: use "
                          "another --out, or --force to mix them")
    if stages and all(st.get("status") == "ok" for st in stages):
        raise ConfigError(f"--out {out} holds a finished {had} series (started "
                          f"{meta.get('started', '?')}): use another --out, or --force to run "
                          "it again over it")


def run_series(profile: str, notebooks: list[str] | None = None, out: str | Path | None = None,
               parameters: dict[str, Any] | None = None, *, seed: int = 0,
               source_dir: str | Path = NOTEBOOKS_DIR, cell_timeout: int | None = None,
               timeout: int | None = None, force: bool = False) -> Path:
    """Execute the notebooks in order into one series run dir (see the module docstring).

    Args:
        profile: ``smoke`` (CI), ``micro``, ``laptop`` ...; passed to every notebook.
        notebooks: prefixes or stems to run, e.g. ``["00", "02"]`` (None: all, in order).
        out: the series dir (None: a new ``runs/notebooks/<profile>__s<seed>__<time>/``).
        parameters: extra parameters. ``{"suite": "bfcl-base"}`` goes to every notebook that
            declares ``suite``; ``{"02": {"task_index": 3}}`` goes to that notebook only.
        seed: passed to every notebook as ``seed``.
        source_dir: where the committed notebooks are.
        cell_timeout, timeout: seconds per cell and per notebook (default: ``TIMEOUTS``).
        force: write into an ``out`` that ``check_series_folder`` would refuse.

    Returns:
        The series dir, holding ``index.html`` and one folder per notebook.

    Raises:
        NotebookFailed: a notebook failed or timed out; earlier notebooks and the failed one are
            kept, and the index is written first.
        SeriesInterrupted: Ctrl-C; the index and ``series.json`` are written first, the
            running notebook marked ``interrupted``.
        ConfigError: before any kernel starts, one line: an unknown profile, a notebook that does
            not exist, a parameter that fails ``series_params.check_series_params``, or an
            ``out`` that ``check_series_folder`` refuses.
    """
    check_profile(profile)
    paths = select(discover(Path(source_dir)), notebooks)
    extra = dict(parameters or {})
    check_series_params(paths, extra)
    if out:
        check_series_folder(Path(out), profile, force)
    cell_t, nb_t = TIMEOUTS.get(profile, TIMEOUTS["laptop"])
    cell_timeout, timeout = cell_timeout or cell_t, timeout or nb_t
    series = Path(out) if out else new_run_dir("notebooks", profile, seed, str(runs_root()))
    series.mkdir(parents=True, exist_ok=True)
    meta = {"profile": profile, "seed": seed, "commit": git_commit(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cell_timeout": cell_timeout,
            "timeout": timeout, "parameters": extra, "cpus": os.cpu_count(),
            "load": {"start": os.getloadavg()[0], "end": None},
            "stages": [{"name": p.stem, "status": "not run"} for p in paths]}
    for i, src in enumerate(paths):
        base = {"profile": profile, "seed": seed, "run_dir": str(series / src.stem),
                "artifacts_dir": str(series)}
        log.info("notebook %s (%d/%d) ...", src.stem, i + 1, len(paths))
        started = time.perf_counter()
        try:
            record = run_notebook(src, series / src.stem, notebook_parameters(src, base, extra),
                                  cell_timeout, timeout, profile)
        except KeyboardInterrupt:  # the series' pages still tell what ran and where it stopped
            cell, _ = _failure(series / src.stem / src.name)
            meta["stages"][i] = {"name": src.stem, "status": "interrupted", "cell": cell,
                                 "seconds": round(time.perf_counter() - started, 1),
                                 "error": "interrupted (Ctrl-C)", "notebook": src.name}
            write_index(series, meta)
            raise SeriesInterrupted(series, src.stem) from None
        meta["stages"][i] = record
        meta["load"]["end"] = os.getloadavg()[0]
        write_index(series, meta)
        log.info("notebook %s: %s in %.1f s", src.stem, record["status"], record["seconds"])
        if record["status"] != "ok":
            raise NotebookFailed(
                f"notebook {src.stem} {record['status']} at cell {record['cell']}: "
                f"{record['error']}; the executed notebook is kept at "
                f"{series / src.stem / src.name}, earlier notebooks in {series}",
                src.stem, record["cell"], series)
    return series


__all__ = [
    "FINISHED",
    "PAPERMILL_TAGS",
    "TIMEOUTS",
    "NotebookFailed",
    "SeriesInterrupted",
    "check_series_folder",
    "discover",
    "run_notebook",
    "run_series",
    "running_cell",
    "scrub_paths",
    "select",
]
