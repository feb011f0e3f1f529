"""One run per run directory: ``run.lock`` in it, held with ``flock`` by the process that trains there.

The kernel releases a ``flock`` when the process that holds it ends, however it ends (a crash, SIGKILL, a lost
pod), so a dead run never blocks its own ``--resume``; a live one refuses a second run into its directory with
one line that names it (host, pid, since: the file's content). The lock is a file descriptor opened
close-on-exec, so Ray's processes, started by the run, do not inherit it and cannot keep it after the run ends.
``dppo status`` tells a running run from an ended one by the same lock (:func:`holder`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LOCK_NAME = "run.lock"
RETRY_S = 0.5  # a `dppo status` holds the lock shared for microseconds: a start does not take that for a run
# A retried job (--auto-resume) waits this long for the attempt before it: a network file system (a PVC) frees a dead
# client's lock only when its lease ends (NFS: 90 s).
RETRY_WAIT_S = 180.0


class HeldBy(Exception):
    """Another live process holds the run directory; ``holder`` is what it wrote in the lock file."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__(describe(holder))
        self.holder = holder


def describe(holder: dict[str, Any]) -> str:
    """The holder in words: ``pid 4242 on host-a since 2026-11-29 00:41:07 UTC``."""
    if not holder:
        return "another process (it has not written its name yet)"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"


def read_holder(path: Path) -> dict[str, Any]:
    """What the lock file says of its last holder; {} when it is empty or unreadable."""
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def holder(run_dir: Path) -> dict[str, Any] | None:
    """The live process that holds ``run_dir`` (what it wrote of itself), or None when none does. Reads only: a
    shared lock taken and let go at once, which a holder's exclusive one refuses."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(path)
    except OSError:  # a file system without locks: nothing can be told
        return None
    finally:
        os.close(fd)  # closing lets a taken shared lock go
    return None


class RunLock:
    """The lock of one run directory, held until the process ends (or :meth:`release`)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.fd: int | None = None
        self.made: list[Path] = []  # what acquire() created (directories, then the file): release(undo=True) removes

    def acquire(self, wait_s: float = RETRY_S) -> None:
        """Take the lock (creating the directory and the file if needed), waiting up to ``wait_s`` for it;
        :class:`HeldBy` when a live process has it still. A file system that cannot lock (some network mounts) runs
        unlocked, as before locks existed."""
        missing = [p for p in (self.run_dir, *self.run_dir.parents) if not p.exists()]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.made = list(reversed(missing))  # parents first
        if not self.path.exists():
            self.made.append(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(min(0.05 + wait_s / 100, 1.0))
                    continue
                os.close(fd)
                self.made = [p for p in self.made if p != self.path]  # the holder's file: not ours to remove
                self.release(undo=True)
                raise HeldBy(read_holder(self.path)) from None
            except OSError as err:
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                break
        self.fd = fd
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since}) + "\n").encode(),
                  0)

    def release(self, undo: bool = False) -> None:
        """Let the lock go; with ``undo`` first remove what acquire() created (the run ended before writing
        anything: nothing of it stays). The file goes while still held, so no other run locks it in between; a
        directory goes only while empty."""
        for path in reversed(self.made if undo else []):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                break  # something else was written there meanwhile: it stays, and what holds it
        self.made = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
