# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# llama.cpp's backend: auto (CUDA when nvcc or CUDA_HOME and an NVIDIA driver are present), cpu
# or cuda. llama-cpp-python compiles llama.cpp (~12 min on 2 cores); scripts/build_llama.py keeps
# one build per backend, so a cached CPU build is never installed for CUDA, nor the reverse.
GPU ?= auto

.PHONY: setup run test lint format bench screenshot clean

setup: $(VENV)/.installed-$(GPU)

$(VENV)/.installed-$(GPU): pyproject.toml scripts/build_llama.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) scripts/build_llama.py --python $(PY) --backend $(GPU)
	$(PY) -m pip install --progress-bar off -e '.[test]'
	$(PY) -m localserve models  # assembles and verifies the embedded model; says the backend
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $@

run: setup
	$(VENV)/bin/localserve demo

test: setup
	$(PY) -m ruff check localserve tui tests scripts
	$(PY) -m ruff format --check localserve tui tests scripts
	$(VENV)/bin/lint-imports  # the layers of docs/architecture.md: no circle, no upward import
	scripts/install_chromium.sh
	$(PY) -m pytest -n 2 --dist loadgroup  # the unit tests beside the e2e ones (tests/README.md)

lint: setup
	$(PY) -m ruff check localserve tui tests scripts
	$(VENV)/bin/lint-imports

format: setup
	$(PY) -m ruff format localserve tui tests scripts
	$(PY) -m ruff check --fix localserve tui tests scripts

bench: setup
	mkdir -p bench-results
	$(VENV)/bin/localserve bench-engine --out bench-results/engine.json

screenshot: setup
	$(VENV)/bin/localserve demo --screenshot docs/monitor.svg --after 40

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
