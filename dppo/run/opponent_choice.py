"""``dppo eval --opponent``: who a self-play checkpoint plays against, as the user names it.

``random`` (uniform legal moves), ``minimax`` or ``minimax:DEPTH`` (:mod:`dppo.envs.minimax`), ``snapshot:N``
(snapshot N of the checkpoint's own pool, ``snapshot:latest`` its newest) or the path of another checkpoint or
run directory of the same game. Anything else is one line naming the choices (exit 2).
"""

from __future__ import annotations

from typing import Any

from dppo.config import Config, ModelConfig
from dppo.envs.selfplay import Opponents
from dppo.errors import UsageError
from dppo.rl.agent import export_weights
from dppo.rl.opponents import PoolView, SnapshotOpponents
from dppo.run.league import League

CHOICES = "random, minimax, minimax:DEPTH, snapshot:N, snapshot:latest or the path of a checkpoint of the same game"


def _snapshot(checkpoint: dict[str, Any], config: Config, which: str) -> tuple[int, Any]:
    saved = checkpoint.get("league")
    if saved is None or not saved["snapshots"]:
        raise UsageError("--opponent snapshot:...: this checkpoint has no snapshot pool (a run of a two-player game "
                         "saves one); use --opponent random or minimax")
    league = League(config.selfplay)
    league.restore(saved)
    ids = [s.id for s in league.snapshots]
    if which == "latest":
        return ids[-1], league.snapshots[-1].weights
    try:
        return int(which), league.snapshot(int(which)).weights
    except (ValueError, KeyError):
        raise UsageError(f"--opponent snapshot:{which}: the pool holds snapshots {ids}; name one of them or "
                         "snapshot:latest") from None


def _other_checkpoint(path: str, config: Config, spaces: tuple[Any, Any]) -> tuple[Any, ModelConfig]:
    """Another run's weights and the model settings they were trained with (its network, not this one's)."""
    from dppo.run.checkpoint import load
    from dppo.run.trained import trained_model

    other = load(path)
    if other.get("env_id") != config.env.name:
        raise UsageError(f"--opponent {path}: that checkpoint is for env {other.get('env_id')!r}, not "
                         f"{config.env.name!r}; name a checkpoint of the same game")
    trained = trained_model(other, spaces)
    return export_weights(trained.model), trained.config.model


def make_opponents(spec: str, checkpoint: dict[str, Any], config: Config, spaces: tuple[Any, Any],
                   seed: int) -> Opponents:
    """The opponent ``spec`` names, for the checkpoint's game (``spaces``: its observation and action space)."""
    from dppo.envs.make import fixed_opponents

    kind, _, arg = spec.partition(":")
    if kind in ("random", "minimax"):
        return fixed_opponents(spec, config.env, spaces[1], seed)
    model = config.model
    if kind == "snapshot":
        snapshot, weights = _snapshot(checkpoint, config, arg)
    elif "/" in spec or spec.endswith(".pt") or spec == ".":
        snapshot, (weights, model) = 0, _other_checkpoint(spec, config, spaces)
    else:
        raise UsageError(f"--opponent {spec!r} is not an opponent; use {CHOICES}")
    opponents = SnapshotOpponents(*spaces, model, seed)
    opponents.update(PoolView([snapshot], [weights], [1.0]))
    return opponents
