# nexus-mcp tasks. `make run` and `make test` are all a newcomer needs (Python 3.11+).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := .nexus-data/demo-workspace
PORT   ?= 8765
CLIENTS := tests/clients
NPM    ?= npm
# Parallel test workers (pytest-xdist): one per core; TEST_WORKERS=0 runs the suite serially.
TEST_WORKERS ?= auto

.PHONY: run test clients check lint typecheck imports docs bench clean

# pip's own output is the install progress (a first install takes about a minute).
$(BIN)/python:
	@echo "==> creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Reinstall only when the project definition changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "==> installing nexus-mcp and its dependencies into $(VENV)"
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	@echo "==> installing the test tools (pytest, hypothesis, ruff, mypy, mcp-server-git) into $(VENV)"
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

## run: serve the demo workspace over HTTP on 127.0.0.1 in dev mode (port 8765; another: make run PORT=9000)
run: $(VENV)/.installed
	@mkdir -p $(DEMO)
	@cp -Rn demo/workspace/. $(DEMO)/
	$(BIN)/nexus-mcp serve --transport http --mode dev --port $(PORT) \
		--workspace $(DEMO) --data-dir .nexus-data --config demo/nexus.yaml

# The non-Python MCP clients the end-to-end tests drive (tests/e2e/test_clients.py) and the
# reference MCP servers they mount as upstreams (server-filesystem, server-everything), at the
# exact versions of tests/clients/package-lock.json; reinstalled only when the pins change.
$(CLIENTS)/node_modules/.installed: $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	@echo "==> installing the npm test parts (TypeScript SDK, MCP Inspector, oidc-provider, reference servers) into $(CLIENTS)"
	$(NPM) ci --prefix $(CLIENTS) --no-audit --no-fund
	touch $@

## clients: install the TypeScript SDK, MCP Inspector, OpenID provider and reference MCP servers the tests drive (node, npm)
clients: $(CLIENTS)/node_modules/.installed

## test: the whole suite, the command CI runs (the npm client tests skip without npm)
test: $(VENV)/.installed-test
	@if ! command -v $(NPM) >/dev/null 2>&1; then \
		echo "==> npm not found: the TypeScript SDK, MCP Inspector and npm reference-server tests will be skipped"; \
	elif ! $(MAKE) --no-print-directory clients; then \
		echo "==> npm ci failed: the TypeScript SDK, MCP Inspector and npm reference-server tests will be skipped"; fi
	@# The hundreds of servers and upstreams the tests start import nexus-mcp from src: compiled
	@# once here, so a machine with PYTHONDONTWRITEBYTECODE set does not compile it in each.
	$(BIN)/python -m compileall -q src tests/support benchmarks > /dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

## check: lint, format check, strict type check, the package's import contracts and the docs
check: lint typecheck imports docs
lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
typecheck: $(VENV)/.installed-test
	$(BIN)/mypy
# The layers and boundaries of pyproject.toml's [tool.importlinter] (LAYOUT.md).
imports: $(VENV)/.installed-test
	$(BIN)/lint-imports

# docs/ with MkDocs Material, strict (mkdocs.yml): a broken link, anchor or include, or a page
# left out of the nav, fails. The site lands in .nexus-data/site; `mkdocs serve` previews it.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## bench: the benchmark suite, ending with one table (BENCH_FLAGS=--strict: exit 1 on a miss)
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run_all.py $(BENCH_FLAGS)

clean:
	rm -rf $(VENV) .nexus-data .pytest_cache .mypy_cache .ruff_cache $(CLIENTS)/node_modules
