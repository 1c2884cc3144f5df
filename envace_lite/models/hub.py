"""Hub models on this machine: the local Hugging Face cache first, the hub unless it is offline.

``check_model_reachable`` refuses, before any run folder or model, a policy this machine cannot
load (a ``cuda`` device without CUDA, a hub model missing from the local cache while
``HF_HUB_OFFLINE`` is set). ``load_pretrained`` is how ``load.py`` loads a hub model or tokenizer:
the local cache first, then the hub unless offline, with one error naming what to do when
neither has it.

Usage::

    from transformers import AutoTokenizer
    from envace_lite.models.hub import check_model_reachable, load_pretrained

    check_model_reachable(cfg)                      # ConfigError, one line, before anything runs
    tok = load_pretrained(AutoTokenizer, "Qwen/Qwen3-1.7B")
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from envace_lite.config import Config, ConfigError
from envace_lite.profiles import OFFLINE_PROFILES


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes", "on"}


def check_model_reachable(cfg: Config) -> None:
    """Before any run folder or model: the policy ``cfg`` names can load on this machine.

    Checks that a ``cuda`` device has CUDA, and that a hub model (``model.kind="hub"``, no
    ``model.checkpoint``, a name that is no local folder) is in the local Hugging Face cache
    when the hub is offline (``HF_HUB_OFFLINE``). With the hub online a missing model is
    downloaded at load time, so it is not refused here.

    Raises:
        ConfigError: one line naming the setting and what to do instead.
    """
    m = cfg.model
    if m.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--profile {cfg.profile}: model.device={m.device!r} needs a CUDA GPU "
                          "and this machine has none: use an offline profile "
                          f"({', '.join(OFFLINE_PROFILES)}), or --set model.device=cpu")
    if m.kind != "hub" or m.checkpoint or Path(m.name).exists() or not hub_offline():
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(m.name, "config.json"), str):
        raise ConfigError(f"model.name={m.name!r} is not in the local Hugging Face cache and the "
                          f"hub is offline (HF_HUB_OFFLINE): download it on a connected machine "
                          f"(`hf download {m.name}`), point model.name at a local folder, or use "
                          f"an offline profile ({', '.join(OFFLINE_PROFILES)})")


def _hub_error(name: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(
        f"could not load {name!r}: it is not in the local Hugging Face cache and the hub is "
        f"offline or unreachable ({type(exc).__name__}). Download it on a connected machine "
        f"(`hf download {name}`), or use an offline profile: {', '.join(OFFLINE_PROFILES)}."
    )


def load_pretrained(loader: Any, name: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(name, **kwargs)``: local cache first, then the hub unless offline.

    Args:
        loader: a transformers class with ``from_pretrained`` (``AutoTokenizer``,
            ``AutoModelForCausalLM`` ...).
        name: a hub model id or a local folder.

    Raises:
        RuntimeError: neither the cache nor the hub has ``name`` (the hub offline or
            unreachable), naming ``hf download`` and the offline profiles.
        OSError: a local folder that does not load (the hub cannot help).
    """
    try:
        return loader.from_pretrained(name, local_files_only=True, **kwargs)
    except OSError as exc:
        if Path(name).exists():  # a local folder: the hub cannot help
            raise
        if hub_offline():
            raise _hub_error(name, exc) from exc
    try:
        return loader.from_pretrained(name, **kwargs)
    except OSError as exc:  # transformers wraps connection errors as OSError
        raise _hub_error(name, exc) from exc

