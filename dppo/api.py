"""dppo from Python: :func:`train` a policy and :func:`load` it to act, the way `dppo train` and `dppo eval` do.

``dppo train`` is a thin layer over the same path (:mod:`dppo.run.launch`): one validation, one order of checks, and
bad input raised as :class:`~dppo.errors.UsageError` whose message is the command's one line. Ray: the one this
process initialised already (``ray.init`` before ``dppo.train``) is used and left as it is; else ``address=`` (or
RAY_ADDRESS) is joined and left at the end; else a local Ray is started and stopped.

Ctrl-C (SIGINT) ends the run as it ends ``dppo train``: the round in progress, then a final checkpoint and
summary.json (reason ``signal``), with nothing left running; then KeyboardInterrupt is raised (what a script or a
notebook expects of Ctrl-C: uncaught, it ends the process by SIGINT, status 130 in a shell, as `dppo train` exits),
its ``result`` attribute holding the run's result. A stop before training started writes nothing and raises it with
``result`` None. SIGTERM ends the run alike and raises SystemExit(143), as the command exits.
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.errors import UsageError
from dppo.run.launch import TRAIN_FLAGS, TrainRequest

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.run.callbacks import IterationInfo
    from dppo.run.trained_policy import TrainedPolicy

START_WAIT_S = 60.0  # a stop while a local Ray starts: how long its start may take to end before it is killed
FLAG_OF = {key: flag for flag, key in TRAIN_FLAGS.items()}  # config key -> dppo.train's argument


@dataclass
class TrainResult:
    """What a finished run left: its directory and what is in it."""

    run_dir: Path
    summary: dict[str, Any]  # summary.json
    reason: str  # how it ended: target_return, total_steps, time_limit, signal, or a callback's reason
    solved: bool  # the target return was reached
    last_checkpoint: Path | None  # the newest checkpoint (the final one)
    best_checkpoint: Path | None  # checkpoints/best.pt: the best evaluated weights (run.eval_every), else None
    progress: list[dict[str, Any]]  # progress.jsonl, one dict per iteration

    @classmethod
    def read(cls, run_dir: Path, summary: dict[str, Any]) -> TrainResult:
        from dppo.run.checkpoint import BEST, CheckpointStore
        from dppo.run.run_dir import RunDir

        files = RunDir(run_dir)
        checkpoints = CheckpointStore(files.checkpoints, 1).list()
        best = files.checkpoints / BEST
        progress = files.read_progress() if files.progress.is_file() else []
        return cls(files.path, summary, summary["reason"], bool(summary["solved"]),
                   checkpoints[-1] if checkpoints else None, best if best.is_file() else None, progress)


def train(config: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None, *,
          callbacks: Sequence[Callable[[IterationInfo], Any]] | None = None,
          overrides: Mapping[str, Any] | None = None, resume: bool = False, auto_resume: bool = False,
          **flags: Any) -> TrainResult:
    """Train a policy with PPO, as ``dppo train`` does; the run's :class:`TrainResult`.

    ``config``: a YAML file, a dict of sections (``{"env": {"id": "CartPole-v1"}, "ppo": {...}}``) or a
    :class:`dppo.config.Config`; None: the bundled preset for ``env`` (CartPole-v1 without one). ``flags``: the
    command's flags by name: ``env``, ``actors``, ``envs_per_actor``, ``segment_length``, ``total_steps``,
    ``target_return``, ``time_limit``, ``seed``, ``run_dir``, ``metrics_port``, ``address``, ``log_format``,
    ``tensorboard``. ``overrides``: any config key by its dotted name, as ``--set`` (``{"ppo.learning_rate": 3e-4}``).
    ``callbacks``: functions called after each iteration with a :class:`dppo.IterationInfo` (after run.callbacks');
    one may end the run by raising :class:`dppo.StopRun` or returning False. ``resume``/``auto_resume``: as
    ``--resume``/``--auto-resume``. Raises UsageError (bad input, nothing written), RunFailure (the run failed,
    after a checkpoint) or KeyboardInterrupt (Ctrl-C; see the module's docstring).
    """
    request = train_request(config, callbacks, overrides, resume, auto_resume, flags)
    from dppo.run.launch import launch, ray_initialized
    from dppo.run.signals import STOP_SIGNALS, Stopped, StopSignals

    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} if main else {}
    signals = StopSignals()
    signals.install()  # off the main thread nothing is installed: the program that runs this one has the signals
    ours = not ray_initialized()  # a Ray this call starts or joins is this call's to leave
    try:
        outcome = launch(request, signals)
    except Stopped as stop:
        leave_ray(ours, stopped=not (request.overrides.get("run.address") or os.environ.get("RAY_ADDRESS")))
        raise stop_exception(stop.signum, None) from None
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        leave_ray(ours)
    result = TrainResult.read(outcome.run_dir, outcome.summary)
    if outcome.signal is not None:
        raise stop_exception(outcome.signal, result)
    return result


def stop_exception(signum: int, result: TrainResult | None) -> BaseException:
    """What a stop signal raises once the run has ended: SIGINT a KeyboardInterrupt whose ``result`` is the run's
    (itself, not a subclass: Python ends by SIGINT only on that), SIGTERM SystemExit(143), the command's exit code."""
    if signum != signal.SIGINT:
        return SystemExit(128 + signum)
    said = "" if result is None else (f" after {result.summary['iterations']} iterations; the final checkpoint is in "
                                      f"{result.run_dir}")
    stop = KeyboardInterrupt(f"the run was stopped by SIGINT{said}")
    stop.result = result  # type: ignore[attr-defined]
    return stop


def leave_ray(ours: bool, stopped: bool = False) -> None:
    """Leave the Ray this call started or joined (a local one's processes stop with it); ``stopped``: a stop cut a
    local Ray's start short, so it may still be coming up in its thread: its processes are ended too."""
    ray = sys.modules.get("ray")
    if not ours or ray is None:
        return
    if stopped:
        from dppo.distributed.cluster import wait_for_start

        wait_for_start(START_WAIT_S)
    if ray.is_initialized():
        ray.shutdown()
    if stopped:
        from dppo.distributed.cluster import kill_ray_children

        kill_ray_children()  # what a start that did not finish in time left


def train_request(config: Any, callbacks: Sequence[Any] | None, overrides: Mapping[str, Any] | None, resume: bool,
                  auto_resume: bool, flags: dict[str, Any]) -> TrainRequest:
    """dppo.train's arguments as the run they ask for; UsageError for an argument it does not take."""
    for name in flags:
        if name not in TRAIN_FLAGS:
            raise UsageError(unknown_argument(name))
    if isinstance(callbacks, (str, bytes)) or (callbacks is not None and not isinstance(callbacks, Sequence)):
        raise UsageError(f"callbacks={callbacks!r}: pass a list of functions, e.g. callbacks=[stop_when_solved]")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise UsageError(f"overrides={overrides!r}: pass a dict of dotted config keys, e.g. "
                         "overrides={'ppo.learning_rate': 3e-4}")
    given = {TRAIN_FLAGS[name]: plain(value) for name, value in flags.items()}
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not key:
            raise UsageError(f"overrides: key {key!r} is not a config key; write e.g. {{'ppo.learning_rate': 3e-4}}")
        if key in given:
            raise UsageError(f"{FLAG_OF[key]}= and overrides[{key!r}] both set {key}; keep one")
        given[key] = plain(value)
    return TrainRequest(*config_source(config), overrides=given, resume=resume, auto_resume=auto_resume,
                        callbacks=list(callbacks or []))


def plain(value: Any) -> Any:
    """A path given as a Path is its string, as a config holds it."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def config_source(config: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(a YAML path, a config dict) from dppo.train's ``config``."""
    from dppo.config import Config

    if config is None:
        return None, None
    if isinstance(config, (str, os.PathLike)):
        return os.fspath(config), None
    if isinstance(config, Config):
        return None, config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return None, json.loads(json.dumps(dict(config), default=str))  # the caller's dict stays untouched
    raise UsageError(f"config: a {type(config).__name__} is no config; pass a YAML file's path, a dict of sections "
                     "or a dppo.config.Config")


def unknown_argument(name: str) -> str:
    """The line for an argument dppo.train does not take, with the one meant when it is close or a config key."""
    from dppo.config.load import ALIASES

    key = ALIASES.get(name)
    if key is not None:
        meant = f"{FLAG_OF[key]}=" if key in FLAG_OF else f"overrides={{{key!r}: ...}}"
    else:
        close = difflib.get_close_matches(name, list(TRAIN_FLAGS), n=2)
        meant = " or ".join(f"{flag}=" for flag in close) if close else None
    hint = f"; did you mean {meant}?" if meant else ""
    return (f"dppo.train() got an unknown argument {name!r}{hint} (it takes config, the flags of dppo train "
            f"({', '.join(TRAIN_FLAGS)}), overrides={{'section.key': value}}, callbacks, resume, auto_resume)")


def load(path: str | os.PathLike[str], *, best: bool = False, seed: int | None = None) -> TrainedPolicy:
    """The trained policy of a run directory (its newest intact checkpoint; ``best``: checkpoints/best.pt) or of a
    ckpt-*.pt file, ready to ``act(obs)``; UsageError in one line for a path that holds none."""
    from dppo.envs.user_code import add_import_paths, driver_import_paths
    from dppo.run.checkpoint import load as load_checkpoint
    from dppo.run.trained_policy import TrainedPolicy

    checkpoint = load_checkpoint(os.fspath(path), best=best)
    add_import_paths(driver_import_paths())  # the run's env module, to read its spaces
    return TrainedPolicy(checkpoint, seed)
