"""Spaces: encoding against gymnasium's own flatten, and numpy vs torch action distributions on every space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dppo.config import ModelConfig
from dppo.errors import UnsupportedSpace
from dppo.rl.actions import ActionSpec
from dppo.rl.agent import Agent
from dppo.rl.model import ActionDist, ActorCritic
from dppo.rl.spaces import Obs, ObsSpec, check_spaces

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def leaf_spaces(draw: st.DrawFn) -> gym.Space:
    kind = draw(st.sampled_from(["box", "int_box", "discrete", "multi_discrete", "multi_binary"]))
    seed = draw(st.integers(0, 2**16))
    if kind == "box":
        shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        space = gym.spaces.Box(-5.0, 5.0, shape, np.float32)
    elif kind == "int_box":
        space = gym.spaces.Box(-3, 3, (draw(st.integers(1, 4)),), np.int64)
    elif kind == "discrete":
        space = gym.spaces.Discrete(draw(st.integers(1, 6)), start=draw(st.integers(-2, 2)))
    elif kind == "multi_discrete":
        nvec = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
        space = gym.spaces.MultiDiscrete(nvec, start=[draw(st.integers(-1, 1))] * len(nvec))
    else:
        space = gym.spaces.MultiBinary(draw(st.integers(1, 5)))
    space.seed(seed)
    return space


@st.composite
def obs_spaces(draw: st.DrawFn) -> gym.Space:
    shape = draw(st.sampled_from(["leaf", "dict", "tuple", "nested"]))
    if shape == "leaf":
        return draw(leaf_spaces())
    leaves = draw(st.lists(leaf_spaces(), min_size=1, max_size=4))
    if shape == "dict":
        space: gym.Space = gym.spaces.Dict({f"k{i}": s for i, s in enumerate(leaves)})
    elif shape == "tuple":
        space = gym.spaces.Tuple(leaves)
    else:
        space = gym.spaces.Dict({"inner": gym.spaces.Tuple(leaves), "last": gym.spaces.Discrete(3)})
    space.seed(draw(st.integers(0, 2**16)))
    return space


def action_spaces() -> st.SearchStrategy[gym.Space]:
    return st.one_of(
        st.integers(1, 6).map(gym.spaces.Discrete),
        st.builds(lambda n, s: gym.spaces.Discrete(n, start=s), st.integers(1, 6), st.integers(-3, 3)),
        st.lists(st.integers(1, 5), min_size=1, max_size=4).map(gym.spaces.MultiDiscrete),
        st.integers(1, 6).map(gym.spaces.MultiBinary),
        st.lists(st.integers(1, 3), min_size=1, max_size=2).map(
            lambda shape: gym.spaces.Box(-1.0, 1.0, tuple(shape), np.float32)),
    )


@SETTINGS
@given(space=obs_spaces(), rows=st.integers(1, 5))
def test_vector_encoding_is_gymnasium_flatten_and_unflattens(space: gym.Space, rows: int) -> None:
    samples = [space.sample() for _ in range(rows)]
    encoded = ObsSpec(space).encode_many(samples)
    assert encoded.image is None and encoded.vector.dtype == np.float32
    expected = np.stack([gym.spaces.flatten(space, x) for x in samples]).astype(np.float32)
    np.testing.assert_array_equal(encoded.vector, expected)
    for row, sample in zip(encoded.vector, samples, strict=True):  # decoding gives the observation back
        restored = gym.spaces.unflatten(space, row.astype(gym.spaces.flatten_space(space).dtype))
        assert gym.spaces.flatten(space, restored).tolist() == gym.spaces.flatten(space, sample).tolist()


@SETTINGS
@given(space=obs_spaces(), rows=st.integers(2, 5))
def test_batched_and_per_sample_encodings_agree(space: gym.Space, rows: int) -> None:
    """A vector env's batched observation (what step returns) encodes like the same samples one by one."""
    samples = [space.sample() for _ in range(rows)]
    batched = gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, rows))
    spec = ObsSpec(space)
    np.testing.assert_array_equal(spec.encode(batched).vector, spec.encode_many(samples).vector)
    picked = np.array([rows - 1, 0])
    np.testing.assert_array_equal(spec.encode_rows(batched, picked).vector, spec.encode_many(
        [samples[-1], samples[0]]).vector)
    as_objects = np.empty(rows, dtype=object)
    as_objects[:] = [None] * rows
    for i, sample in enumerate(samples):
        as_objects[i] = sample
    np.testing.assert_array_equal(spec.encode_rows(as_objects, picked).vector,
                                  spec.encode_rows(batched, picked).vector)


def test_dict_with_one_image_keeps_the_image_apart() -> None:
    space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
                             "speed": gym.spaces.Box(-1, 1, (2,), np.float32), "gear": gym.spaces.Discrete(3)})
    space.seed(0)
    samples = [space.sample() for _ in range(3)]
    encoded = ObsSpec(space).encode_many(samples)
    np.testing.assert_array_equal(encoded.image, np.stack([s["pixels"] for s in samples]))
    assert encoded.image.dtype == np.uint8 and encoded.vector.shape == (3, 5)  # gear one-hot, then speed
    np.testing.assert_array_equal(encoded.vector[:, :3], np.eye(3)[[s["gear"] for s in samples]])
    model = ActorCritic(space, gym.spaces.Discrete(2), ModelConfig())
    assert model.encoder is not None and model.policy_head[0].in_features == 512 + 5


