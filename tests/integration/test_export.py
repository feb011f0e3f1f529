"""`dppo export`: ONNX (run by onnxruntime) and TorchScript policies equal dppo's own greedy actions."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import new_checkpoint

from dppo.commands.export import export
from dppo.config import ModelConfig, load_config
from dppo.rl.agent import Agent, export_weights
from dppo.rl.deterministic import DeterministicPolicy
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.run.checkpoint import CheckpointStore, encode

SPACES = [
    (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(3, start=-1)),
    (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (2,), np.float32)),
    (gym.spaces.Discrete(5, start=1), gym.spaces.MultiDiscrete([3, 2])),
    (gym.spaces.MultiBinary(4), gym.spaces.MultiBinary(4)),
    (gym.spaces.Tuple([gym.spaces.Discrete(32), gym.spaces.Discrete(11), gym.spaces.Discrete(2)]),
     gym.spaces.Discrete(2)),
    (gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (36, 36, 1), np.uint8), "flip": gym.spaces.Discrete(2),
                      "speed": gym.spaces.Box(-5, 5, (2,), np.float32)}), gym.spaces.Discrete(4)),
    (gym.spaces.Box(0, 255, (4, 36, 36), np.uint8), gym.spaces.MultiBinary(3)),
    # an action mask: an input of the exported graph, and the mode is never a masked action
    (gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,)), "action_mask": gym.spaces.MultiBinary(5)}),
     gym.spaces.Discrete(5, start=1)),
    (gym.spaces.Dict({"pos": gym.spaces.Discrete(4), "action_mask": gym.spaces.MultiBinary(5)}),
     gym.spaces.MultiDiscrete([3, 2])),
]


def legal(samples: list, action_space: gym.Space) -> list:
    """Samples whose action mask (if any) allows at least one value of every component."""
    nvec = [int(action_space.n)] if isinstance(action_space, gym.spaces.Discrete) else list(
        getattr(action_space, "nvec", []))
    for sample in samples:
        if isinstance(sample, dict) and "action_mask" in sample:
            for start in np.cumsum([0, *nvec[:-1]]):
                sample["action_mask"][start] = 1
    return samples


def run_exported(path: Path, fmt: str, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    if fmt == "torchscript":
        return torch.jit.load(str(path))(*inputs).numpy()
    session = ort.InferenceSession(str(path))
    return session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)})[0]


def dppo_greedy(agent: Agent, obs_stats: RunningStats | None, samples: list, clip: float = 10.0) -> np.ndarray:
    """What `dppo eval` does: encode, normalize the vector part, the policy's mode, the env's action."""
    obs = agent.obs_spec.encode_many(samples)
    if obs_stats is not None:
        obs.vector[:] = obs_stats.normalize(obs.vector, clip)
    actions, _, _ = agent.act(obs, greedy=True)
    return agent.action_spec.to_env(actions)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize(("obs_space", "action_space"), SPACES,
                         ids=[f"{type(o).__name__}-{type(a).__name__}" for o, a in SPACES])
def test_exported_policy_equals_dppo_greedy_actions(tmp_path: Path, fmt: str, obs_space: gym.Space,
                                                   action_space: gym.Space) -> None:
    torch.manual_seed(1)
    model = ActorCritic(obs_space, action_space, ModelConfig(init_log_std=-0.5))
    dim = model.obs_spec.vector_dim
    rng = np.random.default_rng(0)
    obs_stats = RunningStats(rng.normal(size=dim), rng.uniform(0.5, 2.0, size=dim), 100.0) if dim else None
    policy = DeterministicPolicy(model, obs_stats, 10.0)
    path = tmp_path / f"policy.{fmt}"
    export(policy, path, fmt)
    agent = Agent(obs_space, action_space, ModelConfig(init_log_std=-0.5), seed=0)
    agent.load(export_weights(model), 1)
    obs_space.seed(7)
    samples = legal([obs_space.sample() for _ in range(9)], action_space)  # 9 rows: a dynamic batch
    from dppo.rl.spaces import at_path, stack

    batch = stack(samples, obs_space)
    inputs = tuple(torch.as_tensor(np.asarray(at_path(batch, p))) for p in policy.input_paths())
    got = run_exported(path, fmt, inputs)
    expected = dppo_greedy(agent, obs_stats, samples)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    for action in got:
        assert action_space.contains(action)


def test_exported_pendulum_checkpoint_matches_dppo_on_a_real_episode(tmp_path: Path) -> None:
    """The CLI on a checkpoint with observation statistics; the observations of a real episode."""
    run = tmp_path / "run"
    config = load_config(overrides={"env.id": "Pendulum-v1", "run.run_dir": str(run)})
    obs_stats = RunningStats(np.array([0.1, -0.2, 0.5]), np.array([0.4, 0.6, 3.0]), 1000.0)
    checkpoint, model = new_checkpoint(config, obs_stats)
    CheckpointStore(run / "checkpoints", 3).save(checkpoint, 1)
    out = {}
    for fmt, name in (("onnx", "policy.onnx"), ("torchscript", "policy.pt")):
        done = subprocess.run([sys.executable, "-m", "dppo", "export", "--checkpoint", str(run), "-o",
                               str(tmp_path / name)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"({fmt};" in done.stdout
        out[fmt] = tmp_path / name
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=3)
    episode = [obs]
    for _ in range(199):
        obs, *_ = env.step(env.action_space.sample())
        episode.append(obs)
    agent = Agent(env.observation_space, env.action_space, config.model, seed=0)
    agent.load(export_weights(model), 1)
    expected = dppo_greedy(agent, obs_stats, episode)
    inputs = (torch.as_tensor(np.stack(episode)),)
    for fmt, path in out.items():
        np.testing.assert_allclose(run_exported(path, fmt, inputs), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_exported_policy_gets_the_mode_open_gives_under_the_umask(tmp_path: Path, fmt: str) -> None:
    """A policy is copied into images and shipped: 0o666 less the umask, as open() creates files (it was 0o600,
    unreadable to the image's non-root user)."""
    policy = DeterministicPolicy(ActorCritic(*SPACES[0], ModelConfig()), None, 10.0)
    for mask, mode in ((0o022, 0o644), (0o077, 0o600)):
        old = os.umask(mask)
        try:
            export(policy, tmp_path / f"policy-{mask:o}.{fmt}", fmt)
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / f"policy-{mask:o}.{fmt}").stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"policy-22.{fmt}", f"policy-77.{fmt}"]  # no temp left


