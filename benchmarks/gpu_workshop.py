"""The workshop's GPU path on one GPU in one 600 s call: a ``train`` step, ``eval`` with parallel
rehearsal N = 2, and notebooks 02-05 under the ``gpu`` profile, each within a time budget, with
wall time, tokens/s and peak GPU memory per phase, written to one JSON.

No network: the policy is a **random-init Qwen3-1.7B** built from Qwen3-1.7B's published
``config.json`` (the values are hard-coded in ``QWEN3_CONFIGS``; ``--size 0.6B`` for Qwen3-0.6B,
``--size tiny`` for the CPU test's stand-in), on the real Qwen3 tokenizer and chat template that
``envace_lite`` rebuilds offline (``qwen3_tokenizer``). The shapes, dtype, LoRA targets,
rendering and generation caps are the profile's, so the memory and time figures are those of the
real model; only the text is noise (a random policy rarely calls a tool, so its episodes end
early: time per **turn** is the figure to carry over, not time per notebook).

The GPU machine has CUDA torch and most of the stack, but not TRL, papermill's kernel stack
or the benchmarks (``benchmarks/gpu_kit.txt``). ``--kit DIR`` first installs the wheels of ``DIR``
(made here by ``make gpu-kit``) with ``pip install --no-index --no-deps --target SITE`` and puts
``SITE`` first on every phase's ``PYTHONPATH``.

What it runs, each as its own process within its share of ``--budget`` (a phase past its time is
stopped and recorded as a timeout; the JSON is rewritten after every phase, so a call stopped at
its limit still leaves what had finished):

1. ``build``: the random-init model folder;
2. ``train_step``: ``envace-lite train --profile P --steps 1`` (the profile's
   ``prompts_per_step × num_generations`` rollouts, gradient accumulation, generation batch);
3. ``eval_rehearsal``: ``envace-lite eval --profile P --rehearsal parallel --n 2 --limit 2``;
4. ``notebooks``: ``envace-lite notebooks --profile P --only 02,03,04,05``;
5. with ``--colab-after`` and time left: the same train step under ``colab`` on a random-init
   Qwen3-0.6B (``colab_build``, ``colab_train_step``).

Peak GPU memory is the largest ``memory.used`` that ``nvidia-smi`` reports while a phase runs
(sampled every 200 ms; it includes PyTorch's cached blocks and the CUDA context, so it is what
the card must hold). Tokens/s: trained tokens per second of the train step (``act/tokens +
rehearse/tokens`` over the step's ``seconds`` in ``metrics.jsonl``, rollout included), and
generated tokens (ACT and rehearsal) per second of the evaluation's
phase. The JSON holds ``machine``
(torch and CUDA versions, the device name), ``command``, ``kit`` (the wheels installed), the
model's shape and per phase ``seconds``, ``budget_s``, ``peak_gpu_mib``, ``status``.

Usage (on the GPU machine, from the repository root)::

    python3 benchmarks/gpu_workshop.py --kit .whl --colab-after     # what the device call runs
    python benchmarks/gpu_workshop.py --size 0.6B --profile colab
    python benchmarks/gpu_workshop.py --size tiny --profile smoke --allow-cpu --kit K  # the test
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import command_line, machine_info, write_json

QWEN3_CONFIGS: dict[str, dict[str, Any]] = {
    "1.7B": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "0.6B": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
}
"""The sizes of Qwen/Qwen3-1.7B and Qwen/Qwen3-0.6B (their hub ``config.json``), and ``tiny``,
the CPU test's stand-in; all share ``QWEN3_COMMON``."""

PHASE_SHARES: dict[str, float] = {"build": 0.12, "train_step": 0.3, "eval_rehearsal": 0.18,
                                  "notebooks": 0.4}
"""Each phase's share of ``--budget`` (what a phase leaves unused passes to the next ones)."""

QWEN3_COMMON: dict[str, Any] = {
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
}
"""What every Qwen3 dense config of this family holds (hub ``config.json``)."""


