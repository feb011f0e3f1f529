"""Two-player turn-based games by self-play, without Ray: the learner's seat against an opponent in a vector env,
the league's pool and Elo, and the opponents `dppo eval` builds (the minimax player: tests/unit/test_minimax.py)."""

from __future__ import annotations

import warnings
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import AECEnv

from dppo.config import Config, load_config
from dppo.envs.make import env_spec, is_self_play, make_env, make_vector_env
from dppo.envs.selfplay import RANDOM, SelfPlayEnv, SelfPlayVectorEnv
from dppo.envs.user_code import EnvLoadError
from dppo.errors import UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.build import build_model
from dppo.rl.opponents import PoolView, SelfPlayGames, SnapshotOpponents
from dppo.rl.sampler import Sampler, actor_seed
from dppo.run.checkpoint import FORMAT, decode, encode
from dppo.run.league import START_ELO, League
from dppo.run.opponent_choice import make_opponents

warnings.filterwarnings("ignore", category=DeprecationWarning)  # PettingZoo's classic modules warn on import
TICTACTOE = "pettingzoo.classic.tictactoe_v3"


def tictactoe():
    from pettingzoo.classic import tictactoe_v3

    return tictactoe_v3.env()


def selfplay_sampler(config: Config) -> tuple[Sampler, SelfPlayGames]:
    """Actor 0's sampler with the actor's self-play games behind its envs (as :class:`dppo.distributed.actor.Actor`
    builds them)."""
    seed = actor_seed(config.run.seed, 0)
    games = SelfPlayGames(config, seed)
    return Sampler(config, 0, seed, make_envs=games.make_envs), games


class Solo(AECEnv):
    """A one-player AEC env: not a two-player game."""

    possible_agents: ClassVar[list[str]] = ["a"]


class FirstMoveWins(AECEnv):
    """Two players; the first player's move 1 wins at once, move 0 passes to the second player, whose move wins."""

    metadata: ClassVar[dict] = {"name": "first_move_wins_v0"}
    possible_agents: ClassVar[list[str]] = ["p0", "p1"]

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Dict({"observation": gym.spaces.Box(0, 2, (1,), np.float32),
                                "action_mask": gym.spaces.MultiBinary(2)})

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.agent_selection, self.moves = "p0", 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}

    def observe(self, agent: str) -> dict:
        return {"observation": np.array([self.moves], np.float32), "action_mask": np.ones(2, np.int8)}

    def step(self, action: int) -> None:
        mover, other = self.agent_selection, "p1" if self.agent_selection == "p0" else "p0"
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.moves += 1
        if (mover == "p0" and action == 1) or mover == "p1":  # p0 wins with 1; any move of p1 wins
            self.rewards = {mover: 1.0, other: -1.0}
            self.terminations = dict.fromkeys(self.agents, True)
        else:
            self.agent_selection = other


class Scripted:
    """Opponents that always play ``move``, recording the batches they were asked for."""

    def __init__(self, move: int) -> None:
        self.move, self.batches = move, []

    def draw(self, rng: np.random.Generator) -> int:
        return 7

    def opening(self, rng: np.random.Generator) -> int:
        return 0

    def act(self, opponent: int, games: list) -> list[int]:
        self.batches.append((opponent, len(games)))
        return [self.move] * len(games)


