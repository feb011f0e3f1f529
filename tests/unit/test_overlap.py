"""The actor's own policy on a worker thread (dppo.rl.worker_thread), in one or two halves, against the in-actor Agent:
the
same segments for a seeded run (exactly for MLPs, which draw from the same stream; for a greedy CNN and LSTM the same
actions, values to float tolerance), masks respected, an env that raises retried the same way; and the config's
checks of run.actor_halves and run.actor_gpus."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from gymnasium.vector import VectorWrapper

import dppo.envs  # noqa: F401 - registers the toy envs
from dppo.config import Config, ConfigError, load_config
from dppo.distributed.actor import actor_sampler
from dppo.distributed.actor_pool import gpu_shortage
from dppo.envs.make import env_spec, make_vector_env
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model
from dppo.rl.sampler import Sampler
from dppo.rl.segment import Segment
from dppo.rl.worker_thread import WorkerThread, own_policy
from dppo.sweep.spec import load_sweep
from dppo.sweep.trainable import trial_bundles

SEED = 7


def weights_of(config: Config, sharpen: float = 1.0) -> dict[str, np.ndarray]:
    """Seeded initial weights; ``sharpen`` scales the policy head's output layer so that sampling picks the largest
    logit with certainty (a greedy policy for the in-actor Agent, whose CNN and LSTM draw from torch's stream)."""
    env = gym.make(config.env.id, **config.env.kwargs)
    torch.manual_seed(3)
    weights = export_weights(build_model(env.observation_space, env.action_space, config.model))
    last = max(int(key.split(".")[1]) for key in weights if key.startswith("policy_head."))
    for kind in ("weight", "bias"):
        weights[f"policy_head.{last}.{kind}"] = weights[f"policy_head.{last}.{kind}"] * sharpen
    return weights


def overlapped(config: Config, halves: int, make_envs: Any = make_vector_env) -> Sampler:
    env = gym.make(config.env.id, **config.env.kwargs)
    policy = own_policy(env.observation_space, env.action_space, config.model, SEED, config.env.num_envs,
                        on_worker=True)
    halved = config.model_copy(update={"run": config.run.model_copy(update={"actor_halves": halves})})
    return Sampler(halved, seed=SEED, policy=policy, make_envs=make_envs)


def assert_same(a: Segment, b: Segment, exact: bool) -> None:
    """Every field of two segments equal (timings aside); ``exact``: bit for bit, else floats within 1e-5."""
    for field in dataclasses.fields(a):
        left, right = getattr(a, field.name), getattr(b, field.name)
        if field.name.endswith("_seconds") or field.name in ("obs_stats", "return_stats"):
            continue
        pairs = zip(left.parts().values(), right.parts().values(), strict=True) if field.name == "obs" else [
            (left, right)]
        for x, y in pairs:
            if isinstance(x, np.ndarray) and x.dtype.kind == "f" and not exact:
                np.testing.assert_allclose(x, y, atol=1e-5, err_msg=field.name)
            elif isinstance(x, np.ndarray):
                np.testing.assert_array_equal(x, y, err_msg=field.name)
            else:
                assert x == y, field.name


@pytest.mark.parametrize("halves", [1, 2])
@pytest.mark.parametrize("overrides", [
    {"env.num_envs": 4, "ppo.segment_length": 40},  # CartPole: truncations at 500 steps never reached; terminations
    {"env.id": "dppo/Counter-v0", "env.num_envs": 2, "ppo.segment_length": 25},  # time limits: V(final obs)
    {"env.id": "dppo/MaskedGrid-v0", "env.num_envs": 4, "ppo.segment_length": 32},  # action masks
])
def test_an_mlp_policy_on_the_worker_samples_exactly_what_the_in_actor_agent_samples(overrides: dict,
                                                                                      halves: int) -> None:
    config = load_config(overrides={"ppo.num_minibatches": 1, **overrides})
    weights = weights_of(config)
    mine, local = overlapped(config, halves), Sampler(config, seed=SEED)
    for sampler in (mine, local):
        sampler.set_weights(weights, 0)
    for _ in range(2):  # env state and episodes carry across segments
        seg = mine.sample()
        assert_same(seg, local.sample(), exact=True)
    assert len(mine.half_envs) == halves
    if seg.obs.mask is not None:
        taken = np.take_along_axis(seg.obs.mask, seg.actions[..., None].astype(np.int64), axis=-1)
        assert taken.all() and not seg.obs.mask.all()  # some actions were masked, none of those taken


@pytest.mark.parametrize("halves", [1, 2])
@pytest.mark.parametrize("overrides", [
    {"env.id": "dppo/DictMatch-v0", "env.num_envs": 4, "ppo.segment_length": 24},  # a CNN and a vector
    {"env.id": "dppo/CueCorridor-v0", "env.kwargs": {"length": 3}, "model.recurrent": "lstm",
     "model.lstm_hidden_size": 16, "env.num_envs": 4, "ppo.segment_length": 16},  # an LSTM's memory and starts
])
def test_a_greedy_cnn_or_lstm_on_the_worker_acts_as_the_in_actor_agent(overrides: dict, halves: int) -> None:
    config = load_config(overrides={"ppo.num_minibatches": 1, **overrides})
    weights = weights_of(config, sharpen=1e6)
    mine, local = overlapped(config, halves), Sampler(config, seed=SEED)
    for sampler in (mine, local):
        sampler.set_weights(weights, 0)
    for _ in range(2):  # the second segment starts from the memory (and episodes) the first left
        seg = mine.sample()
        assert_same(seg, local.sample(), exact=False)
    assert len(np.unique(seg.actions)) > 1  # the policy acts on what it sees, not one action everywhere
    if config.model.recurrent == "lstm":
        assert seg.starts[1:].any() and np.abs(seg.initial_memory).sum() > 0


class RaiseOnce(VectorWrapper):
    """A vector env whose ``at``-th step raises out of it (as ale-py's does: it cannot recreate one copy)."""

    def __init__(self, env: gym.vector.VectorEnv, at: int) -> None:
        super().__init__(env)
        self.steps, self.at = 0, at

    def step(self, actions: Any) -> Any:
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("injected env failure")
        return self.env.step(actions)


def failing_at(which: int, at: int) -> Any:
    """make_envs whose ``which``-th vector env made raises at its ``at``-th step."""
    made: list[gym.vector.VectorEnv] = []

    def make(config: Config) -> gym.vector.VectorEnv:
        made.append(make_vector_env(config))
        return RaiseOnce(made[-1], at) if len(made) == which else made[-1]

    return make


def test_a_vector_env_that_raises_is_made_afresh_mid_segment_as_in_the_actor() -> None:
    """The worker thread's sampler and the in-actor one handle a raising vector env the same way: made afresh at
    that step, every copy's episode cut there (truncated, counted as a failure), the segment kept."""
    config = load_config(overrides={"env.num_envs": 4, "ppo.segment_length": 20, "ppo.num_minibatches": 1})
    weights = weights_of(config)
    mine = overlapped(config, 1, make_envs=failing_at(which=1, at=5))
    local = Sampler(config, seed=SEED, make_envs=failing_at(which=1, at=5))
    for sampler in (mine, local):
        sampler.set_weights(weights, 0)
    seg = mine.sample()
    assert_same(seg, local.sample(), exact=True)
    assert mine.env_resets == local.env_resets == 1
    assert seg.truncated[4].all() and not seg.terminated[4].any() and seg.rewards[4].sum() == 0
    assert seg.env_failures.count == 4 and "injected env failure" in seg.env_failures.first


def test_with_two_halves_only_the_half_that_raised_is_made_afresh() -> None:
    config = load_config(overrides={"env.num_envs": 4, "ppo.segment_length": 20, "ppo.num_minibatches": 1})
    mine = overlapped(config, 2, make_envs=failing_at(which=2, at=5))  # the second half raises, a request in flight
    mine.set_weights(weights_of(config), 0)
    seg = mine.sample()
    assert seg.truncated[4, 2:].all() and not seg.truncated[4, :2].any() and seg.env_failures.count == 2
    assert mine.env_resets == 1 and not mine.in_flight
    assert mine.sample().actions.shape == (20, 4)  # the next segment goes on from there


def test_the_actor_makes_the_overlapped_policy_only_when_asked() -> None:
    config = load_config(overrides={"env.num_envs": 4, "ppo.num_minibatches": 1})
    spec = env_spec(config)
    plain = actor_sampler(config, 0, SEED, spec)  # by default the forward pass on the actor's thread, one group
    assert not isinstance(plain.policy.backend, WorkerThread) and len(plain.half_envs) == 1
    halved = config.model_copy(update={"run": config.run.model_copy(update={"actor_halves": 2})})
    sampler = actor_sampler(halved, 0, SEED, spec)
    assert isinstance(sampler.policy.backend, WorkerThread) and len(sampler.half_envs) == 2
    assert sampler.policy.backend.agent.device == "cpu"


@pytest.mark.parametrize("overrides, message", [
    ({"run.actor_halves": 2, "env.num_envs": 3},
     r"^run.actor_halves=2 steps each actor's envs in two halves, so env.num_envs must be even, not 3; set "
     r"env.num_envs=4 or run.actor_halves=1$"),
    ({"run.actor_halves": 4}, r"^run.actor_halves: Input should be 1 or 2 \(got 4\)$"),
    ({"run.actor_gpus": -0.5}, r"^run.actor_gpus: Input should be greater than or equal to 0 \(got -0.5\)$"),
    ({"run.actor_gpus": 1.5}, r"^run.actor_gpus above 1 must be a whole number of GPUs \(Ray's rule\), not 1.5; use a "
                              r"share below 1 or 1$"),
    ({"run.actor_gpus": 0.5, "run.inference": "server"}, r"^run.actor_gpus and run.actor_halves set how the actors "
                                                         r"run their own policy, and run.inference=server"),
])
def test_bad_actor_halves_and_gpu_shares_are_one_line_naming_the_fix(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={"ppo.num_minibatches": 1, **overrides})


def test_good_actor_halves_and_gpu_shares_load() -> None:
    config = load_config(overrides={"run.actor_halves": 2, "run.actor_gpus": 0.25, "env.num_envs": 16,
                                    "ppo.num_minibatches": 1})
    assert (config.run.actor_halves, config.run.actor_gpus) == (2, 0.25)
    assert load_config(overrides={"run.actor_gpus": 2, "ppo.num_minibatches": 1}).run.actor_gpus == 2


def test_a_gpu_share_no_node_holds_is_one_line() -> None:
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0}}, {"Alive": False, "Resources": {"GPU": 8.0}},
             {"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}]
    assert gpu_shortage(0.25, nodes) is None and gpu_shortage(1, nodes) is None
    line = gpu_shortage(2, nodes)
    assert line is not None and "no node of the Ray cluster has 2 GPUs (the most on one node: 1)" in line
    assert "set run.actor_gpus=0" in line and "\n" not in line
    assert "has 0.5 GPU (the most on one node: 0)" in gpu_shortage(0.5, nodes[:2])


def test_a_sweep_trial_reserves_each_actors_gpu_share(tmp_path: Path) -> None:
    """Tune places a trial's actors in its placement group: a bundle without the GPU share would never hold one."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {"env": "CartPole-v1"}, "set": {"run.actor_gpus": 0.25},
                                    "space": {"ppo.learning_rate": "loguniform(1e-4, 1e-3)"}}))
    bundles = trial_bundles(load_sweep(path))
    assert bundles[1:] == [{"CPU": 1.0, "GPU": 0.25}] * 2
    path.write_text(yaml.safe_dump({"base": {"env": "CartPole-v1"}, "space": {"ppo.learning_rate": "uniform(0.1, 1)"}}))
    assert trial_bundles(load_sweep(path))[1:] == [{"CPU": 1.0}] * 2
