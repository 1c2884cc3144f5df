"""The ``micro`` profile: transcript-trained BPE, from-scratch Qwen3, the ≈512-token budget.

Default tier: offline, CPU. The first run trains and caches the profile's tokenizer (about 10-20 s
on 2 cores); later runs load it.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from envace_lite.config import get_config
from envace_lite.llm.generation import chat_ids
from envace_lite.models.micro import (
    SPECIAL_TOKENS,
    chatml_text,
    micro_model,
    micro_tokenizer,
    train_bpe,
    transcript_texts,
)
from envace_lite.models.load import load_policy
from envace_lite.core.engine import chat_glue
from envace_lite.core.task_split import training_tasks
from envace_lite.core.transcripts import build_transcripts, encode_act, encode_rehearse


@pytest.fixture(scope="module")
def micro_cfg():
    return get_config("micro")


@pytest.fixture(scope="module")
def small_corpus(micro_cfg):
    return transcript_texts(build_transcripts(training_tasks(micro_cfg, "sft")[:8], micro_cfg))


def test_bpe_build_is_deterministic_and_chatml(small_corpus):
    a, b = train_bpe(small_corpus, 600), train_bpe(small_corpus, 600)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert [a.convert_ids_to_tokens(i) for i in range(3)] == list(SPECIAL_TOKENS)
    assert (a.eos_token, a.pad_token) == ("<|im_end|>", "<|endoftext|>")
    text = small_corpus[0]
    assert a.decode(a.encode(text)) == text  # byte-level: lossless
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert a.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        chatml_text(msgs, True)
    glue = chat_glue(a)
    assert glue.eot_id == 2 and glue.gen_prompt == "<|im_start|>assistant\n"


def _pieces(tok, text):
    """The text of each token of ``text`` under ``tok``."""
    return [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]


def test_split_capitalized_gives_a_name_one_token_after_a_space_and_after_a_quote():
    texts = ["Hi, I'm Omar Silva, zip code 98141. " * 3,
             '{"first_name": "Omar", "last_name": "Silva", "zip": "98141"} ' * 3] * 20
    ticket, call = "I'm Omar Silva, zip", '"first_name": "Omar", "last_name": "Silva"'

    merged = train_bpe(texts, 400, split_digits=True)
    # merges cross the word boundaries: the names hide inside longer pieces of the ticket
    assert "Omar" not in _pieces(merged, ticket) and "Silva" not in _pieces(merged, ticket)
    names = train_bpe(texts, 400, split_capitalized=True, split_digits=True)
    assert _pieces(names, ticket) == ["I'm", " ", "Omar", " ", "Silva", ", zip"]
    assert _pieces(names, call) == ['"f', 'irst_name": "', "Omar", '", "last_name": "', "Silva",
                                    '"']
    assert names.decode(names.encode(ticket + " 98141")) == ticket + " 98141"  # still lossless


def test_spell_names_gives_a_name_and_an_id_one_token_per_letter_in_every_context():
    texts = ["Hi, I'm Omar Silva, zip code 98141. My e-mail is mei.martin5518@example.com. " * 3,
             '{"first_name": "Omar", "last_name": "Silva", "zip": "98141"} ' * 3,
             '{"name": "find_user_id_by_name_zip"} fatima_anderson_6252 ' * 3] * 20
    ticket, call = "I'm Omar Silva, zip", '"first_name": "Omar"'

    tok = train_bpe(texts, 400, split_digits=True, spell_names=True)
    # the same letters after a space in the ticket and after a quote in the call
    assert _pieces(tok, ticket)[:12] == ["I", "'m ", "O", "m", "a", "r", " ", "S", "i", "l", "v",
                                         "a"]
    assert _pieces(tok, call)[-5:] == ["O", "m", "a", "r", '"']
    # an id and an e-mail's local part are spelled up to the digits, which split_digits isolates
    assert _pieces(tok, "fatima_anderson_6252") == list("fatima_anderson_6252")
    assert _pieces(tok, "mei.martin5518@example.com")[:14] == list("mei.martin5518")
    # a tool name without a digit still merges, and the text decodes to itself
    assert len(_pieces(tok, '"find_user_id_by_name_zip"')) <= 6  # against 26 characters
    assert tok.decode(tok.encode(ticket + " 98141")) == ticket + " 98141"
    # from the 17th letter on, a capitalized word is one piece again (a fixed-width look-behind)
    split = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("Abcdefghijklmnopqrs")
    assert [p for p, _ in split][-3:] == ["o", "p", "qrs"]


def test_split_id_names_gives_a_user_id_the_same_tokens_in_a_response_and_in_a_call():
    texts = ["<tool_response>\nomar_silva_9907\n</tool_response> " * 3,
             '{"name": "get_user_details", "arguments": {"user_id": "omar_silva_9907"}} ' * 3,
             "Hi, my email is mei.martin5518@example.com. " * 3] * 20
    response, call = "<tool_response>\nomar_silva_9907\n", '{"user_id": "omar_silva_9907"}'

    merged = train_bpe(texts, 400, split_digits=True)
    # without it the id's two names and a "_" merge into one piece, a token of this user only
    assert _pieces(merged, call)[2:4] == ["omar_silva_", "9"]
    ids = train_bpe(texts, 400, split_digits=True, split_id_names=True)
    expected = ["omar", "_", "silva", "_", "9", "9", "0", "7"]
    got_response, got_call = _pieces(ids, response), _pieces(ids, call)
    assert got_response[got_response.index("omar"):][:8] == expected
    assert got_call[got_call.index("omar"):][:8] == expected
    # an e-mail's local part too; a tool name and a key, which reach no digit, still merge
    assert _pieces(ids, "mei.martin5518@")[:3] == ["mei", ".", "martin"]
    keys = '"find_user_id_by_name_zip", "user_id"'
    assert len(ids.backend_tokenizer.pre_tokenizer.pre_tokenize_str(keys)) == 1
    assert ids.decode(ids.encode(call)) == call  # lossless


def test_micro_model_is_deterministic(micro_cfg, small_corpus):
    tok = train_bpe(small_corpus, 600)
    m1, m2 = micro_model(micro_cfg, tok), micro_model(micro_cfg, tok)
    assert all(torch.equal(x, y) for x, y in zip(m1.state_dict().values(),
                                                  m2.state_dict().values()))
    other = get_config("micro", {"run.seed": 1})
    assert not torch.equal(micro_model(other, tok).lm_head.weight, m1.lm_head.weight)
    # hidden 256, 4 layers: per layer q,o 256x256, k,v 256x128, MLP 3 x 256x768, 2 norms + qk norms
    layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256 + 2 * 64
    assert sum(p.numel() for p in m1.parameters()) == 4 * layer + 256 + len(tok) * 256


def test_micro_profile_policy_and_budget(micro_cfg):
    """The cached profile tokenizer: 4,096 ids; training rows average at most 512 tokens and all
    fit the SFT max length; held-out (test) first ACT prompts, never in its corpus, too."""
    from envace_lite.protocol.prompts import act_messages
    from envace_lite.core.task_split import heldout_tasks

    tok = micro_tokenizer(micro_cfg)
    assert len(tok) == micro_cfg.model.vocab_size
    assert micro_tokenizer(micro_cfg).backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert micro_cfg.warmstart.rl_overlap and micro_cfg.grpo.suites == ["tau2-telecom"]
    ts = build_transcripts(training_tasks(micro_cfg, "rl"), micro_cfg, tok)
    act = [len(encode_act(a, tok)[0]) for a in ts.act]
    reh = [len(encode_rehearse(r, tok)[0]) for r in ts.rehearse]
    assert sum(act) / len(act) <= 512 and sum(reh) / len(reh) <= 512
    assert max(act + reh) <= micro_cfg.warmstart.max_length <= micro_cfg.model.context_window
    rc = micro_cfg.rollout
    held = [len(chat_ids(tok, act_messages(t.messages, t.tools, rc.rendering,
                                                   rc.compact_policy_chars, [])))
            for t in heldout_tasks(micro_cfg, 10)]
    assert len(held) == 10 and max(held) <= 512
    model, tok2 = load_policy(micro_cfg)
    assert 3e6 < sum(p.numel() for p in model.parameters()) < 6e6
    ids = chat_ids(tok2, [{"role": "user", "content": "ls"}])
    assert ids[0] == tok2.convert_tokens_to_ids("<|im_start|>")


# ---------------------------------------------------------------------------------------------
# The copy warm-up's samples (study.pretrain="copy")
# ---------------------------------------------------------------------------------------------
def test_copy_samples_need_copying_and_avoid_forbidden_ids():
    import json
    import re

    from envace_lite.drills.copy_samples import copy_samples

    a, b = copy_samples(40, seed=3), copy_samples(40, seed=3)
    assert a == b and a != copy_samples(40, seed=4)
    calls = reports = 0
    for messages, answer in a:
        text = messages[0]["content"]
        if answer.startswith("<tool_call>"):
            calls += 1
            args = json.loads(answer.split("\n")[1])["arguments"]
            (kind, value), = args.items()
            said = value[1:] if kind == "order_id" else value
            assert said in text  # the id the tool takes is in the message, as the user wrote it
            if kind == "order_id":
                assert re.fullmatch(r"#W\d{7}", value) and f"#{said}" not in text
        else:
            reports += 1
            record = json.loads(text.split("\n")[1])
            name = re.search(r"What is the (\w+)\?", text).group(1)
            assert answer == f"The {name} is {record[name]}."
    assert calls > 10 and reports > 10
    # a forbidden id is never produced: forbid every id the seed makes, and none survives
    first = {json.loads(ans.split("\n")[1])["arguments"].popitem()[1]
             for _, ans in a if ans.startswith("<tool_call>")}
    again = copy_samples(40, seed=3, forbidden=frozenset(first))
    for _, ans in again:
        if ans.startswith("<tool_call>"):
            assert json.loads(ans.split("\n")[1])["arguments"].popitem()[1] not in first


def test_copy_samples_with_hops_are_second_calls_that_copy_past_a_record():
    """copy_hops: the plain samples are unchanged in kind, and a hop sample's answer copies the
    id the user named (``update``) or the id the record links to (``lookup``), never another."""
    import hashlib
    import json

    from envace_lite.drills.copy_samples import copy_samples

    samples = copy_samples(300, seed=7, hops=True)
    assert samples == copy_samples(300, seed=7, hops=True)
    hops = [(m, a) for m, a in samples if len(m) == 3]
    # a hop is drawn with p = 1/3 and kept when its linked id is of another kind and no e-mail:
    # about 22 %, 66 of 300 (seeds 0-9 give 54-72); the bounds are 3 standard deviations
    assert 45 <= len(hops) <= 90
    kinds = {"update": 0, "lookup": 0}
    for (user, first, response), answer in hops:
        assert [user["role"], first["role"], response["role"]] == ["user", "assistant", "user"]
        record = json.loads(response["content"].split("\n")[1])
        first_args = json.loads(first["content"].split("\n")[1])["arguments"]
        (kind, arg), = first_args.items()
        assert record[kind] == arg  # the tool response answers the first call
        call = json.loads(answer.split("\n")[1])
        kinds[call["name"]] += 1
        (key, value), = call["arguments"].items()
        if call["name"] == "update":  # the write after the read: the id the user named
            assert (key, value) == (kind, arg)
        else:  # the second hop: the id the record links to, which the user never wrote
            assert record[key + "s"] == [value] and value not in user["content"]
            assert value.lstrip("#") not in user["content"]
    assert kinds["update"] > 5 and kinds["lookup"] > 5
    # without hops, no sample has more than the user's message, and the samples are the plain
    # warm-up's, bit for bit: the digest of the samples the shipped copy base was trained on
    assert all(len(m) == 1 for m, _ in copy_samples(90, seed=7))
    plain = json.dumps(copy_samples(200, seed=0)).encode()
    assert hashlib.sha1(plain).hexdigest() == "78a1ba163a4ed1412d69cf83d65e22ede1d01d4c"


def test_copy_samples_people_take_their_names_from_the_lists_given():
    """copy_people with ``names`` (``study.pretrain_names=sft_users``): every people copy's
    find call, e-mail and user id is made of a first name and a last name from the lists; the
    syllable samples of the same seed are not (their rng draws differ from the first name on)."""
    import json

    from envace_lite.drills.copy_samples import copy_samples

    names = (["Omar", "Mei"], ["Silva"])
    allowed = {"omar_silva", "mei_silva"}
    samples = copy_samples(120, seed=5, people=True, names=names)
    found = 0
    for messages, answer in samples:
        call = json.loads(answer.split("\n")[1]) if answer.startswith("<tool_call>") else {}
        args = call.get("arguments", {})
        if call.get("name") == "find":
            found += 1
            if "email" in args:
                local = args["email"].split("@")[0].rstrip("0123456789")
                assert local.replace(".", "_") in allowed
            else:
                assert (args["first_name"] in names[0], args["last_name"]) == (True, "Silva")
                assert f"{args['first_name']} Silva" in messages[0]["content"]
        elif "user_id" in args and len(messages) == 3:  # the lookup after the find
            assert args["user_id"].rsplit("_", 1)[0] in allowed
            assert args["user_id"] in messages[2]["content"]
    assert found > 5
    syllables = copy_samples(120, seed=5, people=True)
    assert syllables != samples
    assert not any("Silva" in a for _, a in syllables)


def test_people_names_are_the_sft_drills_users_only_under_sft_users():
    from envace_lite.drills.copy_warmup import people_names

    over = {"grpo.suites": ["tau2-retail-drills-v2-compact"], "warmstart.sft_share": 0.5,
            "study.pretrain": "copy_people"}
    assert people_names(get_config("drills", over)) is None  # syllables, the default
    assert people_names(get_config("drills", {**over, "study.pretrain": "copy",
                                              "study.pretrain_names": "sft_users"})) is None
    firsts, lasts = people_names(get_config("drills", {**over,
                                                       "study.pretrain_names": "sft_users"}))
    # the 26 first and 26 last names of the SFT half's users (docs/drills.md)
    assert (len(firsts), len(lasts)) == (26, 26)
    assert {"Omar", "Fatima", "Mei"} <= set(firsts) and {"Silva", "Martin"} <= set(lasts)


def test_warm_start_options_share_the_tokenizer_corpus():
    """Memory transcripts and slip rows are warm-start rows, not tokenizer text: every option of
    a profile trains on one tokenizer (and one cached copy base)."""
    from envace_lite.models.micro import micro_corpus
    with_options = get_config("drills", {"warmstart.sft_share": 0.08,
                                         "warmstart.memory_share": 1.0,
                                         "study.error_rows": True})
    plain = micro_corpus(get_config("drills", {"warmstart.sft_share": 0.08}))
    assert micro_corpus(with_options) == plain and len(plain) > 400
    assert (with_options.warmstart.memory_share, with_options.study.error_rows) == (1.0, True)


def test_copy_lr_factor_warm_up_then_constant_or_cosine_by_hand():
    """The copy warm-up's schedule (``study.pretrain_schedule``), worked by hand for 300 steps:
    warm-up (s + 1) / 50; cosine 0.5 (1 + cos(pi (s + 1 - 50) / 250)) after it."""
    import math

    import pytest

    from envace_lite.drills.copy_warmup import copy_lr_factor

    assert copy_lr_factor(0, 300, "cosine") == pytest.approx(0.02)      # 1 / 50
    assert copy_lr_factor(24, 300, "constant") == pytest.approx(0.5)    # 25 / 50
    assert copy_lr_factor(49, 300, "cosine") == pytest.approx(1.0)      # the last warm-up step
    assert copy_lr_factor(299, 300, "constant") == pytest.approx(1.0)
    assert copy_lr_factor(174, 300, "cosine") == pytest.approx(0.5)     # 125 / 250: cos(pi/2)
    assert copy_lr_factor(111, 300, "cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.248)))  # (112 - 50) / 250
    assert copy_lr_factor(299, 300, "cosine") == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="cosine"):
        copy_lr_factor(0, 300, "linear")


def test_copy_samples_with_records_reuse_the_matching_reference_verbatim():
    """copy_records: a record copy's answer is exactly the result of the reference whose call
    equals the current call, among one to three references with distinct ids; the other samples
    are plain calls and reports; without ``records`` the samples are the plain warm-up's."""
    import json
    import re

    from envace_lite.drills.copy_samples import copy_samples

    plain = copy_samples(60, seed=5)
    assert copy_samples(60, seed=5, records=False) == plain
    mixed = copy_samples(300, seed=5, records=True)
    recs = [(m, a) for m, a in mixed if a.startswith("<execution_result>")]
    assert 60 <= len(recs) <= 140  # about a third of 300
    for messages, answer in recs:
        text = messages[0]["content"]
        refs_part, current = text.split("\n\nCurrent call:\n")
        pairs = re.findall(r"(<tool_call>\n.*?\n</tool_call>)\n<execution_result>\n(.*?)\n"
                           r"</execution_result>", refs_part)
        assert 1 <= len(pairs) <= 3
        calls = [c for c, _ in pairs]
        assert len(set(calls)) == len(calls) and current in calls
        assert answer == f"<execution_result>\n{dict(pairs)[current]}\n</execution_result>"
        record = json.loads(dict(pairs)[current])
        (kind, value), = json.loads(current.split("\n")[1])["arguments"].items()
        assert record[kind] == value and 5 <= len(record) <= 10  # the id, 4-8 fields, items
    assert any(a.startswith("<tool_call>") for _, a in mixed)
    assert any(a.startswith("The ") for _, a in mixed)


