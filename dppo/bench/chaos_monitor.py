"""The per-minute readings of `dppo bench chaos` (and of its ``--no-faults`` long run): every process of the run's
cluster by role (RSS, open files), the run's /dev/shm entries, Ray's object-store use, the run directories' size
and checkpoint count, and Ray's own log directory. One JSON line per reading in ``--out``/samples.jsonl, taken by
a thread beside the bench's loop, so a reading never waits on a kill and a kill never waits on a reading.

Roles come from each process's command line (a Ray worker's title ``ray::<Class>``, Ray's binaries and agents by
their paths, the driver by ``-m dppo train``); the node a process belongs to is the `ray start` tree it descends
from. Object-store use is Ray's own gauge ``ray_object_store_memory`` (bytes by Location and ObjectState, summed)
read from each node's metrics export port, as Prometheus would scrape it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from dppo.bench.chaos_cluster import Cluster, shm_in_use, title, tree
from dppo.bench.chaos_schedule import ACTOR_CLASSES

MIB = 1024 * 1024
CHECKPOINT = re.compile(r"^ckpt-\d{8}\.pt$")
CLASS_ROLES = {cls: kind for kind, cls in ACTOR_CLASSES.items()} | {
    "IDLE": "idle worker", "JobSupervisor": "job supervisor", "DashboardAgent": "dashboard agent",
    "RuntimeEnvAgent": "runtime env agent"}
# Ray's processes by a part of their command line, most specific first.
PATH_ROLES = (("gcs_server", "gcs"), ("/raylet/raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
              ("runtime_env/agent/main.py", "runtime env agent"), ("dashboard/dashboard.py", "dashboard"),
              ("ray-dashboard-", "dashboard module"), ("log_monitor.py", "log monitor"),
              ("autoscaler/_private/monitor.py", "autoscaler monitor"), ("resource_tracker", "resource tracker"),
              ("multiprocessing.forkserver", "dashboard forkserver"),
              (" start ", "ray start"))


def role_of(command: str) -> str:
    """What a process of the run is, from its command line: ``actor``, ``learner``, ``driver``, ``raylet``..."""
    if command.startswith("ray::"):
        name = command.split(" ")[0][5:].split(".")[0]
        return CLASS_ROLES.get(name, name)
    if " -m dppo train " in f"{command} " and not command.startswith(("bash", "/bin/sh", "sh ")):
        return "driver"
    if command.startswith(("bash", "/bin/sh", "sh ")):
        return "job shell"
    for part, role in PATH_ROLES:
        if part in command:
            return role
    words = command.split(" ")
    if "-m" in words[:-1]:  # a Python module run as a process (Ray's client server...)
        return words[words.index("-m") + 1]
    script = next((w for w in words[1:] if w.endswith(".py")), words[0])
    return Path(script).name or "unknown"


def dir_sizes(run_dirs: list[Path]) -> dict[str, Any]:
    """The run directories' bytes (MiB): checkpoints (``ckpt-*.pt``, counted in all and per run dir, which
    ``run.keep_checkpoints`` bounds; ``best.pt`` apart) and the rest (progress.jsonl, train.log, TensorBoard's
    files)."""
    total = ckpt = 0
    count, largest, per_run = 0, 0, {}
    for run_dir in run_dirs:
        per_run[run_dir.name] = 0
        for root, _, files in os.walk(run_dir):
            for name in files:
                with contextlib.suppress(OSError):
                    size = os.stat(os.path.join(root, name)).st_size
                    total += size
                    if CHECKPOINT.match(name):
                        ckpt, count, largest = ckpt + size, count + 1, max(largest, size)
                        per_run[run_dir.name] += 1
    return {"mib": round(total / MIB, 3), "checkpoints": count, "checkpoints_per_run": per_run,
            "checkpoint_mib": round(ckpt / MIB, 3), "largest_checkpoint_mib": round(largest / MIB, 3),
            "other_mib": round((total - ckpt) / MIB, 3)}


def tree_mib(path: Path) -> float:
    """The bytes under ``path`` (Ray's session logs), MiB."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return round(total / MIB, 3)


def metrics_port(command: str) -> int | None:
    """The ``--metrics-export-port`` a `ray start` was given (where its node's metrics are served)."""
    found = re.search(r"--metrics-export-port[= ](\d+)", command)
    return int(found[1]) if found else None


def object_store_mib(port: int) -> dict[str, float] | None:
    """Ray's ``ray_object_store_memory`` gauge at a node's metrics port, summed over its labels, and its object
    count (``ray_object_store_num_local_objects``); None when the port does not answer (a node starting)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return None
    used = objects = 0.0
    seen = False
    for family in text_string_to_metric_families(text):
        if family.name == "ray_object_store_memory":
            used += sum(sample.value for sample in family.samples)
            seen = True
        elif family.name == "ray_object_store_num_local_objects":
            objects += sum(sample.value for sample in family.samples)
    return {"used_mib": round(used / MIB, 3), "objects": objects} if seen else None


def shm_mib(paths: set[str]) -> float:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
    return round(total / MIB, 3)


class Monitor:
    """Takes a reading every ``every_s`` seconds in a thread until stopped; each one is appended to ``path`` and
    kept in ``samples``. ``training_since`` gives the monotonic time of the run's first progress line (0: none
    yet): the report's warm-up counts from it."""

    def __init__(self, cluster: Cluster, out: Path, path: Path, every_s: float,
                 training_since: Callable[[], float]) -> None:
        self.cluster, self.out, self.path, self.every_s = cluster, out, path, every_s
        self.training_since = training_since
        self.start = time.monotonic()
        self.samples: list[dict[str, Any]] = []
        self.ports: dict[str, int] = {}  # node -> its metrics export port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=120)

    def _loop(self) -> None:
        due = time.monotonic()
        while True:
            with contextlib.suppress(Exception):  # a reading that fails (a process ending under it) is skipped
                self.read()
            due += self.every_s  # one each every_s however long a reading takes (seconds on a loaded machine)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return

    def nodes(self) -> dict[str, list[psutil.Process]]:
        """Each node's processes (its `ray start` tree); with a cluster not started here, the run's own ones."""
        local = self.cluster.local
        if local is None:
            return {"here": self.cluster.processes()}
        return {name: tree(node.pid) for name, node in list(local.nodes.items())}

    def read(self) -> dict[str, Any]:
        """One reading, appended to the file and the list."""
        now = time.monotonic()
        since = self.training_since()
        rows, shm, stores = [], set(), {}
        for node, processes in self.nodes().items():
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    command = title(process)
                    memory = process.memory_info()  # shared: pages of files and shared memory (the object store)
                    rows.append({"node": node, "role": role_of(command), "pid": process.pid,
                                 "rss_mib": round(memory.rss / MIB, 2), "shared_mib": round(memory.shared / MIB, 2),
                                 "fds": process.num_fds(), "age_s": round(time.time() - process.create_time(), 1)})
                    if node not in self.ports and (port := metrics_port(command)) is not None:
                        self.ports[node] = port
            shm |= shm_in_use(processes)
            if node in self.ports and (store := object_store_mib(self.ports[node])) is not None:
                stores[node] = store
        local = self.cluster.local
        sample = {
            "t_s": round(now - self.start, 1), "training_s": round(now - since, 1) if since else None,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load": round(os.getloadavg()[0], 2),
            "processes": rows, "shm": {"entries": len(shm), "mib": shm_mib(shm)},
            "object_store": {"used_mib": round(sum(s["used_mib"] for s in stores.values()), 3),
                             "objects": sum(s["objects"] for s in stores.values()), "nodes": len(stores)}
            if stores else None,
            "run_dir": dir_sizes(sorted(self.out.glob("run-*"))),
            "ray_logs_mib": tree_mib(local.root) if local is not None else None,
            "env_steps": latest_env_steps(self.out),
        }
        self.samples.append(sample)
        with self.path.open("a") as fh:
            fh.write(json.dumps(sample) + "\n")
        return sample


def latest_env_steps(out: Path) -> int | None:
    """The env steps of the newest run's last progress line (how far training got at a reading)."""
    runs = sorted(out.glob("run-*/progress.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        with runs[-1].open("rb") as fh:
            fh.seek(max(0, runs[-1].stat().st_size - 8192))
            last = fh.read().decode(errors="replace").rstrip("\n").split("\n")[-1]
        return int(json.loads(last)["env_steps"])
    return None
