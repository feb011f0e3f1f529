"""Actions: the policy head's output as a distribution over an action space, and back to what the env takes.

Discrete and MultiDiscrete are categoricals, MultiBinary independent Bernoullis, a float Box a diagonal
Gaussian with state-independent log-std. The numpy sampling and log-probs here are the actors' fast path;
:class:`dppo.rl.model.ActionDist` computes the same in torch (tests compare them on every space). An action
mask (0/1 per action of a Discrete, per value of each MultiDiscrete component) sets the masked actions' logits
to MASKED_LOGIT: their probability is 0, and entropies and log-probs stay finite (CleanRL's invalid-action
masking, Huang and Ontañón 2022).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from dppo.errors import UnsupportedSpace

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
MASKED_LOGIT = -1e8


class NoLegalAction(ValueError):
    """An action mask that allows no action (in some row, for some component): the env's fault."""


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log(sigmoid(x)), stable for large |x|."""
    return -np.logaddexp(0.0, -x)


class ActionSpec:
    """The action distribution of a space, its stored form, and the conversion to what the env takes.

    - Discrete(n): one categorical, stored as int64 index (start subtracted);
    - MultiDiscrete(nvec): independent categoricals, stored as int64 of shape nvec.shape;
    - MultiBinary(shape): independent Bernoullis, stored as int64 0/1 of that shape;
    - Box(shape): diagonal Gaussian with state-independent log-std, stored unclipped as float32, clipped
      to the bounds only when sent to the env.
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.kind, self.nvec, self.stored_shape = "categorical", [int(space.n)], ()
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.kind, self.nvec = "categorical", [int(n) for n in space.nvec.reshape(-1)]
            self.stored_shape = tuple(space.nvec.shape)
        elif isinstance(space, gym.spaces.MultiBinary):
            self.kind, self.nvec, self.stored_shape = "bernoulli", [], tuple(space.shape)
        elif isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
            self.kind, self.nvec, self.stored_shape = "gaussian", [], tuple(space.shape)
        else:
            raise UnsupportedSpace(f"action space {space} is not supported; use Discrete, MultiDiscrete, "
                                   "MultiBinary or a float Box (wrap the env's actions with an ActionWrapper)")
        self.out_dim = sum(self.nvec) if self.kind == "categorical" else int(np.prod(self.stored_shape))
        self.stored_dtype = np.float32 if self.kind == "gaussian" else np.int64

    @property
    def discrete(self) -> bool:
        return self.kind != "gaussian"

    def apply_mask(self, out: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """The logits with masked actions at MASKED_LOGIT; NoLegalAction when a row allows nothing somewhere."""
        if mask is None:
            return out
        mask = np.asarray(mask, bool).reshape(len(out), -1)
        start = 0
        for j, n in enumerate(self.nvec):
            empty = ~mask[:, start:start + n].any(axis=1)
            if empty.any():
                part = f" component {j}" if len(self.nvec) > 1 else ""
                raise NoLegalAction(f"row {int(np.flatnonzero(empty)[0])} of the mask allows no action{part}")
            start += n
        return np.where(mask, out, MASKED_LOGIT)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Stored actions (B, ...) -> the values the env's action space holds."""
        space = self.space
        if self.kind == "gaussian":
            return np.clip(actions, space.low, space.high)
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            return (actions + space.start).astype(space.dtype)
        return actions.astype(space.dtype)

    def sample(self, out: np.ndarray, log_std: np.ndarray | None, rng: np.random.Generator,
               greedy: bool, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(actions, log-probs) from the policy head's output (B, out_dim), float64 math; masked actions never."""
        rows = len(out)
        out = self.apply_mask(out, mask)
        if self.kind == "categorical":
            actions = np.empty((rows, len(self.nvec)), np.int64)
            log_prob = np.zeros(rows)
            start = 0
            for j, n in enumerate(self.nvec):
                logp = log_softmax(out[:, start:start + n])
                if greedy:
                    choice = logp.argmax(axis=1)
                else:  # inverse CDF: one uniform per row
                    cdf = np.exp(logp).cumsum(axis=1)
                    u = rng.random((rows, 1)) * cdf[:, -1:]
                    choice = np.minimum((u >= cdf).sum(axis=1), n - 1)
                actions[:, j] = choice
                log_prob += logp[np.arange(rows), choice]
                start += n
            return actions.reshape(rows, *self.stored_shape), log_prob.astype(np.float32)
        if self.kind == "bernoulli":
            actions = (out > 0) if greedy else (rng.random(out.shape) < 1.0 / (1.0 + np.exp(-out)))
            actions = actions.astype(np.int64)
            return actions.reshape(rows, *self.stored_shape), self.log_prob(out, log_std, actions)
        # the action is rounded to float32 first: the trainer scores exactly the action that was stored
        noise = 0.0 if greedy else np.exp(log_std) * rng.standard_normal(out.shape)
        actions = (out + noise).astype(np.float32)
        return actions.reshape(rows, *self.stored_shape), self.log_prob(out, log_std, actions)

    def log_prob(self, out: np.ndarray, log_std: np.ndarray | None, actions: np.ndarray,
                 mask: np.ndarray | None = None) -> np.ndarray:
        """log pi(actions) summed over the independent parts, float32."""
        rows = len(out)
        out = self.apply_mask(out, mask)
        flat = np.asarray(actions).reshape(rows, -1)
        if self.kind == "categorical":
            total = np.zeros(rows)
            start = 0
            for j, n in enumerate(self.nvec):
                total += log_softmax(out[:, start:start + n])[np.arange(rows), flat[:, j]]
                start += n
            return total.astype(np.float32)
        if self.kind == "bernoulli":
            return (flat * log_sigmoid(out) + (1 - flat) * log_sigmoid(-out)).sum(axis=1).astype(np.float32)
        z = (flat - out) * np.exp(-log_std)
        return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(axis=1).astype(np.float32)
