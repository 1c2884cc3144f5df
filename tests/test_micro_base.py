"""The shipped micro base: it loads, a damaged copy stops on its hash, a missing file names the
rebuild command.

Default tier: offline, CPU, a few seconds (the base is 17 MB of safetensors).
"""
from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from envace_lite.config import ConfigError, get_config
from envace_lite.models.micro_base import (
    BASE_DIR,
    MANIFEST,
    REBUILD,
    BaseHashError,
    BaseMissingError,
    load_base,
    matches,
    sha256,
    verify,
)


def test_sha256_of_known_bytes(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"abc")  # FIPS 180-2, appendix B.1
    assert sha256(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_shipped_base_loads_with_its_manifest():
    manifest = verify()
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    assert os.path.getsize(BASE_DIR / "model.safetensors") <= 20 * 1024 * 1024
    model, tok = load_base()
    assert not model.training and model.dtype == torch.float32
    # tied embedding 4096*256 + final norm 256 + 4 layers * (q 256*256 + k, v 256*128 each +
    # o 256*256 + MLP 3*256*768 + norms 256+256+64+64) = 1,048,576 + 256 + 4 * 787,072
    assert sum(p.numel() for p in model.parameters()) == 4_197_120
    assert len(tok) == 4096 and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"


def test_drills_profile_loads_the_shipped_base_without_training(monkeypatch):
    from envace_lite.drills import copy_warmup
    from envace_lite.models.load import load_policy, load_tokenizer

    def never(*args, **kwargs):
        raise AssertionError("the copy warm-up ran")

    monkeypatch.setattr(copy_warmup, "train_copy", never)
    monkeypatch.setattr(copy_warmup, "copy_base", never)
    model, tok = load_policy(get_config("drills"))
    shipped, _ = load_base()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  shipped.state_dict().values()))
    assert tok.get_vocab() == load_base()[1].get_vocab()
    assert load_tokenizer(get_config("drills")).get_vocab() == tok.get_vocab()


def test_only_the_shipped_recipe_is_served_by_the_shipped_base():
    assert matches(get_config("drills"))
    assert matches(get_config("drills", {"run.seed": 3, "warmstart.epochs": 2}))
    assert not matches(get_config("drills", {"study.pretrain_steps": 100}))
    assert not matches(get_config("drills", {"study.pretrain_schedule": "cosine"}))


def test_a_people_stage_on_the_shipped_warm_up_stops_with_one_line(monkeypatch):
    """``study.pretrain_people_steps`` is part of the recipe (0 for the shipped base), so the
    shipped base never stands in for a people stage, and without ``copy_people`` the stage stops
    with one line before anything is trained."""
    from envace_lite.drills import copy_warmup
    from envace_lite.models.load import load_policy

    def never(*args, **kwargs):
        raise AssertionError("the copy warm-up ran")

    monkeypatch.setattr(copy_warmup, "train_copy", never)
    monkeypatch.setattr(copy_warmup, "train_people", never)
    cfg = get_config("drills", {"study.pretrain_people_steps": 5})
    assert not matches(cfg) and matches(get_config("drills", {"study.pretrain_people_steps": 0}))
    with pytest.raises(ConfigError, match="people_steps=5 needs study.pretrain='copy_people'"):
        load_policy(cfg)


def _copy(tmp_path):
    dst = tmp_path / "base"
    shutil.copytree(BASE_DIR, dst)
    return dst


def test_a_damaged_copy_stops_with_one_hash_line(tmp_path):
    dst = _copy(tmp_path)
    weights = dst / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    weights.write_bytes(bytes(data))
    with pytest.raises(BaseHashError) as err:
        load_base(dst)
    msg = str(err.value)
    assert "\n" not in msg and "model.safetensors" in msg and "sha256" in msg
    assert isinstance(err.value, ConfigError)  # the CLI prints it and exits 2


def test_a_missing_file_names_the_rebuild_command(tmp_path):
    dst = _copy(tmp_path)
    (dst / "tokenizer.json").unlink()
    with pytest.raises(BaseMissingError) as err:
        load_base(dst)
    msg = str(err.value)
    assert "\n" not in msg and "tokenizer.json" in msg and f"rebuild with `{REBUILD}`" in msg
    (dst / MANIFEST).unlink()
    with pytest.raises(BaseMissingError, match="manifest.json is missing; rebuild with"):
        verify(dst)


def test_manifest_records_the_command_and_its_measured_result():
    manifest = json.loads((BASE_DIR / MANIFEST).read_text())
    assert manifest["command"].startswith("envace-lite ")
    assert 0 <= manifest["result"]["exact_copies"] <= 100
    assert manifest["result"]["steps"] == 300


