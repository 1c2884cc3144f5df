"""The ``micro`` profile's policy: a from-scratch Qwen3 on a BPE vocabulary trained offline.

A model of a few million parameters learns the ACT/REHEARSE formats in minutes on 2 CPU cores,
which makes every mechanism of the course visible on a laptop. Nothing is faked: the
tokenizer is trained on the real warm-start transcripts (``transcript_texts`` of the SFT share
of the train split, never on test tasks), and the model is a real ``Qwen3ForCausalLM``.

Tokenizer (``micro_tokenizer``): byte-level BPE (``tokenizers``) with NO pre-tokenizer split, so
that merges may cross spaces and punctuation; three special tokens ``<|endoftext|>`` (pad),
``<|im_start|>``, ``<|im_end|>`` (eos); a ChatML chat template (``CHAT_TEMPLATE``), so that
``chat_ids``/``chat_glue`` work unchanged. Cached under ``cache_dir("tokenizers")`` by a
fingerprint of (recipe, vocabulary size, corpus).

The vocabulary size (4,096, no word split) and the suite (tau2-telecom, first user turn) were
chosen by measurement; the measurements and the reasons are in docs/design.md, "The micro
profile: measured choices".

Model (``micro_model``): ``Qwen3ForCausalLM`` with ``model.hidden_size`` 256, 4 layers, 4 heads
(2 key/value heads), MLP 768, tied embeddings: 4.2M parameters at a 4,096 vocabulary. The same
seed gives the same weights.

Usage::

    from envace_lite.models import load_policy
    model, tok = load_policy("micro")          # trains the tokenizer on first use (seconds)
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import time
from typing import Any

import torch

from envace_lite.config import Config
from envace_lite.paths import cache_dir, is_cached, write_cache
from envace_lite.progress import get_logger
from envace_lite.prompts import assistant_text, tool_response_message
from envace_lite.rehearse_prompt import rehearsal_text
from envace_lite.types import Observation, ToolCall

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


def train_bpe(texts: list[str], vocab_size: int, split_words: bool = False,
              split_digits: bool = False) -> Any:
    """Train a byte-level BPE on ``texts`` and wrap it as a chat tokenizer.

    Args:
        texts: the corpus (ChatML transcripts).
        vocab_size: total ids, the three special tokens and the 256 byte symbols included.
        split_words: GPT-2's regex split before BPE (merges stay within words); False lets merges
            cross word boundaries (the micro default, see the module docstring).
        split_digits: isolate every digit before BPE (``model.split_digits``), so numbers and
            ids are one token per digit.

    Returns:
        A ``PreTrainedTokenizerFast`` with ``CHAT_TEMPLATE``, eos ``<|im_end|>``, pad
        ``<|endoftext|>``, left padding. Deterministic for the same inputs.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words)
    backend.pre_tokenizer = (pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), byte_level]) if split_digits
        else byte_level)
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
    the pretraining documents when ``model.pretrain`` is set.

    The grounding draw uses seed 0 whatever ``run.seed`` is, and the warm start's extra rows
    (``warmstart.memory_share``, ``warmstart.error_rows``) are left out, so every seed and every
    warm-start option of a profile shares one tokenizer (and one copy base).
    """
    from envace_lite.transcripts import build_transcripts, training_tasks

    plain = copy.deepcopy(cfg)
    plain.warmstart.memory_share, plain.warmstart.error_rows = 0.0, False
    texts = transcript_texts(build_transcripts(training_tasks(plain, "sft"), plain, seed=0))
    if cfg.model.pretrain not in ("", *COPY_PRETRAINS):  # domain documents shape the vocabulary too
        texts += pretrain_corpus(cfg.model.pretrain)
    return texts


def micro_tokenizer(cfg: Config, rebuild: bool = False) -> Any:
    """The micro tokenizer of ``cfg`` (``model.vocab_size``), trained once and cached.

    The cache folder is ``cache_dir("tokenizers")/micro-<fingerprint>``, where the fingerprint
    hashes the recipe, the vocabulary size and the corpus text, so a change of suites, split,
    rendering or user-turn cut trains a new one.
    """
    from transformers import PreTrainedTokenizerFast


    texts = micro_corpus(cfg)
    key = [_RECIPE, cfg.model.vocab_size] + (["digits"] if cfg.model.split_digits else [])
    h = hashlib.sha1(json.dumps(key).encode())
    for t in texts:
        h.update(t.encode())
    target = cache_dir("tokenizers") / f"micro-{h.hexdigest()[:12]}"
    if rebuild or not is_cached(target, _RECIPE):
        start = time.perf_counter()
        tok = train_bpe(texts, cfg.model.vocab_size, split_digits=cfg.model.split_digits)
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


def micro_policy(cfg: Config) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the micro profile (``models.load_policy`` calls this): random
    init, or the domain-pretrained base when ``model.pretrain`` is set."""
    tok = micro_tokenizer(cfg)
    if cfg.model.pretrain in COPY_PRETRAINS:
        return copy_base(cfg, tok), tok
    if cfg.model.pretrain:
        return pretrained_base(cfg, tok), tok
    return micro_model(cfg, tok), tok


