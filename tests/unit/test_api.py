"""dppo.train's arguments and errors, callbacks and dppo.load's policy without Ray (dppo/api.py, dppo/run/launch.py,
dppo/run/callbacks.py, dppo/run/trained_policy.py): bad input is the command's own line, raised as UsageError, with
nothing written; a callback stops a run or fails it naming itself; a loaded policy answers one observation with one
action and a batch with a batch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import CROWD

import dppo
from dppo.api import train_request
from dppo.commands.parser import main
from dppo.config import load_config
from dppo.envs.make import with_agents
from dppo.run.callbacks import Callbacks, resolve_callbacks
from dppo.run.checkpoint import encode


def test_import_dppo_loads_neither_torch_nor_ray() -> None:
    code = "import sys, dppo; dppo.train; dppo.StopRun; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("argv", "kwargs"), [
    (["--set", "ppo.lr=3e-4"], {"overrides": {"ppo.lr": 3e-4}}),
    (["--actors", "0"], {"actors": 0}),
    (["--env", "CartPole-v1", "--set", "ppo.epochs=many"], {"env": "CartPole-v1", "overrides": {"ppo.epochs": "many"}}),
    (["--resume"], {"resume": True}),
    (["--set", "run.callbacks=no_such_module_63:stop"], {"overrides": {"run.callbacks": ["no_such_module_63:stop"]}}),
    (["--set", "run.callbacks=os:no_such_function"], {"overrides": {"run.callbacks": "os:no_such_function"}}),
    (["--set", "run.callbacks=os:sep"], {"overrides": {"run.callbacks": ["os:sep"]}}),
    (["--set", "run.callbacks=[nocolon]"], {"overrides": {"run.callbacks": ["nocolon"]}}),
])
def test_bad_input_is_the_command_s_line_raised_as_usage_error(
        argv: list[str], kwargs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """One path, one validation: dppo.train raises UsageError whose message is the line `dppo train` prints (exit
    2), and neither writes anything."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["train", *argv])
    said = capsys.readouterr().err
    assert exited.value.code == 2 and said.count("\n") == 1 and said.startswith("dppo: error: "), said
    with pytest.raises(dppo.UsageError) as raised:
        dppo.train(**kwargs)
    assert f"dppo: error: {raised.value}\n" == said
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_that_is_a_file_is_refused_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(SystemExit):
        main(["train", "--run-dir", str(taken)])
    with pytest.raises(dppo.UsageError) as raised:
        dppo.train(run_dir=taken)
    assert capsys.readouterr().err == f"dppo: error: {raised.value}\n"
    assert "is a file; pass a directory to --run-dir" in str(raised.value)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"total_timesteps": 10}, "unknown argument 'total_timesteps'; did you mean total_steps=?"),
    ({"learning_rate": 0.1}, "unknown argument 'learning_rate' (it takes config"),
    ({"lr": 0.1}, "unknown argument 'lr'; did you mean overrides={'ppo.learning_rate': ...}?"),
    ({"actros": 2}, "unknown argument 'actros'; did you mean actors=?"),
    ({"actors": 2, "overrides": {"run.actors": 3}}, "actors= and overrides['run.actors'] both set run.actors"),
    ({"config": 3}, "config: a int is no config"),
    ({"callbacks": print}, "pass a list of functions"),
    ({"callbacks": [3]}, "callbacks: 3 is a int, not a function"),
    ({"overrides": ["ppo.learning_rate=1"]}, "pass a dict of dotted config keys"),
])
def test_arguments_dppo_train_does_not_take_are_named_with_the_one_meant(kwargs: dict, said: str) -> None:
    with pytest.raises(dppo.UsageError) as raised:
        dppo.train(**kwargs)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_flags_and_overrides_are_config_keys_and_a_config_is_a_path_a_dict_or_a_config() -> None:
    request = train_request("my.yaml", None, {"ppo.learning_rate": 3e-4}, False, False,
                            {"env": "Pendulum-v1", "actors": 4, "run_dir": "runs/x"})
    assert request.config_path == "my.yaml" and request.config_data is None
    assert request.overrides == {"env.id": "Pendulum-v1", "run.actors": 4, "run.run_dir": "runs/x",
                                 "ppo.learning_rate": 3e-4}
    given = {"env": {"id": "Pendulum-v1"}, "ppo": {"learning_rate": 1e-3}}
    assert train_request(given, None, None, False, False, {}).config_data == given
    config = load_config(overrides={"env.id": "Pendulum-v1"})
    data = train_request(config, None, None, True, False, {}).config_data
    assert data is not None and load_config(base=data) == config


