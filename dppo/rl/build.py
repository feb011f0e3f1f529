"""The network a ``model`` config asks for, feed-forward or recurrent: the one place every process builds it
(the driver, each learner, each actor with a torch policy, ``dppo eval`` and ``dppo export``). Importing this module
imports no torch: the driver's checks call :func:`check_own_network` before its start-up imports torch beside Ray's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from dppo.config import ModelConfig

if TYPE_CHECKING:
    from dppo.rl.model import ActorCritic


def build_model(obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> ActorCritic:
    """``model.recurrent: lstm`` puts an LSTM core between the encoder and the heads; otherwise feed-forward;
    ``model.entry_point`` is a network of one's own (:mod:`dppo.rl.custom`)."""
    if config.entry_point is not None:
        from dppo.rl.custom import OwnActorCritic

        return OwnActorCritic(obs_space, action_space, config)
    if config.recurrent == "lstm":
        from dppo.rl.recurrent import RecurrentActorCritic

        return RecurrentActorCritic(obs_space, action_space, config)
    from dppo.rl.model import ActorCritic

    return ActorCritic(obs_space, action_space, config)


def check_own_network(config: ModelConfig, spaces: Iterable[tuple[gym.Space, gym.Space, Any]]) -> None:
    """Before anything starts: a network of one's own (``model.entry_point``) answers a dummy batch rightly for each
    policy's spaces (``dppo.envs.checks.check_env``'s values), else one line (:mod:`dppo.rl.custom`)."""
    if config.entry_point is not None:
        for obs_space, action_space, _first in spaces:
            build_model(obs_space, action_space, config)
