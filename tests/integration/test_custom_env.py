"""Your own environment: module:EnvId, entry points, wrappers, every standard space, shipping, bad input.

Training runs use the real CLI in subprocesses that join the session's Ray cluster (real actors).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from runs import error_line

from dppo.commands.parser import main
from dppo.config import load_config
from dppo.envs.make import EnvLoadError, env_spaces, make_env

CORRIDOR = textwrap.dedent('''
    """A user's env, not installed: walk right along a corridor to the goal (+1), -0.01 per step."""
    import gymnasium as gym
    import numpy as np


    class CorridorEnv(gym.Env):
        def __init__(self, length: int = 4):
            self.length = length
            self.observation_space = gym.spaces.Box(0.0, 1.0, (length + 1,), np.float32)
            self.action_space = gym.spaces.Discrete(2)

        def _obs(self):
            obs = np.zeros(self.length + 1, np.float32)
            obs[self.pos] = 1.0
            return obs

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.pos = 0
            return self._obs(), {}

        def step(self, action):
            self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
            done = self.pos == self.length
            return self._obs(), 1.0 if done else -0.01, done, False, {}


    def make_corridor(length: int = 4):
        return CorridorEnv(length)


    NOT_CALLABLE = 42


    def not_an_env():
        return "a string"


    class TextEnv(CorridorEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Text(8)


    gym.register("Corridor-v0", entry_point=CorridorEnv, max_episode_steps=30)
''')
FAST = ["--segment-length", "32", "--set", "ppo.minibatch_size=64", "--set", "ppo.learning_rate=0.003",
        "--set", "ppo.gamma=0.9"]
# 256-step iterations: the runs whose subject is not several actors take one actor of 8 envs (an actor's start-up,
# about 2.3 s of CPU, less than two of 4)
TWO_ACTORS = ["--actors", "2", "--envs-per-actor", "4"]
ONE_ACTOR = ["--actors", "1", "--envs-per-actor", "8"]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A directory holding the user's module, as someone's project checkout would."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "corridor_env.py").write_text(CORRIDOR)
    (project / "broken_env.py").write_text("raise RuntimeError('this module is broken')\n")
    return project


def run_cli(cwd: Path, *args: str, address: str | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dppo", *args]
    if address is not None:
        cmd += ["--address", address]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def eval_mean(cwd: Path, run_dir: Path, episodes: int = 20) -> float:
    done = run_cli(cwd, "eval", "--checkpoint", str(run_dir), "--episodes", str(episodes))
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split("mean return ")[1].split()[0])


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--env", "corridor_env:Corridor-v0"],
                                 ["--set", "env.entry_point=corridor_env:make_corridor", "--set",
                                  "env.kwargs.length=4", "--set", "env.max_episode_steps=30"]],
                         ids=["module:EnvId", "entry_point"])
def test_user_env_from_the_working_directory_trains_with_two_actors(
        user_dir: Path, ray_address: str, how: list[str]) -> None:
    """Not installed, only in the cwd: the learner and both actors import it (Ray workers get the cwd)."""
    run_dir = user_dir / "run"
    done = run_cli(user_dir, "train", *how, *TWO_ACTORS, "--total-steps", "40000", "--target-return", "0.9",
                   "--seed", "3", "--run-dir", str(run_dir), *FAST, address=ray_address)
    assert done.returncode == 0, done.stderr
    result = summary(run_dir)
    assert result["solved"] and result["episode_return_mean"] >= 0.9, result
    assert eval_mean(user_dir, run_dir) == pytest.approx(0.97)  # 4 steps right: 1 - 3 x 0.01


@pytest.mark.slow
def test_module_only_the_driver_can_import_stops_with_exit_2_then_runtime_env_ships_it(
        user_dir: Path, ray_address: str, tmp_path: Path) -> None:
    """A cluster's workers do not see the driver's files: the run stops naming the actor, the node and the
    fix; shipping the directory with run.runtime_env (Ray's working_dir) makes the same run work."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    driver = elsewhere / "driver.py"  # puts the module on the driver's sys.path only
    driver.write_text(f"import sys\nsys.path.insert(0, {str(user_dir)!r})\nfrom dppo.commands.parser import main\n"
                      "raise SystemExit(main(sys.argv[1:]))\n")
    run_dir = elsewhere / "run"
    args = ["train", "--env", "corridor_env:Corridor-v0", *TWO_ACTORS, "--total-steps", "256",
            "--run-dir", str(run_dir), "--address", ray_address, *FAST]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(driver), *args], cwd=elsewhere, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    line = error_line(done.stderr)
    assert "corridor_env" in line and re.search(r"\[actor \d+ on node [\d.]+\]$", line) and "runtime_env" in line
    assert not run_dir.exists()
    shipped = subprocess.run([sys.executable, str(driver), *args, "--set", f"run.runtime_env.working_dir={user_dir}"],
                             cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env)
    assert shipped.returncode == 0, shipped.stderr
    assert summary(run_dir)["env_steps"] == 256


def test_frozenlake_discrete_observations_train_and_evaluate(tmp_path: Path, ray_address: str) -> None:
    """Discrete observations (one-hot), four short iterations; that it learns the optimal return is a benchmark
    (`python -m benchmarks learning-checks --only frozenlake-non-slippery`)."""
    run_dir = tmp_path / "run"
    done = run_cli(tmp_path, "train", "--env", "FrozenLake-v1", "--set", "env.kwargs.is_slippery=false",
                   *ONE_ACTOR, "--total-steps", "1024", "--seed", "1", "--run-dir", str(run_dir), *FAST,
                   address=ray_address)
    assert done.returncode == 0, done.stderr
    assert summary(run_dir)["env_steps"] == 1024
    assert 0.0 <= eval_mean(tmp_path, run_dir, episodes=5) <= 1.0


def test_blackjack_tuple_observations_train_and_evaluate(tmp_path: Path, ray_address: str) -> None:
    """Tuple(Discrete, Discrete, Discrete) observations, two iterations; near-optimal play is a benchmark
    (`python -m benchmarks learning-checks --only blackjack`)."""
    run_dir = tmp_path / "run"
    done = run_cli(tmp_path, "train", "--env", "Blackjack-v1", "--actors", "1", "--envs-per-actor", "16",
                   "--segment-length", "64", "--total-steps", "2048", "--seed", "1", "--set", "ppo.gamma=1.0",
                   "--set", "ppo.learning_rate=0.001", "--run-dir", str(run_dir), address=ray_address)
    assert done.returncode == 0, done.stderr
    assert summary(run_dir)["env_steps"] == 2048
    assert -1.0 <= eval_mean(tmp_path, run_dir, episodes=20) <= 1.0


@pytest.mark.parametrize("env_id", ["dppo/MatchBits-v0", "dppo/MatchDigits-v0", "dppo/DictMatch-v0"])
def test_multibinary_multidiscrete_and_dict_spaces_train_and_evaluate(
        tmp_path: Path, ray_address: str, env_id: str) -> None:
    """MultiBinary and MultiDiscrete actions (independent Bernoullis / categoricals); a Dict of an image and
    a Discrete (CNN on the image, the one-hot after it); four short iterations. That each reaches the optimal
    return 10 is a benchmark (`python -m benchmarks learning-checks --only spaces-MatchBits,...`)."""
    run_dir = tmp_path / "run"
    done = run_cli(tmp_path, "train", "--env", env_id, "--actors", "1", "--total-steps", "1024",
                   "--seed", "1", "--run-dir", str(run_dir), "--envs-per-actor", "8",
                   "--segment-length", "32", "--set", "ppo.minibatch_size=64", "--set", "ppo.learning_rate=0.002",
                   "--set", "ppo.gamma=0.5", address=ray_address)
    assert done.returncode == 0, done.stderr
    assert summary(run_dir)["env_steps"] == 1024
    assert 0.0 <= eval_mean(tmp_path, run_dir, episodes=5) <= 10.0


def test_wrappers_apply_in_order_with_kwargs(user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(user_dir))
    config = load_config(sets=["env.id=Blackjack-v1", "env.wrappers=[FlattenObservation]"])
    assert env_spaces(config)[0].shape == (32 + 11 + 2,)
    config = load_config(sets=["env.id=corridor_env:Corridor-v0", "env.wrappers=[{name: "
                               "gymnasium.wrappers:TimeLimit, kwargs: {max_episode_steps: 3}}, "
                               "gymnasium.wrappers:RecordEpisodeStatistics]"])
    env = make_env(config.env)
    assert [type(w).__name__ for w in (env, env.env)] == ["RecordEpisodeStatistics", "TimeLimit"]
    env.reset(seed=0)
    truncated = [env.step(0)[3] for _ in range(3)]
    assert truncated == [False, False, True]


def test_env_section_of_a_config_file_builds_the_entry_point_env(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The YAML way: an entry point with kwargs, no id (and no CartPole preset behind it)."""
    monkeypatch.syspath_prepend(str(user_dir))
    path = user_dir / "corridor.yaml"
    path.write_text(yaml.safe_dump({"env": {"entry_point": "corridor_env:CorridorEnv", "kwargs": {"length": 6},
                                            "max_episode_steps": 12, "wrappers": ["FlattenObservation"]}}))
    config = load_config(path)
    assert config.env.id is None and config.env.name == "corridor_env:CorridorEnv"
    env = make_env(config.env)
    assert env.observation_space.shape == (7,)
    env.reset(seed=0)
    assert [env.step(0)[3] for _ in range(12)][-1] is True  # the time limit from max_episode_steps


BAD_INPUT = [
    (["--env", "no_such_module:Foo-v0"], "cannot import module 'no_such_module'"),
    (["--env", "broken_env:Foo-v0"], "importing module 'broken_env' for env 'broken_env:Foo-v0' raised RuntimeError"),
    (["--env", "corridor_env:NoSuch-v0"], "unknown environment 'corridor_env:NoSuch-v0'"),
    (["--set", "env.entry_point=corridor_env:NOT_CALLABLE"], "not a class or function"),
    (["--set", "env.entry_point=corridor_env:not_an_env"], "returned a str, not a gymnasium.Env"),
    (["--set", "env.entry_point=corridor_env:nothing_here"], "has no 'nothing_here'"),
    (["--set", "env.entry_point=corridor_env"], "is not module.path:callable"),
    (["--set", "env.entry_point=corridor_env:CorridorEnv", "--set", "env.kwargs.width=3"], "rejected env.kwargs"),
    (["--env", "corridor_env:Corridor-v0", "--set", "env.kwargs.width=3"], "rejected env.kwargs"),
    (["--env", "CartPole-v1", "--set", "env.wrappers=[no_such_module:Wrapper]"], "cannot import module"),
    (["--env", "CartPole-v1", "--set", "env.wrappers=[NoSuchWrapper]"], "is not one of gymnasium.wrappers"),
    (["--env", "CartPole-v1", "--set", "env.wrappers=[{name: TimeLimit, kwargs: {bad: 1}}]"], "rejected kwargs"),
    (["--set", "env.entry_point=corridor_env:TextEnv"], "observation space Text("),
    (["--env", "CartPole-v1", "--set", "env.entry_point=corridor_env:CorridorEnv"], "exactly one of env.id"),
    (["--env", "ALE/NoSuchGame-v5"], "unknown environment"),
    (["--env", "MiniGrid-Empty-5x5-v0"], "--env minigrid:MiniGrid-Empty-5x5-v0"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_env_input_exits_2_with_one_line_and_writes_nothing(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
        expected: str) -> None:
    monkeypatch.chdir(user_dir)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cwd added by the CLI goes away after the test
    before = sorted(p.name for p in user_dir.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("dppo: error: ") and "Traceback" not in err, err
    assert expected in err, err
    assert sorted(p.name for p in user_dir.rglob("*") if "__pycache__" not in p.parts and p.suffix != ".pyc"
                  ) == [n for n in before if not n.endswith(".pyc") and n != "__pycache__"]


def test_import_error_says_it_must_be_importable_on_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(sets=["env.id=no_such_module:Foo-v0"])
    with pytest.raises(EnvLoadError) as err:
        env_spaces(config)
    assert "every Ray worker" in str(err.value) and "runtime_env" in str(err.value)


def test_run_dir_name_has_no_path_separators(user_dir: Path) -> None:
    from dppo.commands.train import resolve_run_dir

    assert resolve_run_dir(None, "corridor_env:Corridor-v0").name.startswith("Corridor-v0-")
    assert resolve_run_dir(None, "dppo/Counter-v0").parent == Path("runs")
    assert np.all([c not in resolve_run_dir(None, "a.b:c/d").name for c in ":/"])