def stop_at_two(info: dppo.IterationInfo) -> None:
    if info.iteration >= 2:
        raise dppo.StopRun("two iterations")


def test_callbacks_stop_with_their_reason_or_fail_naming_themselves(tmp_path: Path) -> None:
    config = load_config()
    seen: list[int] = []

    def count(info: dppo.IterationInfo) -> bool | None:
        seen.append(info.iteration)
        return False if info.iteration == 3 else None

    def broken(info: dppo.IterationInfo) -> None:
        raise ValueError(f"no figure at {info.env_steps}")

    callbacks = Callbacks(resolve_callbacks(config, [stop_at_two, count]), config)
    assert callbacks.after({"iteration": 1, "env_steps": 10}, tmp_path, None) is None
    assert callbacks.after({"iteration": 2, "env_steps": 20}, tmp_path, None) == "two iterations"
    assert callbacks.after({"iteration": 3, "env_steps": 30}, tmp_path, None) == "two iterations"  # the first asked
    assert seen == [1, 2, 3]  # every callback sees every iteration, as SB3's CallbackList
    assert Callbacks(resolve_callbacks(config, [count]), config).after({"iteration": 3, "env_steps": 0}, tmp_path,
                                                                        None) == "callback"
    failing = Callbacks(resolve_callbacks(config, [broken]), config)
    with pytest.raises(dppo.RunFailure) as failed:
        failing.after({"iteration": 1, "env_steps": 64}, tmp_path, None)
    assert str(failed.value) == ("callback test_api:test_callbacks_stop_with_their_reason_or_fail_naming_themselves."
                                 "<locals>.broken raised ValueError: no figure at 64")
    assert "Traceback" in (failed.value.details or "")


def saved(config, tmp_path: Path) -> Path:
    """A checkpoint of a fresh run of ``config`` (its initial weights, the model dppo builds for it) on disk."""
    import torch

    from dppo.envs.make import policy_spaces
    from dppo.rl.build import build_model
    from dppo.run.checkpoint import compose
    from dppo.run.state import RunState

    torch.manual_seed(0)
    models = {name: build_model(*spaces, config.model) for name, spaces in policy_spaces(config).items()}
    state = RunState(config, {name: model.obs_spec.vector_dim for name, model in models.items()})
    path = tmp_path / "ckpt-00000001.pt"
    path.write_bytes(encode(compose(state, {name: m.state_dict() for name, m in models.items()},
                                    dict.fromkeys(models), None)))
    return path


def test_a_loaded_policy_acts_on_one_observation_or_a_batch_as_dppo_eval_does(tmp_path: Path) -> None:
    from dppo.rl.agent import Agent, export_weights
    from dppo.rl.transforms import ObsNormalizer
    from dppo.run.checkpoint import load
    from dppo.run.trained import trained_model

    config = load_config(overrides={"env.id": "Pendulum-v1"})
    path = saved(config, tmp_path)
    policy = dppo.load(path)
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0)
    one = policy.act(obs)
    assert one.shape == (1,) and env.action_space.contains(one)
    batch = policy.act(np.stack([obs] * 5))
    assert batch.shape == (5, 1) and np.allclose(batch, one)  # deterministic: the mode, the same for each row
    trained = trained_model(load(path))  # what `dppo eval` acts with
    agent = Agent(env.observation_space, env.action_space, config.model, seed=0)
    agent.load(export_weights(trained.model), 0)
    normalize = ObsNormalizer(trained.obs_stats is not None, config.env.obs_clip, agent.obs_spec.vector_dim)
    if trained.obs_stats is not None:
        normalize.stats = trained.obs_stats
    greedy, _, _ = agent.act(normalize(agent.obs_spec.encode_one(obs)), greedy=True)
    assert np.allclose(one, np.clip(greedy[0], -2, 2))
    sampled = dppo.load(path, seed=1).act(np.stack([obs] * 64), deterministic=False)
    assert sampled.std() > 0 and np.all(np.abs(sampled) <= 2)
    with pytest.raises(dppo.UsageError, match=r"act\(\): an observation of shape \(2, 2, 3\) fits neither"):
        policy.act(np.zeros((2, 2, 3)))


