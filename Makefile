# envace-lite: two commands do everything on a fresh machine.
#   make run    the main job: the notebook series on the `laptop` profile (creates .venv first)
#   make test   the test suite (creates .venv first if missing); CI runs this
# PROFILE=smoke make run   runs the main job on another profile.

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
PROFILE ?= laptop
# torch: the CPU build (2.13.0+cpu) on a machine without CUDA, unless TORCH is given. It comes
# from a local wheel when pip's find-links has one, else from PyTorch's CPU index; plain PyPI
# would pull the multi-GB CUDA build on Linux. macOS wheels on PyPI are CPU-only; a machine with
# nvidia-smi gets PyPI's default (CUDA) build: pass TORCH=... for another CUDA version.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ifeq ($(shell uname -s),Darwin)
TORCH   ?= torch==2.13.0
else ifneq ($(shell command -v nvidia-smi 2>/dev/null),)
TORCH   ?= torch==2.13.0
else
TORCH   ?= torch==2.13.0+cpu
endif
PYTEST_ARGS ?=
# torch's OpenMP threads spin while waiting; on a shared 2-core machine that slows generation
# about 25x whenever another process is busy. PASSIVE waits cost little when the machine is idle.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY

.PHONY: setup run test test-all clean-venv gpu-kit

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt requirements-nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH) || { case "$(TORCH)" in *+cpu*) \
	  $(PIP) install -q $(TORCH) --extra-index-url $(TORCH_CPU_INDEX);; *) false;; esac; }
	$(PIP) install -q -c constraints.txt -e ".[test]"
	$(PIP) install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (envace-lite)"
	touch $@

run: setup
	$(VENV)/bin/envace-lite notebooks --profile $(PROFILE)

# the suite runs on one pytest-xdist worker per core (TEST_WORKERS=0: one process), each with
# one torch thread, so the pure-Python tau2 replays use every core
TEST_WORKERS ?= auto
test: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# every tier that runs on CPU, including the hand-run real-model tests
test-all: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "" $(PYTEST_ARGS)

# the wheels the lent GPU machine lacks, for Python 3.12, into .whl/ (benchmarks/gpu_kit.py)
gpu-kit: setup
	$(PY) benchmarks/gpu_kit.py --out .whl

clean-venv:
	rm -rf $(VENV)
