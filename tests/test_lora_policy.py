"""The trainable policy under the GPU profiles' settings, on the tiny Qwen3 (CPU).

* the LoRA adapter is fp32 on a bf16 base (``load_policy`` no longer casts it), so one AdamW
  step at lr 1e-5 moves every entry of ``lora_A`` (in bf16, most updates of that size round
  away: |Δ| ≈ 1e-5 against a bf16 spacing of 2^-8 × |w| ≈ 4e-5 for |w| ≈ 0.01);
* the LoRA initialisation is seeded by ``run.seed``: two fresh loads with one seed give the same
  adapter, another seed a different one.
"""
from __future__ import annotations

import torch

from envace_lite.config import get_config
from envace_lite.models.load import load_policy

BF16_LORA = {"model.dtype": "bfloat16", "model.lora_r": 8, "model.lora_alpha": 16}


def _adapter(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_lora_adapter_is_fp32_on_a_bf16_base_and_one_small_step_moves_it():
    model, tok = load_policy(get_config("smoke", BF16_LORA), train=True)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    assert {p.dtype for p in lora.values()} == {torch.float32}
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert {p.dtype for p in base} == {torch.bfloat16}
    before = _adapter(model)
    opt = torch.optim.AdamW(lora.values(), lr=1e-5, weight_decay=0.0)
    ids = torch.tensor([tok.encode("a tool call and its observation")])
    # lora_B starts at 0, so lora_A's first gradient is 0: one step on B first, then the tested one
    for _ in range(2):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    after = _adapter(model)
    a_names = [n for n in before if "lora_A" in n]
    moved = sum(int((after[n] != before[n]).sum()) for n in a_names)
    total = sum(before[n].numel() for n in a_names)
    # AdamW's first steps move every entry with a nonzero gradient by about lr; fp32 keeps them all
    assert moved / total > 0.99, f"{moved} of {total} lora_A entries moved"
    assert all(after[n].dtype == torch.float32 for n in after)


def test_lora_init_is_seeded_by_run_seed():
    a = _adapter(load_policy(get_config("smoke", {**BF16_LORA, "run.seed": 3}), train=True)[0])
    torch.rand(5)  # the global RNG moves between loads, as it does in a real session
    b = _adapter(load_policy(get_config("smoke", {**BF16_LORA, "run.seed": 3}), train=True)[0])
    c = _adapter(load_policy(get_config("smoke", {**BF16_LORA, "run.seed": 4}), train=True)[0])
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a if "lora_A" in n)
