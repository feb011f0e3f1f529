"""The network a ``model`` config asks for, feed-forward or recurrent: the one place every process builds it
(the driver, each learner, each actor with a torch policy, ``dppo eval`` and ``dppo export``)."""

from __future__ import annotations

import gymnasium as gym

from dppo.config import ModelConfig
from dppo.rl.model import ActorCritic
from dppo.rl.recurrent import RecurrentActorCritic


def build_model(obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> ActorCritic:
    """``model.recurrent: lstm`` puts an LSTM core between the encoder and the heads; otherwise feed-forward;
    ``model.entry_point`` is a network of one's own (:mod:`dppo.rl.custom`, imported only then)."""
    if config.entry_point is not None:
        from dppo.rl.custom import OwnActorCritic

        return OwnActorCritic(obs_space, action_space, config)
    if config.recurrent == "lstm":
        return RecurrentActorCritic(obs_space, action_space, config)
    return ActorCritic(obs_space, action_space, config)
