"""One candidate measured as it would run, by the Coordinator `dppo train` runs on the Ray session this process
holds, so every mode (a policy map, self-play, an LSTM, the service) is measured by the code that runs it. Two
looks: :func:`train`, a short real training run (env steps per second of the iterations after the first, which
warms up, with their sampling and update seconds), and :func:`screen`, the setting's sampling rounds timed apart
from an update (a first look that costs a start-up and a few rounds, not a few updates). Both watch the memory of
the process tree.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.errors import first_line

if TYPE_CHECKING:
    from dppo.bench.memory import PeakMemory
    from dppo.config import Config
    from dppo.run.coordinator import Coordinator


@dataclass
class Trained:
    """What one measurement of a candidate found (``error``: why it could not run, one line)."""

    iterations: int = 0
    steps: int = 0  # env steps of the timed iterations
    seconds: float = 0.0  # their wall seconds
    sample_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    rss_mib: float = 0.0  # the peak of the process tree's summed RSS
    process_rss_mib: float = 0.0  # the largest one process held then
    gpu_mib: float | None = None  # the peak GPU memory of the process tree (None: no GPU on this machine)
    wall_s: float = 0.0  # the measurement, start-up included
    error: str | None = None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def add(self, other: Trained) -> Trained:
        """Two measurements of one candidate as one (a later, longer look)."""
        return Trained(self.iterations + other.iterations, self.steps + other.steps, self.seconds + other.seconds,
                       self.sample_s + other.sample_s, self.update_s + other.update_s,
                       max(self.rss_mib, other.rss_mib), max(self.process_rss_mib, other.process_rss_mib),
                       highest(self.gpu_mib, other.gpu_mib), self.wall_s + other.wall_s, self.error or other.error)

    def row(self) -> dict[str, Any]:
        median = (lambda v: round(statistics.median(v), 3) if v else None)  # noqa: E731
        return {"train_steps_per_s": round(self.steps_per_s, 1), "iterations": self.iterations,
                "sample_s": median(self.sample_s), "update_s": median(self.update_s),
                "rss_mib": round(self.rss_mib), "max_process_rss_mib": round(self.process_rss_mib),
                "gpu_mib": None if self.gpu_mib is None else round(self.gpu_mib),
                "measured_s": round(self.wall_s, 1)}


def highest(a: float | None, b: float | None) -> float | None:
    """The larger of two peaks, either of which may not have been read."""
    return b if a is None else a if b is None else max(a, b)


def measurement_config(config: Config, iterations: int | None, run_dir: str) -> Config:
    """``config`` as a measurement runs it: no stop on a return, no evaluation, checkpoint or sink but progress,
    for ``iterations`` timed iterations after the one that warms up (None: until the measurement stops it)."""
    config = config.model_copy(deep=True)
    run = config.run
    run.target_return, run.time_limit_s = None, None
    run.total_steps = config.batch_size * (iterations + 1) if iterations else 2**62
    run.eval_every, run.checkpoint_every, run.keep_checkpoints = 0, 10**9, 1
    run.tensorboard, run.log_format, run.run_dir = False, "none", run_dir
    config.metrics.port = 0
    return config


@contextmanager
def started(config: Config, iterations: int | None,
            on_iteration: Callable[[dict[str, Any], Path | None], None] | None = None) -> Iterator[Started]:
    """A Coordinator of ``config`` as a measurement runs it, started on the Ray session this process holds, in a run
    directory that goes with it, the process tree's memory watched meanwhile; shut down on the way out."""
    from dppo.bench.memory import PeakMemory
    from dppo.run.coordinator import Coordinator

    with tempfile.TemporaryDirectory(prefix="dppo-tune-") as run_dir:
        measured = measurement_config(config, iterations, str(Path(run_dir) / "run"))
        with PeakMemory(own_processes, every_s=1.0) as memory:
            coordinator = None
            try:
                coordinator = Coordinator(measured, Path(measured.run.run_dir), on_iteration=on_iteration)
                coordinator.start()
                coordinator.run_dir.path.mkdir(parents=True, exist_ok=True)
                yield Started(coordinator, memory)
            finally:
                if coordinator is not None:
                    coordinator.shutdown()


@dataclass
class Started:
    """A measurement's coordinator and the memory watched while it runs."""

    coordinator: Coordinator
    memory: PeakMemory


