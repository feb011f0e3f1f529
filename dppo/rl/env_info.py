"""The env's own figures (``metrics.info_keys``): each named ``info`` entry's value at the end of every episode that
ended in a segment, as Stable-Baselines3's Monitor ``info_keywords`` records it, for the driver to average per
iteration.

A gymnasium vector env in ``SAME_STEP`` autoreset mode (the sampler's) reports an ended copy's last info under
``info["final_info"]`` (its top-level entries are then the new episode's reset info); each entry comes with a ``_key``
mask of the copies that set it. A vector env without ``final_info`` reports the last step's info at the top level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dppo.envs.checks import info_number


def ended_values(info: dict[str, Any], ended: np.ndarray, key: str, env_name: str) -> list[float]:
    """``key``'s value in the last info of each copy where ``ended`` (those that set it)."""
    final = info.get("final_info")
    source = final if isinstance(final, dict) else info
    if key not in source:
        return []
    values = source[key]
    mask = np.asarray(source.get(f"_{key}", np.ones(len(ended), bool)), bool)
    return [info_number(key, values[i], env_name) for i in np.flatnonzero(ended & mask)]


class EndedInfo:
    """The info values of the episodes that ended since :meth:`start`, by key (the sampler's, one per segment)."""

    def __init__(self, keys: Sequence[str], env_name: str) -> None:
        self.keys, self.env_name = list(keys), env_name
        self.values: dict[str, list[float]] = {key: [] for key in self.keys}

    def start(self) -> None:
        self.values = {key: [] for key in self.keys}

    def add(self, info: dict[str, Any], ended: np.ndarray) -> None:
        """One vector env's step: ``ended`` (its copies' width) marks the episodes that ended and count."""
        if not self.keys or not ended.any():
            return
        for key in self.keys:
            self.values[key] += ended_values(info, ended, key, self.env_name)

    def take(self) -> dict[str, np.ndarray]:
        """The segment's values, by key (a key no ended episode set: none)."""
        return {key: np.asarray(values, np.float64) for key, values in self.values.items() if values}


def iteration_means(keys: Sequence[str], per_segment: Sequence[dict[str, np.ndarray]]) -> dict[str, float | None]:
    """``info/KEY`` of a progress record: each key's mean over the iteration's ended episodes (every segment's), None
    where none carried it (no value, not 0)."""
    means: dict[str, float | None] = {}
    for key in keys:
        parts = [values[key] for values in per_segment if key in values]
        means[f"info/{key}"] = float(np.concatenate(parts).mean()) if parts else None
    return means
