"""Batch: one iteration's segments as the flat rows the PPO update samples minibatches from.

GAE runs per segment, on its own (T, E) time axis (:mod:`dppo.rl.advantages`); then every array is flattened
to N x T x E rows and concatenated, once, on the learner's device. A recurrent policy's rows are ordered by
env column (row c * T + t), so that a minibatch of whole columns replays each env's steps in order.

A multi-agent column whose agent has left (``Segment.active`` False, "black death") is padding: its value is 0 (the
agent's last live step bootstraps from nothing, as an agent's termination should) and the batch's ``active`` rows
keep it out of the losses, as MAPPO's active masks do.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from dppo.rl.advantages import gae
from dppo.rl.normalizer import ValueNormalizer
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs

SAMPLE_FIELDS = ("actions", "log_probs", "values", "advantages", "returns")


class Batch(NamedTuple):
    """Flattened samples of one iteration: N x T x E rows (recurrent: also where episodes start and the memory
    each env column started from)."""

    obs: Obs  # of tensors
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    starts: torch.Tensor | None = None  # (rows,) bool
    memory: tuple[torch.Tensor, torch.Tensor] | None = None  # (h, c), each (1, columns, hidden)
    steps: int = 0  # T: the length of a column
    active: torch.Tensor | None = None  # (rows,) bool: a live agent's step; None: every row is

    def live(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (one per batch row) of the live agents' steps only: all of them without a mask."""
        return rows if self.active is None else rows[self.active]


def build_batch(segments: list[Segment], gamma: float, lam: float, device: torch.device,
                value_normalizer: ValueNormalizer | None = None) -> Batch:
    """GAE per segment (each has its own time axis), then flatten and concatenate. ``value_normalizer``: the values
    the actors recorded are the head's normalized outputs; GAE and the batch get them in the returns' scale."""
    recurrent = segments[0].starts is not None
    padded = any(seg.active is not None for seg in segments)  # some agent left: every segment gets a mask

    def rows_of(array: np.ndarray) -> np.ndarray:  # (T, E, ...) -> (T * E, ...), time- or column-major
        array = array.swapaxes(0, 1) if recurrent else array
        return array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])

    parts: dict[str, list[np.ndarray]] = {k: [] for k in (*SAMPLE_FIELDS, "starts", "active")}
    obs_parts: dict[str, list[np.ndarray]] = {}
    for seg in segments:
        values, final_values, last_values = seg.values, seg.final_values, seg.last_values
        if value_normalizer is not None:
            values, final_values, last_values = (value_normalizer.to_returns(v, seg.policy_version)
                                                 for v in (values, final_values, last_values))
        active = seg.active
        if active is not None:  # padding is worth nothing
            values, final_values = values * active[:-1], final_values * active[:-1]
            last_values = last_values * active[-1]
        elif padded:
            active = np.ones((seg.rewards.shape[0] + 1, seg.rewards.shape[1]), bool)
        advantages, returns = gae(seg.rewards, values, seg.terminated, seg.truncated, final_values, last_values,
                                  gamma, lam)
        for name, part in seg.obs.parts().items():
            obs_parts.setdefault(name, []).append(rows_of(part))
        for name, array in (("actions", seg.actions), ("log_probs", seg.log_probs), ("values", values),
                            ("advantages", advantages), ("returns", returns), ("starts", seg.starts),
                            ("active", None if active is None else active[:-1])):
            if array is not None:
                parts[name].append(rows_of(array))
    obs = Obs(**{name: torch.as_tensor(np.concatenate(p), device=device) for name, p in obs_parts.items()})
    samples = (torch.as_tensor(np.concatenate(parts[k]), device=device) for k in SAMPLE_FIELDS)
    active = torch.as_tensor(np.concatenate(parts["active"]), device=device) if padded else None
    if not recurrent:
        return Batch(obs, *samples, active=active)
    memory = np.concatenate([seg.initial_memory for seg in segments], axis=1)  # (2, columns, hidden)
    h, c = (torch.as_tensor(m[None], device=device) for m in memory)
    return Batch(obs, *samples, starts=torch.as_tensor(np.concatenate(parts["starts"]), device=device),
                 memory=(h, c), steps=segments[0].rewards.shape[0], active=active)
