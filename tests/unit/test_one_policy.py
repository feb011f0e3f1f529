"""One Policy class (issue 62): whichever backend computes the forward pass (the actor's thread with one group of
envs, a worker thread with two halves, the inference service's batched passes), the actor draws every action with
numpy from its own seeded stream and keeps a recurrent policy's memory itself, so a seeded sampler's segments are
the same, bit for bit, for an MLP, an LSTM, a CNN, a Dict observation with an action mask and a two-agent
PettingZoo env (each agent a column; its faults raise only inside a Ray actor, so never here). No Ray: the service's
forward passes are its plain class, run when a result is asked for. The torch networks (LSTM, CNN) compute in
float32, whose CPU kernels give a row other last bits in a batch of fewer than 4 rows or an odd count; the torch
path pads each pass to a multiple of 4 rows (dppo.rl.agent.ROW_BLOCK), so 4 envs in halves of 2 (an LSTM) and 2 envs
in halves of 1 (a CNN) sample the same too. The MLP computes in float64 numpy, batch-invariant by design."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import dppo.envs  # noqa: F401 - registers the toy envs
from dppo.config import Config, load_config
from dppo.distributed.actor import actor_sampler
from dppo.distributed.inference import ForwardPasses
from dppo.envs.make import env_spec, with_agents
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model
from dppo.rl.policy import BackendPolicy, Reply, Request
from dppo.rl.sampler import Sampler
from dppo.rl.worker_thread import InActor, WorkerThread

SEED = 7


class Served:
    """The inference service's forward passes in this process, computed when a result is asked for."""

    def __init__(self, passes: ForwardPasses) -> None:
        self.passes = passes

    def submit(self, request: Request) -> Request:
        return request

    def result(self, ticket: Request) -> Reply:
        return self.passes.forward([ticket])[0]

    def cancel(self, ticket: Request) -> None:
        """Nothing computed before the result is asked for."""


def placed(base: Config, **run: object) -> Config:
    return base.model_copy(update={"run": base.run.model_copy(update=run)})


def samplers(overrides: dict) -> list[Sampler]:
    """The same seeded sampler with its policy on the actor's thread, on a worker thread in two halves, and in the
    service (two halves), every one holding the same weights."""
    config = with_agents(load_config(overrides={"env.num_envs": 8, "ppo.segment_length": 16,
                                                "ppo.minibatch_size": 32, **overrides, "run.seed": 1}))
    spec = env_spec(config)
    (obs_space, action_space), = spec.spaces.values()  # of one agent, for a multi-agent env
    torch.manual_seed(3)
    weights = export_weights(build_model(obs_space, action_space, config.model))
    actor = actor_sampler(placed(config, inference="actor"), 0, SEED, spec)
    halves = actor_sampler(placed(config, inference="actor", actor_halves=2), 0, SEED, spec)
    for sampler in (actor, halves):
        sampler.set_weights(weights, 0)
    passes = ForwardPasses(obs_space, action_space, config.model)
    passes.load(weights, 0)
    policy = BackendPolicy(obs_space, action_space, config.model, SEED, config.columns, Served(passes))
    service = Sampler(placed(config, inference="server"), seed=SEED, policy=policy)
    service.set_weights({}, 0)
    assert isinstance(actor.policy.backend, InActor) and isinstance(halves.policy.backend, WorkerThread)
    assert [len(s.half_envs) for s in (actor, halves, service)] == [1, 2, 2]
    return [actor, halves, service]


@pytest.mark.parametrize("overrides", [
    {"env.id": "CartPole-v1"},
    {"env.id": "CartPole-v1", "model.recurrent": "lstm", "model.lstm_hidden_size": 16},
    {"env.id": "dppo/CueCorridor-v0", "model.recurrent": "lstm", "model.lstm_hidden_size": 16},
    {"env.id": "CartPole-v1", "model.recurrent": "lstm", "model.lstm_hidden_size": 16, "env.num_envs": 4},
    {"env.id": "dppo/Frames-v0"},  # pixels: the CNN
    {"env.id": "dppo/Frames-v0", "env.num_envs": 2},  # passes of 1 and 2 rows, padded to 4
    {"env.id": "dppo/MaskedGrid-v0"},  # a Dict observation with an action mask
    {"env.id": None, "env.entry_point": "dppo.envs.flaky:flaky_pair", "env.multiagent": True},  # two agents
], ids=["mlp", "lstm-cartpole", "lstm-cue", "lstm-4-envs", "cnn", "cnn-2-envs", "dict-mask", "two-agent"])
def test_every_placement_samples_the_same_segments(overrides: dict) -> None:
    first, *others = samplers(overrides)
    for _ in range(2):  # env state, episodes and a recurrent memory carry across segments
        want = first.sample()
        for other in others:
            got = other.sample()
            for field in dataclasses.fields(want):
                left, right = getattr(want, field.name), getattr(got, field.name)
                if field.name.endswith("_seconds"):  # timings
                    continue
                if field.name == "obs":
                    for part in ("image", "vector"):
                        if getattr(left, part) is not None:
                            np.testing.assert_array_equal(getattr(left, part), getattr(right, part), err_msg=part)
                elif isinstance(left, np.ndarray):
                    np.testing.assert_array_equal(left, right, err_msg=field.name)
                elif field.name in ("obs_stats", "return_stats") and left is not None:
                    np.testing.assert_equal(dataclasses.asdict(left), dataclasses.asdict(right), err_msg=field.name)
                else:
                    assert left == right, field.name
    for sampler in (first, *others):
        sampler.close()
