"""Joining a Ray cluster or starting a local one for a run, and leaving it.

Joining a cluster that uses Ray's token authentication (``ray start --head`` turns it on by default since Ray
2.52; KubeRay's ``authOptions: {mode: token}``): Ray enables it for a client only when ``RAY_AUTH_MODE=token``
is set, even when the token is at hand. So before connecting, dppo asks the cluster's GCS whether it wants a
token; if it does, the token is taken where Ray documents it (``RAY_AUTH_TOKEN``, the file named by
``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), and without one the run stops with one line that says so.

Stopping while Ray starts: ``ray.init`` in the main thread replaces the process's SIGTERM handler with one that
calls ``sys.exit(15)``, and Ray's C++ core worker installs a crash handler that prints a stack dump
(``*** SIGTERM received ...``) for SIGTERM. ``dppo train`` handles SIGTERM itself (a final checkpoint, exit 143),
so it starts Ray in a thread of its own (:func:`connect_ray_beside`: Ray then leaves Python's handlers alone and
the main thread stays free to take a stop at once) and the driver does without the C++ crash handler.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from concurrent.futures import Future
from typing import Any, TextIO

from dppo.config import Config
from dppo.errors import RunFailure, UsageError, first_line

LOCAL_TRIES = 2  # starts of a local Ray before the run fails
STARTING: Future[None] | None = None  # the last connect_ray_beside's outcome (wait_for_start)
STARTUP_TIMED_OUT = "timed out during startup"  # Ray's words for a raylet that did not register in time
# Ray's raylet and GCS run on the jemalloc Ray ships (its LD_PRELOAD). With jemalloc's defaults (four arenas per
# CPU, a cache per thread) freed memory stayed with the allocator for the first half hour of a run: a raylet's
# private memory grew +8 to +13 %/h over 60 minutes of training (docs/benchmarks.md, long runs). With one arena, no
# thread caches and freed pages returned after a second it stays flat (which of these matters was not isolated).
# Only jemalloc reads MALLOC_CONF: Python and Ray's workers (glibc's malloc) ignore it. The image sets the same
# (Dockerfile).
RAY_MALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache:false"
# Ray's GCS keeps a cluster's history: up to 100,000 task events (about 3.5 KiB each here), dead actors and dead
# workers (Ray's ray_config_def.h). A run that loses processes often (each replaced by a new actor, each driver attempt
# a new job) fills them for days: under an hour of chaos the GCS grew +15 to +20 %/h (docs/benchmarks.md). Kept to
# the recent past (a run's last minutes under chaos; its last ~20 driver attempts, at 15 task events each, without)
# they stop growing: in an hour of chaos the GCS grew about 3 MiB in its first 17 minutes and little after, +5.4 %/h
# over the hour (docs/benchmarks.md). `ray list actors` and `ray list tasks` show as far back.
RAY_GCS_HISTORY = {"RAY_task_events_max_num_task_in_gcs": "300", "RAY_maximum_gcs_destroyed_actor_cached_count": "100",
                   "RAY_maximum_gcs_dead_worker_cached_count": "100"}
# A node that starts is given Ray's 30 s to register with its GCS, then `ray start` (or ray.init) raises: a machine
# that is busy when Ray starts took longer (a clean-clone CI of this project: a head started beside the suite's image
# build failed after 45 s), and a pod's whole RayJob fails for it. Only the waits for a node to appear read it (Ray's
# global_state_accessor.cc): a node that registers sooner is not slowed.
RAY_NODE_START_WAIT = {"RAY_raylet_start_wait_time_s": "120"}
# Ray's metrics reach Prometheus through each node's dashboard agent. On its default OpenTelemetry path the agent
# drops a dead worker's gauges only when its metrics port is scraped (ray-project/ray#64633): a node nobody scrapes
# (the chart's monitoring is off by default, a local Ray has no scraper) grew its agent about 43 KiB for each worker
# that came and went (134.7 -> 155.6 MiB over 400 workers), and each job attempt 150-180 KiB with a scrape each
# minute. On the OpenCensus path the agent drops the series of a worker silent for 120 s at its next report (every
# 5 s), scraped or not: the same 400 workers +6.3 MiB and flattening, the jobs 40-90 KiB each (readings by hand,
# docs/faults.md). The same metric names are served either way but three (docs/faults.md).
RAY_METRICS_PATH = {"RAY_enable_open_telemetry": "0"}
RAY_PROCESS_ENV = {"MALLOC_CONF": RAY_MALLOC_CONF, **RAY_GCS_HISTORY, **RAY_NODE_START_WAIT,
                   **RAY_METRICS_PATH}  # the image's ENV too
TOKEN_HINT = ("set RAY_AUTH_TOKEN to the cluster's token, or put it in ~/.ray/auth_token (or in a file named by "
              "RAY_AUTH_TOKEN_PATH); `ray get-auth-token` on the head prints it (on Kubernetes: the Secret KubeRay "
              "made for the RayCluster)")


def connect_ray(config: Config, min_cpus: float = 0.0) -> None:
    """Join run.address / RAY_ADDRESS, or start a quiet local Ray sized to fit every actor (and at least
    ``min_cpus``: a sweep's trial, its driver included)."""
    import ray

    # The driver's SIGTERM is dppo's to handle (see above); actors and Ray's own processes keep the handler.
    ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    address = config.run.address or os.environ.get("RAY_ADDRESS")
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if config.run.runtime_env:
        quiet["runtime_env"] = config.run.runtime_env
    try:
        if address:
            if is_gcs_address(address):
                use_token_if_required(address)
            ray.init(address=address, **quiet)
        else:
            needed = config.run.actors * config.run.actor_cpus  # learner processes reserve CPUs too
            if config.run.learners > 1:
                needed += config.run.learners * config.run.learner_cpus
            cpus = max(os.cpu_count() or 1, math.ceil(needed), math.ceil(min_cpus))
            start_local_ray(cpus, quiet)
    except (UsageError, RunFailure):
        raise  # the token check's own line; a local Ray that did not start
    except (ConnectionError, ValueError, RuntimeError) as err:
        raise UsageError(f"cannot connect to Ray at {address!r}: {first_line(err)}; check --address / "
                         "RAY_ADDRESS") from None


def with_ray_process_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` with RAY_PROCESS_ENV for the Ray processes started with it: each variable it sets already stands (the
    user's, an empty MALLOC_CONF too: jemalloc's defaults)."""
    for name, value in RAY_PROCESS_ENV.items():
        env.setdefault(name, value)
    return env


def start_local_ray(cpus: int, options: dict[str, Any], tries: int = LOCAL_TRIES) -> None:
    """A local Ray of ``cpus`` CPUs, started again when it does not come up (a raylet that has not registered with
    its GCS in RAY_NODE_START_WAIT, which a very busy machine can take, makes Ray raise a bare Exception); a
    RunFailure in one line after ``tries``. Ray reads RAY_PROCESS_ENV from this process's environment when it starts
    (after ``import ray`` too), and its raylet and GCS inherit it: it goes there first."""
    import ray

    with_ray_process_env(os.environ)
    for _ in range(tries):
        try:
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **options)
            return
        except Exception as err:  # Ray raises Exception itself for a node that did not come up
            if STARTUP_TIMED_OUT not in str(err):
                raise
            failed = err
            with contextlib.suppress(Exception):
                ray.shutdown()  # what the failed start left running
    raise RunFailure(f"the local Ray did not start in {tries} tries ({first_line(failed)}); the machine may be too "
                     "busy: try again, or start Ray with `ray start --head` and pass its address with --address")


def connect_ray_beside(config: Config) -> Future[None]:
    """:func:`connect_ray` in a thread of its own, which then lives as long as the process: the processes of a
    local Ray are bound to the thread that started them (Ray sets ``PR_SET_PDEATHSIG``, which Linux fires when
    that *thread* ends), so it must not end before the run does. The future holds connect_ray's outcome."""
    global STARTING
    started: Future[None] = Future()
    STARTING = started

    def start() -> None:
        try:
            connect_ray(config)
        except BaseException as err:  # a UsageError for the main thread to report
            started.set_exception(err)
            return
        started.set_result(None)
        threading.Event().wait()  # keep the local Ray's processes alive: see above

    threading.Thread(target=start, name="ray-start", daemon=True).start()
    return started


def wait_for_start(timeout: float) -> None:
    """Wait (up to ``timeout`` s) for the last :func:`connect_ray_beside` to end, however it ends: a stop that cut the
    wait for it short leaves it starting Ray's processes, which must be stopped once they are all there."""
    if STARTING is not None:
        with contextlib.suppress(BaseException):
            STARTING.exception(timeout)


def is_gcs_address(address: str) -> bool:
    """host:port of a cluster's GCS (not ``ray://`` Ray Client addresses, not ``auto`` or ``local``)."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and "://" not in address)


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Ray's C++ client logs each refused attempt to file descriptor 2; the user gets our one line instead. The
    check runs in the thread that starts Ray (connect_ray_beside) while the main thread may be writing a line of
    its own (a stop's, then an exit): Python's sys.stderr, where it writes to fd 2, is pointed meanwhile at where
    fd 2 went before, so only the C++ logs go to /dev/null."""
    python_stderr = sys.stderr
    redirect = writes_to_fd2(python_stderr)
    if redirect:
        python_stderr.flush()
        sys.stderr = original_stderr()  # made (if new) before fd 2 is silenced
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        if redirect:
            sys.stderr.flush()
            sys.stderr = python_stderr
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


ORIGINAL_STDERR: TextIO | None = None  # a copy of fd 2 as the process got it, never closed (a thread may hold it)


def original_stderr() -> TextIO:
    """A text stream on a duplicate of fd 2 made the first time this is called (before any silencing), kept open
    for the process's life: a line written to it while another thread silences fd 2 is not lost."""
    global ORIGINAL_STDERR
    if ORIGINAL_STDERR is None:
        ORIGINAL_STDERR = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
                                    errors="backslashreplace")
    return ORIGINAL_STDERR


def writes_to_fd2(stream: TextIO) -> bool:
    """Whether ``stream`` writes to file descriptor 2 (not a notebook's stream or a test's capture of it)."""
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def gcs_refusal(address: str) -> str | None:
    """Connect to the GCS at ``address`` once: None when it answers, "token" when it wants a (valid) token.
    Anything else is bad input: nothing answers there."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError, RpcError

    try:
        with stderr_silenced():
            GcsClient(address=address, cluster_id=None)
    except AuthenticationError:
        return "token"
    except RpcError as err:
        raise UsageError(f"cannot connect to Ray at {address!r}: {err}; check --address / RAY_ADDRESS") from None
    return None


def use_token_if_required(address: str) -> None:
    """Turn Ray's token mode on for this process when the cluster at ``address`` requires it and a token is where
    Ray looks for one; else stop with one line (exit 2) that says what is missing."""
    from ray._raylet import AuthenticationTokenLoader
    from ray._raylet import Config as RayConfig

    if gcs_refusal(address) is None:
        return
    token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    has_token = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    if not has_token:
        raise UsageError(f"the Ray cluster at {address} requires a token (Ray token authentication) and none was "
                         f"found; {TOKEN_HINT}")
    if token_mode:
        raise UsageError(f"the Ray cluster at {address} refused the token found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
                         f"or ~/.ray/auth_token); {TOKEN_HINT}")
    os.environ["RAY_AUTH_MODE"] = "token"  # what Ray documents for clients; actors and workers inherit it
    RayConfig.initialize("")
    use_token_if_required(address)  # once more, now with the token: a wrong one is refused here


def stop_ray() -> None:
    """Leave a joined cluster with ray.shutdown (its job ends cleanly); stop a local Ray this process
    started by killing its processes, all of them this process's descendants (GCS, raylet, its agents and
    workers). ray.shutdown would stop them one by one, about 1.4 s here, protecting nothing: the actors are
    stopped and every file of the run is closed by now."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not getattr(node, "head", False):
        ray.shutdown()
        return
    kill_children()


def kill_children() -> None:
    """SIGKILL every descendant of this process: a local Ray's processes (GCS, raylet, its agents and workers),
    also while ``ray.init`` is still starting them (a stop then ends the run at once)."""
    import psutil

    for process in psutil.Process().children(recursive=True):  # SIGKILL lands at once; no need to wait
        with contextlib.suppress(psutil.Error):
            process.kill()


def kill_ray_children() -> None:
    """SIGKILL the descendants of this process that are a local Ray's (GCS, raylet, its agents and workers), and no
    other: a program that called dppo.train may have children of its own."""
    import psutil

    killed = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(mark in " ".join(process.cmdline()[:3]) for mark in RAY_PROCESS_MARKS):
                process.kill()
                killed.append(process)
    psutil.wait_procs(killed, timeout=5)  # reaped: the program goes on, and keeps no zombies


# What a local Ray's processes run: its binaries, its Python modules, the workers' titles.
RAY_PROCESS_MARKS = ("gcs_server", "raylet", "ray::", "/ray/_private/", "/ray/dashboard/", "/ray/autoscaler/",
                     "/ray/core/src/")
