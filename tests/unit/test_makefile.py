"""The torch wheel the Makefile installs (issue 45): the pip command it would run, read with `make -n`, never
downloaded. A machine whose pip has no config gets PyTorch's CPU index, a GPU machine PyPI's CUDA build, a local
find-links directory holding the CPU wheel is used offline; the Dockerfile names the same indexes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_install(tmp_path: Path, *args: str, gpu: bool = False, find_links: Path | None = None) -> str:
    """The venv recipe's torch line as `make -n` prints it, pip's config files and PIP_* variables removed."""
    if shutil.which("make") is None:
        pytest.skip("make not found")
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    smi = fake / "nvidia-smi"  # the two answers of the real tool: a GPU listed, or a driver without a GPU
    listing = "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'" if gpu else "echo 'No devices were found'; exit 6"
    smi.write_text(f"#!/bin/sh\n{listing}\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MAKE"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PATH=f"{fake}{os.pathsep}{env.get('PATH', '')}")
    if find_links is not None:
        env["PIP_FIND_LINKS"] = str(find_links)
    out = subprocess.run(["make", "-n", "-B", f"PYTHON={sys.executable}", ".venv/.installed-stamp", *args],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if '"torch==' in line]
    assert len(lines) == 1, out.stdout
    return lines[0]


def test_no_pip_config_installs_the_cpu_build_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    line = torch_install(tmp_path)
    assert line.endswith(f'pip install -q --index-url {CPU_INDEX} "torch==2.13.0"'), line


def test_a_gpu_picks_the_cuda_build_and_torch_cpu_overrides_it(tmp_path: Path) -> None:
    assert "--index-url https://pypi.org/simple " in torch_install(tmp_path, gpu=True)
    assert f"--index-url {CPU_INDEX} " in torch_install(tmp_path, "TORCH=cpu", gpu=True)
    assert "--index-url https://pypi.org/simple " in torch_install(tmp_path, "TORCH=cuda")


def test_an_empty_index_leaves_the_choice_to_pip(tmp_path: Path) -> None:
    assert torch_install(tmp_path, "TORCH_INDEX=").endswith('pip install -q "torch==2.13.0"')


def test_a_local_cpu_wheel_is_used_without_asking_an_index(tmp_path: Path) -> None:
    """A find-links directory with the CPU wheel (a local wheel cache): no index to wait on when it is unreachable."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(wheels / "torch-2.13.0+cpu-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    assert torch_install(tmp_path, find_links=wheels).endswith('pip install -q "torch==2.13.0+cpu"')


def test_a_misspelled_torch_switch_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(["make", "-n", "-B", ".venv/.installed-stamp", "TORCH=gpu"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "TORCH=gpu: use TORCH=cpu or TORCH=cuda" in out.stderr


def test_the_dockerfile_names_the_makefiles_indexes() -> None:
    makefile = (REPO / "Makefile").read_text()
    indexes = dict(re.findall(r"^TORCH_INDEX_(cpu|cuda) := (\S+)$", makefile, re.M))
    assert indexes == {"cpu": CPU_INDEX, "cuda": "https://pypi.org/simple"}
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"index={indexes['cpu']}" in dockerfile and f"index={indexes['cuda']}" in dockerfile
    version = re.search(r"^TORCH_VERSION := (\S+)$", makefile, re.M)
    assert version and f"ARG TORCH_VERSION={version.group(1)}" in dockerfile
