# syntax=docker/dockerfile:1
# dppo image for KubeRay: Ray's own image at the pinned Ray version (it has ray and bash, which
# KubeRay's probes and init container need), CPU torch, and dppo with the Box2D, MuJoCo and Atari envs.
#   docker build -t dppo:0.1.0 .                                   (make image)
#   docker build --build-arg VARIANT=gpu -t dppo:0.1.0-gpu .       (CUDA torch, for head.gpus > 0)
# tests/deploy/test_image.py builds this file and checks what its RUN steps installed.
ARG RAY_VERSION=2.60.0
ARG PYTHON=py311
ARG VARIANT=cpu

# Build the dppo wheel in a throw-away stage (sources copied to a directory the ray user owns, since
# setuptools builds in-tree), plus a one-line requirements file that names the wheel.
FROM rayproject/ray:${RAY_VERSION}-${PYTHON}-${VARIANT} AS wheel
COPY --chown=1000:100 pyproject.toml README.md /tmp/src/
COPY --chown=1000:100 dppo /tmp/src/dppo
RUN cp -r /tmp/src /tmp/build \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels /tmp/build \
    && echo "dppo[box2d,mujoco,atari,multiagent] @ file://$(echo /tmp/wheels/dppo-*.whl)" > /tmp/wheels/requirements.txt

FROM rayproject/ray:${RAY_VERSION}-${PYTHON}-${VARIANT}
ARG RAY_VERSION
ARG VARIANT
ARG TORCH_VERSION=2.13.0
# Empty: the CPU wheel index for VARIANT=cpu (a plain torch wheel would pull a multi-GB CUDA build),
# PyPI's CUDA build for VARIANT=gpu: the Makefile's TORCH_INDEX_cpu and TORCH_INDEX_cuda.
ARG TORCH_INDEX_URL=""
# MALLOC_CONF: Ray's raylet and GCS (on the jemalloc Ray ships) with one arena and no thread caches, so their memory
# stays flat over hours; the RAY_ variables keep the GCS's history of tasks, dead actors and dead workers to the
# recent past, so it stays flat however often a run's processes are replaced; a node that starts on a busy machine
# gets 120 s to register, not Ray's 30 (dppo.distributed.cluster.RAY_PROCESS_ENV says why; a local Ray started by
# dppo gets the same); Ray's metrics take the path whose agent forgets dead workers without a Prometheus scrape
# (dppo.distributed.cluster.RAY_METRICS_PATH).
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache:false \
    RAY_task_events_max_num_task_in_gcs=300 \
    RAY_maximum_gcs_destroyed_actor_cached_count=100 \
    RAY_maximum_gcs_dead_worker_cached_count=100 \
    RAY_raylet_start_wait_time_s=120 \
    RAY_enable_open_telemetry=0
# The wheel is bind-mounted, not copied: no layer of the final image holds it or any build tool.
RUN --mount=type=bind,from=wheel,source=/tmp/wheels,target=/tmp/wheels \
    set -eu; \
    index="${TORCH_INDEX_URL:-}"; \
    if [ -z "$index" ]; then \
      if [ "$VARIANT" = cpu ]; then index=https://download.pytorch.org/whl/cpu; else index=https://pypi.org/simple; fi; \
    fi; \
    pip install --no-cache-dir --index-url "$index" "torch==${TORCH_VERSION}"; \
    pip install --no-cache-dir "ray[default,tune]==${RAY_VERSION}" --requirement /tmp/wheels/requirements.txt; \
    dppo --help >/dev/null
# The base image's non-root `ray` user, by number so Kubernetes can check runAsNonRoot.
USER 1000:100
WORKDIR /home/ray
