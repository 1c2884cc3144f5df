"""Where files go: caches, derived data and run dirs; cache stamps; JSONL reading and appending;
the run-folder lock; the record a checkpoint keeps of the profile it was trained under.

Environment variables move each root: ``ENVACE_CACHE`` (default ``~/.cache/envace_lite``),
``ENVACE_RUNS`` (default ``runs`` under the current directory).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from envace_lite.config import ConfigError
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


def repair_tail(path: str | Path) -> str:
    """Make a JSONL file safe to append to: it must end with a newline.

    A last line without its newline is either a complete JSON value (a cut after a full disk
    wrote every byte but the newline: the newline is added) or torn (a kill landed mid-write:
    the partial line is moved to ``<path>.torn`` and cut off the file). Both are logged.

    Returns:
        ``"ok"`` (absent, empty, or ending with a newline), ``"newline"`` or ``"torn"``.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return "ok"
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return "ok"
        data = path.read_bytes()
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    try:
        json.loads(tail.decode("utf-8"))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        torn = path.with_name(path.name + ".torn")
        with torn.open("ab") as f:
            f.write(tail + b"\n")
        with path.open("r+b") as f:
            f.truncate(start)
        log.error("%s: its last line was torn (%d bytes); set aside to %s before appending",
                  path, len(tail), torn.name)
        return "torn"
    with path.open("ab") as f:
        f.write(b"\n")
    log.warning("%s: its last line was complete but had no newline; the newline was added "
                "before appending", path)
    return "newline"


def append_jsonl(path: str | Path, *values: Any) -> None:
    """Append each value as one JSON line, after ``repair_tail`` (never onto a partial line).

    The one way this package appends to a JSONL run file (``results.jsonl``,
    ``metrics.jsonl``): the lines are written in one ``write`` call and flushed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_tail(path)
    text = "".join(json.dumps(v) + "\n" for v in values)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


# ---------------------------------------------------------------------------------------------
# The run-folder lock
# ---------------------------------------------------------------------------------------------
LOCK_FILE = ".envace.lock"
"""The lock file inside a run folder: ``{"pid", "host", "since", "command"}`` of its writer."""


class RunFolderLocked(ConfigError):
    """Another live process writes into this run folder (a ``ConfigError``: the CLI prints one
    line and exits 2)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


TAKEOVER_STALE_S = 10.0
"""A takeover file older than this was left by a process that died mid-takeover (a takeover
lasts microseconds)."""


def _remove_stale(path: Path, owner: dict[str, Any]) -> bool:
    """Remove the lock ``path`` if it still holds ``owner`` (a dead pid), under a takeover file.

    Removing a lock read as stale is the racy step: between the read and the unlink another
    process may take the stale lock over and write its own, which an unlink would then delete
    (two holders). Only the holder of ``<lock>.takeover`` (``O_EXCL``) may remove a lock, and
    only after reading it again under it: the lock's content (pid, host, start time) names one
    writer, so an unchanged content is still the stale lock.

    Returns:
        True when this process removed the stale lock (the caller then competes for the lock
        with ``O_EXCL``); False when another takeover runs or the lock changed.
    """
    guard = path.with_name(path.name + ".takeover")
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        with contextlib.suppress(OSError):  # a takeover file left by a process that died in it
            if time.time() - guard.stat().st_mtime > TAKEOVER_STALE_S:
                guard.unlink()
        time.sleep(0.001)
        return False
    try:
        os.close(fd)
        try:
            now = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            return False
        if now != owner:  # taken over and written anew since it was read
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        guard.unlink(missing_ok=True)


_HELD: dict[Path, int] = {}
"""Folders whose lock this process holds, with the nesting depth (a run inside a run)."""


