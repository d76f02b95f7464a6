VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTHON ?= python3

.PHONY: venv bytecode test test-stress test-peers check demo lab-down bench screenshots snapshots clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# The package's byte code, written before a suite runs: the suite starts ftconsole in hundreds of processes (serve,
# the command line), and where PYTHONDONTWRITEBYTECODE is set (as in CI's containers) each one compiled every module
# again: a third of a second each (the CLI tests: 84 s -> 64 s). compileall does not follow the links in ftconsole/,
# so their folders are named.
bytecode: venv
	$(PY) -m compileall -q ftconsole scheduler probes >/dev/null

# The suite runs in a random order (pytest-randomly), a new one each time: its seed is printed before and after the
# run, and `make test SEED=N` runs that order again. It runs in WORKERS processes (pytest-xdist; 2 by default, the
# budget's machine: 25 minutes on 2 cores): most tests wait on real processes, sshd nodes and timeouts, so two share
# two cores well (25 min -> 16 min). Which worker runs which test is decided as the run goes, so a seed gives each
# worker's order again only with WORKERS=1 (one process, as before). The 25 slowest tests are listed at the end.
# Temporary folders go under a short /tmp/ft-XXXXXX (removed after a run that passed): the tests make Unix
# sockets under them, whose paths may have 107 bytes at most, and xdist adds a folder per worker.
ifndef SEED
SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(1 << 31))')
endif
WORKERS ?= 2

test: venv bytecode
	@echo "test order: seed $(SEED) (make test SEED=$(SEED) runs it again), $(WORKERS) workers"
	@tmp=$$(mktemp -d /tmp/ft-XXXXXX) && \
	$(PY) -m pytest -q -p randomly --randomly-seed=$(SEED) -n $(WORKERS) --basetemp=$$tmp/t --durations=25; \
	rc=$$?; if [ $$rc -eq 0 ]; then rm -rf $$tmp; else echo "temporary folders kept: $$tmp/t"; fi; exit $$rc

# The suite under load: RUNS runs (a new order each, seeds printed), with LOAD spinning processes keeping the CPUs
# busy; it stops at the first failure and says how to run that order again (tests/stress.py).
RUNS ?= 3
LOAD ?= $(shell nproc)

test-stress: venv bytecode
	$(PY) tests/stress.py --runs $(RUNS) --load $(LOAD) --seed $(SEED)

# The real-launcher suite (tests/peers): each launch mode against its real launcher on two sshd test
# nodes. Its own environment, pinned and CPU only, which the main suite does not need; deepspeed comes last and
# without build isolation (its setup.py imports torch: isolated, pip would fetch a CUDA torch for the build).
# Needs Debian's openmpi-bin, mpich and pdsh (.ci/run installs them).
PEERS_VENV := .venv-peers
PEERS_LAUNCHERS := mpirun.openmpi orted mpirun.mpich hydra_pmi_proxy pdsh

$(PEERS_VENV)/.installed: tests/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	echo '*' > $(PEERS_VENV)/.gitignore
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q -r tests/peers/requirements.txt
	$(PEERS_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps deepspeed==0.19.8
	touch $@

test-peers: venv bytecode $(PEERS_VENV)/.installed
	@for c in $(PEERS_LAUNCHERS); do command -v $$c >/dev/null || \
	    { echo "test-peers: $$c missing; apt-get install openmpi-bin mpich pdsh" >&2; exit 1; }; done
	$(PY) -m pytest -q --timeout=600 tests/peers

check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: venv
	$(VENV)/bin/ftconsole demo

lab-down: venv
	$(VENV)/bin/ftconsole lab down

bench: venv
	$(PY) bench/probe_sweep.py
	$(PY) bench/placement.py
	$(PY) bench/submit.py
	$(PY) bench/console.py
	$(PY) bench/recovery.py

screenshots: venv  # the console's pictures in the README and docs/console.md (docs/images/console-*.svg)
	$(PY) tests/screenshots.py

snapshots: venv  # after a deliberate change to the console's look; review the SVGs before committing
	$(PY) -m pytest -q tests/unit/test_console_snapshots.py --snapshot-update

clean:
	rm -rf $(VENV) $(PEERS_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
