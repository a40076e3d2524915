# Kiln's developer entry points. `make help` lists them; the README names the two that matter:
# `make demo` (Kiln's main job, locally) and `make test` (every test).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
KUBECONFIG_LOCAL := $(CURDIR)/.kiln/kubeconfig
export KUBECONFIG ?= $(KUBECONFIG_LOCAL)
CHART := manifests/charts/kiln
# The CRDs, generated from the pydantic models into crds/ (a kustomize base) and copied, byte for
# byte, into the Helm chart's crds/ (which Helm installs before the templates and never deletes).
define GENERATE_CRDS
$(PY) -m kiln_operator.api.crdgen --out crds/
rm -f $(CHART)/crds/*.yaml
for crd in crds/*.yaml; do [ "$${crd##*/}" = kustomization.yaml ] || cp "$$crd" $(CHART)/crds/; done
endef

help: ## List the targets with a line on each
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# ---------------------------------------------------------------- environment
$(VENV)/.installed: constraints.txt requirements-dev.txt operator/pyproject.toml runtime_image/pyproject.toml e2e/pyproject.toml
	@echo "Installing Kiln's Python dependencies into $(VENV) (a few minutes; log: $(VENV)/install.log)"
	$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install -q --upgrade pip && \
	   $(PY) -m pip install -q -c constraints.txt -r requirements-dev.txt \
	     -e 'operator[simulator]' -e 'runtime_image[test,bench]' -e e2e; } >$(VENV)/install.log 2>&1 \
	  || { tail -n 40 $(VENV)/install.log; echo "pip install failed: see $(VENV)/install.log"; exit 1; }
	touch $@

venv: $(VENV)/.installed ## Create .venv with every Python dependency (pinned by constraints.txt)

lock: ## Re-pin constraints.txt from what .venv has installed
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > constraints.txt

system-deps: ## Install the Debian packages the tests use (needs root)
	bash e2e/system-deps.sh

# ---------------------------------------------------------------- local cluster
cluster-binaries: ## Obtain etcd, kube-*, kubectl, kwok, kubelet, kube-proxy (cache, download, or go build)
	@bash e2e/cluster/binaries.sh
	@bash e2e/cluster/binaries.sh node

cluster-up: venv ## Start the local control plane with kwok GPU nodes; writes .kiln/kubeconfig
	$(PY) -m kiln_localcluster up

cluster-down: venv ## Stop exactly the processes cluster-up started
	$(PY) -m kiln_localcluster down

docker-up: ## Install (if needed) and start the Docker engine; no image can be pulled here
	bash e2e/docker/docker-up.sh

# ---------------------------------------------------------------- quality
lint: venv ## ruff, the import-linter layer contracts and vulture (unused code; tools/vulture_whitelist.py)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture

typecheck: venv ## mypy (strict) over every package and the tests
	$(VENV)/bin/mypy

check: venv ## Regenerate generated files and fail on any difference
	$(GENERATE_CRDS)
	@test -z "$$(git status --porcelain -- crds/ $(CHART)/crds/)" || { git status --short -- crds/ $(CHART)/crds/; \
	  echo "crds/ or $(CHART)/crds/ differs from what the models generate: run 'make crds' and commit"; exit 1; }

# The Kubernetes binaries and the runtime image are made before pytest starts: on a fresh machine
# each takes minutes, longer than a test's own time limit.
test: venv lint typecheck check system-deps native docker-up cluster-binaries gotools image-runtime ## Every test: lint, types, generated files, unit, integration, images, e2e
	$(MAKE) --no-print-directory test-runtime-pure
	KILN_RUNTIME_BUILD=compiled $(PY) -m pytest tests --durations=25

test-unit: venv ## Unit tests only (no cluster, no network)
	$(PY) -m pytest tests/unit

# mypyc compiles the runtime's request path in place (runtime_image/setup.py says which modules
# and why); the image ships that build and `make test` tests it. Remade when a source changes.
NATIVE := runtime_image/build/.native
$(NATIVE): $(VENV)/.installed runtime_image/setup.py $(shell find runtime_image/kiln_runtime -name '*.py')
	mkdir -p runtime_image/build
	cd runtime_image && KILN_RUNTIME_COMPILE=1 ../$(PY) setup.py -q build_ext --inplace >build/mypyc.log 2>&1 \
	  || { tail -n 30 build/mypyc.log; exit 1; }
	# setuptools keeps an unchanged library's old time; the tests compare it with the sources
	touch runtime_image/kiln_runtime/_compiled__mypyc*.so $@

native: $(NATIVE) ## Compile the runtime's request path in place with mypyc (what the image ships)

clean-native: ## Remove the compiled modules: the working tree runs as pure Python again
	find runtime_image/kiln_runtime -name '*.so' -delete
	rm -f $(NATIVE)