@pytest.mark.parametrize(("args", "message"), [
    (["--checkpoint", "garbage.pt", "-o", "p.onnx"], "garbage.pt"),
    (["--checkpoint", "future.pt", "-o", "p.onnx"], "format 2 and this dppo reads format 1"),
    (["--checkpoint", "run", "-o", "no/such/dir/p.onnx"], "does not exist"),
    (["--checkpoint", "run", "-o", "run"], "it is a directory"),
    (["--checkpoint", "run", "-o", "garbage.pt/p.onnx"], "does not exist"),
    (["--checkpoint", "run", "-o", "p.onnx", "--format", "tflite"], "invalid choice"),
    (["--checkpoint", "run", "-o", "policy.xyz"], "-o 'policy.xyz' ends in '.xyz', which names no export format; name "
                                                  "the file .onnx (ONNX) or .pt (TorchScript), or pass --format"),
    (["--checkpoint", "run", "-o", "policy"], "-o 'policy' has no suffix, which names no export format"),
])
def test_bad_export_input_exits_2_with_one_line_and_writes_nothing(
        tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    config = load_config(overrides={"run.run_dir": str(tmp_path / "run")})
    checkpoint = new_checkpoint(config)[0]
    CheckpointStore(tmp_path / "run" / "checkpoints", 3).save(checkpoint, 1)
    (tmp_path / "future.pt").write_bytes(encode({**checkpoint, "format": 2}))  # written by a later dppo
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = subprocess.run([sys.executable, "-m", "dppo", "export", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                       "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