# ---------------------------------------------------------------------------------------------
# Domain pretraining (model.pretrain): a base that can copy ids
# ---------------------------------------------------------------------------------------------
_PRETRAIN_RECIPE = 2
"""Bump when the pretraining recipe changes (part of the cache fingerprint)."""


def pretrain_corpus(domain: str) -> list[str]:
    """Documents of tau2 ``domain``'s database for the TRAIN-split users only: per user, the
    ``get_user_details`` output, then each order's ``get_order_details`` output (airline: each
    reservation's ``get_reservation_details``), exactly as tau2 returns them, one document per
    user. No test-split user, order or reservation appears (split rule: ``drill_spec.test_user``).

    Raises:
        KeyError: an unknown domain.
    """
    from envace_lite.envs.drill_gen import _Solver
    from envace_lite.envs.drill_spec import check_domain, test_user

    check_domain(domain)
    solver = _Solver(domain)
    docs = []
    for uid in sorted(solver.db.users):
        if test_user(uid):
            continue
        user = solver.db.users[uid]
        parts = [solver.call("get_user_details", user_id=uid)[1]["content"]]
        if domain == "retail":
            parts += [solver.call("get_order_details", order_id=o)[1]["content"] for o in user.orders]
        else:
            parts += [solver.call("get_reservation_details", reservation_id=r)[1]["content"]
                      for r in user.reservations]
        docs.append("\n".join(parts))
    return docs


def _step(model: Any, opt: Any, sched: Any, loss: torch.Tensor, backward: bool = True) -> float:
    """One optimizer step of a base training (gradient clip 1.0); returns the loss.
    ``backward=False``: the gradients are already accumulated (``loss`` is only logged)."""
    if backward:
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


# ---------------------------------------------------------------------------------------------
# The copy warm-up (model.pretrain="copy"): entity-free samples that teach in-context copying
# ---------------------------------------------------------------------------------------------
_COPY_RECIPE = 1
"""Bump when the copy warm-up recipe changes (part of the cache fingerprint)."""

COPY_PRETRAINS = ("copy", "copy_hops", "copy_records")
"""The ``model.pretrain`` values that start from the copy warm-up (``copy_base``)."""

_FIRST = ("alex", "bea", "cato", "dara", "eli", "faye", "gus", "hana", "ines", "jude", "kai",
          "lena", "milo", "nora", "otto", "pia", "quin", "rosa", "seb", "tova", "ugo", "vera")
_LAST = ("abe", "berg", "cruz", "dahl", "eze", "frost", "gale", "holm", "iver", "juno", "kerr",
         "lund", "mora", "nash", "orr", "pike", "quay", "rook", "sato", "tate", "ueda", "vance")
_COPY_ASKS = (
    "Hi, what is the status of {what} {x}?", "I want to cancel {what} {x}, please.",
    "Please look up {what} {x} for me.", "Can you check {what} {x}?", "{what} {x} has a problem.",
    "My {what} is {x}. What do you see?", "Something is wrong with {x}.",
)