# The runtime's unit tests on the pure source too (a copy without the compiled modules): the
# source is what a reader reads and a debugger steps through, so it must behave the same.
PURE := .kiln/pure
test-runtime-pure: venv ## The runtime's unit tests on the pure-Python source (no compiled modules)
	rm -rf $(PURE) && mkdir -p $(PURE)
	tar -c --exclude='*.so' --exclude=__pycache__ runtime_image/kiln_runtime runtime_image/bench | tar -x -C $(PURE)
	KILN_RUNTIME_BUILD=pure $(PY) -m pytest tests/unit/runtime -o pythonpath=$(PURE)/runtime_image -q

MODEL_FROM ?= claim
demo: venv system-deps cluster-binaries ## Kiln's main job, locally: cluster, operator, a sample service, load (MODEL_FROM=s3: the model from a bucket)
	MODEL_FROM=$(MODEL_FROM) bash e2e/demo.sh

e2e: venv system-deps docker-up cluster-binaries image-runtime ## The end-to-end suite: the local cluster's real node, or $$KILN_E2E_KUBECONFIG
	$(PY) -m pytest tests/e2e

e2e-kind: venv ## The end-to-end suite on kind (needs Docker, kind and internet; not run here)
	bash e2e/kind.sh

OPERATOR_IMAGE ?= kiln/operator:dev
image-operator: base-image ## Build the operator image from operator/Dockerfile as $(OPERATOR_IMAGE)
	tar -c --exclude=__pycache__ -C operator Dockerfile pyproject.toml kiln_operator -C $(CURDIR) constraints.txt \
	  | bash e2e/docker/build.sh $(OPERATOR_IMAGE) --build-arg BASE_IMAGE=$(RUNTIME_BASE_IMAGE)

docs: ## Render docs/architecture.svg from docs/architecture.dot (Graphviz's dot)
	@command -v dot >/dev/null || { echo "make docs needs Graphviz's dot: apt-get install -y graphviz"; exit 1; }
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

.PHONY: help venv lock kube-schemas system-deps cluster-binaries cluster-up cluster-down docker-up lint typecheck check test test-unit native clean-native test-runtime-pure demo e2e e2e-kind image-operator docs

# ---- operator ----
KUBECTL = $$(bash e2e/cluster/binaries.sh)/kubectl

crds: venv ## Regenerate crds/ (CRDs + kustomization) and the Helm chart's copies from the pydantic models
	$(GENERATE_CRDS)