def test_the_learners_seat_is_drawn_and_the_opponent_plays_inside_step() -> None:
    opponents = Scripted(move=0)  # as p0 it passes
    vec = SelfPlayVectorEnv([FirstMoveWins() for _ in range(16)], "first", opponents)
    obs, _ = vec.reset(seed=3)
    seats = [game.learner for game in vec.games]
    assert set(seats) == {"p0", "p1"}  # both seats are learned
    # as p1 the learner sees the opponent's first move (0: a pass) already played, all in one batch
    assert obs["observation"][:, 0].tolist() == [1.0 if s == "p1" else 0.0 for s in seats]
    assert opponents.batches == [(7, seats.count("p1"))]
    _, rewards, terminated, truncated, infos = vec.step(np.ones(16, np.int64))
    # as p0 the learner's 1 wins; as p1, after the opponent's pass, any move wins
    assert rewards.tolist() == [1.0] * 16
    assert terminated.all() and not truncated.any()
    assert infos["final_obs"][0]["observation"].shape == (1,)  # SAME_STEP: the last observation kept
    assert vec.take_results() == [(7, 1.0)] * 16 and vec.take_results() == []
    seats = [game.learner for game in vec.games]  # the next games' seats, drawn again
    _, rewards, *_ = vec.step(np.zeros(16, np.int64))  # as p0 a pass now loses to the opponent's reply
    assert rewards.tolist() == [-1.0 if s == "p0" else 1.0 for s in seats] and set(seats) == {"p0", "p1"}


def test_a_game_that_is_not_two_players_is_one_line() -> None:
    with pytest.raises(EnvLoadError, match="turn-based \\(AEC\\) env with 1 players"):
        SelfPlayVectorEnv([Solo()], "solo")


def test_a_classic_game_is_named_by_its_module() -> None:
    cfg = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 4})
    assert cfg.env.multiagent and is_self_play(cfg.env)
    assert isinstance(make_vector_env(cfg), SelfPlayVectorEnv) and isinstance(make_env(cfg.env), SelfPlayEnv)
    assert not is_self_play(load_config(None, {}).env)


def test_the_elo_of_one_game_between_equals_moves_by_half_k() -> None:
    league = League(load_config(None, {}).selfplay)
    league.add({"w": np.zeros(2, np.float32)}, 0)
    record = league.record(np.array([[0, 1.0], [RANDOM, 0.0]]))
    assert league.elo == START_ELO + 8.0 and league.snapshots[0].elo == START_ELO - 8.0  # K 16 x (1 - 1/2)
    assert record["selfplay_games"] == 2 and record["selfplay_win_rate"] == 0.5 and record["selfplay_loss_rate"] == 0.5
    league.record(np.array([[0, 1.0]]))  # the second game expects a win more: it moves less
    assert 8.0 > league.elo - (START_ELO + 8.0) > 0


def test_the_pool_drops_its_oldest_and_draws_as_configured() -> None:
    config = load_config(None, {}, ["selfplay.pool_size=3", "selfplay.snapshot_every=5"]).selfplay
    league = League(config)
    assert league.due(0)
    for iteration in (0, 5, 10, 15):
        league.add({"w": np.full(1, iteration, np.float32)}, iteration)
    assert [s.iteration for s in league.snapshots] == [5, 10, 15] and not league.due(15) and league.due(20)
    league.record(np.array([[1, 1.0]] * 20 + [[3, 0.0]] * 20))  # snapshot 1 beaten, 3 not
    probs = league.probs()
    assert probs[2] > probs[1] > probs[0] and sum(probs) == pytest.approx(1)  # the unbeaten drawn most
    latest = League(config.model_copy(update={"opponents": "latest"}))
    latest.add({"w": np.zeros(1)}, 0)
    latest.add({"w": np.zeros(1)}, 5)
    assert latest.probs() == [0.0, 1.0]


def test_the_league_survives_a_checkpoint() -> None:
    league = League(load_config(None, {}).selfplay)
    league.add({"w": np.arange(3, dtype=np.float32)}, 0)
    league.record(np.array([[0, 0.5], [0, 1.0]]))
    restored = League(league.config)
    saved = decode(encode({"format": FORMAT, "league": league.to_state()}), "test")  # torch weights_only load
    restored.restore(saved["league"])
    assert restored.elo == league.elo and restored.probs() == league.probs()
    assert restored.snapshots[0].weights["w"].tolist() == [0.0, 1.0, 2.0]
    assert (restored.snapshots[0].games, restored.snapshots[0].score, restored.next_id) == (2, 1.5, 1)


