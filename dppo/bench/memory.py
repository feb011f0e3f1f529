"""Memory of a process tree, read from Linux /proc (no psutil needed).

A run's memory is not one process's: Ray's GCS, raylet and workers descend from the driver, so the
benchmarks sum RSS (shared pages counted once per process) and PSS (shared pages shared out) over the tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable


def read_kib(path: str, key: str) -> int:
    """The KiB value of the line starting with ``key`` in a /proc file (0 when the file or line is missing)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def process_tree(roots: list[int]) -> set[int]:
    """The roots and all their descendants (Ray's GCS, raylet and workers descend from the driver)."""
    children = _children_map()
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def tree_memory_mib(roots: list[int]) -> dict[str, float]:
    """Summed RSS (counts shared pages once per process) and PSS (shares them out) over the tree, MiB."""
    return memory_mib(process_tree(roots))


def memory_mib(pids: set[int]) -> dict[str, float]:
    """Summed RSS and PSS of these processes, MiB, and the most one of them holds."""
    each = [read_kib(f"/proc/{p}/status", "VmRSS:") for p in pids]
    pss = sum(read_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    return {"processes": len(pids), "rss_mib": round(sum(each) / 1024, 1), "pss_mib": round(pss / 1024, 1),
            "max_rss_mib": round(max(each, default=0) / 1024, 1)}


def compute_apps_mib(text: str) -> dict[int, float]:
    """MiB of GPU memory per process from ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,
    nounits`` (a process on two GPUs: both summed; a line nvidia-smi could not fill, ``[N/A]``, is skipped)."""
    found: dict[int, float] = {}
    for line in text.splitlines():
        pid, _, used = line.partition(",")
        with contextlib.suppress(ValueError):
            found[int(pid)] = found.get(int(pid), 0.0) + float(used)
    return found


def nvidia_smi(query: str) -> str | None:
    """nvidia-smi's answer to ``--query-...`` as csv without header or units (None without it, or when it fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpu_memory_by_pid() -> dict[int, float] | None:
    """What each process holds on this machine's NVIDIA GPUs, MiB (None without nvidia-smi, or when it fails)."""
    text = nvidia_smi("--query-compute-apps=pid,used_memory")
    return None if text is None else compute_apps_mib(text)


def smallest_gpu_mib() -> float | None:
    """The memory of this machine's smallest NVIDIA GPU, MiB (None without one)."""
    text = nvidia_smi("--query-gpu=memory.total")
    try:
        return min((float(line) for line in (text or "").split()), default=None)
    except ValueError:
        return None


class PeakMemory:
    """Samples tree memory in a thread; keeps the peak summed RSS and PSS, and the peak GPU memory the tree's
    processes held on this machine's GPUs (``gpu_mib``; None on a machine without one)."""

    def __init__(self, roots: Callable[[], list[int]], every_s: float = 0.5) -> None:
        self.roots, self.every_s = roots, every_s
        self.peak = {"processes": 0, "rss_mib": 0.0, "pss_mib": 0.0}
        self.largest_mib = 0.0  # the most one process of the tree held at any sample
        self.gpu_mib: float | None = None
        self.gpus = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            tree = process_tree(self.roots())
            now = memory_mib(tree)
            self.largest_mib = max(self.largest_mib, now.pop("max_rss_mib"))
            if now["rss_mib"] > self.peak["rss_mib"]:
                self.peak = now
            if self.gpus and (held := gpu_memory_by_pid()) is not None:
                self.gpu_mib = max(self.gpu_mib or 0.0, sum(mib for pid, mib in held.items() if pid in tree))

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def reset_peak_rss() -> None:
    """Restart this process's peak-RSS count (VmHWM), so a row reports its own peak (Linux >= 4.0)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM) since it started or since :func:`reset_peak_rss`, MiB."""
    return round(read_kib("/proc/self/status", "VmHWM:") / 1024, 1)