def _rewrite_manifest(dst, change):
    m = json.loads((dst / MANIFEST).read_text())
    change(m)
    (dst / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")


@pytest.mark.parametrize("damage, words", [
    (lambda m: m.clear() or m.update({"recipe": {}}), "sha256"),        # an emptied manifest
    (lambda m: m["recipe"].update({"pretrain_steps": 301}), "sha256"),  # a recipe field changed
    (lambda m: m.update({"files": {}}), "sha256"),                      # no file listed
])
def test_a_damaged_manifest_stops_before_any_base_is_trained(tmp_path, monkeypatch, damage, words):
    """Every change of the shipped manifest stops on the pinned hash, one line;
    the drills profile never falls back to training a base of its own."""
    from envace_lite.drills import copy_warmup
    from envace_lite.models import micro_base
    from envace_lite.models.load import load_policy

    from envace_lite.models.micro_base import SHIPPED_MANIFEST_SHA256

    dst = _copy(tmp_path)
    _rewrite_manifest(dst, damage)
    with pytest.raises(BaseHashError) as err:
        verify(dst, pinned=SHIPPED_MANIFEST_SHA256)
    assert "\n" not in str(err.value) and MANIFEST in str(err.value) and words in str(err.value)
    assert REBUILD in str(err.value)

    def never(*args, **kwargs):
        raise AssertionError("a base of its own was trained")

    monkeypatch.setattr(copy_warmup, "train_copy", never)
    monkeypatch.setattr(copy_warmup, "copy_base", never)
    monkeypatch.setattr(micro_base, "BASE_DIR", dst)
    monkeypatch.setattr(matches, "__defaults__", (dst,))
    with pytest.raises(BaseHashError):
        load_policy(get_config("drills"))


def test_manifest_structure_is_checked_when_not_pinned(tmp_path):
    """The structure checks, on a base built elsewhere (no pin): not JSON, no files,
    a required file not listed, a recipe without its fields; each one line naming the file."""
    from envace_lite.models.micro_base import SHIPPED_MANIFEST_SHA256, read_manifest

    dst = _copy(tmp_path)
    (dst / MANIFEST).write_text('{"files": {')
    with pytest.raises(BaseHashError, match="not JSON"):  # pinned: the hash stops it first
        read_manifest(dst, pinned=None)
    with pytest.raises(BaseHashError, match="sha256"):
        read_manifest(dst, pinned=SHIPPED_MANIFEST_SHA256)
    read_manifest(BASE_DIR)  # the shipped folder: pinned by default
    for body, words in (({"files": {}, "recipe": {}}, "lists no files"),
                        ({"files": {"config.json": "x"}, "recipe": {}}, "does not list"),
                        ({"files": {n: "x" for n in ("config.json", "model.safetensors",
                                                      "tokenizer.json")}, "recipe": {}},
                         "recipe lacks")):
        (dst / MANIFEST).write_text(json.dumps(body))
        with pytest.raises(BaseHashError, match=words) as err:
            read_manifest(dst, pinned=None)
        assert "\n" not in str(err.value) and str(dst / MANIFEST) in str(err.value)


def test_a_listed_file_that_is_a_device_or_too_large_stops_at_once(tmp_path):
    """A link to /dev/zero is refused before hashing; a file of another size too."""
    dst = _copy(tmp_path)
    weights = dst / "model.safetensors"
    weights.unlink()
    weights.symlink_to("/dev/zero")
    with pytest.raises(BaseHashError, match="not a regular file"):
        verify(dst)
    weights.unlink()
    shutil.copy(BASE_DIR / "model.safetensors", weights)
    with open(weights, "ab") as f:
        f.write(b"\0")
    with pytest.raises(BaseHashError, match=r"has \d+ bytes, its manifest records \d+"):
        verify(dst)


def test_the_pinned_hash_is_the_shipped_manifest():
    from envace_lite.models.micro_base import SHIPPED_MANIFEST_SHA256

    assert sha256(BASE_DIR / MANIFEST) == SHIPPED_MANIFEST_SHA256
    manifest = verify()
    assert manifest["sizes"] == {n: (BASE_DIR / n).stat().st_size for n in manifest["files"]}


def test_a_rebuilt_base_elsewhere_loads_under_its_own_manifest(tmp_path):
    """The pin is the shipped folder's: a base rebuilt into another folder (another manifest,
    same structure) verifies by its own hashes; the shipped folder's manifest stays pinned."""
    dst = _copy(tmp_path)
    _rewrite_manifest(dst, lambda m: m["result"].update({"seconds": 1}))
    assert verify(dst)["result"]["seconds"] == 1
    assert load_base(dst)[0] is not None
