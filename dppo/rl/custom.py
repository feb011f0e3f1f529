"""A network of one's own (``model.entry_point``) behind the built-in model's interface.

The user's module maps the encoded observation to (action-head output (B, out_dim), value (B,)); it is checked once on
a dummy batch of the observation space, so a wrong output is one line at start, not a shape error in an actor.
:class:`OwnActorCritic` presents it to every caller of :class:`dppo.rl.model.ActorCritic` (the trainer, the torch
path of :class:`dppo.rl.agent.Agent` in actors, worker threads and the inference service, ``dppo eval`` and the
exported deterministic policy): its "features" are the network's two outputs side by side, its heads pick them apart.
So nothing downstream knows whose network it is, and an ONNX export traces the user's forward as it is.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from dppo.config import ModelConfig
from dppo.envs.user_code import EnvLoadError, load_callable
from dppo.rl.actions import ActionSpec
from dppo.rl.model import ActionDist, ActorCritic
from dppo.rl.spaces import Obs, ObsSpec, check_spaces

PURPOSE = "model.entry_point"
CHECK_ROWS = 3  # rows of the dummy batch: not 1, so a network that drops the batch dimension is caught


class NetworkError(EnvLoadError):
    """The network named by model.entry_point cannot be loaded or built, or answers the dummy batch wrongly."""


class Columns(nn.Module):
    """Columns [start, stop) of the features: one of the network's two outputs."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features[:, self.start:self.stop]


class OwnActorCritic(ActorCritic):
    """The user's network as an ActorCritic: ``net`` holds its weights (state-dict keys ``net.*``), plus the
    state-independent log-std of a Gaussian policy, as the built-in model has."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.obs_spec, self.action_spec = check_spaces(obs_space, action_space, config)
        self.discrete = self.action_spec.discrete
        self.encoder = None
        self.policy_features = None
        out_dim = self.action_spec.out_dim
        self.feature_dim = out_dim + 1
        self.entry_point = str(config.entry_point)
        self.net = build_network(str(config.entry_point), obs_space, action_space, config)
        self.policy_head: nn.Module = Columns(0, out_dim)
        self.value_head: nn.Module = Columns(out_dim, out_dim + 1)
        if self.action_spec.kind == "gaussian":
            self.log_std = nn.Parameter(torch.full((out_dim,), float(config.init_log_std)))
        check_outputs(self, self.entry_point)

    def inputs(self, obs: Obs) -> tuple[torch.Tensor, ...]:
        """What the network's forward takes: the image, the vector, or both in that order."""
        parts = []
        if self.obs_spec.has_image:
            parts.append(obs.image)
        if self.obs_spec.has_vector:
            parts.append(obs.vector.float())
        return tuple(parts)

    def features(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        out, value = self.net(*self.inputs(self.as_obs(obs)))
        return torch.cat([out.float(), value.reshape(-1, 1).float()], -1)  # what the distributions expect

    def distribution(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> ActionDist:
        return ActionDist(self.action_spec, self.policy_head(features), getattr(self, "log_std", None), mask)


def head_width(action_space: gym.Space) -> int:
    """The width of the action-head output a network of one's own returns for ``action_space``: Discrete n,
    MultiDiscrete the sum of nvec, MultiBinary n, Box the number of its components."""
    return ActionSpec(action_space).out_dim


def input_shapes(obs_space: gym.Space, config: ModelConfig) -> list[tuple[int, ...]]:
    """The shapes (without the batch) of what a network of one's own takes, in order: the image (H, W, C) uint8 when
    the space has one, then the vector (D,) float32 when it has other leaves."""
    spec = ObsSpec(obs_space, config.action_mask_key, config.mask_in_network, config.value_only_key)
    return ([tuple(spec.image_shape)] if spec.has_image else []) + ([(spec.vector_dim,)] if spec.has_vector else [])


def build_network(ref: str, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> nn.Module:
    """The user's module, built from the spaces and the model config; one line if it cannot be."""
    factory = load_callable(ref, PURPOSE)
    try:
        net = factory(obs_space, action_space, config)
    except Exception as err:
        raise NetworkError(f"{PURPOSE} {ref!r} raised {type(err).__name__} when built as "
                           f"{ref.partition(':')[2]}(observation_space, action_space, model_config): {err}") from None
    if not isinstance(net, nn.Module):
        raise NetworkError(f"{PURPOSE} {ref!r} returned a {type(net).__name__}, not a torch nn.Module; name an "
                           "nn.Module subclass or a function that returns one")
    return net


def dummy_obs(model: ActorCritic, rows: int = CHECK_ROWS, seed: int = 0) -> Obs:
    """A batch of ``rows`` observations of the model's space, encoded as the actors encode them."""
    space = model.obs_spec.space
    space.seed(seed)
    return model.obs_spec.encode_many([space.sample() for _ in range(rows)]).map(torch.as_tensor)


def check_outputs(model: OwnActorCritic, ref: str) -> None:
    """The network's answer to a dummy batch: a pair (out (B, out_dim) float, value (B,) or (B, 1) float), else one
    line naming what was expected and what came back."""
    obs = dummy_obs(model)
    rows, out_dim = CHECK_ROWS, model.action_spec.out_dim
    expected = (f"(action-head output ({rows}, {out_dim}), value ({rows},)) for a batch of {rows} "
                f"({model.action_spec.kind} {_action_words(model)})")
    with torch.no_grad():
        try:
            answer = model.net(*model.inputs(obs))
        except Exception as err:
            raise NetworkError(f"{PURPOSE} {ref!r} raised {type(err).__name__} on a batch of {rows} observations "
                               f"({_input_words(model, obs)}): {err}") from None
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise NetworkError(f"{PURPOSE} {ref!r} returned {_describe(answer)}; forward must return {expected}")
    out, value = answer
    if not (isinstance(out, torch.Tensor) and out.is_floating_point() and tuple(out.shape) == (rows, out_dim)):
        raise NetworkError(f"{PURPOSE} {ref!r} returned an action-head output {_describe(out)}; expected "
                           f"a float tensor ({rows}, {out_dim}): {expected}")
    if not (isinstance(value, torch.Tensor) and value.is_floating_point()
            and tuple(value.shape) in ((rows,), (rows, 1))):
        raise NetworkError(f"{PURPOSE} {ref!r} returned a value {_describe(value)}; expected a float tensor "
                           f"({rows},) or ({rows}, 1): {expected}")


def _describe(thing: Any) -> str:
    if isinstance(thing, torch.Tensor):
        return f"tensor {tuple(thing.shape)} {str(thing.dtype).removeprefix('torch.')}"
    if isinstance(thing, (tuple, list)):
        return f"a {type(thing).__name__} of {len(thing)}: ({', '.join(_describe(t) for t in thing)})"
    return f"a {type(thing).__name__}"


def _input_words(model: OwnActorCritic, obs: Obs) -> str:
    return ", ".join(_describe(t) for t in model.inputs(obs))


def _action_words(model: OwnActorCritic) -> str:
    spec = model.action_spec
    what = {"categorical": "logits", "bernoulli": "logits", "gaussian": "the Gaussian's mean"}[spec.kind]
    return f"{what} of {spec.space}"