def test_chunked_answer_loss_equals_one_padded_batch(micro_cfg, small_corpus):
    """``copy_records`` trains in length chunks; the loss and gradient must equal one padded
    batch's mean over every answer token."""
    import pytest
    import torch

    from envace_lite.drills.copy_warmup import answer_batch, chunked_answer_loss
    from envace_lite.models.micro import micro_model, train_bpe

    tok = train_bpe(small_corpus, 300)
    model = micro_model(micro_cfg, tok).train()
    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(3, len(tok), (int(n),), generator=gen).tolist(),
             torch.randint(3, len(tok), (int(k),), generator=gen).tolist())
            for n, k in ((5, 2), (9, 7), (3, 1), (12, 4), (4, 9))]
    ids, labels = answer_batch(rows, tok.pad_token_id)
    assert ids.shape == (5, 16) and int((labels != -100).sum()) == 23
    full = model(input_ids=ids, labels=labels).loss
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got = chunked_answer_loss(model, rows, tok.pad_token_id, chunk=2)
    assert float(got) == pytest.approx(float(full), rel=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, want[n], rtol=1e-4, atol=1e-6), n


def test_people_samples_are_the_people_copies_alone_each_copying_from_its_prompt():
    """``people_samples`` (the people stage, ``study.pretrain_people_steps``): every sample is a
    find call whose name and zip, or e-mail, stand in its ticket, or a lookup of the user id
    that the find call's response returns; the same seed gives the same samples."""
    import json

    from envace_lite.drills.copy_samples import people_samples

    samples = people_samples(400, seed=3)
    assert len(samples) == 400 and samples == people_samples(400, seed=3)
    assert samples != people_samples(400, seed=4)
    kinds = {"name": 0, "email": 0, "user_id": 0}
    for messages, answer in samples:
        call = json.loads(answer.split("\n")[1])
        args, ticket = call["arguments"], messages[0]["content"]
        if len(messages) == 1:
            assert call["name"] == "find"
            if "email" in args:
                kinds["email"] += 1
                assert args["email"] in ticket and args["email"].endswith("@example.com")
            else:
                kinds["name"] += 1
                assert f"{args['first_name']} {args['last_name']}" in ticket
                assert args["zip"] in ticket and len(args["zip"]) == 5
        else:
            kinds["user_id"] += 1
            assert call["name"] == "lookup" and len(messages) == 3
            assert messages[1]["content"].startswith("<tool_call>")
            assert messages[2]["content"] == f"<tool_response>\n{args['user_id']}\n</tool_response>"
            assert args["user_id"].startswith(
                json.loads(messages[1]["content"].split("\n")[1])["arguments"].get(
                    "first_name", "").lower())
    # a fair coin for find/lookup, then one for name/e-mail: about 100, 100 and 200 of 400
    assert 70 <= kinds["name"] <= 130 and 70 <= kinds["email"] <= 130
    assert 160 <= kinds["user_id"] <= 240


