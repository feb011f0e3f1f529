"""Atari: the standard preprocessing, learning signals vs reported scores, uint8 end to end, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from runs import progress_records

from dppo.config import load_config
from dppo.distributed.learner_group import resolve_device
from dppo.envs.atari import game, make_atari_env
from dppo.envs.make import make_vector_env
from dppo.errors import UsageError
from dppo.rl.agent import export_weights
from dppo.rl.batch import build_batch
from dppo.rl.model import ActorCritic
from dppo.rl.sampler import Sampler


def breakout(**overrides: object):
    return load_config(overrides={"env.id": "ALE/Breakout-v5", **overrides})


def test_game_name_is_the_ale_id_in_snake_case() -> None:
    assert game("ALE/Breakout-v5") == "breakout" and game("ALE/MontezumaRevenge-v5") == "montezuma_revenge"


def test_both_pipelines_give_84x84x4_uint8_frames_and_the_same_spaces() -> None:
    config = breakout(**{"env.num_envs": 2})
    single = make_atari_env(config.env)
    vector = make_vector_env(config)
    try:
        assert single.observation_space == vector.single_observation_space
        assert single.observation_space.shape == (4, 84, 84) and single.observation_space.dtype == np.uint8
        assert single.action_space == vector.single_action_space
        obs, _ = single.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs[-1].any()
        batch, info = vector.reset(seed=0)
        assert batch.shape == (2, 4, 84, 84) and batch.dtype == np.uint8 and list(info["lives"]) == [5, 5]
    finally:
        single.close()
        vector.close()


def test_life_loss_ends_episodes_for_learning_only_and_scores_stay_raw() -> None:
    """A random policy loses all 5 lives in a few hundred steps: more learning terminals than games, the
    games' returns are raw scores (sums of unclipped rewards), the learning rewards are signs."""
    config = breakout(**{"env.num_envs": 2, "ppo.segment_length": 400, "run.seed": 3})
    sampler = Sampler(config)
    try:
        segment = sampler.sample()
    finally:
        sampler.close()
    games = len(segment.episode_returns)
    assert games >= 1
    assert segment.terminated.sum() >= 4 * games  # four lost lives per game before the last one ends it
    assert set(np.unique(segment.rewards)) <= {0.0, 1.0}
    assert np.all(segment.episode_returns == np.round(segment.episode_returns))
    assert np.all(segment.episode_lengths > 20)
    # full games: every game spans all its lives, so no game is shorter than the shortest run between terminals
    assert segment.obs.image.dtype == np.uint8 and segment.obs.vector is None
    batch = build_batch([segment], 0.99, 0.95, torch.device("cpu"))
    assert batch.obs.image.dtype == torch.uint8 and batch.obs.image.shape == (800, 4, 84, 84)


def test_life_loss_on_an_env_without_lives_is_a_usage_error(tmp_path: Path) -> None:
    config = load_config(overrides={"env.id": "CartPole-v1", "env.terminal_on_life_loss": True})
    with pytest.raises(UsageError, match="info\\['lives'\\]"):
        Sampler(config)


@pytest.mark.parametrize("sets", [["env.vectorization=ale"], ["env.atari=true"],
                                  ["env.id=ALE/Pong-v5", "env.atari=false"]])
def test_ale_options_need_an_ale_id_and_the_preprocessing(sets: list[str]) -> None:
    from dppo.config import ConfigError

    with pytest.raises(ConfigError, match=r"ALE/|env\.atari"):
        load_config(sets=["env.id=CartPole-v1", *sets] if "env.id" not in sets[0] else sets)


def test_learner_device_resolves_and_actors_get_numpy_weights() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match=r"run\.device=cuda"):
            resolve_device("cuda")
    config = breakout()
    env = make_atari_env(config.env)
    model = ActorCritic(env.observation_space, env.action_space, config.model).to(resolve_device("auto"))
    env.close()
    weights = export_weights(model)
    assert all(isinstance(w, np.ndarray) for w in weights.values())  # what the broadcast carries


@pytest.mark.slow
def test_breakout_preset_trains_with_two_actors_through_the_cli(tmp_path: Path, ray_address: str) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--env", "ALE/Breakout-v5", "--address",
                           ray_address, "--run-dir", str(run_dir), "--envs-per-actor", "2", "--segment-length", "64",
                           "--total-steps", "768", "--set", "ppo.minibatch_size=128"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    records = progress_records(run_dir)
    assert len(records) == 3 and records[-1]["env_steps"] == 768
    assert all(np.isfinite(r["policy_loss"]) for r in records)
    assert json.loads((run_dir / "summary.json").read_text())["env"] == "ALE/Breakout-v5"