@pytest.mark.parametrize("space", [
    gym.spaces.Text(5), gym.spaces.Sequence(gym.spaces.Discrete(2)),
    gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None),
    gym.spaces.Dict({"a": gym.spaces.Box(0, 255, (36, 36, 1), np.uint8),
                     "b": gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)}),
    gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Text(3)]),
])
def test_unsupported_observation_spaces_name_the_space_and_the_fix(space: gym.Space) -> None:
    with pytest.raises(UnsupportedSpace) as err:
        check_spaces(space, gym.spaces.Discrete(2))
    message = str(err.value)
    assert "\n" not in message and "observation space" in message and ("wrap" in message or "wrapper" in message)


@pytest.mark.parametrize("space", [gym.spaces.Tuple([gym.spaces.Discrete(2)]), gym.spaces.Box(0, 3, (2,), np.int64),
                                   gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Text(4)])
def test_unsupported_action_spaces_are_rejected_naming_the_action_space(space: gym.Space) -> None:
    with pytest.raises(UnsupportedSpace, match="action space"):
        check_spaces(gym.spaces.Box(-1, 1, (2,)), space)


@SETTINGS
@given(space=action_spaces(), rows=st.integers(1, 6), seed=st.integers(0, 2**16), greedy=st.booleans())
def test_numpy_and_torch_action_distributions_agree(space: gym.Space, rows: int, seed: int, greedy: bool) -> None:
    spec = ActionSpec(space)
    rng = np.random.default_rng(seed)
    out = rng.normal(size=(rows, spec.out_dim)) * 2
    log_std = rng.normal(size=spec.out_dim) * 0.5 if spec.kind == "gaussian" else None
    actions, log_probs = spec.sample(out, log_std, rng, greedy)
    assert actions.shape == (rows, *spec.stored_shape) and actions.dtype == spec.stored_dtype
    dist = ActionDist(spec, torch.as_tensor(out), None if log_std is None else torch.as_tensor(log_std))
    torch_lp = dist.log_prob(torch.as_tensor(actions)).numpy()
    np.testing.assert_allclose(log_probs, torch_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(spec.log_prob(out, log_std, actions), torch_lp, rtol=1e-5, atol=1e-5)
    if greedy:
        np.testing.assert_allclose(actions, dist.mode().numpy(), rtol=1e-6, atol=1e-6)
    for action in spec.to_env(actions):
        assert space.contains(action)
    sampled = dist.sample()
    assert tuple(sampled.shape) == (rows, *spec.stored_shape)
    assert torch.isfinite(dist.entropy()).all() and dist.entropy().shape == (rows,)


@pytest.mark.parametrize("obs_space,action_space", [
    (gym.spaces.Discrete(5), gym.spaces.MultiDiscrete([3, 2])),
    (gym.spaces.Tuple([gym.spaces.Discrete(32), gym.spaces.Discrete(11), gym.spaces.Discrete(2)]),
     gym.spaces.Discrete(2)),
    (gym.spaces.MultiBinary(4), gym.spaces.MultiBinary(4)),
    (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (3,)), "b": gym.spaces.MultiDiscrete([2, 3])}),
     gym.spaces.Box(-2, 2, (2,), np.float32)),
    (gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (36, 36, 1), np.uint8), "flip": gym.spaces.Discrete(2)}),
     gym.spaces.Discrete(4)),
    (gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.MultiBinary(3)),
])
def test_agent_numpy_path_matches_the_torch_model(obs_space: gym.Space, action_space: gym.Space) -> None:
    """What an actor samples is scored identically by the learner's model (log-prob and value)."""
    torch.manual_seed(0)
    obs_space.seed(0)
    agent = Agent(obs_space, action_space, ModelConfig(init_log_std=-0.3), seed=0)
    obs = agent.obs_spec.encode_many([obs_space.sample() for _ in range(8)])
    actions, log_probs, values = agent.act(obs)
    greedy, _, _ = agent.act(obs, greedy=True)
    with torch.no_grad():
        dist, torch_values = agent.model(obs.map(torch.as_tensor))
        np.testing.assert_allclose(log_probs, dist.log_prob(torch.as_tensor(actions)).numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(values, torch_values.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(greedy, dist.mode().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(agent.value(obs), values, rtol=1e-5, atol=1e-6)
    assert agent.fast == (not agent.obs_spec.has_image)


def test_indexing_obs_picks_the_same_rows_of_image_and_vector() -> None:
    obs = Obs(image=np.arange(24, dtype=np.uint8).reshape(4, 2, 3, 1), vector=np.arange(8.0).reshape(4, 2))
    picked = obs[np.array([3, 1])]
    assert len(picked) == 2 and picked.image[0, 0, 0, 0] == 18 and picked.vector[1, 0] == 2.0
