"""The project's real image, built once per test session and handed to a private Docker daemon: the tests of
the image itself and the emulation that runs the chart's pods as containers share it.

Docker Hub is not reachable where this project is tested, so when `rayproject/ray:<ray>-py311-cpu` cannot
be pulled a stand-in is built with that name: a Debian bookworm root filesystem (mmdebstrap) with what the
Dockerfile relies on in Ray's image -- Python 3.11 with pip first on PATH, writable by the `ray` user 1000:100
(HOME /home/ray, the default user), bash, wget, and `ray[default]` at the pinned version. The stand-in also
carries this machine's CA bundle (PIP_CERT), which the package index here needs. The CPU torch wheel comes
from a local index on 127.0.0.1 (TORCH_INDEX_URL; download.pytorch.org is not reachable here either);
everything else from the machine's package index. Tools: buildah, mmdebstrap, dockerd (`.ci/run` installs
them; `make test` as root on Debian).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

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


@dataclass
class DockerImage:
    """The built image in a running private daemon: ``env`` points the docker CLI at the daemon."""

    env: dict[str, str]
    name: str
    base: str
    root: Path
    timings: dict[str, float] = field(default_factory=dict)

    def docker(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run("docker", *args, env=self.env, timeout=timeout)


@contextlib.contextmanager
def built_image() -> Iterator[DockerImage]:
    """Build the image with `make image` (buildah), load it and its base into a private dockerd, yield them."""
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dppo-image-") as work:
        base = ensure_base(Path(work), timings)
        index = torch_index(Path(work) / "index")
        with serve(index) as port:
            start = time.monotonic()
            run("make", "-C", str(REPO), "image", "BUILDER=buildah",
                f"IMAGE_BUILD_ARGS=--build-arg TORCH_INDEX_URL=http://127.0.0.1:{port}/simple", timeout=2400)
            timings["dppo image"] = time.monotonic() - start
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
            yield DockerImage(env, IMAGE, base, docker_root, timings)
    finally:
        shutil.rmtree(docker_root, ignore_errors=True)
