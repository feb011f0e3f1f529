"""What a checkpoint holds, rebuilt outside training: the config, the model with its weights, and the
observation statistics it was trained with (``dppo eval`` and ``dppo export`` start here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from dppo.config import Config, validate
from dppo.envs.make import policy_spaces
from dppo.errors import first_line
from dppo.rl.build import build_model
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.run.checkpoint import CheckpointError, policy_entry


@dataclass
class TrainedModel:
    config: Config
    model: ActorCritic
    obs_stats: RunningStats | None


def trained_model(checkpoint: dict[str, Any], spaces: tuple[gym.Space, gym.Space] | None = None,
                  policy: str | None = None) -> TrainedModel:
    """The checkpoint's model of ``policy`` (default: its first, the only one without a policy map) for ``spaces``
    (default: the policy's in its env, made once to read them)."""
    config = validate(checkpoint["config"], warn=False)
    name = policy or config.policy_names[0]
    policy_entry(checkpoint, name)  # a policy the checkpoint has, before its env is made
    return _trained(checkpoint, config, name, spaces or policy_spaces(config)[name])


def trained_policies(checkpoint: dict[str, Any]) -> dict[str, TrainedModel]:
    """Every policy's model of the checkpoint, by name, in map order (one env made to read their spaces)."""
    config = validate(checkpoint["config"], warn=False)
    return {name: _trained(checkpoint, config, name, spaces) for name, spaces in policy_spaces(config).items()}


def _trained(checkpoint: dict[str, Any], config: Config, name: str, spaces: tuple[gym.Space, gym.Space]
             ) -> TrainedModel:
    entry = policy_entry(checkpoint, name)
    model = build_model(*spaces, config.model)
    load_weights(model, entry)
    stats = entry.get("obs_stats")
    return TrainedModel(config, model.eval(), RunningStats.from_state(stats) if stats else None)


def load_weights(model: ActorCritic, checkpoint: dict[str, Any]) -> None:
    """The checkpoint's weights (or one policy's entry's: :func:`policy_entry`) into ``model``, or CheckpointError:
    they were trained for another network."""
    try:
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, KeyError) as err:
        raise CheckpointError(f"the checkpoint does not fit this model ({first_line(err)}); use the run's own "
                              "config (env and model sections)") from None