def test_snapshot_opponents_act_with_the_broadcast_weights() -> None:
    env = make_env(load_config(None, {"env.id": TICTACTOE}).env)
    spaces = (env.observation_space, env.action_space)
    config = load_config(None, {}).model
    weights = export_weights(build_model(*spaces, config))
    opponents = SnapshotOpponents(*spaces, config, seed=0)
    assert opponents.draw(np.random.default_rng(0)) == RANDOM  # before any pool: the random player
    opponents.update(PoolView([4], [weights], [1.0]))
    assert opponents.draw(np.random.default_rng(0)) == 4
    env.reset(seed=0)
    moves = opponents.act(4, [env.game] * 3)
    mask = env.game.observe()["action_mask"]
    assert len(moves) == 3 and all(mask[m] for m in moves)
    assert isinstance(opponents.snapshots[4], Agent) and opponents.snapshots[4].version == 4
    opponents.update(PoolView([5], [weights], [1.0]), in_play={4})  # 4 left the pool, a game still plays it
    assert set(opponents.snapshots) == {4, 5} and len(opponents.act(4, [env.game])) == 1
    assert opponents.draw(np.random.default_rng(0)) == 5  # new games only draw from the pool
    opponents.update(PoolView([5], [weights], [1.0]))
    assert set(opponents.snapshots) == {5}


def test_a_game_against_a_snapshot_the_pool_drops_plays_on() -> None:
    """An actor's games outlive a round: one drawn against a snapshot the next round's pool no longer holds goes on
    against it (the sampler names the opponents in play) and is scored against it."""
    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 4, "ppo.segment_length": 2})
    sampler, games = selfplay_sampler(config)
    weights = export_weights(sampler.agent.model)
    games.set_pool(PoolView([0], [weights], [1.0]))
    for game in sampler.envs.games:  # the games under way were drawn before the pool: give them snapshot 0
        game.opponent = 0
    sampler.sample()
    games.take_results()
    games.set_pool(PoolView([1], [weights], [1.0]))  # snapshot 0 dropped mid-game
    for _ in range(4):
        sampler.sample()
    results = games.take_results()
    assert 0 in results[:, 0]  # the games against 0 finished and were scored against it
    assert all(game.opponent == 1 for game in sampler.envs.games)  # and new ones drew from the pool
    games.set_pool(PoolView([1], [weights], [1.0]))
    assert set(games.snapshots) == {1}  # no game plays 0 any more: its Agent is gone


def test_the_sampler_knows_no_games() -> None:
    """Self-play lives behind the envs (:class:`SelfPlayGames`): the sampler imports none of it, holds no opponents
    and reports no results; a game's sampler steps it like any vector env."""
    import ast
    import inspect

    import dppo.rl.sampler

    tree = ast.parse(inspect.getsource(dppo.rl.sampler))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert "dppo.envs.make" in imported  # the check sees the imports
    assert not imported & {"dppo.envs.selfplay", "dppo.rl.opponents", "dppo.run.league"}
    assert not any(hasattr(Sampler, name) for name in ("set_opponents", "opponents", "_match_results"))
    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 4, "ppo.segment_length": 8})
    segment = Sampler(config).sample()
    assert segment.match_results is None and len(segment.episode_returns) > 0


def test_the_actors_games_hand_the_pool_to_their_envs_and_take_each_result_once() -> None:
    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 8, "ppo.segment_length": 16})
    sampler, games = selfplay_sampler(config)
    segment = sampler.sample()  # before any pool: the random player, every finished game scored against it
    first = games.take_results()
    assert first.shape == (len(segment.episode_returns), 2) and len(first) > 0
    assert set(first[:, 0]) == {RANDOM} and set(first[:, 1]) <= {0.0, 0.5, 1.0}
    assert games.take_results().shape == (0, 2)  # taken once
    # a finished game's score is the sign of the learner's return
    assert first[:, 1].tolist() == [{1.0: 1.0, 0.0: 0.5, -1.0: 0.0}[r] for r in segment.episode_returns]
    weights = export_weights(sampler.agent.model)
    games.set_pool(PoolView([3], [weights], [1.0]))
    assert sampler.envs.opponents is games.opponents and set(games.snapshots) == {3}
    sampler.sample()
    sampler.restart_envs()  # a recreated env plays the same pool; the closed one's games and results are gone
    assert sampler.envs.opponents is games.opponents and games.games == [sampler.envs]
    assert games.take_results().shape == (0, 2)
    assert {game.opponent for game in sampler.envs.games} == {3}
    for _ in range(3):
        sampler.sample()
    results = games.take_results()
    assert len(results) > 0 and set(results[:, 0]) == {3.0}


