"""Per-iteration output: one flushed line on stdout (text or JSON), a live bar only on a terminal, and the
same lines appended to ``<run_dir>/train.log`` (a retried Kubernetes run loses its pods' logs, not this)."""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

TEXT_FIELDS = (
    ("iter", "iteration", "{:d}"), ("steps", "env_steps", "{:,d}"), ("steps/s", "steps_per_s", "{:,.0f}"),
    ("return", "episode_return_mean", "{return}"), ("episodes", "episodes", "{:d}"),
    ("pi_loss", "policy_loss", "{:.4f}"), ("v_loss", "value_loss", "{:.4f}"), ("entropy", "entropy", "{:.3f}"),
    ("kl", "approx_kl", "{:.4f}"), ("clip", "clip_fraction", "{:.3f}"), ("ev", "explained_variance", "{:.2f}"),
)

RUN_ONLY = ("iteration", "env_steps", "steps_per_s", "episodes")  # the run's, never a policy's


def _fmt(fmt: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format_return(value) if fmt == "{return}" else fmt.format(value)


def format_return(value: float) -> str:
    """Enough digits for the env's scale: 0.955 (MiniGrid), 12.34, 475.3 (CartPole), -1381.2 (Pendulum)."""
    size = abs(value)
    return f"{value:.{3 if size < 10 else 2 if size < 100 else 1}f}"


def counted(count: int, noun: str) -> str:
    """A count and its noun in the right number: ``1 episode``, ``2,048 env steps``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def run_line(text: str, log_format: str) -> None:
    """A line that frames the run (what starts, when it is up, how it ended): on stdout beside the iteration lines,
    flushed at once (a log reader sees it when it happens), or on stderr when stdout carries only JSON records."""
    print(text, file=sys.stderr if log_format == "json" else sys.stdout, flush=True)


POLICY_RETURN = "/episode_return_mean"  # a run of several policies: POLICY/episode_return_mean, POLICY/policy_loss..


def text_line(record: dict[str, Any]) -> str:
    """The run's fields; with several policies, the update's fields per policy: ``| adversary return=.. pi_loss=..``."""
    policies = [key.removesuffix(POLICY_RETURN) for key in record if key.endswith(POLICY_RETURN)]
    fields = [field for field in TEXT_FIELDS if not policies or field[1] in (*RUN_ONLY, "episode_return_mean")]
    line = " ".join(f"{label}={_fmt(fmt, record.get(key))}" for label, key, fmt in fields)
    for name in policies:
        line += f" | {name} " + " ".join(f"{label}={_fmt(fmt, record.get(f'{name}/{key}'))}"
                                         for label, key, fmt in TEXT_FIELDS if key not in RUN_ONLY)
    if "eval_return_mean" in record:  # an evaluation finished this iteration (run.eval_every)
        line += f" eval={_fmt('{return}', record['eval_return_mean'])}@{record['eval_env_steps']:,}"
    if "selfplay_elo" in record:  # self-play: the learner against its snapshot pool
        line += (f" win/draw/loss={_fmt('{:.2f}', record['selfplay_win_rate'])}/"
                 f"{_fmt('{:.2f}', record['selfplay_draw_rate'])}/{_fmt('{:.2f}', record['selfplay_loss_rate'])}"
                 f" elo={record['selfplay_elo']:.0f} pool={record['selfplay_pool_size']}")
    return line


class IterationLog:
    """Writes each iteration record to stdout; a rich progress bar when stdout is a TTY and format is text."""

    def __init__(self, log_format: str, total_steps: int, stream: TextIO | None = None,
                 log_file: Path | None = None) -> None:
        self.format = log_format
        self.stream = stream or sys.stdout
        self.log_file = log_file
        self.progress: Any = None
        if log_format == "text" and self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            # Fits 80 columns (checked in tmux): bar, env steps done/total, return, ETA from the env-step rate.
            self.progress = Progress(TextColumn("[bold]training"), BarColumn(bar_width=16), MofNCompleteColumn(),
                                     TextColumn("steps  {task.description}"), TextColumn("ETA"),
                                     TimeRemainingColumn(), transient=True)
            self.task = self.progress.add_task("", total=total_steps)
            self.progress.start()

    def to_file(self, text: str, at: datetime | None = None) -> bool:
        """Append a line stamped with its time (``at``, or now) to the run's log file (opened per line: the run dir
        may be new); False when there is no file to write (no run dir yet)."""
        if self.log_file is None or not self.log_file.parent.is_dir():
            return False
        stamp = (at or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(self.log_file, "a") as fh:
            fh.write(f"{stamp} {text}\n")
        return True

    def iteration(self, record: dict[str, Any]) -> None:
        self.to_file(text_line(record))
        if self.format == "none":
            return
        if self.format == "json":
            line = json.dumps(record, allow_nan=False, default=str)
        else:
            line = text_line(record)
        if self.progress is not None:
            self.progress.console.print(line, highlight=False)
            self.progress.update(self.task, completed=record["env_steps"],
                                 description=f"return {_fmt('{return}', record.get('episode_return_mean'))}")
        else:
            print(line, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """A non-iteration line (start, resume, actor restart, summary): stderr keeps stdout parseable."""
        self.to_file(text)
        if self.progress is not None:
            self.progress.console.print(text, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
