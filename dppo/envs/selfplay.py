"""Two-player turn-based games (PettingZoo's AEC API: ``pettingzoo.classic.tictactoe_v3``, ``connect_four_v3``)
as one learner sees them in self-play: the learner takes one seat, an opponent the other, and the opponent's moves
happen inside ``step``. So the sampler, the update and the masks work as for any single-agent env.

Who the opponent is, is not this module's business: an :class:`Opponents` draws one per game and acts for it.
In training they are frozen snapshots of the policy (:mod:`dppo.rl.opponents`, the pool from
:mod:`dppo.run.league`); before any snapshot arrives, and in ``dppo eval`` unless told otherwise, a uniformly
random player (:class:`RandomOpponents`). The learner's seat is drawn per game, so it learns both sides, and the
opponents may have a game begin with a few random moves of both players (selfplay.random_opening).

A game's reward is the learner's: what the env gives it for its own move and for the opponent's reply, summed.
Each finished game is a result ``(opponent id, score)`` with score 1 for a win, 0.5 for a draw, 0 for a loss (the
sign of the learner's return), which the driver turns into win rates and Elo.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from dppo.envs.failures import describe, fresh_copy
from dppo.envs.user_code import EnvLoadError
from dppo.errors import UsageError

if TYPE_CHECKING:
    from pettingzoo import AECEnv

RANDOM = -1  # the opponent id of the uniformly random player
MAX_REPLIES = 1_000  # opponent moves in a row before the game is called broken (a game that never returns the turn)


class Opponents(Protocol):
    """Who plays the learner's opponent: drawn per game, acting for a batch of that opponent's games at once; and
    how each game opens."""

    def draw(self, rng: np.random.Generator) -> int:
        """The id of the next game's opponent."""
        ...

    def opening(self, rng: np.random.Generator) -> int:
        """How many uniformly random moves the next game starts with (selfplay.random_opening; 0 for a fixed
        player)."""
        ...

    def act(self, opponent: int, games: list[Game]) -> list[Any]:
        """Actions of ``opponent`` in its games, each waiting for its move (``game.observe()``: the observation,
        with the action mask, as the env gives it; ``game.env``: the game itself, for a search)."""
        ...


def legal_random(observation: Any, rng: np.random.Generator, space: gym.Space) -> Any:
    """A uniformly random legal action: among the mask's ones when the observation has one."""
    mask = observation.get("action_mask") if isinstance(observation, dict) else None
    if mask is not None:
        return int(rng.choice(np.flatnonzero(np.asarray(mask))))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    raise UsageError(f"the random player needs a Discrete action space or an action mask, not {space}")


class RandomOpponents:
    """The uniformly random legal player (id :data:`RANDOM`), drawing from ``rng`` (a seed, or the env's own
    generator so a seeded env replays its games)."""

    def __init__(self, action_space: gym.Space, rng: np.random.Generator | int | None = None) -> None:
        self.space = action_space
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def draw(self, rng: np.random.Generator) -> int:
        return RANDOM

    def opening(self, rng: np.random.Generator) -> int:
        return 0

    def act(self, opponent: int, games: list[Game]) -> list[Any]:
        return [legal_random(game.observe(), self.rng, self.space) for game in games]


def two_player_spaces(env: AECEnv, name: str) -> tuple[gym.Space, gym.Space]:
    """The one observation and action space both seats share, or UsageError (one policy plays both sides)."""
    players = list(env.possible_agents)
    if len(players) != 2:
        raise EnvLoadError(f"env {name!r} is a turn-based (AEC) env with {len(players)} players; dppo trains AEC games "
                           "of two players by self-play: if its agents can act at once, name its parallel_env or add "
                           "env.wrappers: [pettingzoo.utils.conversions:aec_to_parallel]")
    spaces = [(env.observation_space(p), env.action_space(p)) for p in players]
    if spaces[0] != spaces[1]:
        raise EnvLoadError(f"env {name!r}: the players {players[0]!r} and {players[1]!r} have different spaces "
                           f"({spaces[0]} vs {spaces[1]}); self-play needs one policy for both seats: pad them to one")
    return spaces[0]


