

def test_output_caps_by_hand():
    """16 tokens: REHEARSE/FEEDBACK/MEMORY at 16, ACT raised to 48; 100 tokens: ACT capped by
    the profile's own 64; 0: no override."""
    from envace_lite.config import get_config
    from envace_lite.course.helpers import output_caps

    cfg = get_config("smoke", {"rollout.max_new_tokens_act": 64})
    assert output_caps(cfg, 16) == {"rollout.max_new_tokens_rehearse": 16,
                                    "rehearsal.max_new_tokens_feedback": 16,
                                    "rehearsal.memory_max_tokens": 16,
                                    "rollout.max_new_tokens_act": 48}
    assert output_caps(cfg, 100)["rollout.max_new_tokens_act"] == 64
    assert output_caps(cfg, 0) == {}
