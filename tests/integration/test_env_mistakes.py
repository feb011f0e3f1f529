"""A user's first hour with their own env: every mistake in reset() or step() is bad input, answered with its
cause in one line (exit 2) before anything is written; an env that only fails inside the actors is named
with the actor and its node."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dppo.commands.parser import main

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

CASES = [
    ("ResetWithoutInfo", "reset() returned a ndarray, not (obs, info)"),
    ("ArrayForDict", "reset() raised AssertionError: The obs returned by the `reset()` method must be a dict"),
    ("FloatsForMultiDiscrete", "reset() returned obs of dtype float32 where MultiDiscrete([3 3]) holds integers"),
    ("DictMissingKey", "observation keys is not same as the observation space keys"),
    ("OldStepApi", "step() raised ValueError: not enough values to unpack (expected 5, got 4)"),
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
    assert done.stderr.count("\n") == 1 and "\x1b[" not in done.stderr, done.stderr  # one line, no colours
    assert ("env 'wrong_envs:FailsInActors' raised FileNotFoundError while starting: scenario data /data/maps "
            "missing on this node [actor ") in done.stderr and " on node " in done.stderr
    assert not (user_dir / "run").exists()