def build_model_folder(size: str, folder: Path, seed: int = 0) -> dict[str, Any]:
    """Write a random-init Qwen3 of ``size`` (bf16) and the offline Qwen3 tokenizer to ``folder``.

    Returns:
        ``{"size", "parameters", "seconds"}``.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from envace_lite.models.load import qwen3_tokenizer

    start = time.perf_counter()
    tok = qwen3_tokenizer()
    config = Qwen3Config(**QWEN3_CONFIGS[size], **QWEN3_COMMON)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=151643, pad_token_id=151643, eos_token_id=[151645, 151643],
        do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"size": size, "parameters": n, "seconds": round(time.perf_counter() - start, 1)}


class GpuPeak:
    """Largest ``nvidia-smi`` ``memory.used`` (MiB) of GPU 0 while the ``with`` block runs."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                     "-i", "0"], capture_output=True, text=True, timeout=10).stdout
                self.peak = max(self.peak, int(out.strip().splitlines()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass
            self._stop.wait(self.every)

    def __enter__(self) -> GpuPeak:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def run_phase(name: str, cmd: list[str], env: dict[str, str], log_dir: Path,
              timeout: float) -> dict[str, Any]:
    """Run one command, timing it and sampling GPU memory; its output goes to ``<name>.log``."""
    start = time.perf_counter()
    with GpuPeak() as peak, open(log_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)  # its own group: kernels stop with it
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {timeout:.0f} s"
        finally:  # a timeout, Ctrl-C or a kill of this script: the phase's group goes too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    record = {"command": " ".join(cmd), "status": status,
              "seconds": round(time.perf_counter() - start, 1), "peak_gpu_mib": peak.peak}
    print(f"{name}: {status}, {record['seconds']} s, peak {peak.peak} MiB", flush=True)
    return record


def install_kit(kit: Path, site: Path) -> list[str]:
    """Install every wheel of ``kit`` into ``site`` (``pip --no-index --no-deps --target``).

    Returns:
        The wheel file names, sorted.

    Raises:
        FileNotFoundError: ``kit`` holds no wheel. subprocess.CalledProcessError: pip failed
            (its output is printed first).
    """
    wheels = sorted(kit.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"--kit {kit}: no .whl file there (make gpu-kit writes them)")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
           *map(str, wheels)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        print(done.stdout[-3000:] + done.stderr[-3000:])
        done.check_returncode()
    return [w.name for w in wheels]


def tokens_per_second(phase: str, out_dir: Path, record: dict[str, Any]) -> None:
    """Add the phase's tokens/s to ``record`` from what its command wrote under ``out_dir``."""
    try:
        if phase.endswith("train_step"):
            rows = [json.loads(line) for line in
                    next(out_dir.rglob("metrics.jsonl")).read_text().splitlines() if line]
            row = [r for r in rows if "step" in r][-1]
            trained = int(row.get("act/tokens") or 0) + int(row.get("rehearse/tokens") or 0)
            step_s, rollout_s = row.get("seconds"), row.get("rollout_seconds")
            record |= {"trained_tokens": trained, "step_seconds": step_s,
                       "rollout_seconds": rollout_s}
            if step_s:  # the step alone: from the trainer's start, not the process's
                record["trained_tokens_per_s"] = round(trained / step_s, 1)
        elif phase == "eval_rehearsal":
            rows = [json.loads(line) for line in
                    (out_dir / "results.jsonl").read_text().splitlines() if line]
            generated = sum(int(r.get("generated_tokens") or 0)
                            + int(r.get("rehearsal_tokens") or 0) for r in rows)
            record |= {"episodes": len(rows), "generated_tokens": generated,
                       "errors": sum(bool(r.get("error")) for r in rows)}
            if record["seconds"]:
                record["generated_tokens_per_s"] = round(generated / record["seconds"], 1)
    except (StopIteration, OSError, ValueError, IndexError) as e:
        record["tokens_note"] = f"no token counts: {type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, install the kit, build the stand-in, run the phases, write the JSON.

    Returns:
        0 when every phase that ran ended ``ok``, else 1 (the JSON is written either way).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(QWEN3_CONFIGS), default="1.7B")
    ap.add_argument("--profile", default="gpu", help="gpu (one 40-80 GB GPU) or colab (T4)")
    ap.add_argument("--kit", default="", help="a folder of wheels to install first (make gpu-kit)")
    ap.add_argument("--site", default="", help="where the kit is installed (default: a folder "
                    "under the run's temporary folder)")
    ap.add_argument("--budget", type=float, default=540, help="seconds for all phases together")
    ap.add_argument("--notebooks", default="02,03,04,05")
    ap.add_argument("--skip-notebooks", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--eval-suite", default="bfcl-base")
    ap.add_argument("--colab-after", action="store_true",
                    help="with time left, a colab train step on a random-init Qwen3-0.6B")
    ap.add_argument("--allow-cpu", action="store_true", help="run without CUDA (the CPU test)")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="extra config override for the train step, group.field=value")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"gpu_workshop_{args.profile}_{args.size}.json")
    result: dict[str, Any] = {"command": command_line("gpu_workshop.py", argv),
                              "profile": args.profile, "budget_s": args.budget, "phases": {}}
    with tempfile.TemporaryDirectory(prefix="gpu_workshop_") as tmp:
        tmp = Path(tmp)
        site = Path(args.site) if args.site else tmp / "site"
        pythonpath = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        if args.kit:
            start = time.perf_counter()
            result["kit"] = {"wheels": install_kit(Path(args.kit), site), "site": str(site)}
            result["kit"]["seconds"] = round(time.perf_counter() - start, 1)
            sys.path.insert(0, str(site))
            pythonpath.insert(0, str(site))
            print(f"kit: {len(result['kit']['wheels'])} wheels installed into {site} in "
                  f"{result['kit']['seconds']} s", flush=True)
        import torch

        result["machine"] = machine_info()
        result["machine"] |= {"cuda": torch.version.cuda, "cuda_available":
                              torch.cuda.is_available()}
        if not torch.cuda.is_available() and not args.allow_cpu:
            result["note"] = "no GPU on this machine: nothing was run"
            write_json(out, result)
            print(result["note"])
            return 1
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join(p for p in pythonpath if p),
                   ENVACE_RUNS=str(tmp / "runs"))
        cli = [sys.executable, "-m", "envace_lite.cli.main"]

        def left() -> float:
            return args.budget - (time.perf_counter() - t0)

        skipped = {"train_step": args.skip_train, "eval_rehearsal": args.skip_eval,
                   "notebooks": args.skip_notebooks}

        def budget(name: str) -> float:  # what is left, less the shares of the phases to come
            names = list(PHASE_SHARES)
            later = [p for p in names[names.index(name) + 1:] if not skipped.get(p)]
            return max(1.0, left() - sum(PHASE_SHARES[p] for p in later) * args.budget)

        def model_sets(folder: Path) -> list[str]:
            return ["--set", "model.kind=hub", "--set", f"model.name={folder}",
                    "--set", "model.device=auto"]

        def phase(name: str, cmd: list[str], seconds: float, out_dir: Path | None = None) -> bool:
            rec = run_phase(name, cmd, env, tmp, seconds)
            rec["budget_s"] = round(seconds, 1)
            if out_dir is not None:
                tokens_per_second(name, out_dir, rec)
            result["phases"][name] = rec
            write_json(out, result)  # after every phase: a stopped call keeps what finished
            return rec["status"] == "ok"

        folder = tmp / f"qwen3-{args.size}-random"
        start = time.perf_counter()
        result["model"] = build_model_folder(args.size, folder)
        result["model"]["config"] = {**QWEN3_CONFIGS[args.size], **QWEN3_COMMON}
        result["phases"]["build"] = {"status": "ok",
                                     "seconds": round(time.perf_counter() - start, 1)}
        write_json(out, result)
        if not args.skip_train:
            run_out = tmp / "runs" / "train_step"
            phase("train_step", [*cli, "train", "--profile", args.profile, "--steps", "1",
                                 "--run-dir", str(run_out), *model_sets(folder),
                                 *[x for s in args.sets for x in ("--set", s)]],
                  budget("train_step"), run_out)
        if not args.skip_eval:
            eval_out = tmp / "runs" / "eval_rehearsal"
            phase("eval_rehearsal", [*cli, "eval", "--profile", args.profile, "--suite",
                                     args.eval_suite, "--limit", "2", "--rehearsal", "parallel",
                                     "--n", "2", "--out", str(eval_out), *model_sets(folder)],
                  budget("eval_rehearsal"), eval_out)
        if not args.skip_notebooks:
            series = tmp / "series"
            cmd = [*cli, "notebooks", "--profile", args.profile, "--only", args.notebooks,
                   "--out", str(series), "-p", f"model_dir={folder}"]
            phase("notebooks", cmd, budget("notebooks"))
            meta = series / "series.json"
            if meta.exists():
                result["phases"]["notebooks"]["notebooks"] = [
                    {k: s.get(k) for k in ("name", "status", "seconds", "cell", "error")}
                    for s in json.loads(meta.read_text())["stages"]]
        if args.colab_after and left() > 60:
            small = tmp / "qwen3-0.6B-random"
            start = time.perf_counter()
            result["colab_model"] = build_model_folder("0.6B", small)
            result["phases"]["colab_build"] = {"status": "ok",
                                               "seconds": round(time.perf_counter() - start, 1)}
            run_out = tmp / "runs" / "colab_train_step"
            if left() > 30:
                phase("colab_train_step", [*cli, "train", "--profile", "colab", "--steps", "1",
                                           "--run-dir", str(run_out), *model_sets(small)],
                      left() - 5, run_out)
        result["logs_tail"] = {p.stem: p.read_text()[-3000:] for p in tmp.glob("*.log")}
        result["seconds"] = round(time.perf_counter() - t0, 1)
        if str(site) in sys.path:  # the kit's folder goes with the temporary folder
            sys.path.remove(str(site))
    write_json(out, result)
    print(f"wrote {out} ({result['seconds']} s)")
    return 0 if all(p.get("status") == "ok" for p in result["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
