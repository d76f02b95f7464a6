VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTHON ?= python3

.PHONY: venv test check demo lab-down bench snapshots clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -q

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

snapshots: venv  # after a deliberate change to the console's look; review the SVGs before committing
	$(PY) -m pytest -q tests/unit/test_console_snapshots.py --snapshot-update

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
