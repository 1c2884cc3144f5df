"""The learning experiment: window means, the seed rule, segments, RL task overlap, and a
smoke-size end-to-end run (warm start → held-out checks → GRPO in segments → resume)."""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from envace_lite.config import ConfigError, get_config
from envace_lite.envs import list_tasks
from envace_lite.pipelines.learning_curve import (_segments, run_experiment, settle_points, ship, summarize_seeds,
                                    window_means)
from envace_lite.core.task_split import training_tasks


def test_window_means_by_hand():
    rewards = [0.0, 0.1, None, 0.2, 0.3, 0.5, 0.6]
    w = window_means(rewards, window=2)
    # None is skipped: values 0, .1, .2, .3, .5, .6 -> first (0+.1)/2, last (.5+.6)/2
    assert w["first"] == pytest.approx(0.05) and w["last"] == pytest.approx(0.55)
    assert w["gap"] == pytest.approx(0.5)
    assert window_means([None, None])["gap"] is None


def test_summarize_seeds_rule_by_hand():
    runs = [{"seed": s, "window": {"gap": g}} for s, g in [(0, 0.1), (1, 0.3), (2, -0.1)]]
    s = summarize_seeds(runs)
    # mean 0.1; sample std sqrt(((0)^2 + .2^2 + .2^2) / 2) = 0.2; SE = 0.2 / sqrt(3)
    assert s["mean_gap"] == pytest.approx(0.1)
    assert s["se"] == pytest.approx(0.2 / math.sqrt(3))
    assert not s["all_positive"] and not s["passes"]  # 0.1 < 2 × 0.1155
    ok = summarize_seeds([{"seed": i, "window": {"gap": g}} for i, g in enumerate([.1, .2, .3])])
    assert ok["all_positive"] and ok["passes"]
    tight = [{"seed": i, "window": {"gap": g}} for i, g in enumerate([.30, .32, -.01, .31])]
    # one negative seed, but mean .23 > 2 SE (std .159 / 2 = .0795 → 2 SE .159)
    assert summarize_seeds(tight)["passes"] and not summarize_seeds(tight)["all_positive"]


def test_segments():
    assert _segments(40, 0) == [40]
    assert _segments(40, 20) == [20, 40]
    assert _segments(45, 20) == [20, 40, 45]
    assert _segments(5, 10) == [5]


def test_rl_overlap_gives_rl_every_train_task():
    base = {"warmstart.max_user_turns": 1, "grpo.suites": ["bfcl-base"]}
    disjoint = get_config("smoke", {**base, "warmstart.sft_share": 0.5})
    overlap = get_config("smoke", {**base, "warmstart.sft_share": 1.0,
                                   "warmstart.rl_overlap": True})
    every = set(list_tasks("bfcl-base", "train"))
    assert {t.id for t in training_tasks(overlap, "rl")} == every
    assert {t.id for t in training_tasks(overlap, "sft")} == every
    rl = {t.id for t in training_tasks(disjoint, "rl")}
    assert rl < every and not rl & {t.id for t in training_tasks(disjoint, "sft")}
    assert all(len(t.user_turns) <= 1 for t in training_tasks(overlap, "rl"))


