"""Domain pretraining of the micro policy (``study.pretrain="retail"`` or ``"airline"``): a
base trained on a tau2 domain's database documents, a study lever beyond the paper
(``docs/drills.md``).

``pretrained_base`` trains once on ``pretrain_corpus`` and caches the model;
``drills/__init__.py`` registers both with ``models.micro.register_base`` (the corpus also
shapes the micro tokenizer's vocabulary).
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import torch

from envace_lite.config import Config
from envace_lite.drills.copy_warmup import copy_config, optimizer_step
from envace_lite.models.micro import micro_model
from envace_lite.paths import cache_dir, is_cached, write_cache
from envace_lite.progress import get_logger

log = get_logger(__name__)

_PRETRAIN_RECIPE = 2
"""Bump when the pretraining recipe changes (part of the cache fingerprint)."""


def pretrain_corpus(domain: str) -> list[str]:
    """Documents of tau2 ``domain``'s database for the TRAIN-split users only: per user, the
    ``get_user_details`` output, then each order's ``get_order_details`` output (airline: each
    reservation's ``get_reservation_details``), exactly as tau2 returns them, one document per
    user. No test-split user, order or reservation appears (split rule: ``spec.test_user``).

    Raises:
        KeyError: an unknown domain.
    """
    from envace_lite.drills.solver import Solver
    from envace_lite.drills.spec import check_domain, test_user

    check_domain(domain)
    solver = Solver(domain)
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


def pretrained_base(cfg: Config, tokenizer: Any) -> Any:
    """The micro model of ``cfg`` after domain pretraining (``study.pretrain``), trained once and
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


    m, st = cfg.model, cfg.study
    docs = pretrain_corpus(st.pretrain)
    key = [_PRETRAIN_RECIPE, st.pretrain, m.hidden_size, m.num_layers, m.num_heads,
           m.intermediate_size, st.pretrain_epochs, st.pretrain_seed, len(tokenizer),
           m.context_window]
    h = hashlib.sha1(json.dumps(key).encode())
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    for d in docs:
        h.update(d.encode())
    target = cache_dir("pretrained") / f"micro-{st.pretrain}-{h.hexdigest()[:12]}"
    if is_cached(target, _PRETRAIN_RECIPE):
        return Qwen3ForCausalLM.from_pretrained(target).eval()
    start = time.perf_counter()
    seeded = copy_config(cfg, seed=st.pretrain_seed)
    model = micro_model(seeded, tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stream: list[int] = []
    for d in docs:
        stream += tokenizer(d, add_special_tokens=False)["input_ids"] + [eos]
    block, batch = 512, 8
    if len(stream) < block * batch:
        raise ValueError(f"pretraining corpus of {st.pretrain!r} has {len(stream)} tokens: "
                         f"need at least {block * batch}")
    blocks = torch.tensor(stream[: len(stream) // block * block]).view(-1, block)
    gen = torch.Generator().manual_seed(st.pretrain_seed)
    steps = max(1, int(st.pretrain_epochs * len(blocks) / batch))
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
        losses.append(optimizer_step(model, opt, sched, loss))
        if step % 50 == 0:
            log.info("pretrain %s step %d/%d loss %.3f", st.pretrain, step, steps, losses[-1])
    model.eval()
    write_cache(target, _PRETRAIN_RECIPE, model.save_pretrained)
    log.info("pretrained the micro base on %s: %d docs, %d blocks of %d, %d steps, loss %.2f -> "
             "%.2f, %.0f s; cached at %s", st.pretrain, len(docs), len(blocks), block, steps,
             losses[0], sum(losses[-20:]) / len(losses[-20:]), time.perf_counter() - start, target)
    return model


__all__ = ["pretrain_corpus", "pretrained_base"]
