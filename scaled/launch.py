#!/usr/bin/env python3
"""Launch envace-lite at scale: the notebooks' ``train()`` under accelerate + DeepSpeed, vLLM
generation, an LLM checklist judge, and the notebook series run headlessly.

Every subcommand builds its config with ``envace_lite.config.get_config`` from the ``scaled``
profile plus override files (``scaled/overrides/*.yaml``) and ``--set group.field=value``, and
takes ``--dry-run``: it then prints one JSON document (the resolved config, the entry point, the
world size and the exact command) and starts nothing. This file holds no training code:
``train`` runs ``accelerate launch -m envace_lite.cli.main train``, which calls
``envace_lite.pipelines.train.train``, the function notebook 04 calls.

Usage (from the repository root; scaled/README.md has the full recipes)::

    python scaled/launch.py train --accelerate-config scaled/accelerate/zero3_8gpu.yaml \\
        --overrides scaled/overrides/reference.yaml --run-dir runs/train/reference --dry-run
    python scaled/launch.py vllm-server --gpus 4,5,6,7 --dry-run     # rollouts, server mode
    python scaled/launch.py judge --gpus 6,7 --tensor-parallel 2 --dry-run   # Qwen3-30B-A3B
    python scaled/launch.py notebooks --accelerate-config scaled/accelerate/zero3_8gpu.yaml \\
        --overrides scaled/overrides/reference.yaml --dry-run
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = "envace_lite.pipelines.train.train (via `python -m envace_lite.cli.main train`)"
TRAIN_PARAM = "train_run_dir"
"""The notebook parameter that receives the accelerate-launched training run (notebook 04 reads
its metrics and checkpoints instead of training in the kernel, when it declares it)."""
JUDGE_MODEL = "Qwen/Qwen3-30B-A3B"
"""The paper's checklist judge (EnvACE §3.1), served as an OpenAI-compatible endpoint."""


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------
def resolve_config(profile: str, override_files: list[str], sets: list[str],
                   extra: dict[str, Any] | None = None) -> Any:
    """``cli.options.resolve_config``: files in order, then ``extra``, then ``--set`` (typed and
    range-checked by ``config.parse_overrides``); what every rank builds (the same function the
    CLI's ``train`` calls)."""
    from envace_lite.cli import options

    return options.resolve_config(profile, override_files, sets, extra)


def accelerate_world(config_file: str, num_processes: int | None = None,
                     num_machines: int | None = None) -> dict[str, Any]:
    """Load an accelerate config with accelerate's own loader; the world it launches.

    Returns:
        ``{"distributed_type", "num_machines", "world_size", "deepspeed_config_file",
        "deepspeed": the DeepSpeed JSON or None}``; ``world_size`` is the total process count.
    """
    from accelerate.commands.config.config_args import load_config_from_file

    cc = load_config_from_file(config_file)
    ds_file = (cc.deepspeed_config or {}).get("deepspeed_config_file")
    return {"distributed_type": str(cc.distributed_type),
            "num_machines": num_machines or cc.num_machines,
            "world_size": num_processes or cc.num_processes,
            "deepspeed_config_file": ds_file,
            "deepspeed": json.loads((ROOT / ds_file).read_text()) if ds_file else None}


HIDDEN_SIZE = {"Qwen/Qwen3-8B": 4096, "Qwen/Qwen3-1.7B": 2048}
"""Hidden sizes of the hub models (their published config.json), for DeepSpeed's "auto" bucket
sizes when the config itself is not cached."""


