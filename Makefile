# Every target creates or refreshes .venv itself: the stamp is rebuilt whenever pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lint venv clean protos

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job on an embedded default: no cluster, no GPU needed.
run: $(STAMP)
	$(BIN)/topoalloc demo

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# Regenerate the kubelet gRPC stubs from agent/deviceplugin/proto/*.proto (a test checks they match).
protos: $(STAMP)
	$(BIN)/python -m agent.deviceplugin.proto.generate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
