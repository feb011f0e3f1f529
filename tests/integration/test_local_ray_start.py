"""A local Ray that does not come up (Ray gives a raylet 30 s to register with its GCS, which a busy machine can
take) is started again; one that never does is one line, and a bad option is not hidden behind the retry. Each case
in a process of its own (ray.init is once per process); Ray's own start stands in for the busy machine's by raising
its own words on the first try."""

from __future__ import annotations

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


RAYLET_ENV = """
import os, ray, psutil
from dppo.distributed.cluster import start_local_ray

start_local_ray(1, {"logging_level": 40})
raylets = [p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]
for p in raylets:
    maps = open(f"/proc/{p.pid}/maps").read()
    print(p.environ().get("MALLOC_CONF"), "jemalloc" if "jemalloc" in maps else "glibc")
ray.shutdown()
"""


def test_a_local_ray_s_raylet_runs_on_jemalloc_with_dppo_s_conf_unless_the_user_set_one() -> None:
    from dppo.distributed.cluster import RAY_MALLOC_CONF

    def raylet(env: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, "-c", RAYLET_ENV], capture_output=True, text=True, timeout=180,
                              env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    plain = {k: v for k, v in os.environ.items() if k != "MALLOC_CONF"}
    assert raylet(plain) == f"{RAY_MALLOC_CONF} jemalloc"
    assert raylet({**plain, "MALLOC_CONF": "narenas:2"}) == "narenas:2 jemalloc"
