"""The cluster side of `dppo bench chaos`: its job API, the processes of it the bench may kill (and only those),
and what they leave behind (processes, /dev/shm entries)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from dppo.bench.chaos_schedule import ACTOR_CLASSES, KINDS
from dppo.bench.local_cluster import RAY, LocalCluster
from dppo.errors import UsageError

FINISHED = {"SUCCEEDED", "FAILED", "STOPPED"}


class Cluster:
    """The job API of the cluster the run goes to, and the processes of it this bench may kill."""

    def __init__(self, dashboard: str, env: dict[str, str], local: LocalCluster | None, marker: str) -> None:
        self.dashboard, self.env, self.local, self.marker = dashboard, env, local, marker
        self.token = env.get("RAY_AUTH_TOKEN", "")
        self.job_ids: set[str] = set()  # Ray's ids of our jobs (every attempt's), as the job API gave them

    def api(self, path: str) -> Any:
        request = urllib.request.Request(f"{self.dashboard}{path}", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.load(resp)

    def submit(self, job_id: str, entrypoint: str) -> None:
        """The submitter's command (KubeRay joins it with spaces and runs it with `bash -c`)."""
        out = subprocess.run(["bash", "-c", f"{RAY} job submit --address {self.dashboard} --no-wait "
                              f"--submission-id {job_id} -- {entrypoint}"], env=self.env, capture_output=True,
                             text=True, timeout=180, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"ray job submit failed: {out.stdout}{out.stderr}")

    def status(self, job_id: str) -> str:
        try:
            job = self.api(f"/api/jobs/{job_id}")
            self.note_job(job)
            return str(job["status"])
        except (OSError, ValueError, KeyError):
            return "UNKNOWN"  # the head is busy: ask again

    def processes(self, job_id: str | None = None) -> list[psutil.Process]:
        """Processes of this cluster the bench may kill (local: every descendant of our `ray start`s; a given
        cluster: :func:`own_processes` of our job)."""
        if self.local is not None:
            return self.local.processes()
        from ray.util.state import list_actors, list_nodes
        from ray.util.state.exception import RayStateApiException

        with contextlib.suppress(OSError, ValueError, KeyError, RayStateApiException):
            job = self.api(f"/api/jobs/{job_id}")
            self.note_job(job)
            actors = list_actors(address=self.dashboard, filters=[("state", "=", "ALIVE")], limit=10000)
            nodes = {node.node_id: node.node_ip for node in list_nodes(address=self.dashboard, limit=10000)}
            return own_processes(job, actors, nodes, machine_ips(), self.marker)
        return []

    def note_job(self, job: dict[str, Any]) -> None:
        """Remember the Ray job id of a job of ours (every attempt's): the run's actors are found by it."""
        ray_id = job.get("job_id") or (job.get("driver_info") or {}).get("id")
        if ray_id:
            self.job_ids.add(str(ray_id))

    def actors_left(self) -> list[str]:
        """A given cluster's actors of our jobs that are not dead (Ray's table, wherever they run)."""
        from ray.util.state import list_actors
        from ray.util.state.exception import RayStateApiException

        with contextlib.suppress(OSError, ValueError, KeyError, RayStateApiException):
            return [f"{a.class_name} pid {a.pid} (job {a.job_id}, {a.state})"
                    for a in list_actors(address=self.dashboard, filters=[("state", "!=", "DEAD")], limit=10000)
                    if a.job_id in self.job_ids]
        return []


def machine_ips() -> set[str]:
    """This machine's addresses: a Ray node reporting one of them runs here (its pids are this machine's)."""
    return {address.address for addresses in psutil.net_if_addrs().values() for address in addresses
            if address.family in (socket.AF_INET, socket.AF_INET6)}