def test_people_stage_counts_its_held_out_copies_by_kind(monkeypatch):
    """``train_people`` holds out the first 100 samples of ``people_samples(seed=pretrain_seed +
    1)`` and counts exact copies per kind: with every user-id lookup copied and nothing else,
    its counts are the kinds of those 100 samples, counted here by their shape."""
    from envace_lite.drills import copy_warmup
    from envace_lite.drills.copy_samples import people_samples

    monkeypatch.setattr(copy_warmup, "_fit", lambda *a, **k: [2.0] * 19 + [1.0, 0.5])
    monkeypatch.setattr(copy_warmup, "_exact_copies",
                        lambda model, tok, samples: int(len(samples[0][0]) == 3))
    monkeypatch.setattr(copy_warmup, "tau2_ids", lambda: frozenset())
    cfg = get_config("drills", {"study.pretrain": "copy_people", "study.pretrain_people_steps": 2,
                                "study.pretrain_seed": 4})
    _, result = copy_warmup.train_people("model", cfg, "tokenizer")
    held = people_samples(100 + 64 * 2, seed=5)[:100]
    lookups = sum(len(m) == 3 for m, _ in held)
    emails = sum(len(m) == 1 and '"email"' in a for m, a in held)
    assert result["exact_by_kind"] == {"name": [0, 100 - lookups - emails], "email": [0, emails],
                                       "user_id": [lookups, lookups]}
    assert result["exact_copies"] == lookups and 30 < lookups < 70
    # loss_last is the mean of the last 20 losses: (18 * 2.0 + 1.0 + 0.5) / 20
    assert (result["steps"], result["loss_first"], result["loss_last"]) == (2, 2.0, 1.88)


