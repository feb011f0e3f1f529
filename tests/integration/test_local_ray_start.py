"""A local Ray that does not come up (a raylet that has not registered with its GCS in RAY_NODE_START_WAIT, which a very
busy machine can take) is started again; one that never does is one line, and a bad option is not hidden behind the
retry. Each case in a process of its own (ray.init is once per process); Ray's own start stands in for the busy
machine's by raising its own words on the first try."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import ray
from dppo.distributed.cluster import STARTUP_TIMED_OUT, start_local_ray

real, tries = ray.init, []

def busy_first(*args, **kwargs):
    tries.append(kwargs.get("address"))
    if len(tries) <= {busy}:
        raise Exception("The current node " + STARTUP_TIMED_OUT + ". This could happen because ...")
    return real(*args, **kwargs)

ray.init = busy_first
try:
    start_local_ray(1, {{"logging_level": 40{extra}}})
    print("started after", len(tries), "tries;", ray.cluster_resources()["CPU"], "CPU")
except Exception as err:
    print(type(err).__name__ + ":", err)
"""


def run(busy: int, extra: str = "") -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(busy=busy, extra=extra)], capture_output=True,
                          text=True, timeout=180)
    return done.stdout.strip().splitlines()[-1]


def test_a_local_ray_that_timed_out_starting_is_started_again() -> None:
    assert run(busy=1) == "started after 2 tries; 1.0 CPU"


def test_a_local_ray_that_never_starts_is_one_line_and_a_bad_option_is_not_retried() -> None:
    assert run(busy=5) == ("RunFailure: the local Ray did not start in 2 tries (The current node timed out during "
                           "startup. This could happen because ...); the machine may be too busy: try again, or "
                           "start Ray with `ray start --head` and pass its address with --address")
    bad = run(busy=0, extra=', "object_store_memory": 10')
    assert bad.startswith("ValueError: Attempting to cap object store memory usage at 10 bytes")


RAY_PROCESSES_ENV = """
import json, ray, psutil
from dppo.distributed.cluster import RAY_PROCESS_ENV, start_local_ray

start_local_ray(1, {"logging_level": 40})
seen = {}
for p in psutil.Process().children(recursive=True):
    if p.name() in ("raylet", "gcs_server"):
        maps = open(f"/proc/{p.pid}/maps").read()
        seen[p.name()] = [p.environ().get(name) for name in RAY_PROCESS_ENV] + ["jemalloc" in maps]
ray.shutdown()
print(json.dumps(seen))
"""


def test_a_local_ray_s_raylet_and_gcs_get_dppo_s_settings_unless_the_user_set_their_own() -> None:
    """jemalloc with dppo's MALLOC_CONF, and the GCS's history bounded (dppo.distributed.cluster.RAY_PROCESS_ENV)."""
    from dppo.distributed.cluster import RAY_PROCESS_ENV

    def ray_processes(env: dict[str, str]) -> dict[str, list[str | bool]]:
        done = subprocess.run([sys.executable, "-c", RAY_PROCESSES_ENV], capture_output=True, text=True, timeout=180,
                              env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    plain = {k: v for k, v in os.environ.items() if k not in RAY_PROCESS_ENV}
    ours = [*RAY_PROCESS_ENV.values(), True]
    assert ray_processes(plain) == {"raylet": ours, "gcs_server": ours}
    users = {"MALLOC_CONF": "narenas:2", "RAY_task_events_max_num_task_in_gcs": "5000"}
    theirs = [users.get(name, value) for name, value in RAY_PROCESS_ENV.items()] + [True]
    assert ray_processes({**plain, **users}) == {"raylet": theirs, "gcs_server": theirs}
