"""What a checkpoint holds, rebuilt outside training: the config, the model with its weights, and the
observation statistics it was trained with (``dppo eval`` and ``dppo export`` start here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from dppo.config import Config, validate
from dppo.envs.make import env_spaces
from dppo.errors import first_line
from dppo.rl.build import build_model
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.run.checkpoint import CheckpointError


@dataclass
class TrainedModel:
    config: Config
    model: ActorCritic
    obs_stats: RunningStats | None


def trained_model(checkpoint: dict[str, Any], spaces: tuple[gym.Space, gym.Space] | None = None) -> TrainedModel:
    """The checkpoint's model for ``spaces`` (default: its env's, made once to read them)."""
    config = validate(checkpoint["config"], warn=False)
    model = build_model(*(spaces or env_spaces(config)), config.model)
    load_weights(model, checkpoint)
    stats = checkpoint.get("obs_stats")
    return TrainedModel(config, model.eval(), RunningStats.from_state(stats) if stats else None)


def load_weights(model: ActorCritic, checkpoint: dict[str, Any]) -> None:
    """The checkpoint's weights into ``model``, or CheckpointError: they were trained for another network."""
    try:
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, KeyError) as err:
        raise CheckpointError(f"the checkpoint does not fit this model ({first_line(err)}); use the run's own "
                              "config (env and model sections)") from None
