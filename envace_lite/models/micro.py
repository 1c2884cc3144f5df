"""The ``micro`` profile's policy: a from-scratch Qwen3 on a BPE vocabulary trained offline.

A model of a few million parameters learns the ACT/REHEARSE formats in minutes on 2 CPU cores,
which makes every mechanism of the course visible on a laptop. Nothing is faked: the
tokenizer is trained on the real warm-start transcripts (``transcript_texts`` of the SFT share
of the train split, never on test tasks), and the model is a real ``Qwen3ForCausalLM``.

Tokenizer (``micro_tokenizer``): byte-level BPE (``tokenizers``) with NO pre-tokenizer split, so
that merges may cross spaces and punctuation (``model.split_digits`` and
``model.split_capitalized`` isolate digits and capitalized words, ``model.split_id_names``
the words of ids, ``model.spell_names`` the letters of names and ids, drills levers); three
special tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos); a ChatML chat template (``CHAT_TEMPLATE``), so that
``chat_ids``/``chat_glue`` work unchanged. Cached under ``cache_dir("tokenizers")`` by a
fingerprint of (recipe, vocabulary size, corpus).

The vocabulary size (4,096, no word split) and the suite (tau2-telecom, first user turn) were
chosen by measurement; the measurements and the reasons are in docs/design.md, "The micro
profile: measured choices".

Model (``micro_model``): ``Qwen3ForCausalLM`` with ``model.hidden_size`` 256, 4 layers, 4 heads
(2 key/value heads), MLP 768, tied embeddings: 4.2M parameters at a 4,096 vocabulary. The same
seed gives the same weights.

Pretrained bases (``study.pretrain``): ``"copy"`` with the shipped recipe is the shipped base in
``data/micro_base`` (``micro_base.py``: weights and tokenizer, sha256-checked, never trained on
the way to a run; the ``drills`` profile starts from it); other values are bases that a plugin
registers (``register_base``) and trains once.

Usage::

    from envace_lite.models.load import load_policy
    model, tok = load_policy(get_config("micro"))          # trains the tokenizer on first use (seconds)
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from typing import Any, Callable

import torch

from envace_lite.config import Config
from envace_lite.paths import cache_dir, is_cached, write_cache
from envace_lite.progress import get_logger

log = get_logger(__name__)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Ids 0, 1, 2 of every micro vocabulary: pad, message start, end of turn (eos)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, append-only (``engine.chat_glue`` derives its glue from it); ``chatml_text``
renders the same text without a tokenizer."""

