"""The minimax player and the worst case of a deterministic player, on tic-tac-toe and a one-move game: the whole
tic-tac-toe tree is searched once for the module, which runs on one worker (tests/conftest.py ONE_WORKER_MODULES) so
that no other worker searches it again."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch
from test_selfplay import TICTACTOE, FirstMoveWins, tictactoe

from dppo.config import load_config
from dppo.envs.make import make_env
from dppo.envs.minimax import Minimax, MinimaxOpponents, worst_case
from dppo.envs.selfplay import SelfPlayEnv
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model

warnings.filterwarnings("ignore", category=DeprecationWarning)  # PettingZoo's classic modules warn on import


@pytest.fixture(scope="module")
def solved_tictactoe() -> Minimax:
    """The whole tic-tac-toe tree searched once (about 70,000 env steps) for the tests that play against minimax."""
    search = Minimax(tictactoe)
    search.values(None, [])
    return search


def test_minimax_solves_tictactoe_and_never_loses_to_random(solved_tictactoe: Minimax) -> None:
    assert set(solved_tictactoe.values(None, []).values()) == {0.0}  # perfect play draws
    opponents = MinimaxOpponents(tictactoe, seed=0)
    opponents.search = solved_tictactoe  # the games below replay no search of their own
    env = SelfPlayEnv(tictactoe(), "ttt", opponents)
    rng, results = np.random.default_rng(0), []
    for episode in range(20):
        obs, _ = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            total, done = total + reward, terminated or truncated
        results.append(total)
    assert max(results) <= 0 and min(results) == -1  # the random player never wins, and loses


def test_a_winning_move_is_worth_one() -> None:
    search = Minimax(FirstMoveWins)
    assert search.values(None, []) == {0: -1.0, 1: 1.0}


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


@functools.cache
def negamax(mine: frozenset, theirs: frozenset) -> tuple[int, int]:
    """Tic-tac-toe solved from the mover's side, apart from the code under test: (value, the lowest best move)."""
    best = (-2, -1)
    for move in sorted(set(range(9)) - mine - theirs):
        if any(set(line) <= mine | {move} for line in LINES):
            value = 1
        else:
            value = 0 if len(mine) + len(theirs) == 8 else -negamax(theirs, mine | {move})[0]
        best = max(best, (value, -move))
    return best[0], -best[1]


def perfect(observation: dict) -> int:
    mine, theirs = (frozenset(np.flatnonzero(plane).tolist()) for plane in observation["observation"].reshape(9, 2).T)
    return negamax(mine, theirs)[1]


def test_worst_case_searches_every_line_an_opponent_can_play() -> None:
    assert worst_case(FirstMoveWins, lambda obs: 1, seat=0) == 1.0  # its winning move: nothing to answer
    assert worst_case(FirstMoveWins, lambda obs: 0, seat=0) == -1.0  # the pass loses to any reply
    assert worst_case(FirstMoveWins, lambda obs: 1, seat=1) == -1.0  # the first player can win at once
    assert [worst_case(tictactoe, perfect, seat) for seat in (0, 1)] == [0.0, 0.0]  # perfect play: never beaten

    def lowest(obs: dict) -> int:  # the lowest legal square: wins against many lines, beaten by some
        return int(np.flatnonzero(obs["action_mask"])[0])

    assert [worst_case(tictactoe, lowest, seat) for seat in (0, 1)] == [-1.0, -1.0]

    def perfect_but_one(obs: dict) -> int:  # perfect, except one reply deep in one line: found, a loss
        planes = obs["observation"].reshape(9, 2)
        if planes[:, 1].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0] and not planes[:, 0].any():
            return 6  # after the edge opening 5, the far corner loses
        return perfect(obs)

    assert [worst_case(tictactoe, perfect_but_one, seat) for seat in (0, 1)] == [0.0, -1.0]


def test_the_evaluation_plays_the_configured_fixed_player(solved_tictactoe: Minimax) -> None:
    from dppo.distributed.broadcast import Broadcast
    from dppo.distributed.evaluation import Evaluator

    results = {}
    for opponent in ("random", "minimax"):
        config = load_config(None, {"env.id": TICTACTOE}, [f"selfplay.eval_opponent={opponent}"])
        evaluator = Evaluator(config, [])
        if opponent == "minimax":  # the configured player, its search the module's (the games replay no search)
            assert isinstance(evaluator.env.unwrapped.opponents, MinimaxOpponents)
            evaluator.env.unwrapped.opponents.search = solved_tictactoe
        with torch.random.fork_rng():  # the same untrained weights against both, whatever ran before
            torch.manual_seed(0)
            weights = export_weights(build_model(evaluator.env.observation_space, evaluator.env.action_space,
                                                 config.model))
        results[opponent] = evaluator.evaluate(Broadcast(weights, 0, None, None), 20, seed=0)
    assert max(results["minimax"]) <= 0 and min(results["minimax"]) == -1  # an untrained policy cannot win
    assert max(results["random"]) == 1  # and does win some games against random


def test_an_evaluation_against_minimax_replays_itself(solved_tictactoe: Minimax) -> None:
    """The same weights and seeds play the same games, however many were played before (best.pt compares
    evaluations): minimax breaks its ties by each game's seed, the seat follows the seed's parity."""
    config = load_config(None, {"env.id": TICTACTOE})
    env = make_env(config.env)
    env.opponents = MinimaxOpponents(tictactoe, seed=3)
    env.opponents.search = solved_tictactoe

    def games(seeds: range) -> list[list[int]]:
        played = []
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            done = False
            while not done:  # the same legal move each time: the lowest
                obs, _, terminated, truncated, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
                done = terminated or truncated
            played.append(list(env.game.history))
        return played

    first = games(range(6))
    assert games(range(3, 6)) == first[3:] and games(range(6)) == first
    assert len({tuple(g) for g in first}) > 2  # ties broken differently per game: not one line replayed
    assert [env.reset(seed=s)[1]["seat"] for s in (0, 1, 2, 5)] == [0, 1, 0, 1]
