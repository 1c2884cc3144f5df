"""Where files go: caches, derived data and run dirs; cache stamps; JSONL reading.

Environment variables move each root: ``ENVACE_CACHE`` (default ``~/.cache/envace_lite``),
``ENVACE_RUNS`` (default ``runs`` under the current directory).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace_lite.progress import get_logger

log = get_logger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout root (holds ``data/``, ``notebooks/``)."""

DATA_DIR = REPO_ROOT / "data"
"""Committed split files and the data card."""


def cache_dir(*parts: str) -> Path:
    """A writable cache folder (created), e.g. ``cache_dir("bfcl")``."""
    root = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace_lite"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(command: str, profile: str, seed: int, root: str | None = None) -> Path:
    """Create ``runs/<command>/<profile>__s<seed>__<time>/`` and return it (docs/design.md,
    "Profiles and runs").

    The root is ``ENVACE_RUNS`` when set, else ``root`` (the config's ``run.runs_root``), else
    ``runs`` under the current directory.
    """
    base = Path(os.environ.get("ENVACE_RUNS") or root or "runs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / command / f"{profile}__s{seed}__{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / command / f"{profile}__s{seed}__{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def read_jsonl(path: str | Path, repair: bool = False) -> list[Any]:
    """The values of a JSONL file, one per non-blank line (``[]`` when it does not exist).

    A last line that is not JSON is torn (a kill landed mid-write): it is dropped with a warning.

    Args:
        path: the file.
        repair: also cut the torn last line off the file, so that rows appended later start on
            a line of their own (call it before appending).

    Returns:
        The decoded lines, in order.

    Raises:
        ValueError: a line before the last is not JSON (names the file and the line number).
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows, offset = [], 0
    for i, line in enumerate(lines):
        try:
            if line.strip():
                rows.append(json.loads(line.decode("utf-8")))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
            if i < last:
                raise ValueError(f"{path}, line {i + 1}: not a JSON line ({e})") from e
            log.warning("%s, line %d: dropping a torn last line (%d bytes)%s", path, i + 1,
                        len(data) - offset, ", cut off the file" if repair else "")
            if repair:
                with path.open("r+b") as f:
                    f.truncate(offset)
        offset += len(line) + 1
    return rows


CACHE_STAMP = "envace_build.json"
"""The file inside a cache folder that marks it complete and names its build number."""


def is_cached(target: Path, build: int) -> bool:
    """True when ``target`` is a complete cache folder of build ``build`` (its stamp says so)."""
    stamp = target / CACHE_STAMP
    return stamp.exists() and json.loads(stamp.read_text()).get("build") == build


def write_cache(target: Path, build: int, write: Callable[[Path], None],
                replace: bool = False) -> None:
    """Fill a cache folder atomically: run ``write(tmp)``, stamp ``tmp``, move it to ``target``.

    Safe for parallel tests and processes: the loser of a race keeps the winner's folder. A
    stale or half-written ``target`` (no stamp, or another build) is replaced, and so is a
    complete one when ``replace``.

    Args:
        target: the cache folder (e.g. ``cache_dir("tokenizers") / "qwen3"``).
        build: the recipe's build number; bump it to invalidate old caches.
        write: writes the folder's files into the path it is given.
        replace: rebuild even when ``target`` is already complete.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a vLLM server may run as another user
    try:
        write(tmp)
        (tmp / CACHE_STAMP).write_text(json.dumps({"build": build, "written": time.time()}))
        if target.exists() and (replace or not is_cached(target, build)):
            shutil.rmtree(target, ignore_errors=True)  # stale, half-written or rebuilt
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its folder is as good as ours
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
