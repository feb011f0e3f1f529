"""Batch: one iteration's segments as the flat rows the PPO update samples minibatches from.

GAE runs per segment, on its own (T, E) time axis (:mod:`dppo.rl.advantages`); then every array is flattened
to N x T x E rows and concatenated, once, on the learner's device.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from dppo.rl.advantages import gae
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs


class Batch(NamedTuple):
    """Flattened samples of one iteration: N x T x E rows."""

    obs: Obs  # of tensors
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor



def build_batch(segments: list[Segment], gamma: float, lam: float, device: torch.device) -> Batch:
    """GAE per segment (each has its own time axis), then flatten and concatenate."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in Batch._fields if k != "obs"}
    obs_parts: dict[str, list[np.ndarray]] = {}
    for seg in segments:
        advantages, returns = gae(seg.rewards, seg.values, seg.terminated, seg.truncated,
                                  seg.final_values, seg.last_values, gamma, lam)
        rows = seg.rewards.size
        for name, part in seg.obs.parts().items():
            obs_parts.setdefault(name, []).append(part.reshape(rows, *part.shape[2:]))
        parts["actions"].append(seg.actions.reshape(rows, *seg.actions.shape[2:]))
        parts["log_probs"].append(seg.log_probs.reshape(rows))
        parts["values"].append(seg.values.reshape(rows))
        parts["advantages"].append(advantages.reshape(rows))
        parts["returns"].append(returns.reshape(rows))
    obs = Obs(**{name: torch.as_tensor(np.concatenate(p), device=device) for name, p in obs_parts.items()})
    return Batch(obs, *(torch.as_tensor(np.concatenate(parts[k]), device=device) for k in Batch._fields[1:]))
