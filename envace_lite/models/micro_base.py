"""The shipped micro base: the copy-warm-up weights and tokenizer, committed with their hashes.

The ``drills`` profile (``study.pretrain="copy"``) starts from a 4.2M-parameter Qwen3 that has
been trained to copy ids from its context (the copy warm-up of the drills study). Trained on
another machine the same recipe gives other last bits, and the warm starts built on it differ by
tens of points, so the base is shipped like a hub model: ``data/micro_base/`` holds
``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files and
``manifest.json`` (each file's sha256, the command that made it and its measured result).
Loading never trains: ``load_base`` checks every hash first.

Outcomes (``tests/test_micro_base.py``):

* the shipped folder loads: ``(model, tokenizer)``, the model in eval mode, fp32;
* a file whose sha256 differs from the manifest stops with ``BaseHashError``, one line;
* a missing file (or manifest) stops with ``BaseMissingError``, one line that names the rebuild
  command (``REBUILD``).

Both errors are ``ConfigError`` s, so the CLI prints the line and exits 2.

Usage::

    from envace_lite.models.micro_base import load_base
    model, tok = load_base()                 # data/micro_base, hashes checked
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envace_lite.config import ConfigError
from envace_lite.paths import DATA_DIR

BASE_DIR = DATA_DIR / "micro_base"
"""Where the shipped base lives in a checkout (``paths.DATA_DIR``)."""

MANIFEST = "manifest.json"
"""The manifest's file name inside a base folder."""

REBUILD = "envace-lite drills copy-base --out data/micro_base"
"""The command that rebuilds the shipped base (about 12 minutes on 2 CPU cores)."""


class BaseMissingError(ConfigError):
    """A base folder lacks its manifest or a file the manifest lists."""


class BaseHashError(ConfigError):
    """A file of a base folder does not have the sha256 its manifest records."""


def sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


RECIPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size",
                 "context_window", "split_digits", "pretrain_steps", "pretrain_seed",
                 "pretrain_schedule")
"""The config fields a base was built with (its manifest's ``recipe``): ``cfg.model``'s, and the
``pretrain_*`` ones of ``cfg.study`` (the drills study's copy warm-up)."""


def recipe(cfg: Any) -> dict[str, Any]:
    """``{field: value}`` for ``RECIPE_FIELDS``, read from ``cfg.study`` for a ``pretrain_*``
    field and from ``cfg.model`` for the others."""
    return {k: getattr(cfg.study if k.startswith("pretrain") else cfg.model, k)
            for k in RECIPE_FIELDS}


def write_manifest(folder: str | Path, command: str, result: dict[str, Any],
                   built_with: dict[str, Any]) -> dict[str, Any]:
    """Hash every file of ``folder`` (the manifest aside) into ``folder/manifest.json``.

    Args:
        folder: a base folder (``save_pretrained`` of the model and of the tokenizer).
        command: the command that made it.
        result: its measured result (e.g. the warm-up's loss and exact copies).
        built_with: its ``recipe``.

    Returns:
        The manifest: ``{"files": {name: sha256}, "command", "result", "recipe"}``.
    """
    folder = Path(folder)
    files = {p.name: sha256(p) for p in sorted(folder.iterdir())
             if p.is_file() and p.name != MANIFEST}
    manifest = {"files": files, "command": command, "result": result, "recipe": built_with}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify(folder: str | Path = BASE_DIR) -> dict[str, Any]:
    """Check every file the manifest of ``folder`` lists against its sha256.

    Returns:
        The manifest.

    Raises:
        BaseMissingError: no manifest, or a listed file is missing (names ``REBUILD``).
        BaseHashError: a file's sha256 differs from the manifest's.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.exists():
        raise BaseMissingError(f"micro base: {path} is missing; rebuild with `{REBUILD}`")
    manifest = json.loads(path.read_text())
    for name, want in manifest["files"].items():
        f = folder / name
        if not f.exists():
            raise BaseMissingError(f"micro base: {f} is missing; rebuild with `{REBUILD}`")
        got = sha256(f)
        if got != want:
            raise BaseHashError(f"micro base: {f} has sha256 {got[:16]}…, its manifest records "
                                f"{want[:16]}…: the file is damaged or not the shipped one")
    return manifest


def matches(cfg: Any, folder: str | Path = BASE_DIR) -> bool:
    """True when ``cfg`` asks for the base in ``folder``: every ``RECIPE_FIELDS`` value
    equals its manifest's ``recipe``. Another recipe (a lever such as
    ``study.pretrain_schedule=cosine``) is a base of its own, trained and cached by the drills
    study (``drills.copy_warmup.copy_base``).

    Raises:
        BaseMissingError: no manifest (names ``REBUILD``).
    """
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise BaseMissingError(f"micro base: {path} is missing; rebuild with `{REBUILD}`")
    built = json.loads(path.read_text()).get("recipe", {})
    return all(built.get(k) == v for k, v in recipe(cfg).items())


def load_tokenizer(folder: str | Path = BASE_DIR) -> Any:
    """The base's tokenizer (hashes checked; left padding)."""
    from transformers import PreTrainedTokenizerFast

    verify(folder)
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    tok.padding_side = "left"
    return tok


def load_base(folder: str | Path = BASE_DIR) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a base folder, after ``verify``: a ``Qwen3ForCausalLM`` in eval
    mode (fp32) and its tokenizer (left padding).

    Raises:
        BaseMissingError, BaseHashError: see ``verify``.
    """
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    verify(folder)
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    tok.padding_side = "left"
    return Qwen3ForCausalLM.from_pretrained(folder).eval(), tok


__all__ = ["BASE_DIR", "BaseHashError", "BaseMissingError", "MANIFEST", "REBUILD", "RECIPE_FIELDS",
           "load_base", "load_tokenizer", "matches", "recipe", "sha256", "verify",
           "write_manifest"]