@pytest.mark.slow
def test_smoke_experiment_end_to_end_and_resume(tmp_path):
    cfg = get_config("smoke", {"grpo.steps": 2, "eval.max_turns": 1, "eval.suites": ["bfcl-base"],
                               "rollout.max_new_tokens_act": 8,
                               "rollout.max_new_tokens_rehearse": 8})
    s = run_experiment(cfg, tmp_path, heldout_every=1, eval_limit=1, fidelity_limit=1)
    stages = [(p["stage"], p["step"]) for p in s["points"]]
    assert stages == [("before_sft", 0), ("after_sft", 0), ("step", 1), ("after_envace", 2)]
    assert s["seconds"]["warmstart"] > 0 and s["seconds"]["total"] >= s["seconds"]["warmstart"]
    for p in s["points"]:
        assert p["tasks"] == 1 and 0.0 <= p["committed_reward"] <= 1.0
        assert p["fidelity_pairs"] >= 1
    rows = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().split("\n")
            if x]
    assert [r["step"] for r in rows] == [1, 2]
    assert s["window"]["first"] is not None and s["reward_control"] == "none"
    # a rerun resumes: no new held-out points, no new training rows
    again = run_experiment(cfg, tmp_path, heldout_every=1, eval_limit=1, fidelity_limit=1)
    assert again["points"] == s["points"]
    assert len((tmp_path / "train" / "metrics.jsonl").read_text().split("\n")) == 3
    # a run on that warm start without the base's point: no before_sft, the same after_sft,
    # measured in the background process (spawned, one torch thread) while training goes on
    one = copy.deepcopy(cfg)
    one.grpo.steps = 1
    nb = run_experiment(one, tmp_path / "nb", warmstart_dir=tmp_path / "warmstart",
                        eval_limit=1, fidelity_limit=1, before_sft=False,
                        background_heldout=True)
    assert [(p["stage"], p["step"]) for p in nb["points"]] == [("after_sft", 0),
                                                                ("after_envace", 1)]
    assert nb["points"][0]["committed_reward"] == s["points"][1]["committed_reward"]


def test_extending_a_run_relabels_its_old_final_point_and_measures_only_new_steps(tmp_path,
                                                                                  monkeypatch):
    from envace_lite.pipelines import learning_curve
    import envace_lite.pipelines.train as train_mod

    measured = []

    def fake_point(cfg, checkpoint, stage, step, **kw):
        measured.append((stage, step, Path(checkpoint).name))
        return {"stage": stage, "step": step, "committed_reward": step / 100}

    monkeypatch.setattr(learning_curve, "heldout_point", fake_point)
    monkeypatch.setattr(train_mod, "train", lambda cfg, run_dir: None)
    monkeypatch.setattr(train_mod, "read_metrics", lambda run_dir: [])
    cfg = get_config("smoke", {"grpo.steps": 4})
    kw = dict(warmstart_dir=tmp_path / "ws", heldout_every=2, eval_limit=1, before_sft=False)
    first = run_experiment(cfg, tmp_path / "run", **kw)
    assert [(p["stage"], p["step"]) for p in first["points"]] == [
        ("after_sft", 0), ("step", 2), ("after_envace", 4)]
    cfg.grpo.steps = 8  # the same run, extended to 8 steps
    longer = run_experiment(cfg, tmp_path / "run", **kw)
    assert [(p["stage"], p["step"], p["committed_reward"]) for p in longer["points"]] == [
        ("after_sft", 0, 0.0), ("step", 2, 0.02), ("step", 4, 0.04), ("step", 6, 0.06),
        ("after_envace", 8, 0.08)]
    # each point measured once, on its own checkpoint: step 4 was not measured again
    assert measured == [("after_sft", 0, "checkpoint"), ("step", 2, "checkpoint-2"),
                        ("after_envace", 4, "checkpoint-4"), ("step", 6, "checkpoint-6"),
                        ("after_envace", 8, "checkpoint-8")]
    saved = json.loads((tmp_path / "run" / "heldout.json").read_text())["points"]
    assert saved == longer["points"]


def _fake_runs(monkeypatch, measured):
    """Training that keeps only its last checkpoint, as the real one does (save_total_limit=1),
    and a held-out check that needs its checkpoint on disk."""
    import shutil

    from envace_lite.pipelines import learning_curve
    import envace_lite.pipelines.train as train_mod
    from envace_lite.pipelines.resume import CHECKPOINTS, checkpoint_step, last_checkpoint

    def fake_train(cfg, run_dir):
        folder = Path(run_dir) / CHECKPOINTS
        last = last_checkpoint(run_dir)
        if last is not None and checkpoint_step(last) >= cfg.grpo.steps:
            return  # already trained that far: nothing to do
        new = folder / f"checkpoint-{cfg.grpo.steps}"
        new.mkdir(parents=True)
        (new / "trainer_state.json").write_text("{}")
        if last is not None:
            shutil.rmtree(last)

    def fake_point(cfg, checkpoint, stage, step, **kw):
        assert stage in ("after_sft", "before_sft") or Path(checkpoint).is_dir(), checkpoint
        measured.append((stage, step))
        return {"stage": stage, "step": step, "committed_reward": step / 100}

    monkeypatch.setattr(learning_curve, "heldout_point", fake_point)
    monkeypatch.setattr(train_mod, "train", fake_train)
    monkeypatch.setattr(train_mod, "read_metrics", lambda run_dir: [])


