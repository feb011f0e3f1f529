"""The run directory: every file a run writes, by name, and the reading back of its progress and summary.

| file | written |
| --- | --- |
| ``config.yaml`` | once, when the actors are ready (the fully resolved config) |
| ``progress.jsonl`` | one JSON object per iteration (appended; cut back to the checkpoint on resume) |
| ``summary.json`` | at the end, atomically |
| ``checkpoints/`` | periodic and final checkpoints (:mod:`dppo.run.checkpoint`) |
| ``tensorboard/`` | TensorBoard event files |
| ``train.log`` | the stdout lines and messages, timestamped |
| ``run.lock`` | when the checks pass, before anything else: held by the live run (:mod:`dppo.run.lock`) |
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from dppo.errors import UsageError


def new_temp_file(path: Path) -> Path:
    """An empty, unique temp file beside ``path`` (same directory, so a rename replaces ``path`` atomically).

    Created with mode 0o666 and the process umask applied, as ``open()`` creates files: what a run writes
    (checkpoints, config.yaml, summary.json) and ``dppo export`` writes is readable by whoever may read the
    directory, e.g. the non-root user of the image it is copied into. (``tempfile.mkstemp`` makes 0o600 files.)
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temp file name beside {path}")


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that ``path`` is either the old content or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_file(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def strict_json(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/Inf become null so every line is strict JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


class RunDir:
    """The files of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.progress = self.path / "progress.jsonl"
        self.summary = self.path / "summary.json"
        self.checkpoints = self.path / "checkpoints"
        self.tensorboard = self.path / "tensorboard"
        self.log = self.path / "train.log"

    def check_writable(self) -> None:
        """The run can create and write its files here (checked before anything is written)."""
        existing = next(p for p in (self.path, *self.path.parents) if p.exists())
        if not existing.is_dir():
            raise UsageError(f"run dir {str(self.path)!r}: {str(existing)!r} is a file; pass a directory to --run-dir")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"run dir {str(self.path)!r} cannot be written ({str(existing)!r} is not writable by "
                             "this user); pass a --run-dir you can write to")

    def holds_run(self) -> bool:
        """A run has written iterations or a checkpoint here (one killed between its first checkpoint and its first
        progress line holds a run too: its --resume continues it)."""
        return self.progress.exists() or (self.checkpoints.is_dir() and any(self.checkpoints.iterdir()))

    def write_config(self, config_yaml: str) -> None:
        atomic_write(self.config, config_yaml.encode())

    def append_progress(self, record: dict[str, Any]) -> None:
        with open(self.progress, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def truncate_progress(self, iteration: int) -> int:
        """Drop progress lines written after ``iteration`` (the checkpoint a run resumes from), so iterations
        stay monotonic; a line cut short by a kill goes too. Returns the last iteration kept (0: none)."""
        if not self.progress.exists():
            return 0
        kept, last = [], 0
        for line in self.progress.read_text().splitlines():
            try:
                number = json.loads(line)["iteration"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if number <= iteration:
                kept.append(line + "\n")
                last = number
        atomic_write(self.progress, "".join(kept).encode())
        return last

    def read_progress(self) -> list[dict[str, Any]]:
        """The records of progress.jsonl; a torn last line (the run is still writing) is ignored."""
        lines = self.progress.read_text().splitlines()
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):
                    break
                raise UsageError(f"{self.progress}:{number} is not valid JSON; is this a dppo progress file?") from None
        return records

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.summary, (json.dumps(summary, indent=2) + "\n").encode())

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, or None when it is missing or unreadable (a run still going, or killed)."""
        try:
            data = json.loads(self.summary.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None