def test_people_stage_goes_on_from_the_cached_warm_up_and_is_cached_beside_it(monkeypatch,
                                                                              tmp_path):
    """``copy_base`` with ``study.pretrain_people_steps``: the copy warm-up with people is trained
    (or loaded) first under its own name, the people stage starts from it and is cached as
    ``<warm-up>-people-<hash>``; a second call trains nothing; without ``copy_people`` it stops
    with one line."""
    from envace_lite.config import ConfigError
    from envace_lite.drills import copy_warmup
    from envace_lite.drills.copy_warmup import copy_config

    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path))
    cfg = get_config("drills", {"study.pretrain": "copy_people", "study.pretrain_people_steps": 5})
    tok = micro_tokenizer(cfg)
    calls = []

    def fake_copy(c, t):
        calls.append(("copy", c.study.pretrain_people_steps))
        return micro_model(copy_config(c, 0), t), {}

    def fake_people(model, c, t):
        calls.append(("people", c.study.pretrain_people_steps))
        with torch.no_grad():
            model.model.norm.weight.fill_(0.5)  # marks the stage's model
        return model, {}

    monkeypatch.setattr(copy_warmup, "train_copy", fake_copy)
    monkeypatch.setattr(copy_warmup, "train_people", fake_people)
    model = copy_warmup.copy_base(cfg, tok)
    assert calls == [("copy", 0), ("people", 5)]
    folders = sorted(p.name for p in (tmp_path / "pretrained").iterdir())
    assert len(folders) == 2 and folders[1].startswith(folders[0] + "-people-")
    assert folders[0].startswith("micro-copy-people-")
    again = copy_warmup.copy_base(cfg, tok)
    assert calls == [("copy", 0), ("people", 5)]  # both cached
    assert torch.equal(again.model.norm.weight, model.model.norm.weight)
    assert float(again.model.norm.weight.detach()[0]) == 0.5
    copy_warmup.copy_base(get_config("drills", {"study.pretrain": "copy_people",
                                                "study.pretrain_people_steps": 6}), tok)
    assert calls[-1] == ("people", 6) and len(list((tmp_path / "pretrained").iterdir())) == 3
    with pytest.raises(ConfigError, match="needs study.pretrain='copy_people'"):
        copy_warmup.copy_base(get_config("drills", {"study.pretrain": "copy_hops",
                                                    "study.pretrain_people_steps": 5}), tok)
