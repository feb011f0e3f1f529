"""The real image: `make image` builds the project's Dockerfile (unchanged) with buildah (once per session,
tests/deploy/image_build.py, with a stand-in for Ray's base image where Docker Hub is unreachable), Docker's
daemon runs it as uid 1000 with a read-only root filesystem; its RUN steps installed the pinned Ray and the CPU
torch, and `dppo --help` and a short CartPole `dppo train` work in it; the final image holds no wheels or build
trees. What the stand-in does not prove: Ray's own image (conda Python, its extra packages and size), the CUDA
variant, and pulls from a registry.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest
from image_build import BASE, RAY_VERSION, TORCH_VERSION, DockerImage

pytestmark = pytest.mark.slow


def test_image_builds_and_trains(tmp_path: Path, docker_image: DockerImage) -> None:
    image, timings = docker_image.name, dict(docker_image.timings)
    print(f"\nbuild: base {docker_image.base}, {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    size = int(docker_image.docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    user = docker_image.docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "1000:100"

    # No wheel or build tree that the build added (virtualenv's seed wheels, a dependency of
    # ray[default], live in site-packages; the stand-in base has Debian's ensurepip wheels). The wheel's
    # bind mount may leave its empty mount point /tmp/wheels behind (buildah): what matters is that nothing is in it.
    def leftovers(name: str) -> set[str]:
        return set(docker_image.docker(
            "run", "--rm", "--network", "host", "--user", "0", "--entrypoint", "bash", name, "-c",
            "find / -xdev \\( -name '*.whl' -o -path /tmp/src -o -path /tmp/build -o -path '/tmp/wheels/*' -o -path"
            " '*/.cache/pip' \\) -print 2>/dev/null | grep -v '/site-packages/' || true").stdout.split())

    assert leftovers(image) - leftovers(BASE) == set()

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, 1000, 100)
    sandbox = ["run", "--rm", "--network", "host", "--user", "1000:100", "--read-only",
               "--tmpfs", "/tmp:rw,exec,size=2g", "--shm-size", "512m", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "-v", f"{run_dir}:/data",
               # As KubeRay does in the chart's pods. Without a token a new local Ray 2.60 cluster
               # turns token auth on and writes ~/.ray/auth_token, which a read-only root refuses.
               "-e", "RAY_AUTH_MODE=token", "-e", f"RAY_AUTH_TOKEN={secrets.token_hex(32)}"]
    help_text = docker_image.docker(*sandbox, image, "dppo", "--help").stdout
    assert "train" in help_text
    # What the RUN steps installed: the pinned Ray and the CPU build of the pinned torch, not a CUDA one.
    versions = docker_image.docker(*sandbox, image, "python", "-c",
                                   "import ray, torch; print(ray.__version__, torch.__version__)").stdout.split()
    assert versions[0] == RAY_VERSION, versions
    assert versions[1].startswith(TORCH_VERSION) and "+cu" not in versions[1], versions
    start = time.monotonic()
    train = docker_image.docker(*sandbox, image, "dppo", "train", "--env", "CartPole-v1", "--actors", "2",
                                "--run-dir", "/data/cartpole", "--set", "run.total_steps=8192")
    timings["train in container"] = time.monotonic() - start
    summary = json.loads((run_dir / "cartpole" / "summary.json").read_text())
    assert summary["env_steps"] >= 8192, train.stdout + train.stderr
    assert "iter=" in (run_dir / "cartpole" / "train.log").read_text()
    report = {"base": docker_image.base, "image_bytes": size, **{k: round(v, 1) for k, v in timings.items()}}
    print(f"\nimage report: {json.dumps(report)}")