class Game:
    """One copy of the AEC env: the learner's seat, this game's opponent and the learner's reward since its last
    move."""

    def __init__(self, env: AECEnv, guarded: bool = False) -> None:
        self.env = env
        self.guarded = guarded  # a move that raises ends the game as a failure (its vector env recreates it)
        self.failure: tuple[str, str] | None = None  # (line, traceback) of the move that raised
        self.players = list(env.possible_agents)
        self.learner, self.opponent, self.reward, self.total = self.players[0], RANDOM, 0.0, 0.0
        self.seed: int | None = None
        self.history: list[Any] = []  # the moves since the reset: a search replays them (the env has no copy)
        self.opening = 0  # the random moves this game opened with (selfplay.random_opening)

    def reset(self, seed: int | None, seat: int, opponent: int) -> None:
        self.env.reset(seed=seed)
        self.failure = None
        self.learner, self.opponent, self.reward, self.total = self.players[seat], opponent, 0.0, 0.0
        self.seed, self.history, self.opening = seed, [], 0

    def restart(self) -> None:
        """The same game (seed, seat, opponent) from its first move, without an opening."""
        self.reset(self.seed, self.players.index(self.learner), self.opponent)

    @property
    def over(self) -> bool:
        env = self.env
        if self.failure is not None or not env.agents:
            return True
        return env.terminations.get(self.learner, True) or env.truncations.get(self.learner, True)

    @property
    def truncated(self) -> bool:
        """Cut by a time limit, or by a move that raised (never a terminal state of the game)."""
        if self.failure is not None:
            return True
        return bool(self.env.truncations.get(self.learner, False)) and not self.env.terminations.get(self.learner)

    @property
    def opponent_to_move(self) -> bool:
        return not self.over and self.env.agent_selection != self.learner

    def observe(self) -> Any:
        """The observation of the player to move (the learner's, when the game is over)."""
        return self.env.observe(self.learner if self.over else self.env.agent_selection)

    def play(self, action: Any) -> None:
        if self.failure is not None:
            return
        try:
            self.env.step(action)
        except Exception as err:
            if not self.guarded:
                raise
            self.failure = (describe(err), traceback.format_exc())
            return
        self.history.append(action)
        reward = float(self.env.rewards.get(self.learner, 0.0))
        self.reward += reward
        self.total += reward

    def take_reward(self) -> float:
        reward, self.reward = self.reward, 0.0
        return reward

    @property
    def score(self) -> float:
        """1 win, 0.5 draw, 0 loss: the sign of the learner's return."""
        return 1.0 if self.total > 0 else 0.0 if self.total < 0 else 0.5


def settle(games: Sequence[Game], opponents: Opponents) -> None:
    """Play the opponents' moves until every game waits for the learner or is over; each opponent acts for all of
    its games at once (one forward pass per snapshot)."""
    for _ in range(MAX_REPLIES):
        waiting = [game for game in games if game.opponent_to_move]
        if not waiting:
            return
        for opponent in sorted({game.opponent for game in waiting}):
            mine = [game for game in waiting if game.opponent == opponent]
            for game, action in zip(mine, opponents.act(opponent, mine), strict=True):
                game.play(action)
    raise RuntimeError(f"the opponent moved {MAX_REPLIES} times in a row without the game giving the learner a turn")


