# Kiln's developer entry points. `make help` lists them; the README names the two that matter:
# `make demo` (Kiln's main job, locally) and `make test` (every test).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
KUBECONFIG_LOCAL := $(CURDIR)/.kiln/kubeconfig
export KUBECONFIG ?= $(KUBECONFIG_LOCAL)

help: ## List the targets with a line on each
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# ---------------------------------------------------------------- environment
$(VENV)/.installed: constraints.txt requirements-dev.txt operator/pyproject.toml runtime_image/pyproject.toml e2e/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -r requirements-dev.txt -e 'operator[simulator]' -e runtime_image -e e2e
	touch $@

venv: $(VENV)/.installed ## Create .venv with every Python dependency (pinned by constraints.txt)

lock: ## Re-pin constraints.txt from what .venv has installed
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > constraints.txt

system-deps: ## Install the Debian packages the tests use (needs root)
	bash e2e/system-deps.sh

# ---------------------------------------------------------------- local cluster
cluster-binaries: ## Obtain etcd, kube-* , kubectl and kwok (env dir, cache, download, or go build)
	@bash e2e/cluster/binaries.sh

cluster-up: venv ## Start the local control plane with kwok GPU nodes; writes .kiln/kubeconfig
	$(PY) -m kiln_localcluster up

cluster-down: venv ## Stop exactly the processes cluster-up started
	$(PY) -m kiln_localcluster down

docker-up: ## Install (if needed) and start the Docker engine; no image can be pulled here
	bash e2e/docker/docker-up.sh

# ---------------------------------------------------------------- quality
lint: venv ## ruff and the import-linter layer contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: venv ## mypy (strict) over every package and the tests
	$(VENV)/bin/mypy

check: venv ## Regenerate generated files and fail on any difference
	$(PY) -m kiln_operator.api.crdgen --out crds/
	git diff --exit-code -- crds/ || { echo "crds/ is out of date: run 'make crds' and commit"; exit 1; }

test: venv system-deps lint typecheck check ## Every test: lint, types, generated files, unit, integration
	$(PY) -m pytest tests

test-unit: venv ## Unit tests only (no cluster, no network)
	$(PY) -m pytest tests/unit

demo: venv system-deps ## Kiln's main job, locally: cluster, operator, a sample service, load
	bash e2e/demo.sh

.PHONY: help venv lock system-deps cluster-binaries cluster-up cluster-down docker-up lint typecheck check test test-unit demo
