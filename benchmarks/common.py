"""Shared helpers of the benchmark scripts: machine info, JSON output, configs, timers.

Every script in ``benchmarks/`` is a plain script (never a timed test, tests/README.md). Each
takes ``--profile`` (``smoke``: the tiny random Qwen3; ``laptop``: SmolLM2-135M), ``--out`` (a
JSON path, default ``benchmarks/results/<script>_<profile>.json``) and ``--quick`` (the smallest
size, used by ``tests/test_benchmarks.py``). Each JSON holds ``machine`` (this module's
``machine_info``), ``command`` (the exact command line that reproduces it) and the figures.

Usage (from the repository root)::

    python benchmarks/rollout_throughput.py --profile laptop
    python benchmarks/table.py            # the README's performance table, from the JSON
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WARM_START = (Path(os.environ["ENVACE_BENCH_CHECKPOINT"])
              if os.environ.get("ENVACE_BENCH_CHECKPOINT") else None)
"""Laptop benchmarks use the warm-started SmolLM2 that ``ENVACE_BENCH_CHECKPOINT`` names (a full
``save_pretrained`` folder, made by ``envace-lite warmstart --profile laptop --seed 0``: the
``checkpoint`` folder of its run dir), so that ACT emits tool calls and trajectories reach
several turns; the base model when it is unset or missing. No default path. The JSON records
which (``model_checkpoint``)."""
GPU_NOTE = "no GPU on this machine: the GPU benchmarks were not run"


def machine_info() -> dict[str, Any]:
    """Where and with what a figure was measured.

    Returns:
        ``{"platform", "python", "cpu", "cpu_count", "load_avg_1m", "torch", "transformers",
        "trl", "gpu", "git_commit", "time"}``. ``load_avg_1m`` is the 1-minute load average
        when the script started: the CPUs may be shared with other jobs, so compare only the
        ratios of variants measured in one run.
    """
    import torch
    import transformers
    import trl

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl.__version__, "gpu": gpu or GPU_NOTE, "git_commit": commit,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that reproduces a result: ``python benchmarks/<script> <args>``."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, args)])


def default_out(name: str, profile: str, quick: bool) -> Path:
    """``benchmarks/results/<name>_<profile>[_quick].json``."""
    return RESULTS / f"{name}_{profile}{'_quick' if quick else ''}.json"


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (indented, keys in insertion order) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def bench_config(profile: str, overrides: dict[str, Any] | None = None) -> Any:
    """The profile's config for a benchmark, with the warm start on ``laptop`` when present."""
    from envace_lite.config import get_config

    extra = dict(overrides or {})
    if profile == "laptop" and WARM_START is not None and WARM_START.exists():
        extra.setdefault("model.checkpoint", str(WARM_START))
    return get_config(profile, extra)


QUICK = {"model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 4,
         "model.intermediate_size": 64}
"""``--quick`` shrinks the smoke model to the tests' tiny Qwen3 (tests/test_grpo.py ``TINY``)."""
_POLICIES: dict[str, tuple[Any, Any]] = {}


def policy(cfg: Any, train: bool = False) -> tuple[Any, Any]:
    """``load.load_policy(cfg, train)``, loaded once per process per model config.

    The scripts run in one process in the tests; a LoRA (``train`` with ``lora_r`` > 0) policy
    is a different object from the plain one.
    """
    import json

    from envace_lite.models.load import load_policy

    d = cfg.to_dict()  # the study group holds the micro base's pretraining (study.pretrain)
    key = json.dumps([d["model"], d["study"], train and cfg.model.lora_r > 0], sort_keys=True)
    if key not in _POLICIES:
        _POLICIES[key] = load_policy(cfg, train=train)
    model, tok = _POLICIES[key]
    model.train(train)
    return model, tok