@pytest.mark.parametrize("every_first, every_second, expected, new", [
    # the default (a check only at the end): the old end, 6, is no segment end of the new run
    (0, 0, [("after_sft", 0), ("step", 6), ("after_envace", 12)], [("after_envace", 12)]),
    # a finer interval: step 4 was passed, and its checkpoint is gone, so it gets no point
    (0, 4, [("after_sft", 0), ("step", 6), ("step", 8), ("after_envace", 12)],
     [("step", 8), ("after_envace", 12)]),
    (6, 5, [("after_sft", 0), ("step", 6), ("step", 10), ("after_envace", 12)],
     [("step", 10), ("after_envace", 12)]),
])
def test_extension_leaves_one_after_envace_point_whatever_the_interval(
        tmp_path, monkeypatch, every_first, every_second, expected, new):
    measured = []
    _fake_runs(monkeypatch, measured)
    kw = dict(warmstart_dir=tmp_path / "ws", eval_limit=1, before_sft=False)
    run_experiment(get_config("smoke", {"grpo.steps": 6}), tmp_path / "run",
                   heldout_every=every_first, **kw)
    measured.clear()
    longer = run_experiment(get_config("smoke", {"grpo.steps": 12}), tmp_path / "run",
                            heldout_every=every_second, **kw)
    assert [(p["stage"], p["step"]) for p in longer["points"]] == expected
    assert measured == new  # the old step-6 point is relabelled, not measured again


def test_shortening_a_run_is_refused_before_anything_is_measured(tmp_path, monkeypatch):
    measured = []
    _fake_runs(monkeypatch, measured)
    kw = dict(warmstart_dir=tmp_path / "ws", eval_limit=1, before_sft=False, heldout_every=6)
    run_experiment(get_config("smoke", {"grpo.steps": 12}), tmp_path / "run", **kw)
    before = (tmp_path / "run" / "heldout.json").read_text()
    measured.clear()
    with pytest.raises(ConfigError, match=r"trained to step 12, past grpo.steps=8"):
        run_experiment(get_config("smoke", {"grpo.steps": 8}), tmp_path / "run", **kw)
    assert measured == [] and (tmp_path / "run" / "heldout.json").read_text() == before
    # a run stopped at step 10 before its step-12 point: trained past 8 with no point there
    (tmp_path / "run" / "heldout.json").unlink()
    ck = tmp_path / "run" / "train" / "checkpoints"
    (ck / "checkpoint-12").rename(ck / "checkpoint-10")
    with pytest.raises(ConfigError, match=r"trained to step 10, past grpo.steps=8"):
        run_experiment(get_config("smoke", {"grpo.steps": 8}), tmp_path / "run", **kw)
    assert measured == []


def test_settle_points_merges_a_twice_measured_step_and_relabels_by_the_total():
    # the shape extensions wrote before the rule: step 12 held after_envace and step
    pts = [{"stage": "after_sft", "step": 0, "r": 0.30}, {"stage": "step", "step": 6, "r": 0.32},
           {"stage": "after_envace", "step": 12, "r": 0.36},
           {"stage": "step", "step": 12, "r": 0.36}, {"stage": "step", "step": 24, "r": 0.26},
           {"stage": "after_envace", "step": 36, "r": 0.12}]
    got = settle_points(pts, 36)
    assert [(p["stage"], p["step"], p["r"]) for p in got] == [
        ("after_sft", 0, 0.30), ("step", 6, 0.32), ("step", 12, 0.36), ("step", 24, 0.26),
        ("after_envace", 36, 0.12)]
    with pytest.raises(ConfigError, match=r"\[24, 36\]"):
        settle_points(got, 12)
    # before_sft measured on a rerun, after after_sft: still sorted first
    late = settle_points([{"stage": "after_sft", "step": 0}, {"stage": "after_envace", "step": 4},
                          {"stage": "before_sft", "step": 0}], 4)
    assert [p["stage"] for p in late] == ["before_sft", "after_sft", "after_envace"]


