"""The session's one Ray cluster, shared by every pytest-xdist worker: the first test that asks for it starts it
(:func:`shared_head`), in a process of its own so that it outlives that worker's tests; the session stops it at its
end (:func:`stop_head`), and it stops by itself when the pytest process that owns it is gone.

Started with Ray's test helper, which can leave out the log monitor: no driver here takes the workers' output
(log_to_driver is off in every one), and the monitor tailing each worker's log files was 2% of the suite's CPU.
Its CPUs are Ray's scheduling tokens, not cores: enough that the runs of every worker's tests at once (a few actors
and learners each, at most 8 tokens) never wait for each other's; a test that measures what fits asks for shares of
CPU_TOKENS large enough that the other workers' runs beside it do not change the answer (tests/integration/
test_short_start.py: two actors of 3/8 fit beside them, so they may hold a quarter: 32 tokens per other worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CPU_TOKENS = 32 * max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) - 1)  # 32 for 2 workers, 64 for 3
ADDRESS, PID = "ray-head.address", "ray-head.pid"  # files in the directory every worker of the session sees


def shared_head(root: Path, owner: int) -> str:
    """The session cluster's GCS address, starting it unless a worker did (``root``: the directory every worker
    sees; ``owner``: the pid of the session's pytest process)."""
    with open(root / "ray-head.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held only while it starts: the other workers wait for the address
        if not (root / ADDRESS).exists():
            log = open(root / "ray-head.log", "wb")  # noqa: SIM115 (the head's whole life)
            head = subprocess.Popen([sys.executable, __file__, str(root), str(owner)], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            (root / PID).write_text(str(head.pid))
            deadline = time.monotonic() + 120
            while not (root / ADDRESS).exists():
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the session's Ray cluster did not start:\n"
                                       + (root / "ray-head.log").read_text(errors="replace")[-3000:])
                time.sleep(0.2)
        return (root / ADDRESS).read_text()


def stop_head(root: Path) -> None:
    """Stop the session cluster if this session started one (its helper shuts Ray down, then exits)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((root / PID).read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # its Ray processes die with it (Ray binds them to their parent)


def main(root: Path, owner: int) -> None:
    from ray.cluster_utils import Cluster

    from dppo.distributed.cluster import RAY_NODE_START_WAIT

    for name, value in RAY_NODE_START_WAIT.items():  # as a local Ray of dppo's: a busy machine registers it slowly
        os.environ.setdefault(name, value)

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPU_TOKENS, "include_dashboard": False, "include_log_monitor": False,
        "object_store_memory": 2 * 1024**3,  # the helper's default, 150 MiB, is less than Atari runs want
        # no idle worker per token when the first driver joins: the tests' actors start their own
        "_system_config": {"prestart_worker_first_driver": False, "enable_worker_prestart": False}})
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    (root / f"{ADDRESS}.new").write_text(cluster.address)
    (root / f"{ADDRESS}.new").rename(root / ADDRESS)
    while not stopping and Path(f"/proc/{owner}").exists():
        time.sleep(0.5)
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