@contextlib.contextmanager
def run_folder_lock(folder: str | Path, command: str = "") -> Iterator[Path]:
    """Hold ``folder/.envace.lock`` while writing into a run folder; one writer at a time.

    The lock file is created with ``O_CREAT | O_EXCL`` and names its owner (pid and host). A
    lock whose pid is dead on this host is stale (a kill -9): it is taken over with a warning,
    by one process at a time (``_remove_stale``: no two holders when several meet it).
    The same process may nest locks on one folder (an experiment trains into its own folder).
    The folder must exist.

    Raises:
        RunFolderLocked: a live process (on this host, or any process on another host) holds
            the lock; the message names it and the lock file to delete if it is known dead.
        ConfigError: the lock file cannot be created (a read-only or absent folder).
    """
    folder = Path(folder).resolve()
    if _HELD.get(folder):
        _HELD[folder] += 1
        try:
            yield folder
        finally:
            _HELD[folder] -= 1
        return
    path = folder / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
          "command": command}
    for _ in range(50):  # another process may win each takeover; each round is short
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                owner = {}
            pid, host = owner.get("pid"), owner.get("host")
            if isinstance(pid, int) and host == me["host"] and not _pid_alive(pid):
                if _remove_stale(path, owner):
                    log.warning("%s: taking over a stale lock of pid %d (no longer running)",
                                folder, pid)
                continue
            who = f"pid {pid} on {host}" if pid else "an unknown process (unreadable lock)"
            what = f" ({owner['command']})" if owner.get("command") else ""
            raise RunFolderLocked(f"{folder} is in use by {who}{what}: wait for it, or delete "
                                  f"{path} if that process is gone") from None
        except OSError as e:  # a read-only folder, a file in the way
            raise ConfigError(f"cannot write into the run folder {folder}: "
                              f"{e.strerror or e}") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise RunFolderLocked(f"{folder}: its stale lock could not be taken over (another "
                              f"takeover runs, or {path.name}.takeover was left by a process "
                              f"killed in one and is removed after {TAKEOVER_STALE_S:.0f} s): "
                              "try again")
    _HELD[folder] = 1
    try:
        yield folder
    finally:
        _HELD.pop(folder, None)
        with contextlib.suppress(OSError):
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()


# ---------------------------------------------------------------------------------------------
# Checkpoint records
# ---------------------------------------------------------------------------------------------
CHECKPOINT_RECORD = "envace_checkpoint.json"
"""The file inside a checkpoint folder naming the profile, model and tokenizer it was trained
under (``write_checkpoint_record``)."""


def tokenizer_id(tokenizer: Any) -> dict[str, Any]:
    """``{"name", "vocab_size", "vocab_sha"}``: which tokenizer, by its vocabulary's SHA-256."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]
    return {"name": str(getattr(tokenizer, "name_or_path", "")), "vocab_size": len(vocab),
            "vocab_sha": digest}


def write_checkpoint_record(folder: str | Path, cfg: Any, tokenizer: Any = None) -> Path:
    """Write ``folder/envace_checkpoint.json``: the profile, ``model.kind``/``name`` and (when
    given) the tokenizer (``tokenizer_id``) of a checkpoint."""
    record = {"profile": cfg.profile, "model.kind": cfg.model.kind, "model.name": cfg.model.name}
    if tokenizer is not None:
        record["tokenizer"] = tokenizer_id(tokenizer)
    path = Path(folder) / CHECKPOINT_RECORD
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
    return path


def check_checkpoint(checkpoint: str | Path, cfg: Any, allow_mismatch: bool = False,
                     name: str = "checkpoint") -> dict[str, Any] | None:
    """Refuse a checkpoint trained under another profile or model than ``cfg``'s.

    Args:
        checkpoint: the checkpoint folder.
        cfg: the config it is about to be used under.
        allow_mismatch: only log the mismatch (``--allow-profile-mismatch``).
        name: the option named in the message.

    Returns:
        The checkpoint's record, or None when it has none (written before records existed).

    Raises:
        ConfigError: the folder is absent, its record is not JSON, or it was trained under
            another profile, ``model.kind`` or ``model.name`` (unless ``allow_mismatch``).
    """
    folder = Path(checkpoint)
    if not folder.is_dir():
        raise ConfigError(f"{name} {checkpoint}: the folder is absent")
    path = folder / CHECKPOINT_RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{name} {checkpoint}: its {CHECKPOINT_RECORD} is damaged (not JSON: "
                          f"{getattr(e, 'msg', e)}); remove it to load the checkpoint without "
                          "the profile check, or rewrite it from the run's config.json") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{name} {checkpoint}: its {CHECKPOINT_RECORD} is not a JSON object")
    mine = {"profile": cfg.profile, "model.kind": cfg.model.kind, "model.name": cfg.model.name}
    diffs = [f"{k} {record.get(k)!r} (now {v!r})" for k, v in mine.items() if record.get(k) != v]
    if diffs:
        text = (f"{name} {checkpoint} was trained under {', '.join(diffs)}; tokenizer "
                f"{record.get('tokenizer', {}).get('name', '?')}")
        if not allow_mismatch:
            raise ConfigError(f"{text}: use --profile {record.get('profile')}, or "
                              "--allow-profile-mismatch")
        log.warning("%s (allowed by --allow-profile-mismatch)", text)
    return record


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
