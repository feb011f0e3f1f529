"""One training run from start to end, as `dppo train` and :func:`dppo.train` both run it: check everything, start
Ray and the run's processes, train, say the outcome.

Order matters for the contract "bad input: one line, nothing written": the config, the run directory, a checkpoint
to resume, the env and the callbacks are checked first, then the run directory's lock is taken (one run per
directory: dppo.run.lock); Ray is started (or joined, or the one this process initialised is used) while the
coordinator is built beside it; the learners and every actor are started and each actor has made its envs; only then
are the run directory's files written. A stop (SIGINT, SIGTERM) until then ends the run at once with nothing written
(the lock's file too): :func:`launch` raises :class:`~dppo.run.signals.Stopped`; afterwards it ends the round in
progress and the run with a final checkpoint (dppo.run.signals). Bad input is a :class:`~dppo.errors.UsageError`
whose message is the one line, a failed run a :class:`~dppo.errors.RunFailure`: the caller (the command, the API)
says them its way.
"""

from __future__ import annotations

import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.run.callbacks import Callback
    from dppo.run.coordinator import Coordinator
    from dppo.run.lock import RunLock
    from dppo.run.signals import StopSignals
    from dppo.run.timing import PhaseClock


@dataclass
class TrainRequest:
    """What a run is asked to be: `dppo train`'s arguments, or :func:`dppo.train`'s."""

    config_path: str | None = None  # a YAML file (default: the preset for env.id)
    config_data: dict[str, Any] | None = None  # or the config as a dict (dppo.train's dict or Config)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key -> value (the flags; None: not given)
    sets: list[str] = field(default_factory=list)  # ``key=value`` items (--set)
    resume: bool = False
    auto_resume: bool = False
    callbacks: list[Callback] = field(default_factory=list)  # functions given in Python, after run.callbacks'


@dataclass
class Outcome:
    """How a run that trained (or had trained already) ended: its summary, its directory, and the stop signal's
    number when one ended it."""

    summary: dict[str, Any]
    run_dir: Path
    signal: int | None


# Flags of `dppo train` that set a config key (dest -> dotted key); dppo.train takes them by the same names.
TRAIN_FLAGS = {
    "env": "env.id", "actors": "run.actors", "envs_per_actor": "env.num_envs",
    "segment_length": "ppo.segment_length", "total_steps": "run.total_steps", "target_return": "run.target_return",
    "time_limit": "run.time_limit_s",
    "seed": "run.seed", "run_dir": "run.run_dir", "metrics_port": "metrics.port", "address": "run.address",
    "log_format": "run.log_format", "tensorboard": "run.tensorboard",
}
INFERENCE = {"actor": "in the actors", "server": "in one inference service"}  # run.inference, as a line says it


def resolve_run_dir(config_dir: str | None, env_name: str) -> Path:
    if config_dir:
        return Path(config_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_name.rpartition(":")[2] or env_name)  # no '/' or ':' in names
    return Path("runs") / f"{safe}-{stamp}"