def test_an_actors_segments_carry_the_results_of_its_games() -> None:
    """What the driver's league reads: each segment's finished games, against the broadcast pool once one arrived."""
    from dppo.distributed.actor import Actor
    from dppo.distributed.broadcast import Broadcast

    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 8, "ppo.segment_length": 16})
    actor = Actor(config, 0, 5, env_spec(config))
    weights = export_weights(actor.sampler.agent.model)
    segments = [actor.sample(Broadcast(weights, v, None, None, PoolView([0], [weights], [1.0]))) for v in range(3)]
    for segment in segments:
        assert segment.match_results.shape == (len(segment.episode_returns), 2)
    assert set(segments[0].match_results[:, 0]) <= {RANDOM, 0} and set(segments[2].match_results[:, 0]) == {0}
    assert set(actor.games.snapshots) == {0}


def test_the_actors_games_leave_other_envs_alone() -> None:
    config = load_config(None, {"env.num_envs": 2, "ppo.segment_length": 4}, ["ppo.minibatch_size=8"])  # CartPole
    games = SelfPlayGames(config, seed=0)
    sampler = Sampler(config, make_envs=games.make_envs)
    sampler.sample()
    games.set_pool(PoolView([0], [export_weights(sampler.agent.model)], [1.0]))
    assert games.take_results() is None and games.opponents is None and not games.games


def test_opponent_epsilon_replaces_that_share_of_a_snapshots_moves_by_random_legal_ones() -> None:
    env = make_env(load_config(None, {"env.id": TICTACTOE}).env)
    spaces = (env.observation_space, env.action_space)
    config = load_config(None, {}).model
    weights = export_weights(build_model(*spaces, config))
    weights["policy_head.4.weight"] = np.zeros_like(weights["policy_head.4.weight"])
    weights["policy_head.4.bias"] = np.where(np.arange(9) == 4, 50.0, 0.0).astype(np.float32)  # always the centre
    env.reset(seed=0)
    moves = {}
    for epsilon in (0.0, 0.5):
        opponents = SnapshotOpponents(*spaces, config, seed=1, epsilon=epsilon)
        opponents.update(PoolView([0], [weights], [1.0]))
        moves[epsilon] = np.array(opponents.act(0, [env.game] * 400))
    assert (moves[0.0] == 4).all()
    off_centre = (moves[0.5] != 4).mean()  # half random, of which 8 in 9 leave the centre: 4/9
    assert 0.35 < off_centre < 0.55 and set(moves[0.5].tolist()) == set(range(9))


class Opening(Scripted):
    """Scripted opponents whose games start with ``plies`` random moves."""

    def __init__(self, move: int, plies: int) -> None:
        super().__init__(move)
        self.plies = plies

    def opening(self, rng: np.random.Generator) -> int:
        return self.plies


def test_a_random_opening_is_played_before_the_learners_first_move() -> None:
    vec = SelfPlayVectorEnv([tictactoe() for _ in range(32)], "ttt", Opening(move=-1, plies=2))
    vec.opponents.act = lambda opponent, games: [int(np.flatnonzero(g.observe()["action_mask"])[0]) for g in games]
    obs, _ = vec.reset(seed=0)
    # two random moves (X and O), then X: the learner as X moves third, as O after the opponent's X, fourth
    assert [len(g.history) for g in vec.games] == [2 if g.learner == "player_1" else 3 for g in vec.games]
    assert len({tuple(g.history[:2]) for g in vec.games}) > 8  # random openings, not one line
    assert (obs["action_mask"].sum(axis=1) == 9 - np.array([len(g.history) for g in vec.games])).all()
    assert all(g.total == 0.0 and not g.over for g in vec.games)


