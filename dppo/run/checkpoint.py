"""Atomic checkpoints with a content hash: save, verify, keep the newest K, resume from the newest intact one.

File layout: ``MAGIC``, the SHA-256 of the payload in hex, a newline, then the ``torch.save`` payload.
A write goes to a temp file in the same directory, is fsynced and renamed into place, then the
``latest`` pointer is replaced the same way, so a crash at any moment leaves every named checkpoint
whole. Loading uses ``torch.load(weights_only=True)``: a checkpoint cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from pathlib import Path
from typing import Any

import torch

from dppo.errors import UsageError
from dppo.run.run_dir import atomic_write

MAGIC = b"DPPO-CKPT-1\n"
NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
BEST = "best.pt"  # the best evaluated weights (run.eval_every), beside the latest; never resumed from
log = logging.getLogger(__name__)


class CheckpointError(UsageError):
    """A checkpoint that is missing, truncated, corrupt or not a dppo checkpoint."""


def encode(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def decode(data: bytes, source: str) -> dict[str, Any]:
    """Verify the header and hash, then load with weights_only=True."""
    if not data.startswith(MAGIC):
        raise CheckpointError(f"{source} is not a dppo checkpoint; pass a ckpt-*.pt file from a run's checkpoints/")
    header_end = len(MAGIC) + 65
    digest, payload = data[len(MAGIC):header_end - 1].decode("ascii", "replace"), data[header_end:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{source} is truncated or corrupt (content hash mismatch); use an older checkpoint")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{source} cannot be loaded ({type(err).__name__}); use another checkpoint") from None


def load(path: str | Path, best: bool = False) -> dict[str, Any]:
    """A ckpt-*.pt file, or a run directory's newest intact checkpoint (``best``: its checkpoints/best.pt)."""
    path = Path(path)
    if best:
        if not path.is_dir():
            raise CheckpointError(f"--best needs a run directory, and {str(path)!r} is not one")
        path = (path / "checkpoints" if (path / "checkpoints").is_dir() else path) / BEST
        if not path.is_file():
            raise CheckpointError(f"no {BEST} in {str(path.parent)!r}: the run did not evaluate (run.eval_every) "
                                  "or no evaluation finished; drop --best for the latest checkpoint")
    if path.is_dir():
        found = newest_intact(path / "checkpoints" if (path / "checkpoints").is_dir() else path)
        if found is None:
            raise CheckpointError(f"no intact checkpoint in {str(path)!r}; pass a run dir or a ckpt-*.pt file")
        return found[1]
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} not found; pass an existing ckpt-*.pt file or run dir")
    return decode(path.read_bytes(), repr(str(path)))


class CheckpointStore:
    """The ``checkpoints/`` directory of a run."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep

    def save(self, state: dict[str, Any], iteration: int) -> Path:
        """Write ``ckpt-<iteration>.pt`` atomically, point ``latest`` at it, prune old ones."""
        path = self.directory / f"ckpt-{iteration:08d}.pt"
        atomic_write(path, encode(state))
        atomic_write(self.directory / "latest", path.name.encode() + b"\n")
        for old in self.list()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def save_best(self, state: dict[str, Any]) -> Path:
        """Write ``best.pt`` atomically (the same format; not a resume point, never pruned)."""
        path = self.directory / BEST
        atomic_write(path, encode(state))
        return path

    def newest_path(self, iteration: int) -> Path | None:
        """This iteration's checkpoint file if it is the newest on disk."""
        return self.directory / f"ckpt-{iteration:08d}.pt" if self.has(iteration) else None

    def has(self, iteration: int) -> bool:
        """This iteration's checkpoint is the newest on disk."""
        existing = self.list()
        return bool(existing) and existing[-1].name == f"ckpt-{iteration:08d}.pt"

    def list(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if NAME.match(p.name))

    def newest_intact(self) -> tuple[Path, dict[str, Any]] | None:
        return newest_intact(self.directory)


def newest_intact(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies; corrupt or truncated ones are skipped with a warning."""
    for path in reversed(CheckpointStore(directory, 1).list()):
        try:
            return path, decode(path.read_bytes(), repr(str(path)))
        except (CheckpointError, OSError) as err:
            log.warning("skipping checkpoint: %s", err)
    return None
