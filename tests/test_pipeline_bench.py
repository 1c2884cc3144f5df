"""benchmarks/pipeline.py's FLOP count, by hand (the run itself is a benchmark, never a test)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pipeline import model_flops


def test_model_flops_of_the_drills_shape_by_hand():
    # the drills micro model: d 256, 4 layers, 4 heads of 64, 2 key/value heads, MLP 768, V 4096
    cfg = SimpleNamespace(hidden_size=256, num_hidden_layers=4, head_dim=64,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
                          vocab_size=4096)
    f = model_flops(cfg)
    # per layer: q 256*256 + k, v 256*128 each + o 256*256 + MLP 3*256*768 = 786,432 weights
    assert f["body"] == 2 * 4 * 786_432 == 6_291_456
    assert f["head"] == 2 * 256 * 4096 == 2_097_152
    # scores q.k and the weighted sum of v: 2 * 2 * 256 per key per layer, 4 layers
    assert f["attn_per_key"] == 4 * 4 * 256 == 4096