def _copy_id(rng: random.Random) -> tuple[str, str, str]:
    """One random id as ``(kind, as the user writes it, as the tool takes it)``, in the shapes
    tau2's retail and airline ids have (``#W`` + 7 digits, ``first_last_dddd``, 6 characters,
    an e-mail), drawn from name parts and digits that tau2's databases do not use together."""
    kind = rng.choice(("order_id", "order_id", "user_id", "reservation_id", "email"))
    if kind == "order_id":
        x = "W" + "".join(rng.choice("0123456789") for _ in range(7))
        return kind, x, "#" + x
    if kind == "user_id":
        x = f"{rng.choice(_FIRST)}_{rng.choice(_LAST)}_{rng.randint(1000, 9999)}"
        return kind, x, x
    if kind == "email":
        x = f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}{rng.randint(1000, 9999)}@example.com"
        return kind, x, x
    x = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6))
    return kind, x, x


def copy_samples(n: int, seed: int, forbidden: frozenset[str] = frozenset(),
                 hops: bool = False, records: bool = False
                 ) -> list[tuple[list[dict[str, str]], str]]:
    """``n`` chat samples ``(messages, answer)`` that can only be answered by copying.

    Half are calls: the user's message names one id among 0-2 distractor ids, and the answer is
    ``<tool_call>{"name": "lookup", "arguments": {<kind>: <id as the tool takes it>}}</tool_call>``
    (an order id gains its ``#``, as tau2's tools need). The other half are reports: a
    ``<tool_response>`` record of random fields, and the answer names the asked field's value.
    No tau2 tool name, entity or policy text appears; ids in ``forbidden`` (e.g. every id in
    tau2's databases) are redrawn.

    With ``hops`` (``model.pretrain="copy_hops"``), about a fifth of the samples (22 % of the
    shipped warm-up's; a draw of 1/3, less the linked ids of the same kind) are second calls, made
    after a first ``lookup`` and its ``<tool_response>``: an ``update`` of the id the user
    named (the write after a read: copy from the message, past a record full of other values), or
    a ``lookup`` of the id the record links to (the second hop: copy from the tool response).
    These are the two copies the drills' writes and two-hop tier need and the plain warm-up never
    shows (``docs/drills.md``, "Why RL has nothing to reinforce"). Without ``hops`` the samples
    are exactly those of the plain warm-up.

    Args:
        n: samples (>= 1). seed: ``random.Random(seed)``, so the same seed gives the same samples.
        forbidden: strings no sample may contain as its id.
        hops: add the second-call samples.
        records: (``model.pretrain="copy_records"``) about a third of the samples become record
            copies (``_record_sample``): one to three reference calls with their results, then a
            current call equal to one of them, answered with that reference's result verbatim in
            ``<execution_result>`` tags. This is REHEARSE's use of its grounding ("if a
            reference call matches the current call, reuse its result"), entity-free.

    Returns:
        A list of ``(messages, answer)``: one user message, or with ``hops`` for a second call,
        ``[user, assistant (the first call), user (its tool response)]``.
    """
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        kind, said, arg = _copy_id(rng)
        if said in forbidden or arg in forbidden:
            continue
        what = {"order_id": "order", "user_id": "user id", "reservation_id": "reservation",
                "email": "email"}[kind]
        if records and rng.random() < 1 / 3:
            sample = _record_sample(rng, kind, forbidden)
            if sample is not None:
                out.append(sample)
            continue
        if hops and rng.random() < 1 / 3:
            sample = _hop_sample(rng, kind, said, arg, what, forbidden)
            if sample is not None:
                out.append(sample)
            continue
        if rng.random() < 0.5:
            noise = " ".join(f"(old ref {_copy_id(rng)[1]})" for _ in range(rng.randint(0, 2)))
            text = (noise + " " + rng.choice(_COPY_ASKS).format(what=what, x=said)).strip()
            answer = _call("lookup", {kind: arg})
        else:
            fields = rng.sample(("status", "city", "cabin", "color", "size", "origin", "method"), 3)
            values = [rng.choice(("pending", "delivered", "processed", "cancelled", "business",
                                  "economy", "red", "blue", "large", "small", "paypal",
                                  "credit_card", "Boston", "Denver", "Austin", "Miami")) for _ in fields]
            record = {kind: arg, **dict(zip(fields, values))}
            ask = rng.randrange(len(fields) + 1)
            name, value = ([kind] + fields)[ask], ([arg] + values)[ask]
            text = (f"<tool_response>\n{json.dumps(record)}\n</tool_response>\n"
                    f"What is the {name}?")
            answer = f"The {name} is {value}."
        out.append(([{"role": "user", "content": text}], answer))
    return out


