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
  command (``REBUILD``);
* a damaged manifest (not JSON, no files, a changed recipe or result: any byte other than the
  shipped one's, ``SHIPPED_MANIFEST_SHA256``, checked for ``BASE_DIR``) and a listed file that
  is not a regular file or has another size than its recorded one stop with ``BaseHashError``,
  one line naming the file, before
  any file is hashed: a damaged manifest never makes the ``drills`` profile train a base of its
  own (only a config that asks for another recipe does, ``matches``).

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


SHIPPED_MANIFEST_SHA256 = "fb62057ad6bdfb9caf143feb40c384b37637e14233b503d742e4006f0d71a78f"
"""The sha256 of ``data/micro_base/manifest.json``: the shipped base is loaded only under this
manifest. A rebuilt base (``REBUILD``) has a manifest of its own; pin its sha256 here."""

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
"""Files every base manifest must list."""


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
                 "context_window", "split_digits", "split_capitalized", "spell_names",
                 "split_id_names", "pretrain_steps", "pretrain_seed", "pretrain_schedule",
                 "pretrain_people_steps")
"""The config fields a base was built with (its manifest's ``recipe``): ``cfg.model``'s, and the
``pretrain_*`` ones of ``cfg.study`` (the drills study's copy warm-up)."""

BUILT_BEFORE = {"split_capitalized": False, "spell_names": False, "split_id_names": False,
                "pretrain_people_steps": 0}
"""Recipe fields added after the shipped base was built, at the value it was built with (its
manifest, pinned by sha256, does not name them)."""


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
        The manifest: ``{"files": {name: sha256}, "sizes": {name: bytes}, "command", "result",
        "recipe"}``.
    """
    folder = Path(folder)
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST]
    manifest = {"files": {p.name: sha256(p) for p in paths},
                "sizes": {p.name: p.stat().st_size for p in paths},
                "command": command, "result": result, "recipe": built_with}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


SHIPPED = "shipped"
"""``pinned``'s default: the shipped pin for the shipped folder (``BASE_DIR``), none elsewhere."""


def _pin(folder: Path, pinned: str | None) -> str | None:
    if pinned != SHIPPED:
        return pinned
    return SHIPPED_MANIFEST_SHA256 if folder.resolve() == Path(BASE_DIR).resolve() else None


def read_manifest(folder: str | Path = BASE_DIR, pinned: str | None = SHIPPED) -> dict[str, Any]:
    """The manifest of ``folder``, checked before any listed file is read.

    Args:
        folder: a base folder.
        pinned: the sha256 the manifest file must have; ``SHIPPED`` (the default): the shipped
            pin when ``folder`` is ``BASE_DIR``, else none; None: no pin (a base built
            elsewhere, checked by its structure only).

    Returns:
        The manifest: ``{"files", "command", "result", "recipe"}`` (and ``sizes``).

    Raises:
        BaseMissingError: no manifest (names ``REBUILD``).
        BaseHashError: the manifest is not a regular file, differs from ``pinned``, is not JSON,
            or lists no files, misses one of ``REQUIRED_FILES`` or has no recipe.
    """
    path = Path(folder) / MANIFEST
    pinned = _pin(Path(folder), pinned)
    if not path.exists():
        raise BaseMissingError(f"micro base: {path} is missing; rebuild with `{REBUILD}`")
    damaged = (f"micro base: {path} is damaged ({{}}); restore it (git checkout {path}), or "
               f"rebuild it with `{REBUILD}` and pin its new sha256 in "
               "micro_base.SHIPPED_MANIFEST_SHA256")
    if not path.is_file():
        raise BaseHashError(damaged.format("not a regular file"))
    if pinned is not None and (got := sha256(path)) != pinned:
        raise BaseHashError(damaged.format(f"sha256 {got[:16]}…, the shipped manifest's is "
                                           f"{pinned[:16]}…"))
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BaseHashError(damaged.format(f"not JSON: {e}")) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise BaseHashError(damaged.format("it lists no files"))
    if missing := [f for f in REQUIRED_FILES if f not in files]:
        raise BaseHashError(damaged.format(f"it does not list {', '.join(missing)}"))
    recipe_ = manifest.get("recipe")
    if not isinstance(recipe_, dict) or set(RECIPE_FIELDS) - set(recipe_) - set(BUILT_BEFORE):
        raise BaseHashError(damaged.format("its recipe lacks fields of RECIPE_FIELDS"))
    return manifest


def verify(folder: str | Path = BASE_DIR, pinned: str | None = SHIPPED) -> dict[str, Any]:
    """Check the manifest of ``folder`` (``read_manifest``), then every file it lists against
    its size and sha256.

    Returns:
        The manifest.

    Raises:
        BaseMissingError: no manifest, or a listed file is missing (names ``REBUILD``).
        BaseHashError: a damaged manifest (``read_manifest``); a listed file that is not a
            regular file (a device, a folder; a link is followed), of another size than its
            recorded one, or whose sha256 differs from the manifest's.
    """
    folder = Path(folder)
    manifest = read_manifest(folder, pinned)
    sizes = manifest.get("sizes", {})
    for name, want in manifest["files"].items():
        f = folder / name
        if not f.exists():
            raise BaseMissingError(f"micro base: {f} is missing; rebuild with `{REBUILD}`")
        if not f.is_file():  # /dev/zero behind a link would hash forever
            raise BaseHashError(f"micro base: {f} is not a regular file; restore it or rebuild "
                                f"with `{REBUILD}`")
        if name in sizes and (size := f.stat().st_size) != sizes[name]:
            raise BaseHashError(f"micro base: {f} has {size} bytes, its manifest records "
                                f"{sizes[name]}: the file is damaged or not the shipped one")
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
        BaseMissingError, BaseHashError: a missing or damaged manifest (``read_manifest``): a
            damaged recipe is never read as another recipe.
    """
    built = read_manifest(folder)["recipe"]
    return all(built.get(k, BUILT_BEFORE.get(k)) == v for k, v in recipe(cfg).items())


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
           "REQUIRED_FILES", "SHIPPED", "SHIPPED_MANIFEST_SHA256", "load_base", "load_tokenizer",
           "matches", "read_manifest", "recipe", "sha256", "verify", "write_manifest"]
