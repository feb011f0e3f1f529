"""The actor's MLP policy in a fresh process: weights and a seed in, actions out, without importing torch."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig
from dppo.rl.agent import Agent, export_weights


def test_an_agent_with_weights_and_a_seed_never_imports_torch(tmp_path) -> None:
    """What a Ray actor runs for an MLP policy: weights in, actions out, no torch (memory, start-up)."""
    env = gym.make("CartPole-v1")
    source = Agent(env.observation_space, env.action_space, ModelConfig(), seed=5)
    np.savez(tmp_path / "weights.npz", **export_weights(source.model))
    obs = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    expected = source.act(obs)[1:]
    script = (
        "import sys, numpy as np, gymnasium as gym\n"
        "from dppo.rl.agent import Agent\nfrom dppo.config import ModelConfig\n"
        "env = gym.make('CartPole-v1')\n"
        "agent = Agent(env.observation_space, env.action_space, ModelConfig(), seed=5)\n"
        f"agent.load(dict(np.load({str(tmp_path / 'weights.npz')!r})), 0)\n"
        "_, log_probs, values = agent.act(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))\n"
        "print('torch' in sys.modules, log_probs.tolist(), values.tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    imported_torch, numbers = done.stdout.split(" ", 1)
    assert imported_torch == "False"
    assert numbers.strip() == f"{expected[0].tolist()} {expected[1].tolist()}"