_HOP_WRITES = ("Please change {what} {x}.", "I want to update {what} {x}.",
               "Hi, make the change on {what} {x}, please.")
_HOP_LINKS = ("Find the {link} linked to {what} {x}.", "Which {link} belongs to {what} {x}?")


def _call(name: str, arguments: dict[str, Any]) -> str:
    """An ACT output of one call, as the transcripts write it (``prompts.assistant_text``)."""
    return assistant_text([ToolCall(name, arguments)])


def _hop_sample(rng: random.Random, kind: str, said: str, arg: str, what: str,
                forbidden: frozenset[str]) -> tuple[list[dict[str, str]], str] | None:
    """One second-call sample of ``copy_samples(hops=True)``; None when the linked id drawn is
    forbidden or of the same kind (the caller draws again)."""
    link_kind, _, link = _copy_id(rng)
    if link in forbidden or link_kind == kind or link_kind == "email":
        return None
    fields = rng.sample(("status", "city", "cabin", "color", "size", "origin", "method"), 2)
    values = [rng.choice(("pending", "delivered", "processed", "cancelled", "economy", "red",
                          "large", "paypal", "Boston", "Miami")) for _ in fields]
    record = {kind: arg, **dict(zip(fields, values)), link_kind + "s": [link]}
    noise = " ".join(f"(old ref {_copy_id(rng)[1]})" for _ in range(rng.randint(0, 1)))
    if rng.random() < 0.5:
        ask, answer = rng.choice(_HOP_WRITES), _call("update", {kind: arg})
    else:
        ask, answer = rng.choice(_HOP_LINKS), _call("lookup", {link_kind: link})
    link_what = link_kind.replace("_id", "").replace("_", " ")
    text = (noise + " " + ask.format(what=what, x=said, link=link_what)).strip()
    return ([{"role": "user", "content": text},
             {"role": "assistant", "content": _call("lookup", {kind: arg})},
             tool_response_message([Observation(json.dumps(record))])], answer)


_REC_KEYS = ("status", "city", "cabin", "color", "size", "origin", "method", "zip", "state",
             "brand", "level", "source", "country", "note")
_REC_WORDS = ("pending", "delivered", "processed", "cancelled", "business", "economy", "red",
              "blue", "large", "small", "paypal", "credit_card", "gift_card", "Boston", "Denver",
              "Austin", "Miami", "maple", "steel", "glass", "USA", "TX", "CA", "plain")


def _record(rng: random.Random, kind: str, arg: str) -> dict[str, Any]:
    """A random record for ``_record_sample``: the id, 4-8 fields of words or digits, and 0-3
    items (a name, a 10-digit item id, a price), in a random field order."""
    fields: list[tuple[str, Any]] = [(kind, arg)]
    for key in rng.sample(_REC_KEYS, rng.randint(4, 8)):
        fields.append((key, rng.choice(_REC_WORDS) if rng.random() < 0.6 else
                       "".join(rng.choice("0123456789") for _ in range(rng.randint(4, 8)))))
    items = [{"name": rng.choice(_REC_WORDS), "item_id": "".join(rng.choice("0123456789")
                                                                  for _ in range(10)),
              "price": round(rng.uniform(5, 900), 2)} for _ in range(rng.randint(0, 3))]
    if items:
        fields.insert(rng.randint(1, len(fields)), ("items", items))
    return dict(fields)