kube-schemas: venv ## Re-extract operator/kiln_operator/api/kubernetes_openapi.json from the pinned Kubernetes module's OpenAPI document
	. e2e/cluster/versions.env && dir=$$(go mod download -json k8s.io/kubernetes@$$KUBERNETES_VERSION | $(PY) -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') && \
	  $(PY) -m kiln_operator.api.kubeschemas --openapi $$dir/api/openapi-spec/v3/api__v1_openapi.json \
	    --source "k8s.io/kubernetes $$KUBERNETES_VERSION api/openapi-spec/v3/api__v1_openapi.json"

run-operator: venv ## Run the operator in the foreground against $KUBECONFIG (default: the local cluster)
	$(KUBECTL) apply -k crds/
	$(KUBECTL) wait --for=condition=Established --timeout=60s crd/inferenceservices.serving.kiln.dev
	MALLOC_ARENA_MAX=2 $(PY) -m kiln_operator run  # as the operator's image sets it

bench-operator: venv ## 100 and 1000 InferenceServices at once (3 rounds against the bare-client bounds), and the autoscaler at steady load, each run on the local cluster started anew (a running one is stopped) -> docs/benchmarks/operator.md
	$(PY) -m tests.integration.operator.bench_operator --counts 100 1000 --autoscaler-counts 100 1000 --out docs/benchmarks/operator.md

bench-pinning: venv system-deps docker-up ## gRPC calls per pod after 1 -> 3 on the real node: 12 clients with/without a max connection age, 1 client via the cluster IP and via round_robin -> docs/benchmarks/grpc-pinning.md
	$(PY) -m tests.e2e.bench_grpc_pinning --out docs/benchmarks

bench-fetch: venv ## Model download MB/s: kiln_runtime fetch vs curl, same SeaweedFS object -> docs/benchmarks/fetch.md
	$(PY) -m tests.integration.fetch.bench_fetch --mib 256 --rounds 5 --out docs/benchmarks/fetch.md


bench-coldstart: venv system-deps docker-up ## Apply -> first inference through the Service on the real node -> docs/benchmarks/cold-start.md
	$(PY) -m tests.e2e.bench_cold_start --out docs/benchmarks

bench-warmup-memory: venv ## Operator peak RSS while 4 services with 16 MiB inputs warm up, with and without the budget -> docs/benchmarks/operator.md
	$(PY) -m tests.integration.warmup.bench_warmup_memory --out docs/benchmarks/operator.md

gotools: ## Build (or find in the cache) Helm, the kstatus command, Argo CD's health test (docs/gitops.md), the Gateway API CRDs, Jaeger (docs/observability.md), Prometheus with Kubernetes discovery and the Prometheus Operator's CRDs (docs/prometheus.md)
	@for tool in helm kstatus argocd-health gateway-api-crds jaeger prometheus prometheus-operator-crds; do bash e2e/gotools/build.sh $$tool; done

test-gitops: venv ## The chart (lint, schema, same objects as kustomize) and the Argo CD health check
	$(PY) -m pytest tests/unit/gitops

.PHONY: crds run-operator bench-operator bench-pinning bench-warmup-memory bench-coldstart gotools test-gitops bench-fetch

# ---- runtime ----
RUNTIME_IMAGE ?= kiln/runtime:dev
RUNTIME_BASE_IMAGE ?= kiln/debian-python:bookworm
BENCH_VENV := .kiln/bench-venv

base-image: docker-up ## Build the local Debian + Python base image (debootstrap + docker import)
	bash e2e/docker/base-image.sh $(RUNTIME_BASE_IMAGE)

image-runtime: base-image ## Build the runtime image from runtime_image/Dockerfile as $(RUNTIME_IMAGE)
	tar -c --exclude=__pycache__ --exclude='*.so' -C runtime_image Dockerfile pyproject.toml setup.py kiln_runtime \
	  -C $(CURDIR) constraints.txt | bash e2e/docker/build.sh $(RUNTIME_IMAGE) --build-arg BASE_IMAGE=$(RUNTIME_BASE_IMAGE)

# pytriton pins numpy 1.x, so Triton's side of the benchmark gets its own virtualenv; it sees
# torch through the main one (a .pth line appended after its own packages).
$(BENCH_VENV)/.installed: runtime_image/pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q nvidia-pytriton matplotlib
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(BENCH_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-kiln-main-venv.pth"
	touch $@

bench-runtime: venv native $(BENCH_VENV)/.installed ## kiln_runtime vs Triton (pytriton), loopback, py-spy profiles, and today against its history A/B (before issue 39, before tracing, off, 1 % traced to Jaeger) -> docs/benchmarks/runtime.md
	bash runtime_image/bench/system-deps.sh
	cd runtime_image && ../$(PY) -m bench.run --out ../docs/benchmarks --triton-python ../$(BENCH_VENV)/bin/python --profile
	cd runtime_image && ../$(PY) -m bench.history_ab --out ../docs/benchmarks

bench-client-ceiling: venv native $(BENCH_VENV)/.installed ## The Python clients against a server that answers in no time, beside Kiln and Triton (3 rounds) -> docs/benchmarks/client-ceiling.md
	cd runtime_image && ../$(PY) -m bench.client_ceiling --out ../docs/benchmarks --triton-python ../$(BENCH_VENV)/bin/python

bench-runtime-profile: venv ## py-spy flame graphs of the runtime under tritonclient.grpc and HTTP JSON -> docs/benchmarks/profile-*.svg
	cd runtime_image && ../$(PY) -m bench.profile --out ../docs/benchmarks

bench-cache: venv native ## The response cache: the same runtime with and without it at hit ratios 0-100 %, side by side (~3 min) -> docs/benchmarks/cache.md
	bash runtime_image/bench/system-deps.sh
	cd runtime_image && ../$(PY) -m bench.cache --out ../docs/benchmarks/cache.md

bench-tracing: venv native ## Tracing's cost: the request path off, at 1 % and at 100 % sampling, request by request (~1 min) -> docs/benchmarks/tracing.md
	cd runtime_image && ../$(PY) -m bench.tracing --out ../docs/benchmarks

.PHONY: base-image image-runtime bench-runtime bench-client-ceiling bench-runtime-profile bench-cache bench-tracing

# ---- autoscaling ----
bench-autoscaling: venv ## Kiln's autoscaler vs HPA, KEDA, Knative, oracles on simulated days -> docs/benchmarks/autoscaling.md
	$(PY) -m kiln_operator.simulator bench --seeds 20 --sweep-seeds 4 --processes 2 --out docs/benchmarks
	$(PY) -m kiln_operator.simulator bench-learned --seeds 10 --processes 2 --out docs/benchmarks

bench-scale-to-zero: venv system-deps docker-up ## Scale to zero: simulated days (replica-hours, attainment), the activator holding 1,000 HTTP + 1,000 gRPC requests on loopback, and on the real node wake latency over 20 cycles 0 -> 1 -> 0 against the cold start (~20 min) -> docs/benchmarks/scale-to-zero.md
	$(PY) -m kiln_operator.simulator bench-zero --seeds 5 --processes 2 --out docs/benchmarks
	cd runtime_image && ../$(PY) -m bench.activator_hold --out ../docs/benchmarks/scale-to-zero.md
	$(PY) -m tests.e2e.bench_scale_to_zero --cycles 20 --services 2 --out docs/benchmarks/scale-to-zero.md

.PHONY: bench-autoscaling bench-scale-to-zero
