"""A local run directory read back for ``dppo status RUN_DIR``: running or ended, how far it got, what it survived,
its newest checkpoint and why it ended. Reads only (no Ray, no torch): a run going on is the one holding the
directory's lock (:mod:`dppo.run.lock`); an ended one has summary.json; one that neither holds nor has a summary was
killed (its ``--resume`` goes on from the newest checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dppo.errors import UsageError
from dppo.run.lock import LOCK_NAME, describe, holder
from dppo.run.run_dir import RunDir

# summary.json's reason -> the state it leaves the run in, and that reason in words.
ENDED = {"target_return": ("solved", "reached its target return"),
         "total_steps": ("finished", "trained its total steps"),
         "time_limit": ("finished", "spent its time limit"),
         "signal": ("stopped", "stopped by a signal (Ctrl-C, SIGTERM); --resume continues it"),
         "error": ("failed", "failed")}


@dataclass(frozen=True)
class LocalRun:
    """One run directory as ``dppo status`` shows it; None where the run has not said (yet)."""

    run_dir: str
    state: str  # running, solved, finished, stopped, failed, killed
    env: str | None
    iteration: int | None
    env_steps: int | None
    episode_return_mean: float | None
    env_failures: int | None
    actor_restarts: int | None  # summary.json's: a running run says them when it ends
    hangs: int | None
    last_checkpoint: str | None
    why: str


def is_run_dir(path: Path) -> bool:
    files = RunDir(path)
    return path.is_dir() and any(p.exists() for p in (files.config, files.progress, files.summary, path / LOCK_NAME))


def runs_under(root: Path) -> list[Path]:
    """The run directories directly under ``root`` (./runs by default), by name."""
    return sorted(p for p in root.iterdir() if is_run_dir(p)) if root.is_dir() else []


def read_run(path: Path) -> LocalRun:
    """The state of the run in ``path`` (a UsageError when it is not a run directory)."""
    if not is_run_dir(path):
        raise UsageError(f"{str(path)!r} is not a dppo run directory (no config.yaml, progress.jsonl or summary.json); "
                         "pass the --run-dir of a dppo train")
    files = RunDir(path)
    last = files.read_progress()[-1:] if files.progress.is_file() else []
    record = last[0] if last else {}
    live = holder(path)
    summary = None if live is not None else files.read_summary()  # a resumed run's old summary is not its state
    if live is not None:
        state, why = "running", f"running: {describe(live)}"
    elif summary is not None:
        state, why = ENDED.get(summary.get("reason"), ("ended", str(summary.get("reason"))))
        if state == "failed":
            why = failure_line(files.log) or why
    else:
        state, why = "killed", ("ended without a summary (killed, or its machine lost); --resume continues it from "
                                "the newest checkpoint" if record else "ended before its first iteration")
    checkpoints = sorted(files.checkpoints.glob("ckpt-*.pt")) if files.checkpoints.is_dir() else []
    ended = summary or {}
    return LocalRun(
        run_dir=str(path), state=state, env=env_name(files, summary),
        iteration=ended.get("iterations", record.get("iteration")),
        env_steps=ended.get("env_steps", record.get("env_steps")),
        episode_return_mean=ended.get("episode_return_mean", record.get("episode_return_mean")),
        env_failures=ended.get("env_failures", record.get("env_failures")),
        actor_restarts=ended.get("actor_restarts") if summary else None,
        hangs=ended.get("hangs", 0) if summary else None,  # summaries written before hangs were counted: none
        last_checkpoint=checkpoints[-1].name if checkpoints else None, why=why)


def env_name(files: RunDir, summary: dict[str, Any] | None) -> str | None:
    """The env the run trains: summary.json's, else the config's id or entry point."""
    if summary and summary.get("env"):
        return str(summary["env"])
    try:
        env = (yaml.safe_load(files.config.read_text()) or {}).get("env") or {}
    except (OSError, yaml.YAMLError):
        return None
    return env.get("id") or env.get("entry_point")


def failure_line(log: Path) -> str | None:
    """The ``run failed: ...`` line a failed run left in train.log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line[line.index("run failed: "):] for line in lines if "run failed: " in line]
    return found[-1] if found else None
