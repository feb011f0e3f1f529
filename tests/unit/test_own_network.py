"""model.entry_point: a network of one's own behind the built-in model's interface (trainer, every Agent backend,
the deterministic export), and the one line each wrong network gets at start."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import dppo.envs  # noqa: F401 - registers the toy envs
from dppo.commands.parser import main
from dppo.config import ModelConfig, load_config
from dppo.envs.user_code import EnvLoadError
from dppo.rl.agent import Agent
from dppo.rl.build import build_model
from dppo.rl.custom import OwnActorCritic, head_width, input_shapes
from dppo.rl.deterministic import DeterministicPolicy, example_inputs
from dppo.rl.ppo import Trainer

EXAMPLE = "examples.own_network.nets:ResidualMLP"

BAD_NETS = '''
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self, observation_space, action_space, config):
        super().__init__()
        self.layer = nn.Linear(4, 2)


class WrongWidth(Base):
    def forward(self, x):
        return torch.zeros(len(x), 5), torch.zeros(len(x))


class NoValue(Base):
    def forward(self, x):
        return self.layer(x)


class IntLogits(Base):
    def forward(self, x):
        return torch.zeros(len(x), 2, dtype=torch.long), torch.zeros(len(x))


class ValueRows(Base):
    def forward(self, x):
        return self.layer(x), torch.zeros(len(x), 2)


class Raises(Base):
    def forward(self, x):
        return self.layer(x[:, :3])


class NumpyInside(Base):
    """Leaves torch for numpy in its forward: it runs, and no exporter can follow it."""

    def forward(self, x):
        import numpy as np

        out = self.layer(x / (float(np.abs(x.detach().numpy()).max()) + 1.0))
        return out, out[:, 0]


def not_a_module(observation_space, action_space, config):
    return "a string"


def cannot_build(observation_space, action_space, config):
    raise ValueError("needs a Dict observation")
'''


@pytest.fixture
def bad_nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "badnets.py").write_text(BAD_NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("badnets", None)


def own(space_id: str, **kwargs: object) -> tuple[OwnActorCritic, gym.Env]:
    env = gym.make(space_id, **kwargs)
    model = build_model(env.observation_space, env.action_space, ModelConfig(entry_point=EXAMPLE))
    assert isinstance(model, OwnActorCritic)
    return model, env


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "dppo/DictMatch-v0", "dppo/MatchBits-v0",
                                    "dppo/MatchDigits-v0"])
def test_the_example_network_acts_and_trains_in_every_space(env_id: str) -> None:
    """The torch Agent (actors, worker threads, the service), the trainer's evaluate and the exported mode agree."""
    torch.manual_seed(0)
    model, env = own(env_id)
    agent = Agent(env.observation_space, env.action_space, ModelConfig(entry_point=EXAMPLE), seed=0)
    agent.load({k: v.numpy() for k, v in model.state_dict().items()}, 1)
    assert not agent.fast  # the numpy MLP path knows only the built-in heads
    env.observation_space.seed(0)
    obs = agent.obs_spec.encode_many([env.observation_space.sample() for _ in range(6)])
    heads = agent.heads(obs)
    _, value = model(obs.map(torch.as_tensor))
    assert np.allclose(heads.values, value.detach().numpy(), atol=1e-6)
    actions, log_probs, _ = agent.act(obs)
    logp, entropy, _ = model.evaluate(obs.map(torch.as_tensor), torch.as_tensor(actions))
    assert np.allclose(log_probs, logp.detach().numpy(), atol=1e-4) and torch.isfinite(entropy).all()
    greedy = DeterministicPolicy(model, None, 10.0)(*example_inputs(DeterministicPolicy(model, None, 10.0)))
    assert greedy.shape[0] == 2
    trainer = Trainer(model, load_config().ppo, 10, 0, torch.device("cpu"))
    assert any(p.requires_grad for p in trainer.model.parameters())