def _record_sample(rng: random.Random, kind: str, forbidden: frozenset[str]
                   ) -> tuple[list[dict[str, str]], str] | None:
    """One record copy of ``copy_samples(records=True)``; None when an id drawn is forbidden or
    repeated (the caller draws again)."""
    refs = []
    for _ in range(rng.randint(1, 3)):
        while True:
            k, said, arg = _copy_id(rng)
            if k == kind:
                break
        if said in forbidden or arg in forbidden or any(arg == a for a, _ in refs):
            return None
        refs.append((arg, _record(rng, kind, arg)))
    target, record = refs[rng.randrange(len(refs))]
    blocks = "\n".join(f"{_call('lookup', {kind: a})}\n{rehearsal_text(json.dumps(r))}"
                       for a, r in refs)
    text = (f"Reference calls and their results:\n{blocks}\n\nCurrent call:\n"
            f"{_call('lookup', {kind: target})}")
    return [{"role": "user", "content": text}], rehearsal_text(json.dumps(record))


def tau2_ids() -> frozenset[str]:
    """Every user, order and reservation id and e-mail in tau2's retail and airline databases
    (with and without an order id's ``#``): the ids ``copy_samples`` must not produce."""
    from envace_lite.envs.drill_gen import _Solver

    ids: set[str] = set()
    for domain in ("retail", "airline"):
        db = _Solver(domain).db
        ids.update(db.users)
        ids.update(u.email for u in db.users.values() if getattr(u, "email", None))
        for table in ("orders", "reservations"):
            for k in getattr(db, table, {}) or {}:
                ids.update((k, k.lstrip("#")))
    return frozenset(ids)


