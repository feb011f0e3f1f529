"""Checkpoints: what one holds, and how it is written and read back. The one module that knows the format.

A checkpoint (format 1) is a dict of types that ``torch.load(weights_only=True)`` accepts:

| key | what |
| --- | --- |
| ``format`` | :data:`FORMAT`; another one is refused on load (one line, exit 2) |
| ``env_id``, ``config`` | the env's name and the fully resolved config (``Config.model_dump(mode="json")``) |
| ``model`` | the model's ``state_dict`` |
| ``trainer`` | the Trainer's ``state_dict`` (Adam's state, the minibatch generator); None in ``best.pt`` |
| ``obs_stats``, ``return_stats``, ``counters``, ``recent_returns``, ``recent_lengths`` | the run's state |
|  | (:meth:`dppo.run.state.RunState.to_state`) |
| ``policies`` | only with several policies (a policy map): per policy, its ``model``, ``trainer``, ``obs_stats``, |
|  | ``return_stats``, ``recent_returns`` and ``recent_lengths``; ``model``, ``trainer`` and the statistics |
|  | above are then None. :func:`policy_entry` reads one policy's part of either kind. |
| ``league`` | self-play's snapshot pool, records and Elo ratings (:class:`dppo.run.league.League`); None else |
| ``progress`` | the iteration's progress record: a run killed after the checkpoint but before its line gets |
|  | it back on resume |

File layout: ``MAGIC``, the SHA-256 of the payload in hex, a newline, then the ``torch.save`` payload.
A write goes to a temp file in the same directory, is fsynced and renamed into place, then the
``latest`` pointer is replaced the same way, so a crash at any moment leaves every named checkpoint
whole. Files get the mode ``open()`` would give (0o666 less the umask): a checkpoint is something users
copy into images and share, like the exported policy. Loading uses ``torch.load(weights_only=True)``: a
checkpoint cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import ValidationError

from dppo.config import Config, ModelConfig
from dppo.errors import UsageError, checkpoint_not_found
from dppo.run.run_dir import atomic_write

if TYPE_CHECKING:
    from dppo.distributed.broadcast import Broadcast
    from dppo.run.state import RunState

MAGIC = b"DPPO-CKPT-1\n"
FORMAT = 1  # the layout above; bump it (and read the old one) when a key changes meaning
NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
BEST = "best.pt"  # the best evaluated weights (run.eval_every), beside the latest; never resumed from
log = logging.getLogger(__name__)


class CheckpointError(UsageError):
    """A checkpoint that is missing, truncated, corrupt or not a dppo checkpoint."""


class CheckpointFormatError(CheckpointError):
    """An intact checkpoint of a format this dppo does not read (written by another version)."""


def compose(state: RunState, models: dict[str, dict[str, Any]], trainers: dict[str, dict[str, Any] | None],
            record: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint of a run at this point: its config, each policy's weights and optimizer, and the run's state."""
    config = state.config
    checkpoint = {"format": FORMAT, "env_id": config.env.name, "config": config.model_dump(mode="json"),
                  "model": None, "trainer": None, **state.to_state(), "progress": record}
    if "policies" in checkpoint:
        for name, part in checkpoint["policies"].items():
            part.update(model=models[name], trainer=trainers[name])
    else:
        (name,) = models
        checkpoint.update(model=models[name], trainer=trainers[name])
    return checkpoint


def compose_best(state: RunState, broadcast: Broadcast | dict[str, Broadcast], record: dict[str, Any]
                 ) -> dict[str, Any]:
    """``best.pt``: the evaluated weights with the observation statistics they were evaluated with (those of their
    broadcast, not the run's newer ones), no optimizer state (never resumed from). ``broadcast``: the one policy's,
    or each policy's by name."""
    broadcasts = broadcast if isinstance(broadcast, dict) else {state.config.policy_names[0]: broadcast}
    weights = {name: {k: torch.from_numpy(np.array(v)) for k, v in b.weights.items()} for name, b in broadcasts.items()}
    checkpoint = compose(state, weights, dict.fromkeys(broadcasts), record)
    for name, b in broadcasts.items():
        policy_entry(checkpoint, name)["obs_stats"] = b.obs_stats.to_state() if b.obs_stats is not None else None
    return checkpoint


def policy_entry(checkpoint: dict[str, Any], name: str) -> dict[str, Any]:
    """One policy's part of a checkpoint (``model``, ``trainer``, ``obs_stats``, ``return_stats``): the entry under
    ``policies``, or, for a checkpoint of one policy, the checkpoint itself."""
    policies = checkpoint.get("policies")
    if policies is None:
        return checkpoint
    if name not in policies:
        raise CheckpointError(f"the checkpoint has no policy {name!r} (it has {', '.join(policies)}); name one of "
                              "those")
    return policies[name]


def check_resumable(checkpoint: dict[str, Any], config: Config) -> None:
    """A checkpoint resumes only into the same env and network shape (checked before anything is written)."""
    saved, wanted = checkpoint.get("env_id"), config.env.name
    if saved != wanted:
        raise CheckpointError(f"the checkpoint is for env {saved!r}, not {wanted!r}; resume with the run's own "
                              "config or start a new --run-dir")
    saved_policies = checkpoint.get("config", {}).get("policies") or {}
    if saved_policies != config.policies:
        raise CheckpointError(f"the checkpoint's policy map {saved_policies} differs from the config's "
                              f"{config.policies}; resume with the run's own policies section")
    saved_model = checkpoint.get("config", {}).get("model") or {}
    try:  # keys added since the checkpoint was written take their defaults
        same = ModelConfig.model_validate(saved_model) == config.model
    except ValidationError:
        same = False
    if not same:
        raise CheckpointError(f"the checkpoint's model settings {saved_model} differ from the config's; "
                              "resume with the run's own model section")


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
        checkpoint = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{source} cannot be loaded ({type(err).__name__}); use another checkpoint") from None
    found = checkpoint.get("format") if isinstance(checkpoint, dict) else None
    if found != FORMAT:
        raise CheckpointFormatError(f"{source} is a checkpoint of format {found!r} and this dppo reads format "
                                    f"{FORMAT}; load it with the dppo version that wrote it")
    return checkpoint


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
        raise CheckpointError(checkpoint_not_found(path))
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
    """The newest checkpoint that verifies; corrupt or truncated ones are skipped with a warning. One of another
    format stops the search (CheckpointFormatError): resuming silently from an older one would lose work."""
    for path in reversed(CheckpointStore(directory, 1).list()):
        try:
            return path, decode(path.read_bytes(), repr(str(path)))
        except CheckpointFormatError:
            raise
        except (CheckpointError, OSError) as err:
            log.warning("skipping checkpoint: %s", err)
    return None
