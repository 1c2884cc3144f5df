# envace-lite: two commands do everything on a fresh machine.
#   make run    the main job: the notebook series on the `laptop` profile (creates .venv first)
#   make test   the test suite (creates .venv first if missing); CI runs this
# PROFILE=smoke make run   runs the main job on another profile.

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
PROFILE ?= laptop
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=
# torch's OpenMP threads spin while waiting; on a shared 2-core machine that slows generation
# about 25x whenever another process is busy. PASSIVE waits cost little when the machine is idle.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY

.PHONY: setup run test test-all clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt requirements-nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -c constraints.txt -e ".[test]"
	$(PIP) install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (envace-lite)"
	touch $@

run: setup
	$(VENV)/bin/envace-lite notebooks --profile $(PROFILE)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# every tier that runs on CPU, including the hand-run real-model tests
test-all: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