class SelfPlayVectorEnv(VectorEnv):
    """E copies of a two-player AEC game, the learner's seat in each; gymnasium's SAME_STEP autoreset (the last
    observation of a game in ``info["final_obs"]``), as :mod:`dppo.rl.sampler` expects of every vector env."""

    def __init__(self, envs: Sequence[AECEnv], name: str, opponents: Opponents | None = None,
                 make: Callable[[], AECEnv] | None = None, reset_tries: int = 0) -> None:
        self.make, self.name, self.reset_tries = make, name, reset_tries  # make: recreates a game whose move raised
        self.games = [Game(env, guarded=make is not None) for env in envs]
        obs_space, action_space = two_player_spaces(envs[0], name)
        self.chosen = opponents  # None: the random player, on this env's seeded generator
        self.num_envs = len(self.games)
        self.single_observation_space, self.single_action_space = obs_space, action_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)
        self.metadata = {**getattr(envs[0], "metadata", {}), "autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = getattr(envs[0], "render_mode", None)
        self.rng = np.random.default_rng()
        self.random = RandomOpponents(action_space, self.rng)
        self.results: list[tuple[int, float]] = []  # (opponent id, score) of each finished game, taken per segment
        self.seen: list[Any] = [None] * self.num_envs  # each game's last observation returned

    @property
    def opponents(self) -> Opponents:
        return self.chosen or self.random

    @opponents.setter
    def opponents(self, opponents: Opponents) -> None:
        self.chosen = opponents

    def _start(self, game: Game, seed: int | None) -> None:
        """A new game: the learner's seat and opponent drawn, then the opening's random moves, if any."""
        seat, opponent = int(self.rng.integers(2)), self.opponents.draw(self.rng)
        game.reset(seed, seat, opponent)
        for _ in range(self.opponents.opening(self.rng)):
            game.play(legal_random(game.observe(), self.rng, self.single_action_space))
            game.opening += 1
            if game.over:  # the random moves ended it before the learner played: start again without them
                game.restart()
                break
        game.reward = game.total = 0.0  # the random moves are nobody's: the learner's return starts here

    def _settle_new(self, games: Sequence[Game]) -> None:
        """The opponents' replies in games that just started. A reply can end a game that its opening left one move
        from the end, before the learner has moved (tic-tac-toe after 4 random moves): that game is nobody's, so it
        starts again without the opening (no result is recorded, and the learner never plays into a finished
        game)."""
        settle(games, self.opponents)
        decided = [game for game in games if game.over and game.opening]
        for game in decided:
            game.restart()
        settle(decided, self.opponents)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        first = seed[0] if isinstance(seed, list) else seed
        self.rng = self.random.rng = np.random.default_rng(first)
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        for game, game_seed in zip(self.games, seeds, strict=True):
            self._start(game, game_seed)
        self._settle_new(self.games)
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        for game, action in zip(self.games, np.asarray(actions).tolist(), strict=True):
            game.play(action)
        settle(self.games, self.opponents)
        rewards = np.array([game.take_reward() for game in self.games], np.float64)
        terminated = np.array([game.over and not game.truncated for game in self.games], bool)
        truncated = np.array([game.truncated for game in self.games], bool)
        finished = np.flatnonzero(terminated | truncated)
        infos: dict[str, Any] = {}
        for i in finished:
            game = self.games[i]
            if game.failure is not None:  # cut, not played out: its last observation is the learner's last, no result
                infos = self._add_info(infos, {"final_obs": self.seen[i]}, i)
                line, details = game.failure
                infos = self._add_info(infos, {"env_failure": line, "env_failure_traceback": details}, i)
                self._recreate(game)
            else:
                infos = self._add_info(infos, {"final_obs": game.observe(), "final_info": {"score": game.score}}, i)
                self.results.append((game.opponent, game.score))
                try:
                    self._start(game, None)
                except Exception as err:  # the next game's reset raised: this copy alone is made afresh
                    if self.make is None:
                        raise
                    infos = self._add_info(infos, {"env_failure": describe(err),
                                                   "env_failure_traceback": traceback.format_exc()}, i)
                    self._recreate(game)
        self._settle_new([self.games[i] for i in finished])
        return self._observe(), rewards, terminated, truncated, infos

    def _recreate(self, game: Game) -> None:
        """A fresh copy of the game whose move raised, seeded from this vector env's generator (reproducible), and
        a new game in it; a copy that cannot reset is made again, faults.env_retries times before an EnvFailure."""
        assert self.make is not None
        fresh_copy(self.make, lambda env: self._start_in(game, env), self.name, self.reset_tries, game.env)

    def _start_in(self, game: Game, env: AECEnv) -> None:
        """A new game in the fresh copy ``env``."""
        game.env = env
        self._start(game, int(self.rng.integers(2**31)))

    def take_results(self) -> list[tuple[int, float]]:
        results, self.results = self.results, []
        return results

    def _observe(self) -> Any:
        """The learner's observation in every game, batched (a game whose opening move raised keeps its last one: it
        ends as a failure at the next step)."""
        self.seen = [self.seen[i] if game.failure is not None else game.observe() for i, game in enumerate(self.games)]
        return self._batch(self.seen)

    def _batch(self, observations: list[Any]) -> Any:
        return concatenate(self.single_observation_space, observations,
                           create_empty_array(self.single_observation_space, self.num_envs))

    def close_extras(self, **kwargs: Any) -> None:
        self.closed = True  # its games are over even if closing one raises (their results are no longer taken)
        for game in self.games:
            game.env.close()


class SelfPlayEnv(gym.Env):
    """One game as a gymnasium Env against ``opponents`` (random unless given): ``dppo eval``, the evaluation
    actor and the start check play it. The learner takes the first seat after a reset with an even seed, the
    second after an odd one (``dppo eval`` seeds its episodes seed, seed + 1, ...: the seats alternate, and every
    evaluation with the same seeds plays the same seats); unseeded resets alternate."""

    def __init__(self, env: AECEnv, name: str, opponents: Opponents | None = None) -> None:
        self.game = Game(env)
        self.observation_space, self.action_space = two_player_spaces(env, name)
        self.chosen = opponents  # None: the random player, on this env's seeded generator (np_random)
        self.episodes = 0
        self.metadata = dict(getattr(env, "metadata", {}))
        self.render_mode = getattr(env, "render_mode", None)

    @property
    def opponents(self) -> Opponents:
        return self.chosen or RandomOpponents(self.action_space, self.np_random)

    @opponents.setter
    def opponents(self, opponents: Opponents) -> None:
        self.chosen = opponents

    @property
    def seat(self) -> int:
        """The learner's seat in the current game (0: the first player)."""
        return self.game.players.index(self.game.learner)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        seat = (self.episodes if seed is None else seed) % 2
        self.episodes += 1
        self.game.reset(seed, seat, self.opponents.draw(self.np_random))
        settle([self.game], self.opponents)
        return self.game.observe(), {"seat": seat}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self.game.play(int(np.asarray(action)) if discrete else action)
        settle([self.game], self.opponents)
        over, truncated = self.game.over, self.game.truncated
        info = {"score": self.game.score, "seat": self.seat} if over else {}
        return self.game.observe(), self.game.take_reward(), over and not truncated, truncated, info

    def render(self) -> Any:
        return self.game.env.render()

    def close(self) -> None:
        self.game.env.close()
