"""Agent: numpy observations in, actions, log-probs and values out; weights loaded by version.

For MLP policies the forward pass runs in numpy: an actor's batch is only E rows, where torch's per-op
dispatch (several microseconds per op) costs more than the math, and an actor that only ever receives
weights never imports torch (about 180 MB and a second or more of start-up per actor). It runs in
float64 and returns float32, so a row's result does not depend on the batch it came in (BLAS sums in a
different order for one row than for many; a truncated episode's V(final obs) must equal V of the same
obs elsewhere). Image and recurrent policies use torch. Both paths compute the same function; tests compare
them. Every action is drawn in numpy from the networks' outputs (:class:`Heads`) with one code,
:meth:`dppo.rl.spaces.ActionSpec.sample`: here for `dppo eval`, the evaluation actor and self-play's frozen
opponents, and by :class:`dppo.rl.policy.BackendPolicy` for the actors, whichever backend computed the outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig
from dppo.rl.spaces import Obs, check_spaces, is_image  # noqa: F401 - is_image re-exported

if TYPE_CHECKING:
    import torch

    from dppo.rl.model import ActorCritic

Weights = dict[str, np.ndarray]
Layers = list[tuple[np.ndarray, np.ndarray]]
_LINEAR_KEY = re.compile(r"^(policy_head|value_head)\.(\d+)\.(weight|bias)$")


# torch's float32 CPU kernels (oneDNN's convolutions, MKL's GEMM) give a row the same result in every batch whose
# rows are a multiple of 4, and other last bits in smaller or odd ones (measured on the development machine: 1-3,
# 5-7 and 9-11 rows differ from the same rows in a batch of 16). The torch path pads each forward pass to a multiple
# of ROW_BLOCK rows (copies of the last row), so an action's numbers do not depend on how many rows were asked with
# it: the actor's one group of envs, a half, or the inference service's batch of several actors' requests.
ROW_BLOCK = 4


def padded(part: np.ndarray) -> np.ndarray:
    """``part`` with copies of its last row up to a multiple of ROW_BLOCK rows."""
    extra = -len(part) % ROW_BLOCK
    return np.pad(part, [(0, extra)] + [(0, 0)] * (part.ndim - 1), mode="edge") if extra else part


def export_weights(model: torch.nn.Module) -> Weights:
    """State dict as numpy arrays: zero-copy through Ray's object store."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def numpy_layers(weights: Weights) -> tuple[Layers, Layers]:
    """(W^T, b) per Linear of the policy and the value MLP, in order, as float64 copies."""
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {"policy_head": {}, "value_head": {}}
    for key, value in weights.items():
        match = _LINEAR_KEY.match(key)
        if match:
            head, index, kind = match.groups()
            found[head].setdefault(int(index), {})[kind] = np.asarray(value, np.float64)
    policy, value = ([(layer["weight"].T, layer["bias"]) for _, layer in sorted(found[head].items())]
                     for head in ("policy_head", "value_head"))  # .T is a view: BLAS reads it transposed
    return policy, value


@dataclass
class Heads:
    """What the networks say about a batch before any action is drawn: the policy head's output (B, out_dim)
    (logits, or the Gaussian's mean) as float64, the log-std of a Gaussian policy, V(obs) (B,) float32, and a
    recurrent policy's memory after the observation (2, B, hidden) float32 (h and c stacked)."""

    out: np.ndarray
    log_std: np.ndarray | None
    values: np.ndarray
    memory: np.ndarray | None = None