def prepare(request: TrainRequest) -> tuple[Config, Path, dict[str, Any] | None, str, RunLock]:
    """Validate everything (config, run dir, checkpoint, env and spaces) before anything is written; also what the
    config started from (a preset, a file, the defaults), and the run dir's lock, taken last (dppo.run.lock): a run
    that holds the directory is refused before any of its files is touched."""
    from dppo.config import load_config
    from dppo.config.load import load_config_with_source
    from dppo.run.lock import RETRY_S, RETRY_WAIT_S, HeldBy, RunLock, holder
    from dppo.run.run_dir import RunDir

    overrides, sets, data = request.overrides, request.sets, request.config_data
    config_path = request.config_path
    run_dir_arg = overrides.get("run.run_dir")
    resuming = request.resume or request.auto_resume
    resume_state = None
    if resuming and not run_dir_arg:
        given = config_path is not None or data is not None
        probe = load_config(config_path, overrides, sets, base=data) if given else None
        run_dir_arg = probe.run.run_dir if probe else None
        if not run_dir_arg:
            raise UsageError("--resume needs the run to continue: pass --run-dir DIR")
    if run_dir_arg:
        files = RunDir(run_dir_arg)
        if files.path.exists() and not files.path.is_dir():
            raise UsageError(f"run dir {str(files.path)!r} is a file; pass a directory to --run-dir")
        found = None
        if resuming and files.path.is_dir():
            from dppo.run.checkpoint import newest_intact  # imports torch: only when resuming

            found = newest_intact(files.checkpoints)
        if request.resume and found is None:
            raise UsageError(f"--resume: no intact checkpoint in {str(files.checkpoints)!r}; "
                             "start a new run without --resume or pass the right --run-dir")
        if found is not None:
            resume_state = found[1]
            if config_path is None and data is None and files.config.is_file():
                config_path = str(files.config)
    config, source = load_config_with_source(config_path, overrides, sets, base=data)
    if data is not None:
        source = "the config given to dppo.train"
    from dppo.run.callbacks import resolve_callbacks

    resolve_callbacks(config, request.callbacks)  # run.callbacks import and name functions: bad input else
    from dppo.envs.checks import check_env
    from dppo.envs.make import with_agents

    config = with_agents(config)  # many agents: each env copy's agents are columns of the batch
    from dppo.rl.spaces import check_first_observation, check_spaces

    checked = check_env(config)  # the env can be made, reset and stepped
    for obs_space, action_space, first in checked.values():
        obs_spec, action_spec = check_spaces(obs_space, action_space, config.model)  # its spaces are supported
        check_first_observation(obs_spec, action_spec, first, config.env.name)
    from dppo.rl.build import check_own_network

    check_own_network(config.model, checked.values())
    run_dir = resolve_run_dir(run_dir_arg or config.run.run_dir, config.env.name)
    files = RunDir(run_dir)
    if not request.auto_resume:  # a retried job waits for the attempt before it to let go (RunLock.acquire)
        check_free(run_dir, holder(run_dir))
    fresh_retry = request.auto_resume and resume_state is None
    if resume_state is None and not fresh_retry and files.holds_run():
        raise UsageError(f"run dir {str(run_dir)!r} already holds a run; pass --resume to continue it or another "
                         "--run-dir")
    if resume_state is not None:
        from dppo.run.checkpoint import check_resumable

        check_resumable(resume_state, config)
    files.check_writable()
    if config.metrics.port:
        from dppo.run.metrics import check_port

        check_port(config.metrics.host, config.metrics.port)
    config.run.run_dir = str(run_dir)
    lock = RunLock(run_dir)
    try:
        lock.acquire(RETRY_WAIT_S if request.auto_resume else RETRY_S)
    except HeldBy as held:
        check_free(run_dir, held.holder)  # a run that took the directory since the check above
    try:
        if resume_state is None and not fresh_retry and files.holds_run():  # ... and wrote its first iteration
            raise UsageError(f"run dir {str(run_dir)!r} already holds a run; pass --resume to continue it or another "
                         "--run-dir")
        if fresh_retry:  # a retried job that died before its first checkpoint: its progress lines describe lost work
            files.progress.unlink(missing_ok=True)
    except BaseException:
        lock.release(undo=True)
        raise
    return config, run_dir, resume_state, source, lock


def check_free(run_dir: Path, held: dict[str, Any] | None) -> None:
    """No live run holds ``run_dir`` (None), else the one line that names it."""
    from dppo.run.lock import describe

    if held is not None:
        raise UsageError(f"run dir {str(run_dir)!r} is in use by a run that is still going ({describe(held)}); wait "
                         "for it to end (dppo status shows it) or pass another --run-dir")


def start_line(config: Config, source: str, resumed: bool, ray_up: bool = False) -> str:
    """The run's first line, printed before Ray starts (seconds of silence otherwise): what trains, from which
    config, on how many processes, where. A setting left ``auto`` is said as configured, decided at start-up
    (:func:`ready_line` says what it became). ``ray_up``: this process is connected to Ray already (dppo.train after
    ray.init), which the run uses."""
    from dppo.run.logs import counted

    run = config.run
    device = (f"{learners(run.learners)} on {run.device}" if run.device != "auto"
              else f"{learners(run.learners)} device auto (decided at start-up)")
    inference = f"inference {INFERENCE['actor' if run.inference == 'auto' else run.inference]}"  # auto: the actors
    address = run.address or os.environ.get("RAY_ADDRESS")
    return (f"{'resuming' if resumed else 'training'} {config.env.name} from {source}: {counted(run.actors, 'actor')} "
            f"x {env_copies(config)}, {device}, {inference}, run dir {run.run_dir}; "
            + ("using the Ray this process initialised" if ray_up else
               f"joining Ray at {address}" if address else "starting a local Ray"))


