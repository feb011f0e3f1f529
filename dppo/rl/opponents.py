"""The opponents an actor's self-play games are played against: frozen snapshots of the policy, drawn per game
from the pool the driver broadcasts (:mod:`dppo.run.league` keeps it), each acting with its own seeded stream.

The pool travels as a :class:`PoolView` beside the weights each round (all of it, so a replacement actor needs
nothing else); the actor keeps one :class:`Agent` per snapshot, and one the pool dropped until the games still
played against it end. Opponents sample their actions (not the mode), so the learner meets the variety a
snapshot plays, and the action mask keeps them legal.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig
from dppo.envs.selfplay import RANDOM, Game, legal_random
from dppo.rl.agent import Agent, Weights


@dataclass
class PoolView:
    """The pool as the actors need it: each snapshot's id and weights, and the chance each is drawn."""

    ids: list[int] = field(default_factory=list)
    weights: list[Weights] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)


class SnapshotOpponents:
    """:class:`dppo.envs.selfplay.Opponents` from the broadcast pool; the random player until a pool arrives."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int,
                 epsilon: float = 0.0, opening: int = 0) -> None:
        """``epsilon``: selfplay.opponent_epsilon; ``opening``: selfplay.random_opening (0 outside training)."""
        self.obs_space, self.action_space, self.config, self.epsilon = obs_space, action_space, config, epsilon
        self.max_opening = opening
        self.rng = np.random.default_rng(seed)
        self.snapshots: dict[int, Agent] = {}  # snapshot id -> the Agent that plays it
        self.view = PoolView()

    def update(self, view: PoolView, in_play: Collection[int] = ()) -> None:
        """Take this round's pool: new snapshots get an Agent; dropped ones lose theirs once no game still in
        play (``in_play``: the opponents of the games going on) is against them. New games draw from ``view``."""
        for snapshot, weights in zip(view.ids, view.weights, strict=True):
            if snapshot not in self.snapshots:
                agent = Agent(self.obs_space, self.action_space, self.config, seed=int(self.rng.integers(2**62)))
                agent.load(weights, snapshot)
                self.snapshots[snapshot] = agent
        for snapshot in set(self.snapshots) - set(view.ids) - set(in_play):
            del self.snapshots[snapshot]
        self.view = view

    def draw(self, rng: np.random.Generator) -> int:
        if not self.view.ids:
            return RANDOM
        return int(self.view.ids[rng.choice(len(self.view.ids), p=np.asarray(self.view.probs))])

    def opening(self, rng: np.random.Generator) -> int:
        """0 to selfplay.random_opening random moves (drawn only when it is set: a run without keeps its stream)."""
        return int(rng.integers(self.max_opening + 1)) if self.max_opening else 0

    def act(self, opponent: int, games: list[Game]) -> list[Any]:
        observations = [game.observe() for game in games]
        if opponent == RANDOM:
            return [legal_random(obs, self.rng, self.action_space) for obs in observations]
        agent = self.snapshots[opponent]
        actions, _, _ = agent.act(agent.obs_spec.encode_many(observations))
        moves = list(agent.action_spec.to_env(actions))
        if self.epsilon:  # selfplay.opponent_epsilon: some moves random, drawn after the policy's (same stream)
            for i in np.flatnonzero(self.rng.random(len(moves)) < self.epsilon):
                moves[i] = legal_random(observations[i], self.rng, self.action_space)
        return moves
