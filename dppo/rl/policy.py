"""The one policy every actor samples with, :class:`BackendPolicy`: a backend computes its forward passes (on the
actor's thread or a worker thread of it, :mod:`dppo.rl.worker_thread`, or in the inference service) and it draws
every action in the actor with the actor's own random stream (numpy), for every model kind, so a seeded run draws the
same actions wherever the forward pass ran; a recurrent policy's memory stays here and travels with each request.
A backend is thus stateless but for its weights, and knows nothing of envs, agents, faults or halves:
``submit(request) -> ticket``, ``result(ticket)``, ``cancel(ticket)``; the Sampler holds the tickets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig
from dppo.rl.agent import Heads, Weights
from dppo.rl.spaces import Obs, check_spaces


class InferenceLost(RuntimeError):
    """The inference service went away mid-segment: the segment is lost, the driver replaces the service."""


class InferenceError(RuntimeError):
    """The inference service answered wrongly (another weights version, a message that breaks the transport's
    protocol) or refused a request: a fault of the service or its transport, not of the env, so no env retry."""


@dataclass
class Request:
    """One batch of an actor's observations for a backend: rows (n, ...) of one group of envs, or a value query."""

    version: int  # the weights to compute with (the service holds the last two)
    obs: Obs  # normalized; the action mask stays with the actor, which applies it when it samples
    memory: np.ndarray | None = None  # (2, n, hidden): a recurrent policy's memory before this observation
    starts: np.ndarray | None = None  # (n,) bool: rows that start an episode (memory zeroed first)


@dataclass
class Reply:
    """A backend's answer to one Request, stamped with the version it computed with."""

    version: int
    heads: Heads


class Backend(Protocol):
    """What computes a BackendPolicy's forward passes: a worker thread, the service (shared memory, Ray calls).
    ``result`` raises InferenceLost when the service is gone; ``cancel``: the reply will not be read."""

    def submit(self, request: Request) -> Any: ...

    def result(self, ticket: Any) -> Reply: ...

    def cancel(self, ticket: Any) -> None: ...


@dataclass
class Asked:
    """A BackendPolicy's ticket: the backend's, and the rows and action mask to draw the actions with."""

    ticket: Any
    rows: slice
    mask: np.ndarray | None


class BackendPolicy:
    """A policy whose forward passes ``backend`` computes; actions drawn here, with this actor's seeded stream."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int,
                 num_envs: int, backend: Backend | None = None,
                 on_load: Callable[[Weights, int], None] | None = None) -> None:
        self.obs_spec, self.action_spec = check_spaces(obs_space, action_space, config)
        self.config, self.num_envs = config, num_envs  # what a shared-memory transport's layout is sized from
        self.recurrent = config.recurrent == "lstm"
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self.backend = backend  # the service's is set by the actor for each segment (the current service)
        self.on_load = on_load  # where the weights go (a worker thread's networks); None: the service holds them
        self.starts = np.ones(num_envs, bool)
        self.memory = np.zeros((2, num_envs, config.lstm_hidden_size), np.float32) if self.recurrent else None

    def load(self, weights: Weights, version: int) -> None:
        """The version, and the weights to whatever computes with them in this process (the service's own are
        loaded by the driver)."""
        if self.on_load is not None:
            self.on_load(weights, version)
        self.version = version

    def _request(self, obs: Obs, rows: slice | np.ndarray) -> Request:
        if not self.recurrent:
            return Request(self.version, Obs(image=obs.image, vector=obs.vector))
        return Request(self.version, Obs(image=obs.image, vector=obs.vector), self.memory[:, rows],
                       self.starts[rows].copy())

    def _heads(self, ticket: Any) -> Heads:
        assert self.backend is not None
        reply = self.backend.result(ticket)
        if reply.version != self.version:
            raise InferenceError(f"the inference service answered with weights version {reply.version}, "
                                 f"not the {self.version} asked for")
        return reply.heads

    def submit(self, obs: Obs, rows: slice) -> Asked:
        assert self.backend is not None, "the actor sets a backend before sampling"
        asked = Asked(self.backend.submit(self._request(obs, rows)), rows, obs.mask)
        self.starts[rows] = False
        return asked

    def result(self, asked: Asked, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        heads = self._heads(asked.ticket)
        if self.recurrent:
            self.memory[:, asked.rows] = heads.memory
        actions, log_probs = self.action_spec.sample(heads.out, heads.log_std, self.rng, greedy, asked.mask)
        return actions, log_probs, heads.values

    def cancel(self, asked: Asked) -> None:
        if self.backend is not None:
            self.backend.cancel(asked.ticket)

    def act(self, obs: Obs, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every env's action at once (no overlap)."""
        return self.result(self.submit(obs, slice(0, len(obs))), greedy)

    def value(self, obs: Obs, rows: np.ndarray | None = None) -> np.ndarray:
        assert self.backend is not None
        index = np.arange(len(obs)) if rows is None else np.asarray(rows)
        return self._heads(self.backend.submit(self._request(obs, index))).values

    def memory_at_start(self, rows: int) -> np.ndarray | None:
        return None if self.memory is None else self.memory.copy()

    def end_episodes(self, done: np.ndarray) -> None:
        self.starts |= done