def own_processes(job: dict[str, Any], actors: list[Any], nodes: dict[str, str], here: set[str],
                  marker: str) -> list[psutil.Process]:
    """The processes of one job of ours on this machine, on a cluster the bench did not start: its actors (Ray's
    ``ActorState`` rows of the job's id on a node whose address is ``here``) and its driver (the job API's
    ``driver_info`` on a node here), each confirmed by its command line (a Ray worker's ``ray::`` title; the
    driver's ``-m dppo train`` with this bench's ``marker``). A pid Ray reports for a node elsewhere names
    another process here (another run's, or anyone's): never ours, never killed, never "left behind"."""
    ray_id = job.get("job_id") or (job.get("driver_info") or {}).get("id")
    driver = job.get("driver_info") or {}
    wanted = [(driver.get("pid"), "driver")] if driver.get("node_ip_address") in here else []
    wanted += [(actor.pid, "actor") for actor in actors
               if ray_id and actor.job_id == ray_id and nodes.get(actor.node_id) in here]
    found = []
    for pid, role in wanted:
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            process = psutil.Process(int(pid))
            command = title(process)
            if command.startswith("ray::") if role == "actor" else is_driver(command, marker):
                found.append(process)
    return found


def title(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())
    return ""


def victims(kind: str, processes: list[psutil.Process], marker: str) -> list[psutil.Process]:
    """This kind's live processes: a Ray actor by its title ``ray::<Class>`` (``ray::<Class>.<method>`` while
    busy), the driver by its command line (``dppo train`` with this bench's output dir); a hang's, those of every Ray
    actor class not stopped already (one stopped before is the run's to replace)."""
    if kind == "hang":
        return [p for name in ACTOR_CLASSES for p in victims(name, processes, marker) if not stopped(p)]
    if kind in ACTOR_CLASSES:
        name = f"ray::{ACTOR_CLASSES[kind]}"
        return [p for p in processes if (t := title(p)).split(" ")[0] in (name,) or t.startswith(name + ".")]
    return [p for p in processes if is_driver(title(p), marker)]


def stopped(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.status() == psutil.STATUS_STOPPED
    return False


def hang(process: psutil.Process) -> None:
    """SIGSTOP the process and never resume it, as a deadlocked simulator, a stuck kernel or a paused node looks to
    the run: alive, answering nothing."""
    with contextlib.suppress(psutil.Error):
        process.send_signal(signal.SIGSTOP)


def is_driver(command: str, marker: str) -> bool:
    """The command line of a driver of this bench's runs (not the shell KubeRay's submitter wraps it in)."""
    return (marker in command and " -m dppo train " in command
            and not command.startswith(("ray::", "bash", "/bin/sh", "sh ")))


def crash(process: psutil.Process) -> None:
    """SIGKILL the process alone, by pid, as a crash or the OOM killer would: its own children (Python's resource
    tracker, which removes the shared memory a killed process made) live on and do what they do after a crash."""
    with contextlib.suppress(psutil.Error):
        process.kill()


def tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants (a node's: its `ray start` process)."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def shm_in_use(processes: list[psutil.Process]) -> set[str]:
    """/dev/shm entries these processes have mapped or open (the run's segments, proved ours)."""
    found = set()
    for process in processes:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{process.pid}/maps").read_text().splitlines():
                if " /dev/shm/" in line and not line.endswith("(deleted)"):
                    found.add(line[line.index("/dev/shm/"):])
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{process.pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("/dev/shm/"):
                        found.add(target)
    return found


def saved_token() -> str:
    """The token `ray start --head` saved for this user (Ray's token auth), if any."""
    path = Path.home() / ".ray" / "auth_token"
    return path.read_text().strip() if path.is_file() else ""


def probe(address: str, token: str) -> str:
    """The job API at ``address`` answers, or a usage error."""
    url = address if address.startswith("http") else f"http://{address}"
    request = urllib.request.Request(f"{url.rstrip('/')}/api/version", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            json.load(resp)
    except (OSError, ValueError) as err:
        raise UsageError(f"--address {address}: no Ray job API answers there ({err}); pass the dashboard's address, "
                         "e.g. http://HEAD:8265, with RAY_AUTH_TOKEN set when the cluster has token auth") from None
    return url.rstrip("/")


def run_processes_left(cluster: Cluster, marker: str, wait_s: float = 60.0) -> list[str]:
    """The run's processes still alive a while after its last job ended: on the local cluster, actors of its kinds
    and its driver; on a given one, the actors of its own jobs (Ray's table), never another run's."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [title(p) for kind in KINDS for p in victims(kind, cluster.processes(), marker)] \
            if cluster.local is not None else cluster.actors_left()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def alive(pid: int, created: float) -> bool:
    """The process seen as ``pid`` (not a later one of the same pid) still runs (a zombie has ended)."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    return False
