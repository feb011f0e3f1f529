"""The backends in the actor's own process: :class:`InActor` computes a forward pass on the actor's thread when its
result is asked (one group of envs: the plain step loop); :class:`WorkerThread` computes them on one worker thread,
so one half of the actor's envs steps while the other's pass runs (EnvPool's and Cleanba's pattern; ale-py's vector
env and torch's kernels release the GIL). Everything but the forward pass is the
:class:`~dppo.rl.policy.BackendPolicy`'s (the actions drawn with the actor's seeded stream, a recurrent policy's
memory), so a seeded run draws the same actions whichever backend computed them.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import gymnasium as gym

from dppo.config import ModelConfig
from dppo.rl.agent import Agent, Weights
from dppo.rl.policy import BackendPolicy, Reply, Request


def forward(agent: Agent, request: Request) -> Reply:
    """``agent``'s forward pass of ``request``: what both backends here compute."""
    return Reply(request.version, agent.heads(request.obs, request.memory, request.starts))


class InActor:
    """A Backend on the actor's own thread: a request is its own ticket, computed when its result is asked."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def submit(self, request: Request) -> Request:
        return request

    def result(self, ticket: Request) -> Reply:
        return forward(self.agent, ticket)

    def cancel(self, ticket: Request) -> None:
        """Nothing was computed for a request not asked for."""

    def load(self, weights: Weights, version: int) -> None:
        self.agent.load(weights, version)


class WorkerThread:
    """A Backend in this process: one worker thread computes the requests in the order they came."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dppo-forward")

    def submit(self, request: Request) -> Future[Reply]:
        """Start the forward pass of ``request``; the Sampler leaves its observation untouched until its result."""
        return self.worker.submit(forward, self.agent, request)

    def result(self, ticket: Future[Reply]) -> Reply:
        return ticket.result()

    def cancel(self, ticket: Future[Reply]) -> None:
        """Not started: never computed; running: it finishes, unread (the worker holds nothing for it)."""
        ticket.cancel()

    def load(self, weights: Weights, version: int) -> None:
        """New weights, loaded on the worker after every forward pass submitted before."""
        self.worker.submit(self.agent.load, weights, version).result()

    def close(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)


def own_policy(obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int, num_envs: int,
               on_worker: bool = False, device: str = "cpu") -> BackendPolicy:
    """The actor's own networks, seeded like the actor and loaded with every broadcast: computed on its thread (the
    plain step loop) or, ``on_worker``, on a worker thread (two halves, or a GPU share: ``device`` cuda)."""
    backend = (WorkerThread if on_worker else InActor)(Agent(obs_space, action_space, config, seed=seed, device=device))
    return BackendPolicy(obs_space, action_space, config, seed, num_envs, backend, on_load=backend.load)
