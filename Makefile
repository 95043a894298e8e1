# numalign developer entry points. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint unit helm cluster bench crds down clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Build (or reuse) the control plane, start it with emulated nodes and sample workloads.
demo: $(BIN)/.installed
	$(BIN)/numalign dev up --demo

down: $(BIN)/.installed
	$(BIN)/numalign dev down

# Everything CI runs: lint, types, layers (pyproject's import-linter contracts), unit
# tests, tests against the real API server and the real node (its kubelet, containerd,
# runc and CNI plugins are built here too).
test: $(BIN)/.installed
	$(BIN)/numalign dev build --real-node
	$(BIN)/ruff check operator tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q -p no:cacheprovider

# Needs nothing built (no control plane, no helm): a fresh clone passes it.
unit: $(BIN)/.installed
	$(BIN)/pytest -q tests/unit

# The chart's tests: they build helm first (as `numalign dev build` does; cached after).
helm: $(BIN)/.installed
	$(BIN)/pytest -q tests/helm

cluster: $(BIN)/.installed
	$(BIN)/pytest -q tests/cluster tests/e2e

bench: $(BIN)/.installed
	$(BIN)/python bench/run.py

crds: $(BIN)/.installed
	$(BIN)/python -m numalign.api.crdgen

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