_RECIPE = 1
"""Bump when the tokenizer recipe changes (part of the cache fingerprint)."""


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
def chatml_text(messages: list[dict[str, str]], gen: bool) -> str:
    """ChatML text of ``messages`` (the micro tokenizer's template; used to train it)."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + ("<|im_start|>assistant\n" if gen else "")


def transcript_texts(ts: Any) -> list[str]:
    """Every transcript of an ``transcripts.TranscriptSet`` as ChatML text, in the order
    ``transcripts.encode_act``/``encode_rehearse`` pack it (the tokenizer corpus)."""
    texts = []
    for tr in ts.act:
        parts = [chatml_text(tr.prompt, True)]
        for k, out in enumerate(tr.outputs):
            parts.append(out + "<|im_end|>")
            if k < len(tr.glue):
                parts.append("\n" + chatml_text(tr.glue[k], True))
        texts.append("".join(parts))
    texts += [chatml_text(ex.messages, True) + ex.target + "<|im_end|>" for ex in ts.rehearse]
    return texts


SPELLED = (r"\p{Lu}|(?<=" + "|".join(r"\p{Lu}" + r"\p{Ll}" * k for k in range(15)) + r")\p{Ll}"
           r"|[\p{L}_.](?=[\p{L}_.]*[\p{N}@])")
"""The characters ``model.spell_names`` isolates (a regex for ``tokenizers``' ``Split``): every
upper-case letter; a lower-case letter after an upper-case one and at most 14 lower-case ones
(the rest of a capitalized word: Oniguruma's look-behind takes fixed-width alternatives only,
so from a capitalized word's 17th letter on it merges again); a letter, ``_`` or ``.``
followed, within a run of such characters, by a digit or ``@`` (an id or an e-mail's local
part). Example: ``I'm Omar, fatima_anderson_6252`` -> ``I``, ``'m ``, ``O``, ``m``, ``a``,
``r``, ``, ``, ``f`` ... ``_``, ``6252`` (the digits are ``model.split_digits``'s)."""

ID_WORDS = r"[a-z]+(?=[_.][a-z]+_?\d)|(?<=[a-z][_.])[a-z]+(?=_?\d)"
"""The words ``model.split_id_names`` isolates (a regex for ``tokenizers``' ``Split``): the
lower-case word before ``_`` or ``.`` and another word that runs on to a digit, and that second
word itself (the name parts of ``omar_silva_9907``, ``mei.martin5518@example.com``, and the
``gift``, ``card`` of ``gift_card_5193172``). Tool names and keys (``find_user_id_by_name_zip``,
``user_id``) reach no digit and still merge."""


def train_bpe(texts: list[str], vocab_size: int, split_capitalized: bool = False,
              split_digits: bool = False, spell_names: bool = False,
              split_id_names: bool = False) -> Any:
    """Train a byte-level BPE on ``texts`` and wrap it as a chat tokenizer.

    Args:
        texts: the corpus (ChatML transcripts).
        vocab_size: total ids, the three special tokens and the 256 byte symbols included.
        split_capitalized: isolate every capitalized word before BPE
            (``model.split_capitalized``), so a name is the same token in every context; other
            text merges across word boundaries either way (the micro default, see the module
            docstring).
        split_digits: isolate every digit before BPE (``model.split_digits``), so numbers and
            ids are one token per digit.
        spell_names: isolate every character that ``SPELLED`` matches (``model.spell_names``),
            so names and ids are one token per letter wherever they appear.
        split_id_names: isolate every word that ``ID_WORDS`` matches (``model.split_id_names``),
            so the name parts of a user id or an e-mail are the same tokens wherever it appears.

    Returns:
        A ``PreTrainedTokenizerFast`` with ``CHAT_TEMPLATE``, eos ``<|im_end|>``, pad
        ``<|endoftext|>``, left padding. Deterministic for the same inputs.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # spelling and id words go first: they look ahead across an id's digits, which Digits then
    # isolates
    steps = [pre_tokenizers.Split(Regex(SPELLED), "isolated")] if spell_names else []
    if split_id_names:
        steps.append(pre_tokenizers.Split(Regex(ID_WORDS), "isolated"))
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split_capitalized:
        steps.append(pre_tokenizers.Split(Regex(r"\p{Lu}\p{Ll}+"), "isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    backend.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=1 << 20,
                                  clean_up_tokenization_spaces=False)
    tok.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                            "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def micro_corpus(cfg: Config) -> list[str]:
    """The tokenizer corpus: ChatML texts of the SFT half's transcripts (train split only), plus
    the pretraining documents when ``study.pretrain`` is set.

    The grounding draw uses seed 0 whatever ``run.seed`` is, and the warm start's extra rows
    (``warmstart.memory_share``, ``study.error_rows``) are left out, so every seed and every
    warm-start option of a profile shares one tokenizer (and one copy base).
    """
    from envace_lite.core.task_split import training_tasks
    from envace_lite.core.transcripts import build_transcripts

    plain = copy.deepcopy(cfg)
    plain.warmstart.memory_share, plain.study.error_rows = 0.0, False
    texts = transcript_texts(build_transcripts(training_tasks(plain, "sft"), plain, seed=0))
    if cfg.study.pretrain and cfg.study.pretrain != SHIPPED_PRETRAIN:
        # a base's own documents (domain pretraining) shape the vocabulary too; the copy
        # warm-up has none
        corpus = _registered_base(cfg.study.pretrain)[1]
        if corpus is not None:
            texts += corpus(cfg.study.pretrain)
    return texts


def micro_tokenizer(cfg: Config, rebuild: bool = False, shipped: bool = True) -> Any:
    """The micro tokenizer of ``cfg`` (``model.vocab_size``), trained once and cached.

    The cache folder is ``cache_dir("tokenizers")/micro-<fingerprint>``, where the fingerprint
    hashes the recipe, the vocabulary size and the corpus text, so a change of suites, split,
    rendering or user-turn cut trains a new one.

    Under ``study.pretrain="copy"`` with the shipped base's recipe (``micro_base.matches``) it
    is the shipped base's tokenizer (``micro_base.load_tokenizer``, hashes checked), unless
    ``shipped`` is False: then the one trained on the corpus (what ``envace-lite drills
    copy-base`` ships).
    """
    from transformers import PreTrainedTokenizerFast

    if shipped and _shipped(cfg):
        from envace_lite.models.micro_base import load_tokenizer

        return load_tokenizer()

    texts = micro_corpus(cfg)
    key = [_RECIPE, cfg.model.vocab_size] + (["digits"] if cfg.model.split_digits else []) + (
        ["capitalized"] if cfg.model.split_capitalized else []) + (
        ["spelled"] if cfg.model.spell_names else []) + (
        ["id_words"] if cfg.model.split_id_names else [])
    h = hashlib.sha1(json.dumps(key).encode())
    for t in texts:
        h.update(t.encode())
    target = cache_dir("tokenizers") / f"micro-{h.hexdigest()[:12]}"
    if rebuild or not is_cached(target, _RECIPE):
        start = time.perf_counter()
        tok = train_bpe(texts, cfg.model.vocab_size, split_capitalized=cfg.model.split_capitalized,
                        split_digits=cfg.model.split_digits, spell_names=cfg.model.spell_names,
                        split_id_names=cfg.model.split_id_names)
        write_cache(target, _RECIPE, tok.save_pretrained, replace=rebuild)
        log.info("trained the micro tokenizer (%d ids, %d texts) in %.1f s; cached at %s",
                 len(tok), len(texts), time.perf_counter() - start, target)
    tok = PreTrainedTokenizerFast.from_pretrained(target)
    tok.padding_side = "left"
    return tok


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
def micro_model(cfg: Config, tokenizer: Any) -> Any:
    """A freshly initialised ``Qwen3ForCausalLM`` sized by ``cfg.model`` on ``tokenizer``.

    ``head_dim = hidden_size // num_heads``, key/value heads half the heads, tied embeddings.
    Seeded by ``cfg.run.seed`` without touching the global RNG. Returned in eval mode, float32.
    """
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    m = cfg.model
    if m.hidden_size % m.num_heads:
        raise ValueError(f"hidden_size {m.hidden_size} is not a multiple of num_heads {m.num_heads}")
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
        num_key_value_heads=max(1, m.num_heads // 2), head_dim=m.hidden_size // m.num_heads,
        max_position_embeddings=m.context_window, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"), eos_token_id=eos,
        pad_token_id=pad,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=pad,
                                               bos_token_id=config.bos_token_id)
    return model.eval()


SHIPPED_PRETRAIN = "copy"
"""The ``study.pretrain`` value served by the shipped base in ``data/micro_base``
(``micro_base.py``): the ``drills`` profile's copy warm-up, loaded and never trained."""

def _shipped(cfg: Config) -> bool:
    """True when ``cfg`` starts from the shipped base (``SHIPPED_PRETRAIN`` and its recipe)."""
    if cfg.study.pretrain != SHIPPED_PRETRAIN:
        return False
    from envace_lite.models.micro_base import matches

    return matches(cfg)


BaseBuilder = Callable[[Config, Any], Any]
"""``build(cfg, tokenizer) -> model``: a pretrained micro base (trained once, then cached)."""

_BASES: dict[str, tuple[BaseBuilder, Callable[[str], list[str]] | None]] = {}


def register_base(names: tuple[str, ...], build: BaseBuilder,
                  corpus: Callable[[str], list[str]] | None = None) -> None:
    """Serve the ``study.pretrain`` values ``names`` with ``build``; ``corpus(name)``, when given,
    returns documents the micro tokenizer also trains on (a plugin registers its bases on
    import; ``plugins.py``)."""
    for name in names:
        _BASES[name] = (build, corpus)


def _registered_base(name: str) -> tuple[BaseBuilder, Callable[[str], list[str]] | None]:
    """``(build, corpus)`` registered for ``study.pretrain`` ``name``, loading the plugins first
    when it is not registered yet.

    Raises:
        KeyError: a ``study.pretrain`` that no plugin registers.
    """
    if name not in _BASES:
        from envace_lite.plugins import load_plugins

        load_plugins()
    if name not in _BASES:
        raise KeyError(f"unknown study.pretrain {name!r}: choose one of {sorted(_BASES)}")
    return _BASES[name]


def micro_policy(cfg: Config) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the micro profile (``load.load_policy`` calls this): random
    init; the shipped base under ``study.pretrain="copy"`` with its recipe
    (``micro_base.load_base``: loaded, never trained); or the registered pretrained base named by
    ``study.pretrain`` (a lever, or ``copy`` with another recipe: trained once and cached).

    Raises:
        KeyError: a ``study.pretrain`` that no plugin registers.
        ConfigError: the shipped base is missing or damaged (``micro_base.verify``).
    """
    if _shipped(cfg):
        from envace_lite.models.micro_base import load_base

        return load_base()
    tok = micro_tokenizer(cfg)
    if cfg.study.pretrain:
        return _registered_base(cfg.study.pretrain)[0](cfg, tok), tok
    return micro_model(cfg, tok), tok


__all__ = ["CHAT_TEMPLATE", "SHIPPED_PRETRAIN", "SPECIAL_TOKENS", "BaseBuilder", "chatml_text",
           "micro_corpus",
           "micro_model", "micro_policy", "micro_tokenizer", "register_base", "train_bpe",
           "transcript_texts"]