def test_helpers_say_the_widths_a_network_takes_and_returns() -> None:
    config = ModelConfig()
    assert head_width(gym.spaces.Discrete(3)) == 3 and head_width(gym.spaces.MultiDiscrete([2, 3])) == 5
    assert head_width(gym.spaces.Box(-1, 1, (2, 3))) == 6
    dict_space = gym.make("dppo/DictMatch-v0").observation_space
    assert input_shapes(dict_space, config) == [(36, 36, 1), (2,)]  # the image, then the one-hot flip
    assert input_shapes(gym.spaces.Box(-1, 1, (4,)), config) == [(4,)]


@pytest.mark.parametrize(("name", "words"), [
    ("WrongWidth", "returned an action-head output tensor (3, 5) float32; expected a float tensor (3, 2)"),
    ("NoValue", "returned tensor (3, 2) float32; forward must return (action-head output (3, 2), value (3,))"),
    ("IntLogits", "action-head output tensor (3, 2) int64; expected a float tensor (3, 2)"),
    ("ValueRows", "returned a value tensor (3, 2) float32; expected a float tensor (3,) or (3, 1)"),
    ("Raises", "raised RuntimeError on a batch of 3 observations (tensor (3, 4) float32)"),
    ("not_a_module", "returned a str, not a torch nn.Module"),
    ("cannot_build", "raised ValueError when built as cannot_build(observation_space, action_space, model_config): "
                     "needs a Dict observation"),
    ("Missing", "module 'badnets' has no 'Missing'"),
])
def test_a_wrong_network_is_one_line_naming_what_was_expected_and_what_came_back(bad_nets: Path, name: str,
                                                                                 words: str) -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(EnvLoadError) as raised:
        build_model(env.observation_space, env.action_space, ModelConfig(entry_point=f"badnets:{name}"))
    line = str(raised.value)
    assert "\n" not in line and words in line and f"'badnets:{name}'" in line, line


def test_a_module_that_is_not_there_says_how_to_ship_it() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(EnvLoadError, match=r"cannot import module .no_such_nets. for model\.entry_point.*runtime_env"):
        build_model(env.observation_space, env.action_space, ModelConfig(entry_point="no_such_nets:Net"))


@pytest.mark.parametrize(("sets", "words"), [
    (["model.entry_point=badnets:WrongWidth"], "expected a float tensor (3, 2)"),
    (["model.entry_point=badnets"], "'badnets' is not module.path:name"),
    (["model.entry_point=badnets:WrongWidth", "model.recurrent=lstm"], "recurrent network of one's own is not"),
    (["metrics.info_keys=[a/b]"], "'a/b' is not an info key"),
])
def test_dppo_train_refuses_before_anything_is_written(bad_nets: Path, capsys: pytest.CaptureFixture[str],
                                                       sets: list[str], words: str) -> None:
    before = sorted(p.name for p in bad_nets.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", "new-run", *(arg for item in sets for arg in ("--set", item))])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err
    assert sorted(p.name for p in bad_nets.iterdir() if p.name != "__pycache__") == before


def test_a_network_that_does_not_trace_is_one_line_at_export_and_nothing_written(bad_nets: Path) -> None:
    from dppo.commands.export import export
    from dppo.errors import UsageError

    env = gym.make("CartPole-v1")
    model = build_model(env.observation_space, env.action_space, ModelConfig(entry_point="badnets:NumpyInside"))
    with pytest.raises(UsageError) as raised:
        export(DeterministicPolicy(model, None, 10.0), bad_nets / "policy.onnx", "onnx")
    line = str(raised.value)
    assert line.startswith("model.entry_point 'badnets:NumpyInside' does not export as onnx: ") and "\n" not in line
    assert line.endswith("or try --format torchscript (-o policy.pt)"), line
    assert not any(p.suffix == ".onnx" or p.name.startswith(".") for p in bad_nets.iterdir())
