"""Joining a Ray cluster or starting a local one for a run, and leaving it."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any

from dppo.config import Config
from dppo.errors import UsageError


def connect_ray(config: Config) -> None:
    """Join run.address / RAY_ADDRESS, or start a quiet local Ray sized to fit every actor."""
    import ray

    address = config.run.address or os.environ.get("RAY_ADDRESS")
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if config.run.runtime_env:
        quiet["runtime_env"] = config.run.runtime_env
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            needed = config.run.actors * config.run.actor_cpus  # learner processes reserve CPUs too
            if config.run.learners > 1:
                needed += config.run.learners * config.run.learner_cpus
            cpus = max(os.cpu_count() or 1, math.ceil(needed))
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"cannot connect to Ray at {address!r}: {first}; check --address / RAY_ADDRESS") from None


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
    import psutil

    for process in psutil.Process().children(recursive=True):  # SIGKILL lands at once; no need to wait
        with contextlib.suppress(psutil.Error):
            process.kill()
