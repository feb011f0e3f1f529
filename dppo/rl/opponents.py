"""The opponents an actor's self-play games are played against: frozen snapshots of the policy, drawn per game
from the pool the driver broadcasts (:mod:`dppo.run.league` keeps it), each acting with its own seeded stream.

The pool travels as a :class:`PoolView` beside the weights each round (all of it, so a replacement actor needs
nothing else); the actor keeps one :class:`Agent` per snapshot, and one the pool dropped until the games still
played against it end. Opponents sample their actions (not the mode), so the learner meets the variety a
snapshot plays, and the action mask keeps them legal.

The actor's :class:`SelfPlayGames` keeps all of this behind the envs its sampler makes: the sampler steps vector
envs and never learns that a game is played, against whom, or how it ended.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from dppo.config import Config, ModelConfig
from dppo.envs.make import make_vector_env
from dppo.envs.selfplay import RANDOM, Game, SelfPlayVectorEnv, legal_random
from dppo.rl.agent import Agent, Weights

OPPONENT_SEED_OFFSET = 500_009  # self-play opponents' stream: apart from every env's and half's seed of the actor


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


class SelfPlayGames:
    """One actor's self-play games, kept behind its sampler's envs. The sampler is given :meth:`make_envs`, which
    hands every self-play vector env it makes this actor's snapshot opponents (so a vector env the sampler recreates
    plays the same pool); :meth:`set_pool` takes each round's pool, :meth:`take_results` the games finished since.
    With an env that is not a two-player game it makes the env and holds nothing (no results: None).

    ``seed``: the sampler's (the opponents act on a stream of their own beside it); ``make_envs``: the factory
    wrapped (default :func:`make_vector_env`)."""

    def __init__(self, config: Config, seed: int, make_envs: Callable[[Config], VectorEnv] = make_vector_env) -> None:
        self.config, self.seed, self.wrapped = config, seed, make_envs
        self.opponents: SnapshotOpponents | None = None  # once a pool arrives; till then each env's random player
        self.made: list[SelfPlayVectorEnv] = []

    def make_envs(self, config: Config) -> VectorEnv:
        """The wrapped factory's vector env; a self-play one plays this actor's opponents once a pool arrived."""
        envs = self.wrapped(config)
        if isinstance(envs, SelfPlayVectorEnv):
            self.made = [*self.games, envs]
            if self.opponents is not None:  # a restart keeps the pool
                envs.opponents = self.opponents
        return envs

    @property
    def games(self) -> list[SelfPlayVectorEnv]:
        """The self-play vector envs in play, in the order made: a recreated one's predecessor is closed (its games,
        and the results it had not handed over, are gone with it)."""
        self.made = [envs for envs in self.made if not envs.closed]
        return self.made

    @property
    def snapshots(self) -> Collection[int]:
        """The ids of the snapshots this actor holds the weights of (a broadcast need not carry them again)."""
        return self.opponents.snapshots if self.opponents is not None else ()

    def set_pool(self, view: PoolView) -> None:
        """This round's opponent pool, drawn from by the games that start from now on (those going on keep their
        opponent, even one the pool dropped)."""
        games = self.games
        if not games:
            return
        if self.opponents is None:
            space, selfplay = games[0], self.config.selfplay
            self.opponents = SnapshotOpponents(space.single_observation_space, space.single_action_space,
                                               self.config.model, self.seed + OPPONENT_SEED_OFFSET,
                                               selfplay.opponent_epsilon, selfplay.random_opening)
        self.opponents.update(view, {game.opponent for envs in games for game in envs.games})
        for envs in games:
            envs.opponents = self.opponents

    def take_results(self) -> np.ndarray | None:
        """The games finished since the last call, as (opponent id, score) rows (float64, (games, 2)); None
        without self-play envs."""
        parts = [envs.take_results() for envs in self.games]
        return np.array([row for part in parts for row in part], np.float64).reshape(-1, 2) if parts else None
