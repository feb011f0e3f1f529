"""The real image: `make image` builds the project's Dockerfile (unchanged) with buildah, Docker's daemon
runs it as uid 1000 with a read-only root filesystem, and `dppo --help` and a short CartPole `dppo train`
work in it; the final image holds no wheels or build trees.

Docker Hub is not reachable where this project is tested, so when `rayproject/ray:<ray>-py311-cpu` cannot
be pulled the test builds a stand-in with that name: a Debian bookworm root filesystem (mmdebstrap) with
what the Dockerfile relies on in Ray's image -- Python 3.11 with pip first on PATH, writable by the `ray`
user 1000:100 (HOME /home/ray, the default user), bash, wget, and `ray[default]` at the pinned version.
The stand-in also carries this machine's CA bundle (PIP_CERT), which the package index here needs. The
CPU torch wheel comes from a local index on 127.0.0.1 (TORCH_INDEX_URL; download.pytorch.org is not
reachable here either); everything else from the machine's package index. What the stand-in does not
prove: Ray's own image (conda Python, its extra packages and size), the CUDA variant, and pulls from a
registry. Tools: buildah, mmdebstrap, dockerd (`.ci/run` installs them; `make test` as root on Debian).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from conftest import require

REPO = Path(__file__).resolve().parents[2]
RAY_VERSION = re.search(r"^ARG RAY_VERSION=(\S+)", (REPO / "Dockerfile").read_text(), re.M).group(1)  # type: ignore[union-attr]
TORCH_VERSION = re.search(r"^ARG TORCH_VERSION=(\S+)", (REPO / "Dockerfile").read_text(), re.M).group(1)  # type: ignore[union-attr]
BASE = f"docker.io/rayproject/ray:{RAY_VERSION}-py311-cpu"
IMAGE = "dppo:0.1.0"
TOOLS = ("buildah", "mmdebstrap", "dockerd", "docker")
MIRROR = "http://deb.debian.org/debian"
PACKAGES = "python3,python3-venv,python3-pip,bash,wget,ca-certificates,passwd"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

STAND_IN = f"""\
# Stand-in for {BASE}: what the dppo Dockerfile relies on in Ray's image.
FROM scratch
ADD rootfs.tar /
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray \\
    && python3 -m venv /home/ray/anaconda3 && chown -R 1000:100 /home/ray \\
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
ENV PATH=/home/ray/anaconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    HOME=/home/ray PIP_CERT=/etc/ssl/certs/ca-certificates.crt
USER 1000:100
WORKDIR /home/ray
RUN pip install --no-cache-dir "ray[default]=={RAY_VERSION}"
"""

pytestmark = pytest.mark.slow


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def run(*args: str, timeout: float = 1200, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    assert out.returncode == 0, f"{' '.join(args)} -> {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def buildah_label(image: str, key: str) -> str | None:
    """The image's label `key` ("" when it has none), or None when there is no such local image."""
    out = subprocess.run(["buildah", "inspect", "--type", "image", "--format",
                          f'{{{{index .OCIv1.Config.Labels "{key}"}}}}', image],
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        return None
    value = out.stdout.strip()
    return "" if value == "<no value>" else value


def ensure_base(work: Path, timings: dict[str, float]) -> str:
    """The real base where it is present or can be pulled, else the stand-in (rebuilt when its recipe
    changes). Returns which one."""
    recipe = hashlib.sha256((STAND_IN + PACKAGES + CA_BUNDLE.read_text()).encode()).hexdigest()[:16]
    label = buildah_label(BASE, "dppo.stand-in")
    if label == recipe:
        return "stand-in (cached)"
    if label == "":
        return "real (local)"
    pulled = subprocess.run(["buildah", "pull", "--retry", "0", BASE], capture_output=True, text=True,
                            timeout=600, check=False)
    if pulled.returncode == 0:
        return "real (pulled)"
    start = time.monotonic()
    run("mmdebstrap", "--variant=apt", f"--include={PACKAGES}", "--components=main", "bookworm",
        str(work / "rootfs.tar"), f"deb {MIRROR} bookworm main", f"deb {MIRROR} bookworm-updates main",
        f"deb {MIRROR}-security bookworm-security main")
    shutil.copy(CA_BUNDLE, work / "ca-certificates.crt")
    (work / "Containerfile").write_text(STAND_IN + f'LABEL dppo.stand-in="{recipe}"\n')
    run("buildah", "bud", "--isolation", "chroot", "--layers", "-t", BASE, str(work))
    (work / "rootfs.tar").unlink()
    timings["stand-in base"] = time.monotonic() - start
    return "stand-in (built)"


def torch_index(root: Path) -> Path:
    """A PEP 503 index of the CPU torch wheel and its dependencies (pip download on this machine)."""
    files = root / "files"
    run(str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "pip"), "download", "-q",
        f"torch=={TORCH_VERSION}", "--only-binary", ":all:", "--python-version", "3.11",
        "--platform", "manylinux_2_28_x86_64", "-d", str(files))
    projects: dict[str, list[str]] = {}
    for wheel in sorted(files.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(wheel.name)
    for name, wheels in projects.items():
        page = root / "simple" / name
        page.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{html.escape(w)}">{html.escape(w)}</a>\n' for w in wheels)
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    assert "torch" in projects
    return root


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[int]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def docker_daemon(root: Path) -> Iterator[dict[str, str]]:
    """A private dockerd (host networking only, no iptables); yields the env that points clients at it."""
    sock = root / "docker.sock"
    log = open(root / "dockerd.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(["dockerd", "--host", f"unix://{sock}", "--data-root", str(root / "data"),
                             "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
                             "--iptables=false", "--ip6tables=false", "--bridge=none"],
                            stdout=log, stderr=subprocess.STDOUT)
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}"}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=30).returncode != 0:
            assert proc.poll() is None, (root / "dockerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (root / "dockerd.log").read_text()[-3000:]
            time.sleep(0.5)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def test_image_builds_and_trains(tmp_path: Path) -> None:
    missing = missing_tools()
    require(not missing, f"the image test needs {', '.join(missing)}: apt-get install buildah mmdebstrap "
                         "docker.io (.ci/run does), or run it where they are")
    require(os.geteuid() == 0, "the image test runs buildah (chroot isolation) and dockerd as root")
    timings: dict[str, float] = {}
    base = ensure_base(tmp_path, timings)
    index = torch_index(tmp_path / "index")
    with serve(index) as port:
        start = time.monotonic()
        run("make", "-C", str(REPO), "image", "BUILDER=buildah",
            f"IMAGE_BUILD_ARGS=--build-arg TORCH_INDEX_URL=http://127.0.0.1:{port}/simple", timeout=2400)
        timings["dppo image"] = time.monotonic() - start
    print(f"\nbuild: base {base}, {json.dumps({k: round(v, 1) for k, v in timings.items()})}")

    docker_root = Path(tempfile.mkdtemp(prefix="dppo-docker-", dir="/var/tmp"))
    try:
        with docker_daemon(docker_root) as env:
            # `buildah push ... docker-daemon:` breaks off with Debian's dockerd 20.10 ("read/write on
            # closed pipe"); an archive and `docker load` work.
            start = time.monotonic()
            for name in (BASE, IMAGE):
                archive = docker_root / "image.tar"
                run("buildah", "push", name, f"docker-archive:{archive}:{name}", timeout=900)
                run("docker", "load", "-i", str(archive), env=env, timeout=900)
                archive.unlink()
            timings["hand to dockerd"] = time.monotonic() - start
            size = int(run("docker", "image", "inspect", "--format", "{{.Size}}", IMAGE, env=env).stdout)
            user = run("docker", "image", "inspect", "--format", "{{.Config.User}}", IMAGE, env=env).stdout.strip()
            assert user == "1000:100"

            # No wheel or build tree that the build added (virtualenv's seed wheels, a dependency of
            # ray[default], live in site-packages; the stand-in base has Debian's ensurepip wheels).
            def leftovers(image: str) -> set[str]:
                return set(run("docker", "run", "--rm", "--network", "host", "--user", "0", "--entrypoint",
                               "bash", image, "-c", "find / -xdev \\( -name '*.whl' -o -path /tmp/src -o -path"
                               " /tmp/build -o -path /tmp/wheels -o -path '*/.cache/pip' \\) -print 2>/dev/null"
                               " | grep -v '/site-packages/' || true", env=env).stdout.split())

            assert leftovers(IMAGE) - leftovers(BASE) == set()

            run_dir = tmp_path / "run"
            run_dir.mkdir()
            os.chown(run_dir, 1000, 100)
            sandbox = ["docker", "run", "--rm", "--network", "host", "--user", "1000:100", "--read-only",
                       "--tmpfs", "/tmp:rw,exec,size=2g", "--shm-size", "512m", "--cap-drop", "ALL",
                       "--security-opt", "no-new-privileges", "-v", f"{run_dir}:/data",
                       # As KubeRay does in the chart's pods. Without a token a new local Ray 2.60 cluster
                       # turns token auth on and writes ~/.ray/auth_token, which a read-only root refuses.
                       "-e", "RAY_AUTH_MODE=token", "-e", f"RAY_AUTH_TOKEN={secrets.token_hex(32)}"]
            help_text = run(*sandbox, IMAGE, "dppo", "--help", env=env).stdout
            assert "train" in help_text
            start = time.monotonic()
            train = run(*sandbox, IMAGE, "dppo", "train", "--env", "CartPole-v1", "--actors", "2",
                        "--run-dir", "/data/cartpole", "--set", "run.total_steps=8192", env=env, timeout=600)
            timings["train in container"] = time.monotonic() - start
            summary = json.loads((run_dir / "cartpole" / "summary.json").read_text())
            assert summary["env_steps"] >= 8192, train.stdout + train.stderr
            assert "iter=" in (run_dir / "cartpole" / "train.log").read_text()
    finally:
        shutil.rmtree(docker_root, ignore_errors=True)
    report = {"base": base, "image_bytes": size, **{k: round(v, 1) for k, v in timings.items()}}
    print(f"\nimage report: {json.dumps(report)}")