def resolve_deepspeed(ds: dict[str, Any], cfg: Any, world: int, bf16: bool | None = None
                      ) -> dict[str, Any]:
    """The DeepSpeed config as the HF Trainer will hand it to DeepSpeed: every "auto" filled.

    It runs transformers' own ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
    ``trainer_config_finalize`` on the run's real ``trl.GRPOConfig`` (``train.grpo_args``), seen
    from a ``world``-process launch on GPUs. Where DeepSpeed is installed, transformers builds that
    class on accelerate's ``HfDeepSpeedConfig``; here the same methods are put on that base
    directly, so it works where DeepSpeed is not installed.

    Args:
        ds: the DeepSpeed JSON, as loaded.
        cfg: the run's finalized ``Config``.
        world: total processes.
        bf16: mixed precision as on the GPU machine (default: ``model.dtype == "bfloat16"``).

    Raises:
        ValueError: a value fixed in the JSON contradicts the trainer's (transformers' message).
    """
    import copy
    import tempfile
    from types import SimpleNamespace

    from accelerate.utils.deepspeed import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from envace_lite.pipelines.train import grpo_args, per_device_batch

    with tempfile.TemporaryDirectory() as tmp:
        real = grpo_args(cfg, tmp)
    view = {"world_size": world, "per_device_train_batch_size": per_device_batch(cfg, world),
            "bf16": cfg.model.dtype == "bfloat16" if bf16 is None else bf16}

    class _GpuView:  # the real arguments, as a GPU launch of `world` processes sees them
        def __getattr__(self, name: str) -> Any:
            return view[name] if name in view else getattr(real, name)

    # transformers' subclass, rebuilt on accelerate's base (what it is when DeepSpeed is present)
    methods = {k: v for k, v in vars(HfTrainerDeepSpeedConfig).items() if not k.startswith("__")}
    hf = type("Resolver", (HfDeepSpeedConfig,), methods)(copy.deepcopy(ds))
    hf._dtype, hf.mismatches = None, []
    args = _GpuView()
    hf.trainer_config_process(args)
    hidden = cfg.model.hidden_size if cfg.model.kind != "hub" else HIDDEN_SIZE[cfg.model.name]
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden))
    hf.trainer_config_finalize(args, model, cfg.grpo.steps)
    return hf.config


def report(dry_run: bool, doc: dict[str, Any], cmd: list[str], env: dict[str, str]) -> int:
    """Print the dry-run document, or run ``cmd`` (replacing this process) with ``env`` added."""
    doc = {**doc, "command": shlex.join(cmd), "env": env}
    if dry_run:
        print(json.dumps(doc, indent=1, default=str))
        return 0
    print(f"[launch] {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(cmd)}",
          file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
    return 1  # not reached


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="scaled", help="config profile (default: scaled)")
    p.add_argument("--overrides", action="append", default=[], metavar="FILE",
                   help="YAML/JSON overrides, applied in order (repeatable)")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                   help="config override group.field=value (repeatable; wins over files)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved config, entry point, world size and command; "
                        "start nothing")


# ---------------------------------------------------------------------------------------------
# train: accelerate launch of the same train()
# ---------------------------------------------------------------------------------------------
def train_command(args: argparse.Namespace, run_dir: str) -> tuple[list[str], dict[str, Any]]:
    """The ``accelerate launch`` command line and the facts the dry run prints."""
    from envace_lite.pipelines.train import per_device_batch

    world = accelerate_world(args.accelerate_config, args.num_processes, args.num_machines)
    cfg = resolve_config(args.profile, args.overrides, args.sets)
    per_device = per_device_batch(cfg, world["world_size"])  # raises on a bad split, before GPUs
    cmd = ["accelerate", "launch", "--config_file", args.accelerate_config]
    if args.num_processes:
        cmd += ["--num_processes", str(args.num_processes)]
    if args.num_machines:
        cmd += ["--num_machines", str(args.num_machines)]
    if args.machine_rank is not None:
        cmd += ["--machine_rank", str(args.machine_rank)]
    if args.main_process_ip:
        cmd += ["--main_process_ip", args.main_process_ip,
                "--main_process_port", str(args.main_process_port)]
    cmd += ["-m", "envace_lite.cli.main", "train", "--profile", args.profile, "--run-dir", run_dir,
            "--seed", str(cfg.run.seed)]
    for f in args.overrides:
        cmd += ["--overrides", f]
    for s in args.sets:
        cmd += ["--set", s]
    if world["deepspeed"] is not None:
        world["deepspeed_resolved"] = resolve_deepspeed(world["deepspeed"], cfg,
                                                        world["world_size"])
    g = cfg.grpo
    facts = {"entry_point": ENTRY_POINT, "world_size": world["world_size"],
             "launcher": world, "run_dir": run_dir,
             "batch": {"rollouts_per_step": g.prompts_per_step * g.num_generations,
                       "per_device_train_batch_size": per_device,
                       "gradient_accumulation_steps": g.gradient_accumulation_steps},
             "config": cfg.to_dict()}
    return cmd, facts


def gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for the training processes (e.g. the GPUs vLLM leaves free)."""
    return {"CUDA_VISIBLE_DEVICES": args.gpus} if args.gpus else {}


def cmd_train(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    if not run_dir:  # one dir for every rank, fixed before the launch
        run_dir = "<a new runs/train/<profile>__s<seed>__<time>/ at launch>"
        if not args.dry_run:
            from envace_lite.paths import new_run_dir

            cfg = resolve_config(args.profile, args.overrides, args.sets)
            run_dir = str(new_run_dir("train", cfg.profile, cfg.run.seed, cfg.run.runs_root))
    cmd, facts = train_command(args, run_dir)
    return report(args.dry_run, facts, cmd, gpu_env(args))


# ---------------------------------------------------------------------------------------------
# vLLM servers: rollouts (server mode) and the LLM judge
# ---------------------------------------------------------------------------------------------
def vllm_command(model: str, gpus: str, port: int, tp: int, max_len: int, memory: float,
                 extra: list[str]) -> tuple[list[str], dict[str, str], int]:
    """``vllm serve`` on the given GPUs: ``(command, env, workers)``."""
    n = len([g for g in gpus.split(",") if g.strip()])
    if n % tp:
        raise SystemExit(f"--gpus {gpus}: {n} GPUs do not split into tensor-parallel groups of {tp}")
    cmd = ["vllm", "serve", model, "--host", "0.0.0.0", "--port", str(port),
           "--tensor-parallel-size", str(tp), "--data-parallel-size", str(n // tp),
           "--max-model-len", str(max_len), "--gpu-memory-utilization", str(memory),
           "--dtype", "bfloat16", *extra]
    return cmd, {"CUDA_VISIBLE_DEVICES": gpus}, n


def cmd_vllm_server(args: argparse.Namespace) -> int:
    url = f"http://{args.host}:{args.port}"
    cfg = resolve_config(args.profile, args.overrides, args.sets,
                         {"rollout.generation_backend": "vllm_server",
                          "rollout.vllm_server_url": url})
    # What TRL's client needs (trl/scripts/vllm_serve.py imposes the same): the NCCL
    # weight-transfer engine, processed logprobs for the importance-sampling ratio, dev endpoints.
    extra = ["--weight-transfer-config", json.dumps({"backend": "nccl"}),
             "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
             "--enable-prefix-caching"]
    cmd, env, workers = vllm_command(args.model or cfg.model.name, args.gpus, args.port,
                                     args.tensor_parallel, cfg.model.context_window,
                                     args.gpu_memory_utilization, extra)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    facts = {"entry_point": "vllm serve (TRL's VLLMClient connects from rank 0 of train())",
             "world_size": workers,
             "train_with": ["--overrides", "scaled/overrides/vllm_server.yaml",
                            "--set", f"rollout.vllm_server_url={url}"],
             "config": cfg.to_dict()}
    return report(args.dry_run, facts, cmd, env)


def cmd_judge(args: argparse.Namespace) -> int:
    url = f"http://{args.host}:{args.port}/v1"
    cfg = resolve_config(args.profile, args.overrides, args.sets,
                         {"grpo.judge": "llm", "grpo.judge_url": url,
                          "grpo.judge_model": args.model})
    # Qwen3 thinks before answering unless told not to: thinking is off by default (one JSON
    # verdict list per trajectory), and the reasoning parser keeps any thinking out of
    # `message.content`, which judge.LLMJudge parses. --think turns it on.
    extra = ["--served-model-name", args.model, "--reasoning-parser", "qwen3",
             "--default-chat-template-kwargs", json.dumps({"enable_thinking": args.think}),
             "--enable-prefix-caching"]
    cmd, env, workers = vllm_command(args.model, args.gpus, args.port, args.tensor_parallel,
                                     args.max_model_len, args.gpu_memory_utilization, extra)
    facts = {"entry_point": "vllm serve, OpenAI-compatible; envace_lite.core.judge.LLMJudge posts "
                            "to /chat/completions",
             "world_size": workers,
             "train_with": ["--overrides", "scaled/overrides/judge_llm.yaml",
                            "--set", f"grpo.judge_url={url}"],
             "config": cfg.to_dict()}
    return report(args.dry_run, facts, cmd, env)


# ---------------------------------------------------------------------------------------------
# The notebook series, headless, with the heavy stage under accelerate
# ---------------------------------------------------------------------------------------------
def notebook_runner_help() -> str | None:
    """``envace-lite notebooks --help`` when that command exists (the notebook issue), else None."""
    from envace_lite.cli.main import app

    if "notebooks" not in [c.name for c in app.registered_commands]:
        return None
    out = subprocess.run([sys.executable, "-m", "envace_lite.cli.main", "notebooks", "--help"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    return out.stdout if out.returncode == 0 else None


def train_run_readers() -> list[str]:
    """The committed notebooks that declare ``train_run_dir`` (papermill's own inspection)."""
    import papermill

    return [nb.stem for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
            if TRAIN_PARAM in papermill.inspect_notebook(str(nb))]


def notebook_stages(args: argparse.Namespace, series: str, train_dir: str
                    ) -> list[tuple[str, list[str]]]:
    """The commands, in order: accelerate-launched training, then the notebooks reading it."""
    train_args = argparse.Namespace(**{**vars(args), "run_dir": train_dir})
    stages = [("train", train_command(train_args, train_dir)[0])]
    helptext = notebook_runner_help()
    if helptext is not None:  # `envace-lite notebooks`: papermill, HTML exports, an index page
        cmd = [sys.executable, "-m", "envace_lite.cli.main", "notebooks", "--profile", args.profile]
        flags = {"--seed": str(resolve_config(args.profile, args.overrides, args.sets).run.seed),
                 "--out": series, "--cell-timeout": str(args.cell_timeout)}
        for flag, value in flags.items():
            if flag in helptext:
                cmd += [flag, value]
        if "--param" in helptext and train_run_readers():  # the runner refuses undeclared ones
            cmd += ["--param", f"{TRAIN_PARAM}={json.dumps(train_dir)}"]
        stages.append(("notebooks", cmd))
        return stages
    import papermill

    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        declared = papermill.inspect_notebook(str(nb))
        params = {"profile": args.profile, "run_dir": f"{series}/{nb.stem}",
                  "artifacts_dir": series, TRAIN_PARAM: train_dir}
        cmd = [sys.executable, "-m", "papermill", str(nb.relative_to(ROOT)),
               f"{series}/{nb.stem}/{nb.name}", "--kernel", "python3",
               "--request-save-on-cell-execute", "--execution-timeout", str(args.cell_timeout)]
        for k, v in params.items():
            if k in declared:
                cmd += ["-p", k, v]
        stages.append((nb.stem, cmd))
    return stages


def cmd_notebooks(args: argparse.Namespace) -> int:
    cfg = resolve_config(args.profile, args.overrides, args.sets)
    if args.series_dir:
        series = args.series_dir
    elif args.dry_run:
        series = "<a new runs/notebooks/<profile>__s<seed>__<time>/ at launch>"
    else:
        from envace_lite.paths import new_run_dir

        series = str(new_run_dir("notebooks", cfg.profile, cfg.run.seed, cfg.run.runs_root))
    stages = notebook_stages(args, series, f"{series}/train")
    world = accelerate_world(args.accelerate_config, args.num_processes, args.num_machines)
    doc = {"entry_point": ENTRY_POINT + f", then the notebooks with {TRAIN_PARAM}=<series>/train",
           "world_size": world["world_size"], "series_dir": series,
           "train_run_readers": train_run_readers(),
           "stages": [{"name": n, "command": shlex.join(c)} for n, c in stages],
           "config": cfg.to_dict()}
    if args.dry_run:
        print(json.dumps(doc, indent=1, default=str))
        return 0
    for name, cmd in stages:
        start = time.perf_counter()
        print(f"[notebooks] {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **gpu_env(args)},
                            check=False).returncode
        print(f"[notebooks] {name}: exit {rc} after {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
        if rc:
            return rc
    return 0


# ---------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def launch_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--accelerate-config", default="scaled/accelerate/zero3_8gpu.yaml",
                       help="an accelerate YAML from scaled/accelerate/")
        q.add_argument("--num-processes", type=int, default=None,
                       help="total processes, over all machines (default: the YAML's)")
        q.add_argument("--num-machines", type=int, default=None)
        q.add_argument("--machine-rank", type=int, default=None)
        q.add_argument("--main-process-ip", default="")
        q.add_argument("--main-process-port", type=int, default=29500)
        q.add_argument("--gpus", default="", help="CUDA_VISIBLE_DEVICES of the training "
                       "processes (default: all)")

    t = sub.add_parser("train", help="accelerate launch of envace_lite.pipelines.train.train")
    _config_args(t)
    launch_args(t)
    t.add_argument("--run-dir", default="", help="the run dir (every rank writes there)")
    t.set_defaults(fn=cmd_train)

    v = sub.add_parser("vllm-server", help="vLLM server for rollouts (TRL server mode)")
    _config_args(v)
    v.add_argument("--gpus", default="4,5,6,7", help="CUDA_VISIBLE_DEVICES of the server")
    v.add_argument("--tensor-parallel", type=int, default=1)
    v.add_argument("--host", default="127.0.0.1", help="address the trainer reaches it at")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--model", default="", help="default: the config's model.name")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.set_defaults(fn=cmd_vllm_server)

    j = sub.add_parser("judge", help="vLLM serving the checklist judge (OpenAI-compatible)")
    _config_args(j)
    j.add_argument("--gpus", default="6,7")
    j.add_argument("--tensor-parallel", type=int, default=2)
    j.add_argument("--host", default="127.0.0.1")
    j.add_argument("--port", type=int, default=8001)
    j.add_argument("--model", default=JUDGE_MODEL)
    j.add_argument("--max-model-len", type=int, default=32768)
    j.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    j.add_argument("--think", action="store_true", help="let Qwen3 think before its verdicts")
    j.set_defaults(fn=cmd_judge)

    n = sub.add_parser("notebooks", help="train under accelerate, then run the notebook series")
    _config_args(n)
    launch_args(n)
    n.add_argument("--series-dir", default="", help="default: a new runs/notebooks/... dir")
    n.add_argument("--cell-timeout", type=int, default=4 * 3600, help="seconds per cell")
    n.set_defaults(fn=cmd_notebooks)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.chdir(ROOT)  # config paths in the YAMLs are relative to the repository root
    if shutil.which("accelerate") is None and not getattr(args, "dry_run", False) \
            and args.command in ("train", "notebooks"):
        raise SystemExit("accelerate is not on PATH: activate the project's environment")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