def env_copies(config: Config) -> str:
    """Each actor's envs as the batch counts them: ``8 envs``; a multi-agent env's copies and the agents of each
    (its columns, :func:`dppo.envs.make.with_agents`): ``8 copies x 3 agents``, a turn-based game's ``8 copies x 1
    agent at a time``."""
    from dppo.run.logs import counted

    env = config.env
    if not env.multiagent:
        return counted(env.num_envs, "env")
    copies = f"{env.num_envs:,} {'copy' if env.num_envs == 1 else 'copies'}"
    columns = env.columns_per_copy or 1
    return f"{copies} x {counted(columns, 'agent')}" if columns > 1 else f"{copies} x 1 agent at a time"


def ready_line(coordinator: Coordinator, clock: PhaseClock) -> str:
    """Once the learners and actors are up: the seconds from launch (Ray's share apart) and what ``auto`` became."""
    from dppo.run.timing import seconds_since_process_start

    run = coordinator.config.run
    devices = "/".join(sorted({group.device for group in coordinator.learners.values()}))
    return (f"started in {seconds_since_process_start():.1f} s from launch (Ray {clock.phases['ray_init']:.1f} s): "
            f"{learners(run.learners)} on {devices}, inference {INFERENCE[run.inference]}"
            + (f" ({coordinator.inference_reason})" if coordinator.inference_reason else ""))


def learners(count: int) -> str:
    return "learner" if count == 1 else f"{count} learners"


def ray_initialized() -> bool:
    """Whether this process is connected to Ray already (a program that calls dppo.train after ray.init): the run
    then uses that Ray as it is, and leaves it so."""
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def start(config: Config, run_dir: Path, resume_state: dict[str, Any] | None, clock: PhaseClock,
          signals: StopSignals, callbacks: list[Callback] | None = None) -> Coordinator:
    """Start (or join) Ray and build the coordinator at the same time: a local Ray start is mostly waiting on
    the processes it launches, the build mostly torch's import and the model. Both run in helper threads (Ray's
    in one that outlives the run: see connect_ray_beside) while the main thread waits, free to take a stop at
    once. Phases: ``ray_init`` (with the build beside it), then ``learner``, what was left of the build; then
    the learners and actors start (``actors_ready``)."""
    import ray  # noqa: F401  (here: a stop cuts an import in the main thread short cleanly, not one in a thread)

    from dppo.distributed.cluster import connect_ray_beside

    def build() -> Coordinator:
        from dppo.run.coordinator import Coordinator

        coordinator = Coordinator(config, run_dir, resume_state, callbacks=callbacks)
        coordinator.signals = signals  # the process's handler, installed before anything started
        return coordinator

    pool = ThreadPoolExecutor(1, thread_name_prefix="coordinator-build")
    building = pool.submit(build)
    if not ray_initialized():
        connect_ray_beside(config).result()  # a UsageError in Ray's start is raised here
    clock.mark("ray_init")
    signals.install()  # again: Ray's start may have put handlers of its own in
    coordinator = building.result()  # a UsageError in the build is raised here
    clock.mark("learner")
    pool.shutdown(wait=False)
    coordinator.start()  # every actor made its envs: a module missing on a worker is bad input
    clock.mark("actors_ready")
    return coordinator


def train(coordinator: Coordinator, config: Config, resumed: bool, clock: PhaseClock,
          said: list[tuple[datetime, str]]) -> dict[str, Any]:
    """Write the run directory's first files (train.log begins with the lines ``said`` before it existed, at their
    times) and train; the summary (a RunFailure: the run failed)."""
    from dppo.errors import RunFailure

    coordinator.startup_s = clock.phases
    coordinator.run_dir.path.mkdir(parents=True, exist_ok=True)
    coordinator.run_dir.write_config(config.to_yaml())
    output = coordinator.reporter.output
    for at, text in said:
        output.to_file(text, at)
    if resumed:
        counters = coordinator.state.counters
        output.message(f"resuming {coordinator.run_dir.path} at iteration {counters.iteration}, "
                       f"{counters.env_steps:,} env steps")
    try:
        return coordinator.run()
    except RunFailure as err:
        if output.to_file(f"run failed: {err}" + (f"\n{err.details}" if err.details else "")) and err.details:
            raise RunFailure(f"{err}; the whole traceback is in {output.log_file}") from err  # one line
        raise
    finally:
        coordinator.shutdown()


# What a run survived, as its last line names it when nonzero: summary.json's key and the noun counted.
FAULTS_SAID = (("env_failures", "env failure"), ("actor_restarts", "actor restart"), ("node_losses", "lost node"),
               ("learner_restarts", "learner restart"), ("updates_skipped", "NaN/Inf update"),
               ("segments_dropped", "dropped segment"), ("hangs", "hang"))


