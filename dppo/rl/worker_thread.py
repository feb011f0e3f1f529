"""An actor's own policy computed on a worker thread, so one half of its envs steps while the other's forward pass
runs: EnvPool's and Cleanba's pattern (envs on C++ threads, the policy beside them in one process) inside one actor.

It is a :class:`~dppo.rl.policy.RemotePolicy` whose client is this process: ``send`` hands a half's observation to
a worker thread and returns at once, ``receive`` waits for that thread's answer, so the Sampler's half loop steps
one half (ale-py's vector env releases the GIL while its threads step) while torch computes the other (it releases
the GIL in its kernels; on cuda the kernels run on the GPU). Everything but the forward pass is the served path's:
actions drawn in the actor with its own seeded stream, a recurrent policy's memory and episode starts kept here,
masks applied when the action is drawn. A greedy policy therefore picks the actions the in-actor Agent picks, and
a seeded run is reproducible (the worker computes the halves in the order they were sent).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import gymnasium as gym

from dppo.config import ModelConfig
from dppo.rl.agent import Agent, Weights
from dppo.rl.policy import RemotePolicy, Reply, Request


class WorkerThread:
    """An InferenceClient in this process: one worker thread computes the requests in the order they came."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dppo-forward")

    def submit(self, request: Request) -> Future[Reply]:
        """Start the forward pass of ``request``; the Sampler leaves its observation untouched until received."""
        return self.worker.submit(self._forward, request)

    def _forward(self, request: Request) -> Reply:
        return Reply(request.version, self.agent.heads(request.obs, request.memory, request.starts))

    def result(self, ticket: Future[Reply]) -> Reply:
        return ticket.result()

    def load(self, weights: Weights, version: int) -> None:
        """New weights, loaded on the worker after every forward pass asked before (a lost segment's included)."""
        self.worker.submit(self.agent.load, weights, version).result()

    def close(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)


class OverlappedPolicy(RemotePolicy):
    """The actor's own networks on ``device`` (cuda with a GPU share, else cpu), stepped in ``halves`` groups."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int,
                 num_envs: int, halves: int, device: str = "cpu") -> None:
        super().__init__(obs_space, action_space, config, seed, num_envs)
        if halves not in (1, 2) or (halves == 2 and num_envs % 2):
            raise ValueError(f"{num_envs} envs cannot be stepped in {halves} halves (1, or 2 of an even count)")
        self.halves = halves
        self.client: WorkerThread = WorkerThread(Agent(obs_space, action_space, config, seed=seed, device=device))

    @property
    def agent(self) -> Agent:
        """The networks the worker computes with (tests and tools read its model)."""
        return self.client.agent

    def load(self, weights: Weights, version: int) -> None:
        self.client.load(weights, version)
        super().load(weights, version)

    def close(self) -> None:
        self.client.close()
