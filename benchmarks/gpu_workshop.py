"""The workshop's GPU path on one GPU: notebooks 02-05 and one ``train`` step under the ``gpu``
profile, with wall time and peak GPU memory, written to JSON.

No network: the policy is a **random-init Qwen3-1.7B** built from Qwen3-1.7B's published
``config.json`` (the values are hard-coded in ``QWEN3_CONFIGS``; ``--size 0.6B`` for Qwen3-0.6B),
on the real Qwen3 tokenizer and chat template that ``envace_lite`` rebuilds offline
(``qwen3_tokenizer``). The shapes, dtype, LoRA targets, rendering and generation caps are the
profile's, so the memory and time figures are those of the real model; only the text is noise
(a random policy rarely calls a tool, so its episodes end early: time per **turn** is the figure
to carry over, not time per notebook).

What it runs (each as its own process, as a user would):

1. ``envace-lite train --profile gpu --steps 1 --set model.name=<folder>``: one role-wise GRPO
   step (the profile's ``prompts_per_step × num_generations`` rollouts, gradient accumulation and
   generation batch size);
2. ``envace-lite notebooks --profile gpu --only 02,03,04,05 -p model_dir=<folder>``.

Peak GPU memory is the largest ``memory.used`` that ``nvidia-smi`` reports while a phase runs
(sampled every 200 ms; it includes PyTorch's cached blocks and the CUDA context, so it is what
the card must hold). The JSON holds ``machine``, ``command``, the model's shape, and per phase
``seconds``, ``peak_gpu_mib``, ``status`` and, for the notebooks, the series' per-notebook times.

Usage (on the GPU machine, from the repository root, after ``make setup`` with CUDA torch)::

    python benchmarks/gpu_workshop.py                     # Qwen3-1.7B shapes
    python benchmarks/gpu_workshop.py --size 0.6B --profile colab
    python benchmarks/gpu_workshop.py --skip-notebooks    # the train step only
"""
from __future__ import annotations

import argparse
import json
import os
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
}
"""The sizes of Qwen/Qwen3-1.7B and Qwen/Qwen3-0.6B (their hub ``config.json``); both share
``QWEN3_COMMON``."""

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
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, timeout=timeout).returncode
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {timeout:.0f} s"
    record = {"command": " ".join(cmd), "status": status,
              "seconds": round(time.perf_counter() - start, 1), "peak_gpu_mib": peak.peak}
    print(f"{name}: {status}, {record['seconds']} s, peak {peak.peak} MiB", flush=True)
    return record


def main() -> None:
    """Parse the arguments, build the stand-in, run the phases, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(QWEN3_CONFIGS), default="1.7B")
    ap.add_argument("--profile", default="gpu", help="gpu (one 40-80 GB GPU) or colab (T4)")
    ap.add_argument("--notebooks", default="02,03,04,05")
    ap.add_argument("--skip-notebooks", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per phase")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="extra config override for the train step, group.field=value")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"gpu_workshop_{args.profile}_{args.size}.json")
    result: dict[str, Any] = {"machine": machine_info(), "command": command_line("gpu_workshop.py", None),
                              "profile": args.profile, "phases": {}}
    if not torch.cuda.is_available():
        result["note"] = "no GPU on this machine: nothing was run"
        write_json(out, result)
        print(result["note"])
        return
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cli = [sys.executable, "-m", "envace_lite.cli.main"]
    with tempfile.TemporaryDirectory(prefix="gpu_workshop_") as tmp:
        tmp = Path(tmp)
        folder = tmp / f"qwen3-{args.size}-random"
        result["model"] = build_model_folder(args.size, folder)
        result["model"]["config"] = {**QWEN3_CONFIGS[args.size], **QWEN3_COMMON}
        env["ENVACE_RUNS"] = str(tmp / "runs")
        if not args.skip_train:
            cmd = [*cli, "train", "--profile", args.profile, "--steps", "1",
                   "--set", f"model.name={folder}"]
            for s in args.sets:
                cmd += ["--set", s]
            result["phases"]["train_step"] = run_phase("train_step", cmd, env, tmp, args.timeout)
        if not args.skip_notebooks:
            series = tmp / "series"
            cmd = [*cli, "notebooks", "--profile", args.profile, "--only", args.notebooks,
                   "--out", str(series), "-p", f"model_dir={folder}"]
            rec = run_phase("notebooks", cmd, env, tmp, args.timeout * 4)
            meta = series / "series.json"
            if meta.exists():
                rec["notebooks"] = [{k: s.get(k) for k in ("name", "status", "seconds", "cell",
                                                           "error")}
                                    for s in json.loads(meta.read_text())["stages"]]
            result["phases"]["notebooks"] = rec
        result["logs_tail"] = {p.stem: p.read_text()[-3000:] for p in tmp.glob("*.log")}
    write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
