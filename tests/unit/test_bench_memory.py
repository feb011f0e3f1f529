"""Memory of a process tree read from /proc (dppo/bench/memory.py), on this test's own process, and the GPU memory
nvidia-smi reports for it."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from dppo.bench.memory import PeakMemory, compute_apps_mib, gpu_memory_by_pid, tree_memory_mib


def test_tree_memory_counts_this_process() -> None:
    memory = tree_memory_mib([os.getpid()])
    assert memory["processes"] >= 1 and memory["rss_mib"] > 10 and memory["pss_mib"] > 0


def test_nvidia_smi_s_compute_apps_per_process() -> None:
    """nvidia-smi's csv, noheader, nounits form: a process on two GPUs is summed, a line it could not fill skipped."""
    text = "4101, 1024\n4102, 350\n4101, 512\n4103, [N/A]\n"
    assert compute_apps_mib(text) == {4101: 1536.0, 4102: 350.0}
    assert compute_apps_mib("") == {}


def test_peak_gpu_memory_counts_only_the_tree_s_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-smi (this machine) there is no GPU figure; with one (a stand-in that answers as nvidia-smi
    does: this machine has no GPU) the tree's processes are summed and another process's memory left out."""
    if shutil.which("nvidia-smi") is None:
        assert gpu_memory_by_pid() is None
        with PeakMemory(lambda: [os.getpid()], every_s=0.05) as memory:
            time.sleep(0.2)
        assert memory.gpu_mib is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{os.getpid()}, 700\\n1, 9000\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpu_memory_by_pid() == {os.getpid(): 700.0, 1: 9000.0}
    with PeakMemory(lambda: [os.getpid()], every_s=0.05) as memory:
        deadline = time.monotonic() + 10
        while memory.gpu_mib is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert memory.gpu_mib == 700.0  # pid 1 is not this tree's