def answer_batch(rows: list[tuple[list[int], list[int]]], pad: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` of shape (len(rows), width) for ``(prompt, answer)`` id rows:
    right-padded with ``pad``; labels are the answer ids, -100 elsewhere (loss on the answer
    only), width the longest row."""
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
    return ids, labels


def chunked_answer_loss(model: Any, rows: list[tuple[list[int], list[int]]], pad: int,
                        chunk: int = 16) -> torch.Tensor:
    """The mean answer-token loss of ``rows``, with its gradient accumulated chunk by chunk.

    The rows are sorted by length and cut into chunks of ``chunk`` rows, so that a few long
    record copies do not pad every short sample (``copy_records``). Each chunk's mean loss is
    weighted by its share of the answer tokens, so the sum, and the accumulated gradient, equal
    one padded batch's mean over every answer token (``tests/test_micro.py`` checks both).

    Returns:
        The loss, detached (the gradients are already in ``model``'s ``.grad``).
    """
    rows = sorted(rows, key=lambda r: len(r[0]) + len(r[1]))
    total = sum(len(a) for _, a in rows)
    loss = torch.zeros(())
    for c in range(0, len(rows), chunk):
        ids, labels = answer_batch(rows[c:c + chunk], pad)
        part = model(input_ids=ids, labels=labels).loss * (
            sum(len(a) for _, a in rows[c:c + chunk]) / total)
        part.backward()  # frees each chunk's graph
        loss = loss + part.detach()
    return loss


def copy_lr_factor(step: int, steps: int, schedule: str) -> float:
    """The copy warm-up's learning-rate factor (times 1e-3) at optimizer step ``step`` (0-based).

    A linear warm-up over the first 50 steps, ``(step + 1) / 50``; then 1.0 (``constant``), or
    ``cosine``: 0.5 (1 + cos(pi (step + 1 - 50) / (steps - 50))), which reaches 0 at the last
    step. Example: steps 300, cosine: step 49 -> 1.0, step 174 -> 0.5, step 299 -> 0.0.

    Raises:
        ValueError: an unknown schedule.
    """
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule={schedule!r}: expected 'constant' or 'cosine'")
    warm = min(1.0, (step + 1) / 50)
    if schedule == "constant" or step < 50 or steps <= 50:
        return warm
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step + 1 - 50) / (steps - 50))))


def copy_base(cfg: Config, tokenizer: Any) -> Any:
    """The micro model of ``cfg`` after the copy warm-up (``model.pretrain="copy"``,
    ``"copy_hops"`` with the second-call samples of ``copy_samples(hops=True)``, or
    ``"copy_records"`` with the record copies of ``copy_samples(records=True)``, trained in
    length chunks by ``chunked_answer_loss``), trained once and cached under
    ``cache_dir("pretrained")`` by (recipe, sizes, steps, seed, vocabulary, and ``hops``,
    ``records`` or a non-constant schedule when set), in ``micro-copy-<hash>``,
    ``micro-copy-hops-<hash>`` or ``micro-copy-records-<hash>``.

    ``model.pretrain_steps`` AdamW steps (lr 1e-3, 50 warm-up steps, then constant, or cosine to
    0 under ``model.pretrain_schedule="cosine"``, ``copy_lr_factor``; weight decay
    0; gradient clip 1.0) of 64 ``copy_samples`` each, loss on the answer tokens only (the
    message's random ids are not predictable, and their loss would drown the copy signal). fp32
    on CPU. Measured: 81 of 100 fresh samples copied exactly after 250 steps (``docs/drills.md``,
    "The copy warm-up"). Logged: steps, first/last loss, exact copies on 100 held-out samples,
    seconds.

    Returns:
        A ``Qwen3ForCausalLM`` in eval mode.
    """
    from transformers import Qwen3ForCausalLM

    m = cfg.model
    hops, records = m.pretrain == "copy_hops", m.pretrain == "copy_records"
    key = [_COPY_RECIPE, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
           m.pretrain_steps, m.pretrain_seed, len(tokenizer), m.context_window] + (
               ["hops"] if hops else []) + (["records"] if records else []) + (
               # the plain warm-up keeps its fingerprint
               [] if m.pretrain_schedule == "constant" else [m.pretrain_schedule])
    h = hashlib.sha1(json.dumps(key).encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    name = "micro-copy-hops" if hops else "micro-copy-records" if records else "micro-copy"
    target = cache_dir("pretrained") / f"{name}-{h.hexdigest()[:12]}"
    if is_cached(target, _COPY_RECIPE):
        return Qwen3ForCausalLM.from_pretrained(target).eval()
    start, batch = time.perf_counter(), 64
    forbidden = tau2_ids()
    model = micro_model(copy_config(cfg, seed=m.pretrain_seed), tokenizer)
    samples = copy_samples(batch * m.pretrain_steps + 100, m.pretrain_seed, forbidden, hops,
                           records)
    held_out, samples = samples[:100], samples[100:]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id

    def encode(messages: list[dict[str, str]], answer: str | None) -> tuple[list[int], list[int]]:
        prompt = tokenizer(chatml_text(messages, True), add_special_tokens=False)["input_ids"]
        target_ids = ([] if answer is None else
                      tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos])
        return prompt, target_ids

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: copy_lr_factor(s, m.pretrain_steps, m.pretrain_schedule))
    model.train()
    losses = []
    for step in range(m.pretrain_steps):
        rows = [encode(*s) for s in samples[step * batch:(step + 1) * batch]]
        if not records:
            ids, labels = answer_batch(rows, pad)
            loss = model(input_ids=ids, labels=labels).loss
        else:  # long record copies: chunks of similar length (gradients accumulated)
            loss = chunked_answer_loss(model, rows, pad)
        losses.append(_step(model, opt, sched, loss, backward=not records))
        if step % 50 == 0:
            log.info("copy warm-up step %d/%d loss %.3f", step, m.pretrain_steps, losses[-1])
    model.eval()
    exact = 0
    with torch.no_grad():
        for messages, answer in held_out:
            prompt, target_ids = encode(messages, answer)
            out = model.generate(torch.tensor([prompt]), do_sample=False,
                                 max_new_tokens=max(48, len(target_ids) + 8))
            exact += tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True) == answer
    write_cache(target, _COPY_RECIPE, model.save_pretrained)
    log.info("copy warm-up of the micro base: %d steps of %d, loss %.2f -> %.2f, exact copies "
             "%d/100 held-out samples, %.0f s; cached at %s", m.pretrain_steps, batch, losses[0],
             sum(losses[-20:]) / len(losses[-20:]), exact, time.perf_counter() - start, target)
    return model


def pretrained_base(cfg: Config, tokenizer: Any) -> Any:
    """The micro model of ``cfg`` after domain pretraining (``model.pretrain``), trained once and
    cached under ``cache_dir("pretrained")`` by a fingerprint of (recipe, model sizes, epochs,
    seed, vocabulary, corpus).

    Next-token loss on the corpus packed into 512-token blocks (documents joined by
    ``<|im_end|>``), AdamW (lr 2e-3, 20 warm-up steps, cosine to 0, weight decay 0), 8 blocks per
    step, fp32 on CPU. Logged: blocks, steps, first/last loss, seconds.

    Returns:
        A ``Qwen3ForCausalLM`` in eval mode.
    """
    import math

    from transformers import Qwen3ForCausalLM


    m = cfg.model
    docs = pretrain_corpus(m.pretrain)
    key = [_PRETRAIN_RECIPE, m.pretrain, m.hidden_size, m.num_layers, m.num_heads,
           m.intermediate_size, m.pretrain_epochs, m.pretrain_seed, len(tokenizer),
           m.context_window]
    h = hashlib.sha1(json.dumps(key).encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    for d in docs:
        h.update(d.encode())
    target = cache_dir("pretrained") / f"micro-{m.pretrain}-{h.hexdigest()[:12]}"
    if is_cached(target, _PRETRAIN_RECIPE):
        return Qwen3ForCausalLM.from_pretrained(target).eval()
    start = time.perf_counter()
    seeded = copy_config(cfg, seed=m.pretrain_seed)
    model = micro_model(seeded, tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stream: list[int] = []
    for d in docs:
        stream += tokenizer(d, add_special_tokens=False)["input_ids"] + [eos]
    block, batch = 512, 8
    if len(stream) < block * batch:
        raise ValueError(f"pretraining corpus of {m.pretrain!r} has {len(stream)} tokens: "
                         f"need at least {block * batch}")
    blocks = torch.tensor(stream[: len(stream) // block * block]).view(-1, block)
    gen = torch.Generator().manual_seed(m.pretrain_seed)
    steps = max(1, int(m.pretrain_epochs * len(blocks) / batch))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    order = torch.randperm(len(blocks), generator=gen)
    losses = []
    for step in range(steps):
        idx = order[(step * batch) % len(blocks):][:batch]
        if len(idx) < batch:
            order = torch.randperm(len(blocks), generator=gen)
            idx = order[:batch]
        x = blocks[idx]
        loss = model(input_ids=x, labels=x).loss
        losses.append(_step(model, opt, sched, loss))
        if step % 50 == 0:
            log.info("pretrain %s step %d/%d loss %.3f", m.pretrain, step, steps, losses[-1])
    model.eval()
    write_cache(target, _PRETRAIN_RECIPE, model.save_pretrained)
    log.info("pretrained the micro base on %s: %d docs, %d blocks of %d, %d steps, loss %.2f -> "
             "%.2f, %.0f s; cached at %s", m.pretrain, len(docs), len(blocks), block, steps,
             losses[0], sum(losses[-20:]) / len(losses[-20:]), time.perf_counter() - start, target)
    return model


def copy_config(cfg: Config, seed: int) -> Config:
    """A copy of ``cfg`` with ``run.seed`` set (the pretrained base ignores the run seed)."""
    import copy as _copy

    c = _copy.deepcopy(cfg)
    c.run.seed = seed
    return c


__all__ = ["CHAT_TEMPLATE", "COPY_PRETRAINS", "SPECIAL_TOKENS", "chatml_text", "copy_base",
           "copy_config", "copy_samples", "micro_corpus", "micro_model", "micro_policy",
           "micro_tokenizer", "pretrain_corpus", "pretrained_base", "tau2_ids", "train_bpe",
           "transcript_texts"]
