"""Recurrent (LSTM) policies: the update's replay of whole env columns recomputes the actors' values exactly and their
log-probs to float32's precision at the first epoch (the actors draw with numpy in float64, issue 62), the memory
crosses segment boundaries and is zeroed where episodes start, the exported policy steps like the actors, and a config
that cannot replay whole columns is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dppo.config import ConfigError, load_config
from dppo.rl.agent import export_weights
from dppo.rl.batch import build_batch
from dppo.rl.build import build_model
from dppo.rl.deterministic import DeterministicPolicy, example_inputs
from dppo.rl.ppo import Trainer
from dppo.rl.recurrent import RecurrentActorCritic
from dppo.rl.sampler import Sampler

CUE = {"env.id": "dppo/CueCorridor-v0", "model.recurrent": "lstm", "model.lstm_hidden_size": 16,
       "env.num_envs": 4, "ppo.segment_length": 16, "ppo.minibatch_size": 32}


def sampler_with_model(overrides: dict, seed: int = 0) -> tuple[Sampler, RecurrentActorCritic]:
    torch.manual_seed(seed)
    config = load_config(overrides={**CUE, **overrides, "run.seed": seed})
    sampler = Sampler(config)
    model = build_model(sampler.envs.single_observation_space, sampler.envs.single_action_space, config.model)
    sampler.set_weights(export_weights(model), 0)
    return sampler, model


@pytest.mark.parametrize("env_id, kwargs", [("dppo/CueCorridor-v0", {}), ("CartPole-v1", {}),
                                            ("dppo/CueCorridor-v0", {"length": 2})])
def test_the_first_epoch_replays_exactly_the_actors_log_probs_and_values(env_id: str, kwargs: dict) -> None:
    sampler, model = sampler_with_model({"env.id": env_id, "env.kwargs": kwargs})
    segments = [sampler.sample() for _ in range(3)]  # episodes end inside segments and across their cuts
    assert any(seg.starts[1:].any() for seg in segments)
    batch = build_batch(segments, 0.99, 0.95, torch.device("cpu"))
    trainer = Trainer(model, sampler.config.ppo, 10, seed=0, device=torch.device("cpu"))
    minibatches = list(trainer._minibatches(batch))
    assert len(minibatches) == 3 * 4 * 16 // 32 and all(len(idx) == 32 for idx in minibatches)  # 2 columns each
    with torch.no_grad():
        for idx in minibatches:
            log_probs, _, values = trainer._evaluate(batch, idx)
            ratio = (log_probs - batch.log_probs[idx]).exp()
            torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)
            assert torch.equal(values, batch.values[idx])
    # the update replays the same way: with a step size of 0 (weights stay put) and the old log-probs shifted by
    # log r row by row, it reports the clip fraction and k3 KL of those ratios, computed by hand
    trainer.config = trainer.config.model_copy(update={"learning_rate": 0.0})
    pattern = [0.7, 1.0, 1.15, 0.95]  # |r - 1| > 0.2: only 0.7
    ratios = torch.tensor(pattern * (len(batch.actions) // len(pattern)))
    stats = trainer.update(batch._replace(log_probs=batch.log_probs - ratios.log()), 0, 1)
    assert stats.epochs_run == sampler.config.ppo.epochs
    assert stats.clip_fraction == pytest.approx(1 / 4, abs=1e-6)
    assert stats.approx_kl == pytest.approx(sum((r - 1) - math.log(r) for r in pattern) / len(pattern), rel=1e-4)


def test_the_memory_crosses_segment_cuts_and_is_zeroed_where_an_episode_starts() -> None:
    sampler, model = sampler_with_model({"env.kwargs": {"length": 6}, "ppo.segment_length": 5,
                                         "ppo.minibatch_size": 10})
    first, second = sampler.sample(), sampler.sample()
    assert not np.allclose(second.initial_memory, 0)  # the second segment starts mid-episode, remembering
    both = build_batch([first, second], 0.99, 0.95, torch.device("cpu"))
    # one column of the two segments joined, replayed from the first one's memory, gives the second's log-probs
    joined = [np.concatenate([a, b]) for a, b in ((first.obs.vector, second.obs.vector),
                                                  (first.actions, second.actions), (first.starts, second.starts))]
    obs, actions, starts = (torch.as_tensor(x[:, 0]) for x in joined)
    memory = tuple(torch.as_tensor(m[None, :1]) for m in first.initial_memory)
    with torch.no_grad():
        log_probs, _, _ = model.evaluate_columns(model.as_obs(obs), actions, starts, memory, steps=10)
    np.testing.assert_allclose(log_probs[5:].numpy(), second.log_probs[:, 0], rtol=0, atol=1e-6)
    assert len(both.memory[0][0]) == 8  # 2 segments x 4 env columns
    # at an episode's first observation the memory is zero: the same as a fresh policy's first step
    t = int(np.flatnonzero(second.starts[:, 0])[0])
    with torch.no_grad():
        fresh = sampler.agent.model(model.as_obs(torch.as_tensor(second.obs.vector[t, :1])))[1]
    assert float(fresh[0]) == pytest.approx(float(second.values[t, 0]), abs=1e-6)


def test_the_exported_recurrent_policy_steps_like_the_model() -> None:
    config = load_config(overrides=CUE)
    sampler = Sampler(config)
    model = build_model(sampler.envs.single_observation_space, sampler.envs.single_action_space, config.model)
    policy = DeterministicPolicy(model, None, 10.0)
    assert policy.input_names() == ["obs", "state.h", "state.c"]
    assert policy.output_names() == ["action", "next_state.h", "next_state.c"]
    obs, h, c = example_inputs(policy, rows=3)
    memory, starts = model.initial_memory(3), torch.zeros(3, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(4):  # the state handed back is the state the model carries
            action, h, c = policy(obs, h, c)
            dist, _, memory = model.step(model.as_obs(obs), memory, starts)
            assert torch.equal(action, dist.mode()) and torch.allclose(h, memory[0][0])
    sampler.close()


@pytest.mark.parametrize("overrides, words", [
    ({"ppo.minibatch_size": 24}, "is not a whole number of env columns"),
    ({"ppo.minibatch_size": 32, "run.learners": 4}, "multiple of ppo.segment_length x run.learners = 64"),
])
def test_minibatches_that_are_not_whole_columns_are_refused(overrides: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_config(overrides={**CUE, "run.actors": 4, **overrides})