def toy_task(i: int = 0) -> Any:
    """A short task for ``--quick`` runs: one tool, one user turn, one gold call."""
    from envace_lite.types import ChecklistItem, Task

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    user = [{"role": "user", "content": f"Weather in Paris? ({i})"}]
    gold = {"name": "get_weather", "arguments": {"city": "Paris"}}
    grounding = [{"call": gold, "observation": {"content": '{"temp": "18C"}', "error": False}}]
    item = ChecklistItem("call", "get_weather", {"city": "Paris"}, weight=1.0)
    return Task(f"toy_{i}", "toy", "train", [{"role": "system", "content": "Be brief."}] + user,
                tools, [user], [[item]], [grounding], [[gold]])


def bench_tasks(n: int, suites: tuple[str, ...] = ("tau2-telecom", "bfcl-base"),
                quick: bool = False) -> list[Any]:
    """``n`` train tasks, alternating between ``suites`` (the compact renderings, docs/design.md,
    "Machine facts").

    Args:
        n: number of tasks; suite ``j`` supplies tasks ``j, j + len(suites), ...``.
        suites: the suites to take them from, in order.
        quick: ``toy_task`` s instead (the tests' size).
    """
    from envace_lite.envs.tasks import load_tasks

    if quick:
        return [toy_task(i) for i in range(n)]

    per = -(-n // len(suites))
    pools = [load_tasks(s, "train", "compact", limit=per) for s in suites]
    return [pools[i % len(suites)][i // len(suites)] for i in range(n)]


def timed(fn: Any) -> tuple[Any, float]:
    """``(fn(), seconds)``, by ``time.perf_counter``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


class ForwardTimer:
    """Splits a model's forward passes into prefill and decode, by forward hooks.

    A forward whose ``input_ids`` has more than one column is a prefill (HF ``generate``'s first
    step, or a training forward); one column is a decode step. Wrap only generation with it.
    With ``HFGenerator``'s prefix cache on, the prefills are its batch-1 forwards over each
    prompt's uncached ids but the last, and ``generate``'s first step (the last prompt id of
    every row, one column) counts as a decode step.

    Attributes:
        prefill_s, decode_s: seconds spent inside the model's forward, per kind.
        prefill_tokens: real (attended) prompt tokens prefilled; ``prefill_padded``: with padding
            (``batch × width``), what the model actually computed.
        decode_steps: decode forwards; ``decode_rows``: rows × steps (finished rows included).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prefill_s = self.decode_s = 0.0
        self.prefill_tokens = self.prefill_padded = self.decode_steps = self.decode_rows = 0
        self._start = 0.0
        self._handles: list[Any] = []

    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        self._start = time.perf_counter()

    def _post(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        spent = time.perf_counter() - self._start
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.dim() != 2:
            return
        if ids.shape[1] > 1:
            mask = kwargs.get("attention_mask")
            real = ids.numel() if mask is None else int(mask[:, -ids.shape[1]:].sum())
            self.prefill_s += spent
            self.prefill_tokens += real
            self.prefill_padded += ids.numel()
        else:
            self.decode_s += spent
            self.decode_steps += 1
            self.decode_rows += ids.shape[0]

    def __enter__(self) -> ForwardTimer:
        self._handles = [
            self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def as_dict(self) -> dict[str, Any]:
        """The counters, seconds rounded to ms."""
        return {"prefill_s": round(self.prefill_s, 3), "decode_s": round(self.decode_s, 3),
                "prefill_tokens": self.prefill_tokens, "prefill_padded_tokens": self.prefill_padded,
                "decode_steps": self.decode_steps, "decode_rows": self.decode_rows}


@contextmanager
def peak_rss() -> Iterator[dict[str, float]]:
    """Peak resident memory of this process, MiB, read from ``/proc/self/status`` (VmHWM).

    The high-water mark only grows, so a per-configuration peak needs a fresh process
    (``scaling.py`` starts one per point). Yields a dict filled with ``peak_mib`` on exit.
    """
    box: dict[str, float] = {}
    try:
        yield box
    finally:
        box["peak_mib"] = _vmhwm_mib()


def _vmhwm_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