class Agent:
    """The networks of one policy, one weights version at a time, no gradients: their outputs for a batch
    (:meth:`heads`, what every backend computes), and whole-episode acting (:meth:`act`) for evaluation.

    ``seed`` seeds the action sampling; without it the seed is drawn from torch's generator (so an
    actor seeded with ``torch.manual_seed`` stays reproducible, at the cost of importing torch).
    ``device``: where the torch model runs (the inference service's; actors use the CPU).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig,
                 seed: int | None = None, device: str = "cpu") -> None:
        self.obs_space, self.action_space, self.config, self.device = obs_space, action_space, config, device
        self.obs_spec, self.action_spec = check_spaces(obs_space, action_space, config)
        self.discrete = self.action_spec.discrete
        self.recurrent = config.recurrent == "lstm"
        self.fast = not self.obs_spec.has_image and not self.recurrent and config.entry_point is None
        self.memory: np.ndarray | None = None  # act()'s recurrent memory (2, B, hidden), one row per env
        self.starts = np.ones(0, bool)  # rows whose next observation starts an episode (memory zeroed then)
        self.relu = config.activation == "relu"
        self.version = -1
        self._model: ActorCritic | None = None
        self._weights: Weights | None = None
        if seed is None:
            import torch

            seed = int(torch.randint(0, 2**62, ()).item())
        self.rng = np.random.default_rng(seed)
        if not self.fast:
            self._copy_weights(self.model)  # the torch path: build the CNN now

    @property
    def model(self) -> ActorCritic:
        """The torch model, built on first use (the numpy path never needs it) with the current weights."""
        if self._model is None:
            import torch

            from dppo.rl.build import build_model

            model = build_model(self.obs_space, self.action_space, self.config)
            if self._weights is not None:
                model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in self._weights.items()})
            model.eval()
            self._model = model.to(self.device)
            if self._weights is None:
                self._copy_weights(model)
        return self._model

    def load(self, weights: Weights, version: int) -> None:
        """Load weights unless this version is already loaded."""
        if version == self.version:
            return
        if self._model is not None:
            import torch

            self._model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})
        self._set_weights(weights)
        self.version = version

    def _copy_weights(self, model: torch.nn.Module) -> None:
        self._set_weights(export_weights(model))

    def _set_weights(self, weights: Weights) -> None:
        self._weights = weights
        if self.fast:
            self.policy_layers, self.value_layers = numpy_layers(weights)
            if self.action_spec.kind == "gaussian":
                self.log_std = np.asarray(weights["log_std"], np.float64)

    def _ready(self) -> None:
        if self._weights is None:  # acting before any weights arrived: the model's initial ones
            _ = self.model

    def as_obs(self, obs: Obs | np.ndarray) -> Obs:
        """A bare array is the image (image-only spaces) or the encoded vector."""
        if isinstance(obs, Obs):
            return obs
        if self.obs_spec.has_image and not self.obs_spec.has_vector:
            return Obs(image=obs)
        return Obs(vector=np.asarray(obs).reshape(len(obs), -1))

    def _policy_vector(self, vector: np.ndarray) -> np.ndarray:
        """What the policy sees of the encoded vector (model.value_only_key's columns are the critic's alone)."""
        columns = self.obs_spec.policy_features
        return vector if columns is None else vector[:, columns]

    def _mlp(self, layers: Layers, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float64).reshape(len(obs), -1)
        for weight_t, bias in layers[:-1]:
            x = x @ weight_t
            x += bias
            if self.relu:
                np.maximum(x, 0, out=x)
            else:
                np.tanh(x, out=x)
        weight_t, bias = layers[-1]
        return x @ weight_t + bias

    def act(self, obs: Obs | np.ndarray, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (or pick the mode of) actions for a batch: (actions, log_probs, values); a recurrent policy
        steps its memory of these rows (zeroed where :meth:`end_episodes` said an episode starts)."""
        obs = self.as_obs(obs)
        memory = starts = None
        if self.recurrent:
            if self.memory is None or self.memory.shape[1] != len(obs):
                self.memory = np.zeros((2, len(obs), self.config.lstm_hidden_size), np.float32)
                self.starts = np.ones(len(obs), bool)
            memory, starts = self.memory, self.starts.copy()
            self.starts[:] = False
        heads = self.heads(obs, memory, starts)
        if self.recurrent:
            self.memory = heads.memory
        actions, log_probs = self.action_spec.sample(heads.out, heads.log_std, self.rng, greedy, obs.mask)
        return actions, log_probs, heads.values

    def heads(self, obs: Obs | np.ndarray, memory: np.ndarray | None = None,
              starts: np.ndarray | None = None) -> Heads:
        """The networks' outputs without sampling: what the inference service computes for its actors, which draw
        the actions themselves. ``memory`` (2, B, hidden) and ``starts`` (B,): a recurrent policy's state."""
        obs = self.as_obs(obs)
        if self.fast:
            self._ready()
            return Heads(self._mlp(self.policy_layers, self._policy_vector(obs.vector)), getattr(self, "log_std", None),
                         self._mlp(self.value_layers, obs.vector)[:, 0].astype(np.float32))
        import torch

        model, rows = self.model, len(obs)
        obs = obs.map(padded)
        with torch.inference_mode():
            features = model.features(obs.map(lambda part: torch.as_tensor(part, device=self.device)))
            after = None
            if self.recurrent:
                h, c = (torch.as_tensor(padded(part), device=self.device)[None] for part in memory)
                core, (h, c) = model.unroll(features[None], torch.as_tensor(padded(starts), device=self.device)[None],
                                            (h, c))
                features, after = core[0], torch.cat([h, c])[:, :rows].cpu().numpy()
            out = model.policy_head(model.policy_input(features))[:rows].double().cpu().numpy()
            values = model.value_head(features).squeeze(-1)[:rows].cpu().numpy()
        log_std = getattr(model, "log_std", None)
        return Heads(out, None if log_std is None else log_std.detach().double().cpu().numpy(), values, after)

    def value(self, obs: Obs | np.ndarray) -> np.ndarray:
        """V(obs) of a feed-forward policy (tests compare the paths with it)."""
        obs = self.as_obs(obs)
        if self.fast:
            self._ready()
            return self._mlp(self.value_layers, obs.vector)[:, 0].astype(np.float32)
        return self.heads(obs).values

    def end_episodes(self, done: np.ndarray) -> None:
        """The envs in ``done`` start new episodes: their memory is zeroed before their next observation."""
        if self.recurrent and len(self.starts) == len(done):
            self.starts |= done
