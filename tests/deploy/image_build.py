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

Nothing lands in the machine's own stores: buildah's images (the cached base, the dppo image), its scratch files
and the private dockerd's data and state all live under the repository's `.cache/` (`make clean` unmounts and
removes it). The base stays there between sessions (building the stand-in takes minutes); the dppo image and the
daemon's whole directory are removed when the session ends, and a directory a killed session left is removed
when the next one starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import re
import shutil
import signal
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
CACHE = REPO / ".cache"
STORE = CACHE / "containers"  # buildah's graph root, run root and scratch files for the tests' builds
DOCKER_ROOT = CACHE / "docker"  # the private dockerd's data root, exec root, socket and log
# The one file buildah 1.28 writes outside its store whatever the storage.conf (containers/image's blob info cache,
# root's default path): removed at the end of the session when the session created it.
BLOB_INFO_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb")
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

# What a build must not leave in an image: wheels outside site-packages (virtualenv's seed wheels, a dependency of
# ray[default], live in site-packages; the stand-in base has Debian's ensurepip wheels), the wheel stage's build tree,
# pip's cache. The wheel's bind mount may leave its empty mount point /tmp/wheels behind (buildah): what matters is
# that nothing is in it.
LEFTOVERS = ("find / -xdev \\( -name '*.whl' -o -path /tmp/src -o -path /tmp/build -o -path '/tmp/wheels/*' -o -path"
             " '*/.cache/pip' \\) -print 2>/dev/null | grep -v '/site-packages/' || true")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def buildah_env() -> dict[str, str]:
    """The environment that points buildah (and `make image` run with it) at the store under `.cache/containers`
    instead of /var/lib/containers, with its scratch files (layer blobs, RUN --mount caches) beside it."""
    (STORE / "tmp").mkdir(parents=True, exist_ok=True)
    conf = STORE / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{STORE / "storage"}"\nrunroot = "{STORE / "run"}"\n')
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "TMPDIR": str(STORE / "tmp")}


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first (dockerd and overlay leave some behind)."""
    prefix = str(root.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def remove_tree(root: Path) -> None:
    """Unmount whatever is still mounted below ``root``, then delete it; a failure is an error, not a leftover."""
    for point in mounts_under(root):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=60, check=False)
    if root.exists():
        shutil.rmtree(root)


@contextlib.contextmanager
def removing_blob_info_cache() -> Iterator[None]:
    """Remove the blob info cache file and the directories above it that did not exist before (only when empty)."""
    created = [p for p in (BLOB_INFO_CACHE.parents[1], BLOB_INFO_CACHE.parent, BLOB_INFO_CACHE) if not p.exists()]
    try:
        yield
    finally:
        for path in reversed(created):
            with contextlib.suppress(OSError):  # gone, or a directory something else wrote into too
                if path.is_dir():
                    path.rmdir()
                else:
                    path.unlink()


def stop_stale_daemon(root: Path) -> None:
    """A dockerd that a killed session left running on ``root`` (its pidfile there, its --data-root ours)."""
    try:
        pid = int((root / "docker.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if Path(cmdline[0].decode()).name == "dockerd" and str(root / "data").encode() in cmdline:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.5)


def run(*args: str, timeout: float = 1200, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    assert out.returncode == 0, f"{' '.join(args)} -> {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def base_leftovers(env: dict[str, str]) -> set[str]:
    """What LEFTOVERS finds in the base itself, read in buildah's store (the base mounted, searched from a chroot of
    ours): the base is not handed to the daemon (its layers travel inside the image's archive; a second archive of
    them cost half a minute). Not with `buildah run`: once (CI of 2af6617) its output came back without the base's
    two Debian wheels, so they were counted as the build's; `buildah run` relays the command's output through its
    own pipes, `chroot` here writes into ours."""
    container = run("buildah", "from", "--pull-never", BASE, env=env).stdout.strip()
    try:
        root = run("buildah", "mount", container, env=env).stdout.strip()
        return set(run("chroot", root, "bash", "-c", LEFTOVERS).stdout.split())
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=120, check=False, env=env)


def buildah_label(image: str, key: str, env: dict[str, str]) -> str | None:
    """The image's label `key` ("" when it has none), or None when there is no such local image."""
    out = subprocess.run(["buildah", "inspect", "--type", "image", "--format",
                          f'{{{{index .OCIv1.Config.Labels "{key}"}}}}', image],
                         capture_output=True, text=True, timeout=60, check=False, env=env)
    if out.returncode != 0:
        return None
    value = out.stdout.strip()
    return "" if value == "<no value>" else value


