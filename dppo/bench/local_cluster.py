"""A Ray cluster of several nodes on this machine: each node a ``ray start --block`` process with its own ports,
as a pod would run it. The node-loss benchmark (and the tests of clusters) kill a node whole and start it
again. Nothing outside loopback is touched, and every process started here is stopped at the end: each node's
whole process tree (raylet, agents, workers), found from its ``ray start`` process, never a global ``ray stop``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from dppo.distributed.cluster import with_ray_process_env
from dppo.distributed.ports import free_ports
from dppo.transport.protocol import runs

RAY = str(Path(sys.executable).parent / "ray")


def node_port_flags(ports: list[int] | None = None) -> list[str]:
    """The per-node ports ``ray start`` would otherwise take at fixed numbers (two nodes on one host collide);
    ``ports``: four chosen with the caller's others (ports chosen apart can repeat)."""
    metrics, agent, agent_grpc, runtime_env = ports or free_ports(4)
    return [f"--metrics-export-port={metrics}", f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={runtime_env}"]


def kill_group(pgid: int, wait_s: float = 30.0) -> None:
    """SIGKILL to a process group, then wait (up to ``wait_s``) until none of it runs to hold a port or a file."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while group_runs(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)


def group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie has ended: it holds nothing)."""
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


class LocalCluster:
    """Named Ray nodes as processes; ``env`` is every node's environment (token auth variables go there; what the
    image sets for Ray's processes, RAY_PROCESS_ENV, is added where it does not set it)."""

    def __init__(self, env: dict[str, str], root: Path | None = None) -> None:
        # A short path: Ray's Unix sockets live under it (108-byte limit).
        self.root = root or Path(tempfile.mkdtemp(prefix="dppo-cl-", dir="/tmp"))
        self.env = {**env}
        # Ray's own 30 s for a node to register, not RAY_PROCESS_ENV's 120 s: start() starts a node whose `ray start`
        # gave up again, with ports of its own, and the longer wait only put that off (a clean-clone CI of c92b04f: a
        # node started again after its loss sat past start()'s 120 s with no word from Ray; why is not known).
        self.env.setdefault("RAY_raylet_start_wait_time_s", "30")
        with_ray_process_env(self.env)
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        # name -> what it was started with, its command (or the function that gives it) and env: a restart runs it
        self.commands: dict[str, tuple[list[str] | Callable[[], list[str]], dict[str, str] | None]] = {}
        self.address = ""
        self.dashboard = ""  # the job API's address (http://...), when the head serves one

    def start(self, name: str, args: list[str] | Callable[[], list[str]], env: dict[str, str] | None = None,
              wait_for: str = "Ray runtime started", timeout: float = 120.0, wait: bool = True,
              tries: int = 3) -> None:
        """Start a node's process (``args``: the whole command, or a function that gives it for each try) and wait
        until its log says ``wait_for`` (unless not ``wait``: a node coming back while the caller goes on). A `ray
        start` that exits first is started again, as a pod's container is (up to ``tries`` times): it gives up after
        Ray's fixed 30 s for its raylet to register, which a loaded small machine can take; what the failed try
        started is gone before the next begins (a process in uninterruptible I/O outlives its SIGKILL a while, its
        ports still bound: a function gives the next try ports of its own)."""
        first = ""
        self.commands[name] = (args, env)
        for attempt in range(tries):
            log_name = name if attempt == 0 else f"{name}-restart-{attempt}"
            log = open(self.root / f"{log_name}.log", "wb")  # noqa: SIM115 (closed with the node's life)
            command = args() if callable(args) else args
            self.nodes[name] = subprocess.Popen(command, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            if not wait:
                return
            deadline = time.monotonic() + timeout
            while wait_for not in self.log(log_name):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Ray node {name} did not start in {timeout:.0f} s:\n"
                                       f"{self.log(log_name)[-3000:]}")
                if self.nodes[name].poll() is not None:
                    kill_group(self.nodes[name].pid)  # its GCS or raylet, left behind
                    break
                time.sleep(0.3)
            else:
                return
            first = first or self.log(log_name)[-1500:]
        raise RuntimeError(f"Ray node {name} did not start in {tries} tries; the first try's log ends:\n{first}\n"
                           f"the last try's:\n{self.log(log_name)[-1500:]}")

    def start_head(self, cpus: int, *extra: str, dashboard: bool = False, timeout: float = 120.0) -> str:
        """A head with ``cpus`` CPUs, without a dashboard unless ``dashboard`` (then ``self.dashboard`` is its job
        API, as a RayJob's submitter reaches it); returns its GCS address."""
        def command() -> list[str]:
            gcs, client, dash, *node = free_ports(7)
            board = ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"] \
                if dashboard else ["--include-dashboard=false"]
            self.address = f"127.0.0.1:{gcs}"
            self.dashboard = f"http://127.0.0.1:{dash}" if dashboard else ""
            return [RAY, "start", "--head", "--block", f"--port={gcs}", f"--num-cpus={cpus}",
                    f"--ray-client-server-port={client}", *board, *node_port_flags(node), *self._common(), *extra]

        self.start("head", command, timeout=timeout)
        return self.address

    def start_worker(self, name: str, cpus: int, *extra: str, wait: bool = True, timeout: float = 120.0) -> None:
        """A worker node joining the head (one at a time: two raylets registering at once can time out)."""
        self.start(name, lambda: [RAY, "start", f"--address={self.address}", "--block", f"--num-cpus={cpus}",
                                  *node_port_flags(), *self._common(), *extra], wait=wait, timeout=timeout)

    def restart_if_exited(self, name: str) -> bool:
        """A node whose `ray start` exited (it gave up on Ray's 30 s for its raylet to register, which a loaded
        machine can take) started again with its command (ports of its own), as a pod's container is, without
        waiting; True when it was. What the exited try left in its process group is killed first, and its log kept
        beside (``NAME-exited-K.log``)."""
        node = self.nodes.get(name)
        if node is None or node.poll() is None:
            return False
        kill_group(node.pid)
        exited = len(list(self.root.glob(f"{name}-exited-*.log")))
        (self.root / f"{name}.log").rename(self.root / f"{name}-exited-{exited + 1}.log")
        args, env = self.commands[name]
        self.start(name, args, env, wait=False)
        return True

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: the nodes' `ray start` processes and their descendants (raylets,
        agents, workers, a job's driver), never another Ray's on the machine."""
        found = []
        for node in self.nodes.values():
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(node.pid)
                found += [root, *root.children(recursive=True)]
        return found

    def _common(self) -> list[str]:
        return ["--node-ip-address=127.0.0.1", f"--temp-dir={self.root}", "--object-store-memory=100000000",
                "--disable-usage-stats"]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str) -> list[psutil.Process]:
        """Lose a node whole, as when its machine goes away: SIGKILL to its raylet, agents and workers at once. The
        processes sent it (they end a moment later)."""
        proc = self.nodes.pop(name)
        tree: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        proc.wait(timeout=30)
        return tree

    def stop(self) -> None:
        """Stop every node started here (their whole process trees, ended when it returns: what they held, such as an
        inference service's shared memory, can be told left behind), then remove the temp dir."""
        trees = [process for name in list(self.nodes) for process in self.kill(name)]
        marker = str(self.root)
        for process in psutil.process_iter(["cmdline"]):  # workers of a killed raylet that outlived it
            with contextlib.suppress(psutil.Error):
                if marker in " ".join(process.info["cmdline"] or []):
                    process.kill()
                    trees.append(process)
        deadline = time.monotonic() + 30.0
        while any(runs(process.pid) for process in trees) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
