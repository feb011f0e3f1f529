"""A perfect player for small two-player games: negamax over the game itself, so it plays any PettingZoo AEC
game without knowing its rules. ``dppo eval --opponent minimax`` judges a self-play policy with it (tic-tac-toe:
a policy that never loses to it plays perfectly). A depth limit (``minimax:4``) makes it a shallow searcher for
games too large to solve (Connect Four): positions past the limit count as draws.

PettingZoo's envs cannot be copied (``deepcopy`` of an EzPickle env builds a fresh one), so a position is
reached by replaying its moves from the reset in a scratch env of the same game. Positions are remembered by the
mover and its observation, which in PettingZoo's classic games is the whole board from the mover's side; among
equally good moves it picks at random (seeded), so its games vary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dppo.envs.selfplay import Game


def position_key(env: Any, depth: int) -> tuple[str, bytes, int]:
    agent = env.agent_selection
    obs = env.observe(agent)
    parts = [np.asarray(v).tobytes() for v in obs.values()] if isinstance(obs, dict) else [np.asarray(obs).tobytes()]
    return agent, b"|".join(parts), depth


def legal_actions(env: Any) -> list[int]:
    obs = env.observe(env.agent_selection)
    mask = obs.get("action_mask") if isinstance(obs, dict) else None
    if mask is None:
        return list(range(env.action_space(env.agent_selection).n))
    return np.flatnonzero(np.asarray(mask)).tolist()


class Minimax:
    """Each legal move's value for the player to move (win 1, draw 0, loss -1), by negamax with memory."""

    def __init__(self, make_env: Callable[[], Any], depth: int | None = None) -> None:
        self.scratch, self.depth = make_env(), depth
        self.memory: dict[tuple[str, bytes, int], dict[int, float]] = {}

    def _replay(self, seed: int | None, moves: list[Any]) -> Any:
        self.scratch.reset(seed=seed)
        for move in moves:
            self.scratch.step(move)
        return self.scratch

    def values(self, seed: int | None, moves: list[Any], depth: int | None = None) -> dict[int, float]:
        """The values of the moves of the position ``moves`` lead to from a reset with ``seed``."""
        depth = self.depth if depth is None else depth
        return self._values_here(self._replay(seed, moves), seed, moves, depth)

    def _values_here(self, env: Any, seed: int | None, moves: list[Any], depth: int | None) -> dict[int, float]:
        """The values of the position the scratch env is in (``moves`` from the reset). The first move is tried from
        the env as it is; each further one needs the position replayed (replays are where a search spends its time)."""
        key = position_key(env, -1 if depth is None else depth)
        if key not in self.memory:
            values = {}
            for n, action in enumerate(legal_actions(env)):
                values[action] = self._after(env if n == 0 else self._replay(seed, moves), seed, moves, action, depth)
            self.memory[key] = values
        return self.memory[key]

    def _after(self, env: Any, seed: int | None, moves: list[Any], action: int, depth: int | None) -> float:
        """The value of ``action`` for the player to move in ``env``, which is at the position of ``moves``."""
        mover = env.agent_selection
        env.step(action)
        if env.terminations.get(mover, False) or env.truncations.get(mover, False) or not env.agents:
            return float(np.sign(env.rewards.get(mover, 0.0)))
        if depth is not None and depth <= 1:
            return 0.0
        same_mover = env.agent_selection == mover
        best = max(self._values_here(env, seed, [*moves, action], None if depth is None else depth - 1).values())
        return best if same_mover else -best


def worst_case(make_env: Callable[[], Any], choose: Callable[[Any], Any], seat: int, seed: int | None = None) -> float:
    """The least a deterministic player (``choose``: its move for an observation, e.g. a policy's greedy one) scores
    in ``seat`` (0: the first player) whatever its opponent plays: win 1, draw 0, loss -1, over every line of the
    opponent's moves. 0 in tic-tac-toe: no player beats it, minimax with any tie-break included; a sample of games
    cannot say that. Positions are replayed like :class:`Minimax`'s, so this too is for small games only."""
    scratch = make_env()
    scratch.reset(seed=seed)
    player = scratch.possible_agents[seat]
    memory: dict[tuple[str, bytes, int], float] = {}

    def replay(moves: list[Any]) -> Any:
        scratch.reset(seed=seed)
        for move in moves:
            scratch.step(move)
        return scratch

    def value(env: Any, moves: list[Any]) -> float:
        """The least score from the position ``env`` is in (``moves`` from the reset); its first line is followed
        in ``env`` itself, each further one from a replay."""
        key = position_key(env, -1)
        if key not in memory:
            mover = env.agent_selection
            actions = [choose(env.observe(mover))] if mover == player else legal_actions(env)
            scores = []
            for n, action in enumerate(actions):
                env = env if n == 0 else replay(moves)
                env.step(action)
                if not env.agents or env.terminations.get(player, False) or env.truncations.get(player, False):
                    scores.append(float(np.sign(env.rewards.get(player, 0.0))))
                else:
                    scores.append(value(env, [*moves, action]))
            memory[key] = min(scores)
        return memory[key]

    return value(replay([]), [])


class MinimaxOpponents:
    """:class:`dppo.envs.selfplay.Opponents` that is the minimax player (one opponent, id 0)."""

    def __init__(self, make_env: Callable[[], Any], depth: int | None = None, seed: int = 0) -> None:
        self.search, self.seed, self.rng = Minimax(make_env, depth), seed, np.random.default_rng(seed)

    def draw(self, rng: np.random.Generator) -> int:
        return 0

    def opening(self, rng: np.random.Generator) -> int:
        return 0

    def act(self, opponent: int, games: list[Game]) -> list[Any]:
        moves = []
        for game in games:
            values = self.search.values(game.seed, game.history)
            best = max(values.values())
            # ties broken by the game's own seed and move number, so a seeded game replays whatever came before it
            rng = self.rng if game.seed is None else np.random.default_rng([self.seed, game.seed, len(game.history)])
            moves.append(int(rng.choice([a for a, v in values.items() if v == best])))
        return moves
