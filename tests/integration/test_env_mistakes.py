"""A user's first hour with their own env: every mistake in reset() or step() is bad input, answered with its
cause in one line (exit 2) before anything is written; an env that only fails inside the actors is named
with the actor and its node; an env of the old gym API is named as such wherever it runs (the check at start,
an actor's sampler, `dppo eval`)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import new_checkpoint
from runs import error_line

from dppo.commands.parser import main
from dppo.config import Config, load_config
from dppo.envs.user_code import EnvLoadError
from dppo.rl.sampler import EnvFailure, Sampler
from dppo.run.checkpoint import CheckpointStore

WRONG_ENVS = textwrap.dedent('''
import gymnasium as gym
import numpy as np
import ray


class Base(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class ResetWithoutInfo(Base):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32)


class ArrayForDict(Base):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})


class FloatsForMultiDiscrete(Base):
    observation_space = gym.spaces.MultiDiscrete([3, 3])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([0.5, 1.5], np.float32), {}


class DictMissingKey(Base):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"a": 0}, {}


class OldStepApi(Base):
    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, {}


class ResetWithoutSeed(Base):
    def reset(self):
        return np.zeros(2, np.float32)


class OldStepAtEpisodeEnd(Base):
    """gymnasium's API for two steps, then the old one: what the check at start cannot see."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps >= 3:
            return np.zeros(2, np.float32), 0.0, True, {}
        return super().step(action)


gym.register("OldStepApi-v0", entry_point=OldStepApi)
gym.register("ResetWithoutInfo-v0", entry_point=ResetWithoutInfo)


class StepWrongObs(Base):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"a": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"a": np.zeros(3, np.float32)}, 0.0, False, False, {}


class FailsInActors(Base):
    def reset(self, *, seed=None, options=None):
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            raise FileNotFoundError("scenario data /data/maps missing on this node")
        return super().reset(seed=seed, options=options)
''')

OLD_RESET = ("reset() returned only an observation: the old gym API; gymnasium's reset(*, seed=None, options=None) "
             "returns (obs, info)")
OLD_STEP = ("step() returned 4 values (obs, reward, done, info): the old gym API; gymnasium's step() returns 5, (obs, "
            "reward, terminated, truncated, info): split done into terminated")
SHIMMY = "--set env.entry_point=shimmy:GymV21CompatibilityV0 --set env.kwargs.env_id=<its gym id>"

CASES = [
    ("ResetWithoutInfo", OLD_RESET),
    ("ResetWithoutSeed", "reset() takes no seed: the old gym API"),
    ("ArrayForDict", "reset() raised AssertionError: The obs returned by the `reset()` method must be a dict"),
    ("FloatsForMultiDiscrete", "reset() returned obs of dtype float32 where MultiDiscrete([3 3]) holds integers"),
    ("DictMissingKey", "observation keys is not same as the observation space keys"),
    ("OldStepApi", OLD_STEP),
    ("StepWrongObs", "step() returned obs['a'] of shape (3,) where Box(-1.0, 1.0, (2,), float32) has shape (2,)"),
]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "wrong_envs.py").write_text(WRONG_ENVS)
    return tmp_path


@pytest.mark.parametrize(("env", "expected"), CASES, ids=[c for c, _ in CASES])
def test_a_wrong_env_is_bad_input_with_its_cause_in_one_line(user_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], env: str,
                                                             expected: str) -> None:
    monkeypatch.chdir(user_dir)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--set", f"env.entry_point=wrong_envs:{env}", "--run-dir", "run"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dppo: error: env 'wrong_envs:{env}': ") and expected in err, err
    assert not (user_dir / "run").exists()


def test_an_env_that_fails_only_in_the_actors_is_named_with_the_actor_and_its_node(
        user_dir: Path, dppo_cmd: list[str], ray_address: str) -> None:
    done = subprocess.run([*dppo_cmd, "train", "--address", ray_address, "--set",
                           "env.entry_point=wrong_envs:FailsInActors", "--run-dir", "run"], cwd=user_dir,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    line = error_line(done.stderr)
    assert "\x1b[" not in done.stderr, done.stderr  # no colours
    assert ("env 'wrong_envs:FailsInActors' raised FileNotFoundError while starting: scenario data /data/maps "
            "missing on this node [actor ") in line and " on node " in line
    assert not (user_dir / "run").exists()


@pytest.mark.parametrize(("env_id", "expected"), [("OldStepApi-v0", OLD_STEP), ("ResetWithoutInfo-v0", OLD_RESET)],
                         ids=["step", "reset"])
def test_a_registered_env_of_the_old_gym_api_is_named_as_such_in_one_line(user_dir: Path, dppo_cmd: list[str],
                                                                           env_id: str, expected: str) -> None:
    """Made by gymnasium.make (its wrappers raise an unpack error first), in a real process: what a user reads."""
    done = subprocess.run([*dppo_cmd, "train", "--env", f"wrong_envs:{env_id}", "--run-dir", "run"], cwd=user_dir,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"dppo: error: env 'wrong_envs:{env_id}': {expected}"), done.stderr
    assert done.stderr.rstrip().endswith(SHIMMY), done.stderr
    assert sorted(p.name for p in user_dir.iterdir()) == ["wrong_envs.py"]


@pytest.fixture
def on_path(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def sampler_config(env: str, vectorization: str = "sync") -> Config:
    return load_config(sets=[f"env.entry_point=wrong_envs:{env}", f"env.vectorization={vectorization}",
                             "env.num_envs=2", "ppo.segment_length=8", "ppo.minibatch_size=16"])


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_an_actor_whose_env_resets_the_old_way_names_the_old_api(on_path: Path, vectorization: str) -> None:
    """The sampler an actor runs, without Ray: the vector env's reset fails on an unpack; the error says why."""
    with pytest.raises(EnvLoadError, match=re.escape(f"env 'wrong_envs:ResetWithoutInfo': {OLD_RESET}")):
        Sampler(sampler_config("ResetWithoutInfo", vectorization))


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_an_old_step_seen_only_while_sampling_names_the_old_api_without_retries(on_path: Path,
                                                                               vectorization: str) -> None:
    sampler = Sampler(sampler_config("OldStepAtEpisodeEnd", vectorization))
    try:
        with pytest.raises(EnvFailure, match=re.escape(f"env 'wrong_envs:OldStepAtEpisodeEnd': {OLD_STEP}")):
            sampler.sample()
        assert sampler.env_resets == 0  # no retry: the env's API does not pass
    finally:
        sampler.close()


def test_dppo_eval_of_an_env_of_the_old_api_names_it_in_one_line(on_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint of an env whose code went back to the old API (its first steps still pass): `dppo eval`."""
    monkeypatch.chdir(on_path)
    config = load_config(sets=["env.entry_point=wrong_envs:OldStepAtEpisodeEnd"])
    path = CheckpointStore(on_path / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(path), "--episodes", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dppo: error: env 'wrong_envs:OldStepAtEpisodeEnd': {OLD_STEP}"), err