def test_ship_copies_results_and_writes_meta(tmp_path):
    out = tmp_path / "run"
    (out / "train").mkdir(parents=True)
    (out / "train" / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (out / "heldout.json").write_text('{"points": []}')
    (out / "summary.json").write_text(json.dumps({"profile": "micro", "seed": 2, "mode": "shared",
                                                  "steps": 40, "seconds": {"total": 1.0}}))
    with pytest.raises(FileNotFoundError):
        ship(tmp_path / "missing", tmp_path / "x", "cmd")
    dest = ship(out, tmp_path / "ref" / "shared_s2", "envace-lite experiment --seed 2", "abc123")
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["commit"] == "abc123" and meta["seed"] == 2 and meta["source"] == "shipped"
    assert meta["command"] == "envace-lite experiment --seed 2" and meta["steps"] == 40
    assert (dest / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.5}\n'
    assert not (dest / "train").exists()
    assert meta["reward_control"] == "none"  # a summary written before the field
    summary = json.loads((out / "summary.json").read_text()) | {"reward_control": "shuffle"}
    (out / "summary.json").write_text(json.dumps(summary))
    meta = json.loads((ship(out, tmp_path / "ref" / "c", "cmd", "abc") / "meta.json").read_text())
    assert meta["reward_control"] == "shuffle"


def test_background_heldout_measures_every_point_on_a_copy_and_resumes_from_a_left_copy(
        tmp_path, monkeypatch):
    """Background checks (an executor in place of the spawned process): the same points as the
    serial run; the intermediate checkpoints, which training deletes, are read from copies that
    are gone afterwards; a copy left by an interrupted run is measured on the rerun."""
    from concurrent.futures import ThreadPoolExecutor

    import envace_lite.pipelines.heldout_background as heldout_bg

    measured = []
    _fake_runs(monkeypatch, measured)
    monkeypatch.setattr(heldout_bg, "background_pool", lambda: ThreadPoolExecutor(1))
    kw = dict(warmstart_dir=tmp_path / "ws", eval_limit=1, before_sft=False, heldout_every=2)
    serial = run_experiment(get_config("smoke", {"grpo.steps": 6}), tmp_path / "serial", **kw)
    measured.clear()
    bg = run_experiment(get_config("smoke", {"grpo.steps": 6}), tmp_path / "bg",
                        background_heldout=True, **kw)
    assert bg["points"] == serial["points"]
    assert [(p["stage"], p["step"]) for p in bg["points"]] == [
        ("after_sft", 0), ("step", 2), ("step", 4), ("after_envace", 6)]
    assert sorted(measured) == [("after_envace", 6), ("after_sft", 0), ("step", 2), ("step", 4)]
    assert not (tmp_path / "bg" / heldout_bg.SNAPSHOTS).exists()
    assert bg["background_heldout"] is True and serial["background_heldout"] is False
    # an interrupted run: the step-4 point never saved, its copy left on disk
    held = json.loads((tmp_path / "bg" / "heldout.json").read_text())
    held["points"] = [p for p in held["points"] if p["step"] != 4]
    (tmp_path / "bg" / "heldout.json").write_text(json.dumps(held))
    left = tmp_path / "bg" / heldout_bg.SNAPSHOTS / "checkpoint-4"
    left.mkdir(parents=True)
    measured.clear()
    again = run_experiment(get_config("smoke", {"grpo.steps": 6}), tmp_path / "bg",
                           background_heldout=True, **kw)
    assert measured == [("step", 4)] and again["points"] == serial["points"]
    assert not (tmp_path / "bg" / heldout_bg.SNAPSHOTS).exists()


def test_snapshot_copies_weights_not_optimizer_state_and_keeps_a_whole_copy(tmp_path):
    from envace_lite.pipelines.heldout_background import snapshot

    ck = tmp_path / "checkpoint-3"
    ck.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt",
                 "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (ck / name).write_text(name)
    dest = snapshot(ck, tmp_path / "snaps" / "checkpoint-3")
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors",
                                                      "tokenizer.json"]
    (ck / "model.safetensors").write_text("changed")
    assert snapshot(ck, dest) == dest  # an existing copy is whole: it is kept as it is
    assert (dest / "model.safetensors").read_text() == "model.safetensors"
    assert not (tmp_path / "snaps" / "checkpoint-3.tmp").exists()