def train(config: Config, iterations: int | None = None, seconds: float | None = None) -> Trained:
    """Train ``config`` on the Ray session this process holds for ``iterations`` timed iterations or, with
    ``seconds``, until that long has passed and one iteration after the first has ended; the timed iterations are
    all but the first."""
    from dppo.errors import RunFailure, UsageError

    records: list[dict[str, Any]] = []
    began = training = time.perf_counter()

    def enough(record: dict[str, Any], _checkpoint: Path | None) -> None:
        records.append(record)
        if seconds is not None and len(records) >= 2 and time.perf_counter() - training >= seconds:
            run.coordinator.signals.received = signal.SIGTERM  # the run ends after this iteration, as on a stop

    try:
        with started(config, iterations, enough) as run:
            training = time.perf_counter()
            run.coordinator.run()
    except (RunFailure, UsageError, ValueError) as err:
        return Trained(error=first_line(err), wall_s=time.perf_counter() - began)
    timed = records[1:]
    memory = run.memory
    return Trained(len(timed), sum(r["env_steps_delta"] for r in timed), sum(r["iteration_s"] for r in timed),
                   [r["sample_s"] for r in timed if "sample_s" in r], [r["update_s"] for r in timed if "update_s" in r],
                   memory.peak["rss_mib"], memory.largest_mib, memory.gpu_mib, time.perf_counter() - began)


@dataclass
class Screened:
    """A setting's sampling timed apart from its update (`dppo tune`'s first look at each setting; its update costs
    the same in every setting of a batch size, so it is timed once per batch size)."""

    steps: int = 0  # env steps a round
    round_s: list[float] = field(default_factory=list)  # each timed round's wall seconds (weights out, segments in)
    update_s: float | None = None  # an update on a round's batch (the median of those timed), when asked for
    start_s: float = 0.0  # the start-up: learners, actors, envs
    rss_mib: float = 0.0
    process_rss_mib: float = 0.0
    gpu_mib: float | None = None
    wall_s: float = 0.0
    error: str | None = None

    @property
    def round_median_s(self) -> float:
        return statistics.median(self.round_s) if self.round_s else 0.0


SCREEN_S = 1.0  # timed rounds (and updates) go on until this long, so a round of milliseconds is not timed once
MOST_TIMED = 30  # of each


def screen(config: Config, rounds: int, updates: int, seconds: float = SCREEN_S) -> Screened:
    """Start ``config``, sample a round that warms up, then at least ``rounds`` timed rounds (more while they last
    under ``seconds``); then, with ``updates`` 1, time updates on the last round's batch the same way (their median;
    2: one that warms up first; 0: none), all on this process's Ray session."""
    from dppo.errors import RunFailure, UsageError

    began = time.perf_counter()
    try:
        with started(config, None) as run:
            start_s = time.perf_counter() - began
            gathered = run.coordinator.sample_round()
            round_s: list[float] = []
            while len(round_s) < rounds or (sum(round_s) < seconds and len(round_s) < MOST_TIMED):
                at = time.perf_counter()
                gathered = run.coordinator.sample_round()
                round_s.append(time.perf_counter() - at)
            if updates > 1:
                run.coordinator.update_on(gathered)
            update_s: list[float] = []
            while updates and (not update_s or (sum(update_s) < seconds and len(update_s) < MOST_TIMED)):
                at = time.perf_counter()
                run.coordinator.update_on(gathered)
                update_s.append(time.perf_counter() - at)
            steps = sum(segment.num_steps for segment in gathered.segments)
    except (RunFailure, UsageError, ValueError) as err:
        return Screened(error=first_line(err), wall_s=time.perf_counter() - began)
    memory = run.memory
    return Screened(steps, round_s, statistics.median(update_s) if update_s else None, start_s, memory.peak["rss_mib"],
                    memory.largest_mib, memory.gpu_mib, time.perf_counter() - began)


def own_processes() -> list[int]:
    """This driver and its job's live actors on this machine: a local Ray's processes descend from the driver, but
    on a cluster (``--address``) only the job's actors are this measurement's. Ray's GCS tables are read directly
    (``ray._private.state``, as :mod:`dppo.distributed.ray_calls` does): the state API needs a dashboard."""
    import ray

    context = ray.get_runtime_context()
    job, node = context.get_job_id(), context.get_node_id()
    try:
        actors = ray._private.state.actors().values()
    except Exception:  # the driver's own figures are still worth having
        return [os.getpid()]
    return [os.getpid(), *(a["Pid"] for a in actors if a.get("JobID") == job and a.get("State") == "ALIVE"
                          and a.get("Address", {}).get("NodeID") == node and a.get("Pid"))]