def outcome_line(summary: dict[str, Any], signal_name: str | None, run_dir: Path) -> str:
    """The run's last line: how it ended (the signal's name for a stop), its return (and the final weights'
    evaluation, run.eval_every), steps, its seconds of training (a resumed run's earlier attempts included), this
    process's seconds from launch (Ray's start included), and what it survived (env failures, actor restarts, lost
    nodes...), so a run shorter than the env failures' count line (every 30 s) still says how many there were."""
    from dppo.run.logs import counted, format_return
    from dppo.run.timing import seconds_since_process_start

    verdict = "solved" if summary["solved"] else "stopped"
    reason = signal_name if summary["reason"] == "signal" else summary["reason"]
    mean, evaluated, steps = summary["episode_return_mean"], summary.get("eval_return_mean"), summary["env_steps"]
    if evaluated is not None:
        at = summary.get("eval_env_steps")  # None: a checkpoint older than the key
        which = ("the final weights" if at == steps else "earlier weights" if at is None
                 else f"the weights at {at:,} env steps")
        evaluated = f" (eval {format_return(evaluated)} of {which})"
    faults = [counted(summary[key], noun) for key, noun in FAULTS_SAID if summary.get(key)]
    return (f"{verdict} ({reason}): return {'-' if mean is None else format_return(mean)}{evaluated or ''}"
            + f" after {counted(steps, 'env step')}, {counted(summary['iterations'], 'iteration')}, "
            f"{summary['wall_s']:.1f} s training, {seconds_since_process_start():.1f} s from launch"
            + (f"; {', '.join(faults)}" if faults else "") + f" -> {run_dir / 'summary.json'}")




def launch(request: TrainRequest, signals: StopSignals) -> Outcome:
    """The run ``request`` asks for, from its checks to its last line, with ``signals`` installed by the caller.
    Raises UsageError (bad input: nothing written), :class:`~dppo.run.signals.Stopped` (a stop before training:
    nothing written; the caller ends what Ray it started) or RunFailure (the run failed, after a checkpoint)."""
    from dppo.envs.user_code import add_import_paths, driver_import_paths
    from dppo.run.logs import run_line
    from dppo.run.resumed import end_untrained, finished_before
    from dppo.run.signals import Stopped, stop_of
    from dppo.run.timing import PhaseClock

    clock = PhaseClock()  # start-up phases, reported in summary.json
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # A round abandoned when the run stops can hold other actors' errors; the run reports its own, once.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    coordinator = done = lock = None
    said: list[tuple[datetime, str]] = []  # the lines before the run dir exists, for train.log

    def say(text: str) -> None:
        run_line(text, config.run.log_format)
        said.append((datetime.now(timezone.utc), text))

    try:
        with signals.interrupting():  # until the run's files are written: a stop ends the run at once
            add_import_paths(driver_import_paths())  # a user's module beside them works as with `python -m`
            warnings.filterwarnings("ignore", module="gymnasium")  # env-checker chatter; errors still surface
            config, run_dir, resume_state, source, lock = prepare(request)
            clock.mark("config")
            done = finished_before(config, resume_state) if resume_state is not None else None
            if done is None:
                say(start_line(config, source, resume_state is not None, ray_initialized()))
                coordinator = start(config, run_dir, resume_state, clock, signals, request.callbacks)
                say(ready_line(coordinator, clock))
    except BaseException as err:  # nothing written yet: the run dir as it was found, its lock let go
        if lock is not None:
            lock.release(undo=True)
        signum = stop_of(err, signals)
        if signum is not None and not isinstance(err, Stopped):  # a stop, however it surfaced
            raise Stopped(signum) from err
        raise
    try:
        if coordinator is None:
            summary, output = end_untrained(config, run_dir, *done, clock)
        else:
            summary = train(coordinator, config, resume_state is not None, clock, said)
            output = coordinator.reporter.output
        line = outcome_line(summary, signals.name, run_dir)
        output.to_file(line)
        run_line(line, config.run.log_format)
        if coordinator is not None:
            if config.metrics.port and config.metrics.linger_s > 0:
                signals.sleep(config.metrics.linger_s)  # let Prometheus scrape the final values (a stop cuts it short)
            coordinator.reporter.metrics.shutdown()
    finally:
        lock.release()  # the run has ended: `dppo status` and a next run see the directory free
    return Outcome(summary, run_dir, signals.received)