def test_bad_paths_to_load_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    for path, said in ((tmp_path / "missing", "not found"), (tmp_path, "no intact checkpoint"),
                       (tmp_path / "notes.txt", "is not a dppo checkpoint")):
        with pytest.raises(dppo.UsageError, match=said):
            dppo.load(path)


def test_a_recurrent_policy_keeps_its_memory_until_reset(tmp_path: Path) -> None:
    config = load_config(sets=["model.recurrent=lstm"])
    policy = dppo.load(saved(config, tmp_path))
    (part,) = policy.policies.values()
    obs = np.full((3, 4), 0.5, np.float32)
    policy.act(obs)
    assert part.agent.memory is not None and part.agent.memory.shape[1] == 3  # one row per observation
    before = part.agent.memory.copy()
    policy.act(obs)
    assert not np.allclose(part.agent.memory, before)  # the memory moved on
    policy.reset(np.array([True, False, False]))
    assert part.agent.starts.tolist() == [True, False, False]  # the first row's episode starts afresh
    policy.reset()
    assert part.agent.memory is None


@pytest.mark.parametrize("policy_map", [[], ["policies={first: [a0], rest: ['a[12]']}"]], ids=["shared", "map"])
def test_a_multi_agent_policy_takes_and_answers_a_dict_by_agent(policy_map: list[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One policy for every agent, or a policy map's: each agent acts by its policy, within its action mask."""
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = with_agents(load_config(overrides={"env.id": "crowd"}, sets=["env.multiagent=true", *policy_map]))
    policy = dppo.load(saved(config, tmp_path), seed=0)
    assert sorted(policy.policies) == (["first", "rest"] if policy_map else ["default"])
    from crowd import parallel_env

    del sys.modules["crowd"]  # another test's crowd.py is another module
    env = parallel_env()
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        actions = policy.act(obs, deterministic=False)
        assert set(actions) == set(obs)
        obs, *_ = env.step(actions)  # the env asserts that no masked action was taken
    with pytest.raises(dppo.UsageError, match="takes a dict of observations by agent"):
        policy.act(np.zeros(3))


def test_the_docs_python_blocks_compile_and_the_callback_example_stops_where_it_says(tmp_path: Path) -> None:
    """The README's and docs/python-api.md's Python is valid; the page's callback raises StopRun at 450 and not
    before, and its YAML names the callback as run.callbacks takes it (the train-and-act example runs in
    tests/integration/test_python_api.py)."""
    import re

    import yaml
    from runs import REPO

    pages = {name: (REPO / name).read_text() for name in ("README.md", "docs/python-api.md")}
    blocks = {name: re.findall(r"```python\n(.*?)```", text, re.S) for name, text in pages.items()}
    assert blocks["README.md"] and len(blocks["docs/python-api.md"]) >= 4
    for name, found in blocks.items():
        for block in found:
            compile(block, name, "exec")
    (example,) = [b for b in blocks["docs/python-api.md"] if "def stop_when_steady" in b]
    namespace: dict = {"dppo": dppo}
    exec(example.split("\nresult = ")[0], namespace)  # the function, not its training run
    config = load_config()
    for mean, stops in ((None, False), (449.9, False), (450.0, True)):
        info = dppo.IterationInfo({"iteration": 1, "env_steps": 1, "episode_return_mean": mean}, tmp_path, None, config)
        if stops:
            with pytest.raises(dppo.StopRun, match="steady at 450"):
                namespace["stop_when_steady"](info)
        else:
            namespace["stop_when_steady"](info)
    (listed,) = re.findall(r"```yaml\n(run:\n  callbacks:.*?)```", pages["docs/python-api.md"], re.S)
    assert load_config(base=yaml.safe_load(listed)).run.callbacks == ["mypkg.callbacks:stop_when_steady"]
