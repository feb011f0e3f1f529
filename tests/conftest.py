"""Shared fixtures: one local Ray cluster per session, paths to ../shared and the external tools."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing on a user's machine; fail under CI, where it must exist."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    require(SHARED.is_dir(), f"{SHARED} is absent (it sits beside the repository in the dev workspace)")
    return SHARED


def _tool(name: str) -> str | None:
    local = REPO / ".tools" / "bin" / name
    return str(local) if local.exists() else shutil.which(name)


@pytest.fixture(scope="session")
def helm_bin() -> str:
    path = _tool("helm")
    require(path is not None, "helm not found; `make tools` installs it from ../shared/tools/get-helm")
    return str(path)


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    path = _tool("prometheus")
    require(path is not None, "prometheus not found; `apt-get install prometheus` (make tools does it as root)")
    return str(path)


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray cluster for the whole session; CLI subprocesses join it with --address."""
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", configure_logging=True)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def dppo_cmd() -> list[str]:
    """The real CLI, run as a subprocess of the venv's interpreter."""
    return [sys.executable, "-m", "dppo"]
