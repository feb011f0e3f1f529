"""A user's own env: importing this package registers ``DppoExample/Corridor-v0``.

Train it with ``dppo train --env dppo_example_env:DppoExample/Corridor-v0``: dppo imports the module
(in the learner and in every actor), which registers the id, then makes the env.
"""

import gymnasium as gym

from dppo_example_env.corridor import CorridorEnv

__all__ = ["CorridorEnv"]

if "DppoExample/Corridor-v0" not in gym.registry:
    gym.register("DppoExample/Corridor-v0", entry_point=CorridorEnv, max_episode_steps=30)