def ensure_base(work: Path, timings: dict[str, float], env: dict[str, str]) -> str:
    """The real base where it is present or can be pulled, else the stand-in (rebuilt when its recipe
    changes). Returns which one."""
    recipe = hashlib.sha256((STAND_IN + PACKAGES + CA_BUNDLE.read_text()).encode()).hexdigest()[:16]
    label = buildah_label(BASE, "dppo.stand-in", env)
    if label == recipe:
        return "stand-in (cached)"
    if label == "":
        return "real (local)"
    pulled = subprocess.run(["buildah", "pull", "--retry", "0", BASE], capture_output=True, text=True,
                            timeout=600, check=False, env=env)
    if pulled.returncode == 0:
        return "real (pulled)"
    start = time.monotonic()
    run("mmdebstrap", "--variant=apt", f"--include={PACKAGES}", "--components=main", "bookworm",
        str(work / "rootfs.tar"), f"deb {MIRROR} bookworm main", f"deb {MIRROR} bookworm-updates main",
        f"deb {MIRROR}-security bookworm-security main")
    shutil.copy(CA_BUNDLE, work / "ca-certificates.crt")
    (work / "Containerfile").write_text(STAND_IN + f'LABEL dppo.stand-in="{recipe}"\n')
    run("buildah", "bud", "--isolation", "chroot", "--layers", "-t", BASE, str(work), env=env)
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
    """A private dockerd (host networking only, no iptables) with everything it writes under ``root``; yields
    the env that points clients at it. Stopped and ``root`` removed (mounts first) on the way out."""
    stop_stale_daemon(root)
    remove_tree(root)  # what a killed session left
    root.mkdir(parents=True)
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
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        remove_tree(root)


@dataclass
class DockerImage:
    """The built image in a running private daemon: ``env`` points the docker CLI at the daemon."""

    env: dict[str, str]
    name: str
    base: str
    root: Path
    base_leftovers: set[str]
    timings: dict[str, float] = field(default_factory=dict)

    def docker(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run("docker", *args, env=self.env, timeout=timeout)


def hand_over(env: dict[str, str], docker_env: dict[str, str]) -> None:
    """The image from buildah's store into the daemon, streamed through a pipe: `docker load` reads the archive as
    `buildah push` writes it (no 2.5 GB file written, then read). `buildah push ... docker-daemon:` itself breaks off
    with Debian's dockerd 20.10 ("read/write on closed pipe")."""
    pipe = DOCKER_ROOT / "image.pipe"
    os.mkfifo(pipe)
    with open(DOCKER_ROOT / "load.log", "w+") as log:
        load = subprocess.Popen(["docker", "load", "-i", str(pipe)], env=docker_env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            run("buildah", "push", IMAGE, f"docker-archive:{pipe}:{IMAGE}", timeout=900, env=env)
            if load.wait(timeout=900) != 0:
                log.seek(0)
                raise AssertionError(f"docker load -> {load.returncode}\n{log.read()[-3000:]}")
        finally:
            if load.poll() is None:
                load.kill()
                load.wait(timeout=60)
    pipe.unlink()


@contextlib.contextmanager
def built_image() -> Iterator[DockerImage]:
    """Build the image with `make image` (buildah, store under `.cache/containers`), load it and its base into a
    private dockerd (`.cache/docker`), yield them; the dppo image and the daemon are removed afterwards."""
    timings: dict[str, float] = {}
    env = buildah_env()
    with removing_blob_info_cache(), built_and_loaded(env, timings) as image:
        yield image


@contextlib.contextmanager
def built_and_loaded(env: dict[str, str], timings: dict[str, float]) -> Iterator[DockerImage]:
    """`make image` with buildah's ``env``, then the base and the image handed to a private dockerd."""
    with tempfile.TemporaryDirectory(prefix="image-build-", dir=STORE / "tmp") as work:
        base = ensure_base(Path(work), timings, env)
        in_base = base_leftovers(env)
        index = torch_index(Path(work) / "index")
        with serve(index) as port:
            start = time.monotonic()
            run("make", "-C", str(REPO), "image", "BUILDER=buildah",
                f"IMAGE_BUILD_ARGS=--build-arg TORCH_INDEX_URL=http://127.0.0.1:{port}/simple", timeout=2400, env=env)
            timings["dppo image"] = time.monotonic() - start
    try:
        with docker_daemon(DOCKER_ROOT) as docker_env:
            # `buildah push ... docker-daemon:` breaks off with Debian's dockerd 20.10 ("read/write on
            # closed pipe"); an archive and `docker load` work.
            start = time.monotonic()
            hand_over(env, docker_env)
            timings["hand to dockerd"] = time.monotonic() - start
            yield DockerImage(docker_env, IMAGE, base, DOCKER_ROOT, in_base, timings)
    finally:
        subprocess.run(["buildah", "rmi", IMAGE], capture_output=True, timeout=300, check=False, env=env)
