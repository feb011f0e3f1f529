"""Memory of a process tree, read from Linux /proc (no psutil needed).

A run's memory is not one process's: Ray's GCS, raylet and workers descend from the driver, so the
benchmarks sum RSS (shared pages counted once per process) and PSS (shared pages shared out) over the tree.
"""

from __future__ import annotations

import contextlib
import os
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
    pids = process_tree(roots)
    each = [read_kib(f"/proc/{p}/status", "VmRSS:") for p in pids]
    pss = sum(read_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    return {"processes": len(pids), "rss_mib": round(sum(each) / 1024, 1), "pss_mib": round(pss / 1024, 1),
            "max_rss_mib": round(max(each, default=0) / 1024, 1)}


class PeakMemory:
    """Samples tree memory in a thread; keeps the peak summed RSS and PSS."""

    def __init__(self, roots: Callable[[], list[int]], every_s: float = 0.5) -> None:
        self.roots, self.every_s = roots, every_s
        self.peak = {"processes": 0, "rss_mib": 0.0, "pss_mib": 0.0}
        self.largest_mib = 0.0  # the most one process of the tree held at any sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            now = tree_memory_mib(self.roots())
            self.largest_mib = max(self.largest_mib, now.pop("max_rss_mib"))
            if now["rss_mib"] > self.peak["rss_mib"]:
                self.peak = now

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
