"""The policy an actor samples with: local (:class:`dppo.rl.agent.Agent`, the networks in the actor's process) or
remote (:class:`RemotePolicy`, the networks in an inference service that batches many actors' observations).

Both draw the actions in the actor, from the distribution the networks give, with the actor's own random stream
(:meth:`dppo.rl.actions.ActionSpec.sample`): a seeded run draws the same actions wherever the forward pass ran,
and a server holds no random state. A recurrent policy's memory stays with the actor too and travels with each
request, so the service is stateless but for its weights (a lost one is replaced without losing anything).
The Sampler steps its envs in ``halves`` groups: with two, one half steps while the other's actions are computed
(Sample Factory's double-buffered sampling); ``send`` then ``receive`` is that overlap's seam.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from dppo.config import ModelConfig
from dppo.rl.agent import Heads, Weights
from dppo.rl.spaces import Obs, check_spaces


class Policy(Protocol):
    """What the Sampler needs from a policy: act, value, episode starts and a recurrent policy's memory."""

    halves: int  # how many groups the Sampler steps its envs in (2: one steps while the other is computed)
    version: int  # the weights' version this policy acts with (stamped on segments)
    recurrent: bool
    starts: np.ndarray  # (E,) bool: rows whose next observation starts an episode (memory zeroed then)

    def load(self, weights: Weights, version: int) -> None: ...

    def send(self, obs: Obs, rows: slice) -> None:
        """Ask for the actions of the envs in ``rows`` (their next, normalized observation)."""

    def receive(self, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, log_probs, values) for what ``send`` asked of ``rows``."""

    def act(self, obs: Obs, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def value(self, obs: Obs, rows: np.ndarray | None = None) -> np.ndarray:
        """V(obs); ``rows``: which envs these observations belong to (a recurrent policy reads their memory)."""

    def memory_at_start(self, rows: int) -> np.ndarray | None: ...

    def end_episodes(self, done: np.ndarray) -> None: ...

    def forget(self) -> None:
        """Drop the requests in flight (the segment they belonged to is lost)."""


class InferenceLost(RuntimeError):
    """The inference service went away mid-segment: the segment is lost, the driver replaces the service."""


class InferenceError(RuntimeError):
    """The inference service answered wrongly (another weights version, a message that breaks the transport's
    protocol) or refused a request: a fault of the service or its transport, not of the env, so no env retry."""


@dataclass
class Request:
    """One batch of an actor's observations for the service: rows (n, ...) of one half, or a value query."""

    version: int  # the weights to compute with (the service holds the last two)
    obs: Obs  # normalized; the action mask stays with the actor, which applies it when it samples
    memory: np.ndarray | None = None  # (2, n, hidden): a recurrent policy's memory before this observation
    starts: np.ndarray | None = None  # (n,) bool: rows that start an episode (memory zeroed first)


@dataclass
class Reply:
    """The service's answer to one Request, stamped with the version it computed with."""

    version: int
    heads: Heads


class InferenceClient(Protocol):
    """How a RemotePolicy reaches the service (shared memory on its node, Ray calls from another, or a plain server in
    tests)."""

    def submit(self, request: Request) -> Any:
        """Send ``request``; returns a ticket for ``result``."""

    def result(self, ticket: Any) -> Reply:
        """The reply to a submitted request; InferenceLost when the service is gone."""


class RemotePolicy:
    """A policy computed by an inference service; actions drawn here, with this actor's seeded stream."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int,
                 num_envs: int) -> None:
        self.obs_spec, self.action_spec = check_spaces(obs_space, action_space, config)
        self.config, self.num_envs = config, num_envs  # what a shared-memory transport's layout is sized from
        self.recurrent = config.recurrent == "lstm"
        self.halves = 2 if num_envs % 2 == 0 else 1
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self.client: InferenceClient | None = None  # set by the actor for each segment (the current service)
        self.starts = np.ones(num_envs, bool)
        self.memory = np.zeros((2, num_envs, config.lstm_hidden_size), np.float32) if self.recurrent else None
        self._asked: dict[int, tuple[Any, np.ndarray | None]] = {}  # rows' start -> (ticket, the rows' mask)

    def load(self, weights: Weights, version: int) -> None:
        """Only the version: the service holds the weights."""
        self.version = version

    def _request(self, obs: Obs, rows: slice | np.ndarray) -> Request:
        if not self.recurrent:
            return Request(self.version, Obs(image=obs.image, vector=obs.vector))
        return Request(self.version, Obs(image=obs.image, vector=obs.vector), self.memory[:, rows],
                       self.starts[rows].copy())

    def _result(self, ticket: Any) -> Heads:
        assert self.client is not None
        reply = self.client.result(ticket)
        if reply.version != self.version:
            raise InferenceError(f"the inference service answered with weights version {reply.version}, "
                                 f"not the {self.version} asked for")
        return reply.heads

    def send(self, obs: Obs, rows: slice) -> None:
        assert self.client is not None, "the actor connects a client before sampling"
        self._asked[rows.start or 0] = (self.client.submit(self._request(obs, rows)), obs.mask)
        self.starts[rows] = False

    def receive(self, rows: slice, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ticket, mask = self._asked.pop(rows.start or 0)
        heads = self._result(ticket)
        if self.recurrent:
            self.memory[:, rows] = heads.memory
        actions, log_probs = self.action_spec.sample(heads.out, heads.log_std, self.rng, greedy, mask)
        return actions, log_probs, heads.values

    def act(self, obs: Obs, greedy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every env's action at once (no overlap)."""
        rows = slice(0, len(obs))
        self.send(obs, rows)
        return self.receive(rows, greedy)

    def value(self, obs: Obs, rows: np.ndarray | None = None) -> np.ndarray:
        assert self.client is not None
        index = np.arange(len(obs)) if rows is None else np.asarray(rows)
        return self._result(self.client.submit(self._request(obs, index))).values

    def memory_at_start(self, rows: int) -> np.ndarray | None:
        return None if self.memory is None else self.memory.copy()

    def end_episodes(self, done: np.ndarray) -> None:
        self.starts |= done

    def forget(self) -> None:
        """Drop the requests in flight (their service is gone: the segment is sampled again)."""
        self._asked.clear()