def test_a_random_opening_that_ends_the_game_is_not_played() -> None:
    vec = SelfPlayVectorEnv([FirstMoveWins() for _ in range(64)], "first", Opening(move=0, plies=1))
    vec.reset(seed=1)  # p0's random 1 would win before the learner plays: those games start again, no opening
    openings = [g.history[:1] for g in vec.games]
    assert [1] not in openings and [0] in openings  # p0's random pass kept
    assert [] in openings  # the 1s undone (each game's opening is 1 in 2)


def test_an_opening_whose_reply_ends_the_game_is_not_played() -> None:
    """p0's random pass hands p1 the win: where p1 is the opponent its reply would end the game before the learner's
    first move (the learner then played into a finished game); such games start again without the opening."""
    vec = SelfPlayVectorEnv([FirstMoveWins() for _ in range(64)], "first", Opening(move=0, plies=1))
    vec.reset(seed=1)
    assert not any(g.over for g in vec.games)
    learner_first = [g for g in vec.games if g.learner == "p0"]
    assert learner_first and all(g.history == [] and g.total == 0.0 for g in learner_first)
    for _ in range(5):  # every game ends at the learner's move: p1 wins, p0's pass hands p1 the win
        vec.step(np.zeros(64, np.int64))
    assert len(vec.take_results()) == 5 * 64


def test_tictactoe_with_four_random_opening_moves_plays_on() -> None:
    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 16},
                         ["selfplay.random_opening=4", "ppo.minibatch_size=16", "ppo.segment_length=64"])
    league = League(config.selfplay)
    env = make_env(config.env)
    torch.manual_seed(0)  # the snapshot's weights: the same games whatever ran before
    league.add(export_weights(build_model(env.observation_space, env.action_space, config.model)), 0)
    sampler, games = selfplay_sampler(config)
    games.set_pool(league.view())
    for _ in range(3):  # 3 x 64 steps x 16 games: many openings of 4 leave a winning reply (10 of 64 did)
        segment = sampler.sample()
    assert sampler.env_resets == 0 and len(segment.episode_returns) > 0


def test_the_samplers_snapshot_opponents_open_games_with_the_configured_random_moves() -> None:
    config = load_config(None, {"env.id": TICTACTOE, "env.num_envs": 4},
                         ["selfplay.random_opening=2", "ppo.minibatch_size=16"])
    league = League(config.selfplay)
    league.add({"w": np.zeros(1, np.float32)}, 0)
    sampler, games = selfplay_sampler(config)
    games.set_pool(league.view())
    rng = np.random.default_rng(0)
    assert sampler.envs.opponents is games.opponents
    assert {games.opponents.opening(rng) for _ in range(100)} == {0, 1, 2}
    env = make_env(config.env)
    unopened = SnapshotOpponents(env.observation_space, env.action_space, config.model, seed=0)  # dppo eval's
    assert unopened.opening(rng := np.random.default_rng(0)) == 0
    assert rng.bit_generator.state == np.random.default_rng(0).bit_generator.state  # no draw: streams unchanged


@pytest.mark.parametrize(("spec", "message"), [
    ("minimax:0", "is not a fixed player: write random, minimax or minimax:DEPTH"),
    ("snapshot:9", "the pool holds snapshots \\[0\\]"),
    ("champion", "is not an opponent; use random, minimax"),
])
def test_a_bad_opponent_is_one_line(spec: str, message: str) -> None:
    config = load_config(None, {"env.id": TICTACTOE})
    env = make_env(config.env)
    league = League(config.selfplay)
    league.add(export_weights(build_model(env.observation_space, env.action_space, config.model)), 0)
    with pytest.raises(UsageError, match=message):
        make_opponents(spec, {"league": league.to_state()}, config, (env.observation_space, env.action_space), 0)
