"""The copy warm-up of the micro policy: a base that can copy ids, a study lever beyond the
paper (``docs/drills.md``).

``train_copy`` trains the micro model on synthetic, entity-free copy samples
(``drills/copy_samples.py``).
The ``drills`` profile's warm-up (``study.pretrain="copy"``) is shipped, not trained on the way
to a run: ``build_base`` writes it with its manifest (``envace-lite drills copy-base --out
data/micro_base``), and ``models.micro_base`` loads it. The levers (``"copy_hops"``,
``"copy_records"``, or ``"copy"`` with another recipe, e.g. ``study.pretrain_schedule=cosine``)
are trained once and cached by ``copy_base``, which ``drills/__init__.py`` registers with
``models.micro.register_base``. Domain pretraining: ``drills/pretrain.py``.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from envace_lite.config import Config, ConfigError
from envace_lite.drills.copy_samples import copy_samples, people_samples, tau2_ids
from envace_lite.models.micro import chatml_text, micro_model, micro_tokenizer
from envace_lite.paths import cache_dir, is_cached, write_cache
from envace_lite.progress import get_logger

log = get_logger(__name__)


def optimizer_step(model: Any, opt: Any, sched: Any, loss: torch.Tensor, backward: bool = True) -> float:
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
# The copy warm-up (study.pretrain="copy"): training on the samples of ``copy_samples.py``
# ---------------------------------------------------------------------------------------------
_COPY_RECIPE = 1
"""Bump when the copy warm-up recipe changes (part of the cache fingerprint)."""

COPY_PRETRAINS = ("copy", "copy_hops", "copy_records", "copy_people")
"""The ``study.pretrain`` values that start from a copy warm-up. ``copy`` with the shipped
recipe is the shipped base (``models.micro_base``); ``copy_base`` trains the others."""

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


def train_copy(cfg: Config, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """The copy warm-up of ``cfg``'s micro model on ``tokenizer``: ``(model, result)``.

    ``study.pretrain_steps`` AdamW steps (lr 1e-3, 50 warm-up steps, then constant, or cosine to
    0 under ``study.pretrain_schedule="cosine"``, ``copy_lr_factor``; weight decay
    0; gradient clip 1.0) of 64 ``copy_samples`` each, loss on the answer tokens only (the
    message's random ids are not predictable, and their loss would drown the copy signal). fp32
    on CPU. ``"copy_hops"`` adds the second-call samples of ``copy_samples(hops=True)``,
    ``"copy_people"`` the people copies of ``copy_samples(people=True)`` (named from the SFT
    drills' users under ``study.pretrain_names=sft_users``, ``people_names``),
    ``"copy_records"`` the record copies of ``copy_samples(records=True)``, trained in length
    chunks by ``chunked_answer_loss``. Measured: 81 of 100 fresh samples copied exactly after
    250 steps (``docs/results-log.md``, "The copy warm-up").

    Returns:
        The model in eval mode, and ``{"steps", "batch", "loss_first", "loss_last" (mean of the
        last 20 steps), "exact_copies" (of 100 held-out samples, greedy), "seconds"}``.
    """
    st = cfg.study
    hops, records = st.pretrain == "copy_hops", st.pretrain == "copy_records"
    people = st.pretrain == "copy_people"
    start = time.perf_counter()
    model = micro_model(copy_config(cfg, seed=st.pretrain_seed), tokenizer)
    samples = copy_samples(_BATCH * st.pretrain_steps + 100, st.pretrain_seed, tau2_ids(), hops,
                           records, people, people_names(cfg))
    losses = _fit(model, tokenizer, samples[100:], st.pretrain_steps, st.pretrain_schedule,
                  records)
    exact = _exact_copies(model, tokenizer, samples[:100])
    result = _result(st.pretrain_steps, losses, exact, start)
    log.info("copy warm-up of the micro base: %d steps of %d, loss %.2f -> %.2f, exact copies "
             "%d/100 held-out samples, %.0f s", st.pretrain_steps, _BATCH, result["loss_first"],
             result["loss_last"], exact, result["seconds"])
    return model, result


def train_people(model: Any, cfg: Config, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """The people stage of the copy warm-up (``study.pretrain_people_steps``): ``model`` (the
    copy warm-up with people, ``train_copy``) trained on for ``pretrain_people_steps`` more
    steps on people copies only (``copy_samples.people_samples``, seed ``pretrain_seed + 1``),
    with ``train_copy``'s optimizer, schedule and batch: ``(model, result)``.

    Why: the two-hop drill's first two calls copy a name out of the ticket and a user id out of
    a response, and the warm-up gives them a third of its samples (the name a twelfth).
    Trained on them alone, the larger micro model copies 47 of 75 held-out user ids but 4 of 25
    names after 300 steps (``docs/drills.md``): the name copy needs far more samples than the
    warm-up gives.

    Returns:
        The model in eval mode, and ``{"steps", "batch", "loss_first", "loss_last",
        "exact_copies" (of 100 held-out people samples, greedy), "exact_by_kind" (``{"name",
        "email", "user_id"}``: ``[exact, samples]``), "seconds"}``.
    """
    st = cfg.study
    start = time.perf_counter()
    samples = people_samples(_BATCH * st.pretrain_people_steps + 100, st.pretrain_seed + 1,
                             tau2_ids(), people_names(cfg))
    losses = _fit(model, tokenizer, samples[100:], st.pretrain_people_steps,
                  st.pretrain_schedule, False)
    by_kind: dict[str, list[int]] = {"name": [0, 0], "email": [0, 0], "user_id": [0, 0]}
    for sample in samples[:100]:
        kind = ("user_id" if len(sample[0]) > 1 else
                "email" if '"email"' in sample[1] else "name")
        by_kind[kind][0] += _exact_copies(model, tokenizer, [sample])
        by_kind[kind][1] += 1
    result = {**_result(st.pretrain_people_steps, losses,
                        sum(v[0] for v in by_kind.values()), start), "exact_by_kind": by_kind}
    log.info("people stage of the copy warm-up: %d steps of %d, loss %.2f -> %.2f, exact "
             "copies %s of 100 held-out people samples, %.0f s", st.pretrain_people_steps,
             _BATCH, result["loss_first"], result["loss_last"], by_kind, result["seconds"])
    return model, result


_BATCH = 64
"""Samples per optimizer step of the copy warm-up and its people stage."""


def _result(steps: int, losses: list[float], exact: int, start: float) -> dict[str, Any]:
    """A warm-up's record: steps, batch, first loss, mean of the last 20, exact copies and the
    seconds since ``start`` (``time.perf_counter``)."""
    return {"steps": steps, "batch": _BATCH, "loss_first": round(losses[0], 2),
            "loss_last": round(sum(losses[-20:]) / len(losses[-20:]), 2),
            "exact_copies": exact, "seconds": round(time.perf_counter() - start)}


def _encode(tokenizer: Any, messages: list[dict[str, str]], answer: str
            ) -> tuple[list[int], list[int]]:
    prompt = tokenizer(chatml_text(messages, True), add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return prompt, tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos]


def _fit(model: Any, tokenizer: Any, samples: list[tuple[list[dict[str, str]], str]],
         steps: int, schedule: str, chunked: bool) -> list[float]:
    """``steps`` AdamW steps of ``_BATCH`` samples each, in order (lr 1e-3 times
    ``copy_lr_factor``, no weight decay, clip 1.0), loss on the answer only; the losses.
    ``chunked``: by ``chunked_answer_loss`` (long record copies). Leaves ``model`` in eval
    mode."""
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: copy_lr_factor(s, steps, schedule))
    model.train()
    losses = []
    for step in range(steps):
        rows = [_encode(tokenizer, *s) for s in samples[step * _BATCH:(step + 1) * _BATCH]]
        if not chunked:
            ids, labels = answer_batch(rows, pad)
            loss = model(input_ids=ids, labels=labels).loss
        else:  # long record copies: chunks of similar length (gradients accumulated)
            loss = chunked_answer_loss(model, rows, pad)
        losses.append(optimizer_step(model, opt, sched, loss, backward=not chunked))
        if step % 50 == 0:
            log.info("copy warm-up step %d/%d loss %.3f", step, steps, losses[-1])
    model.eval()
    return losses


def _exact_copies(model: Any, tokenizer: Any,
                  samples: list[tuple[list[dict[str, str]], str]]) -> int:
    """How many of ``samples`` ``model`` answers exactly, greedy."""
    exact = 0
    with torch.no_grad():
        for messages, answer in samples:
            prompt, target_ids = _encode(tokenizer, messages, answer)
            out = model.generate(torch.tensor([prompt]), do_sample=False,
                                 max_new_tokens=max(48, len(target_ids) + 8))
            exact += tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True) == answer
    return exact


def people_names(cfg: Config) -> tuple[list[str], list[str]] | None:
    """The names the copy warm-up's people copies take under ``study.pretrain_names=sft_users``:
    ``(first names, last names)`` of the SFT drills' users (``drills.copy_rows.user_names``);
    None (syllables) otherwise.

    Raises:
        ConfigError: ``sft_users`` when the SFT tasks hold no drill user.
    """
    if cfg.study.pretrain != "copy_people" or cfg.study.pretrain_names != "sft_users":
        return None
    from envace_lite.core.task_split import training_tasks
    from envace_lite.drills.copy_rows import user_names
    from envace_lite.drills.suite import DRILL_DOMAINS

    try:
        return user_names([t for t in training_tasks(cfg, "sft") if t.suite in DRILL_DOMAINS])
    except ValueError as e:
        raise ConfigError(f"study.pretrain_names=sft_users: {e}") from None


def copy_base(cfg: Config, tokenizer: Any) -> Any:
    """The micro model of ``cfg`` after a copy warm-up lever (``study.pretrain="copy_hops"``,
    ``"copy_records"``, or ``"copy"`` with a recipe other than the shipped base's;
    ``train_copy``), trained once and cached under ``cache_dir("pretrained")`` by (recipe,
    sizes, steps, seed, vocabulary, ``hops``, ``records`` or ``people``, a non-constant schedule
    and the people's names when set), in ``micro-copy-<hash>``, ``micro-copy-hops-<hash>``,
    ``micro-copy-records-<hash>`` or ``micro-copy-people-<hash>``. With
    ``study.pretrain_people_steps``, the people stage (``train_people``) goes on from the copy
    warm-up with people (itself cached) and is cached beside it, in
    ``micro-copy-people-<hash>-people-<hash>``.
    The shipped recipe never reaches it (``models.micro.micro_policy`` loads the shipped base).

    Returns:
        A ``Qwen3ForCausalLM`` in eval mode.

    Raises:
        ConfigError: ``study.pretrain_people_steps`` without ``study.pretrain="copy_people"``.
    """
    from transformers import Qwen3ForCausalLM

    m, st = cfg.model, cfg.study
    hops, records = st.pretrain == "copy_hops", st.pretrain == "copy_records"
    people, names = st.pretrain == "copy_people", people_names(cfg)
    if st.pretrain_people_steps and not people:
        raise ConfigError(f"study.pretrain_people_steps={st.pretrain_people_steps} needs "
                          f"study.pretrain='copy_people' (got {st.pretrain!r})")
    key = [_COPY_RECIPE, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
           st.pretrain_steps, st.pretrain_seed, len(tokenizer), m.context_window] + (
               ["hops"] if hops else []) + (["records"] if records else []) + (
               ["people"] if people else []) + (
               [] if st.pretrain_schedule == "constant" else [st.pretrain_schedule]) + (
               [names] if names else [])
    h = hashlib.sha1(json.dumps(key).encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    name = ("micro-copy-hops" if hops else "micro-copy-records" if records else
            "micro-copy-people" if people else "micro-copy")
    target = cache_dir("pretrained") / f"{name}-{h.hexdigest()[:12]}"
    if st.pretrain_people_steps:  # the people stage goes on from the warm-up it follows
        h.update(json.dumps(["people_steps", st.pretrain_people_steps]).encode())
        target = target.with_name(f"{target.name}-people-{h.hexdigest()[:12]}")
    if is_cached(target, _COPY_RECIPE):
        return Qwen3ForCausalLM.from_pretrained(target).eval()
    if st.pretrain_people_steps:
        warm = copy_config(cfg, cfg.run.seed)
        warm.study.pretrain_people_steps = 0
        model, _ = train_people(copy_base(warm, tokenizer), cfg, tokenizer)
    else:
        model, _ = train_copy(cfg, tokenizer)
    write_cache(target, _COPY_RECIPE, model.save_pretrained)
    log.info("cached the copy warm-up at %s", target)
    return model


def build_base(cfg: Config, out: str | Path, command: str) -> dict[str, Any]:
    """Build a micro base folder: the tokenizer trained on ``cfg``'s corpus, the copy warm-up
    (``train_copy``) on it, both saved to ``out`` with a manifest of their sha256, ``command``,
    the measured result and the recipe (``models.micro_base.write_manifest``).

    ``envace-lite drills copy-base --out data/micro_base`` rebuilds the shipped base this way
    (about 12 minutes on 2 idle cores). Another machine's floats give other last bits, so a
    rebuilt base is not the shipped one bit for bit: its manifest records its own hashes.

    Returns:
        The manifest.
    """
    from envace_lite.models.micro_base import recipe, write_manifest

    tok = micro_tokenizer(cfg, shipped=False)
    model, result = train_copy(cfg, tok)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # a rebuilt folder holds only what this build wrote
        if old.is_file():
            old.unlink()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return write_manifest(out, command, result, recipe(cfg))


def copy_config(cfg: Config, seed: int) -> Config:
    """A copy of ``cfg`` with ``run.seed`` set (the pretrained base ignores the run seed)."""
    import copy as _copy

    c = _copy.deepcopy(cfg)
    c.run.seed = seed
    return c


__all__ = ["COPY_PRETRAINS", "answer_batch", "build_base", "chunked_answer_loss", "copy_base",
           "copy_config", "copy_lr_factor", "optimizer_step", "people_names", "train_copy",
           "train_people"]
