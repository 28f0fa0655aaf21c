# nexus-mcp tasks. `make run` and `make test` are all a newcomer needs (Python 3.11+).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := .nexus-data/demo-workspace
PORT   ?= 8765

.PHONY: run test check lint typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall only when the project definition changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

## run: serve the demo workspace over HTTP on 127.0.0.1 in dev mode
run: $(VENV)/.installed
	@mkdir -p $(DEMO)
	@cp -Rn demo/workspace/. $(DEMO)/
	$(BIN)/nexus-mcp serve --transport http --mode dev --port $(PORT) \
		--workspace $(DEMO) --data-dir .nexus-data --config demo/nexus.yaml

## test: the whole suite, the command CI runs
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest

## check: lint, format check and strict type check
check: lint typecheck
lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

## bench: the benchmark suite (baselines measured side by side in the same run)
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .nexus-data .pytest_cache .mypy_cache .ruff_cache