def test_a_sigint_keeps_the_points_the_background_worker_finished(tmp_path, monkeypatch):
    """The step-2 point ran beside the second segment and finished; Ctrl-C in that segment
    keeps it in heldout.json (it was dropped with the worker's queue) and removes its copy."""
    from concurrent.futures import ThreadPoolExecutor

    import envace_lite.pipelines.train as train_mod
    from envace_lite.pipelines import heldout_background

    measured = []
    _fake_runs(monkeypatch, measured)
    real_train = train_mod.train

    def interrupted_train(cfg, run_dir):
        if cfg.grpo.steps > 2:  # the step-2 point, submitted beside this segment, is done
            import time

            time.sleep(0.3)
            raise KeyboardInterrupt
        real_train(cfg, run_dir)

    monkeypatch.setattr(train_mod, "train", interrupted_train)
    monkeypatch.setattr(heldout_background, "background_pool", lambda: ThreadPoolExecutor(1))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(get_config("smoke", {"grpo.steps": 4}), tmp_path / "run",
                       warmstart_dir=tmp_path / "ws", heldout_every=2, eval_limit=1,
                       before_sft=False, background_heldout=True)
    saved = json.loads((tmp_path / "run" / "heldout.json").read_text())["points"]
    assert [(p["stage"], p["step"]) for p in saved] == [("after_sft", 0), ("step", 2)]
    assert not (tmp_path / "run" / heldout_background.SNAPSHOTS / "checkpoint-2").exists()


def test_the_background_worker_dies_with_its_leader(tmp_path):
    """A kill -9 of the experiment process; its held-out worker ends within seconds instead
    of running on alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import os, sys, time\n"
            "from envace_lite.pipelines.heldout_background import background_pool\n"
            "pool = background_pool()\n"
            "pool.submit(time.sleep, 120)\n"
            "time.sleep(0.5)\n"
            "print(' '.join(str(p) for p in pool._processes), flush=True)\n"
            "time.sleep(120)\n")
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in leader.stdout.readline().split()]
    assert workers
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    deadline = time.time() + 20
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(0.2)
        alive = [p for p in workers if os.path.exists(f"/proc/{p}")
                 and "zombie" not in open(f"/proc/{p}/status").read().lower()]
    assert alive == [], "the worker outlived its leader"


def test_a_moved_experiment_folder_points_its_training_record_at_its_own_warm_start(tmp_path):
    """A copied folder's train/config.json named the old folder's warm start, and the
    training resume refused it as another config; relocate rewrites only that case."""
    from envace_lite.pipelines.resume import check_resume_config, relocate

    new = tmp_path / "copy"
    train_dir = new / "train"
    train_dir.mkdir(parents=True)
    cfg = get_config("smoke", {"model.checkpoint": str(tmp_path / "gone/warmstart/checkpoint")})
    cfg.save(train_dir)
    mine = str(new / "warmstart" / "checkpoint")
    moved = get_config("smoke", {"model.checkpoint": mine})
    with pytest.raises(ConfigError, match="model.checkpoint"):
        check_resume_config(train_dir, moved)
    assert relocate(train_dir, mine)
    check_resume_config(train_dir, moved)  # resumes now
    assert json.loads((train_dir / "config.json").read_text())["model"]["checkpoint"] == mine
    assert not relocate(train_dir, mine)  # nothing left to rewrite
    # an old path that still exists, or another warm start, is a real change: kept, refused later
    other = tmp_path / "elsewhere" / "checkpoint"
    other.mkdir(parents=True)
    get_config("smoke", {"model.checkpoint": str(other)}).save(train_dir)
    assert not relocate(train_dir, mine)
    get_config("smoke", {"model.checkpoint": str(tmp_path / "gone/ws2/ck")}).save(train_dir)
    assert not relocate(train_dir, mine)
