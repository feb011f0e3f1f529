"""The policy-inference service (``run.inference: server``): one Ray actor on ``run.device`` that answers every
actor's observations in batches, so the forward pass runs once for many actors (Sample Factory, SEED RL, Cleanba).

It returns the networks' outputs, not actions (each actor draws its own, seeded: :class:`dppo.rl.policy.
BackendPolicy`), and a recurrent policy's memory travels with each request, so it holds nothing but the last two
weights versions (with ``run.overlap_sampling`` a round samples with the weights the update is about to replace).

:class:`BatchStats` and :class:`ForwardPasses` are plain classes; :class:`InferenceService` is the asyncio Ray
actor around them, which gathers each batch until every actor's request is in or BATCH_WAIT_S has passed (through
shared memory on its node, :mod:`dppo.transport.server`, and Ray calls from others). The driver's side is
:class:`dppo.distributed.service_supervisor.ServiceSupervisor`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque

import gymnasium as gym
import numpy as np
import ray
import torch

from dppo.config import ModelConfig
from dppo.distributed.ray_calls import per_round
from dppo.envs.user_code import add_import_paths
from dppo.rl.agent import Agent, Heads, Weights
from dppo.rl.policy import Reply, Request
from dppo.rl.spaces import Obs, check_spaces
from dppo.transport.protocol import Endpoint, Layout
from dppo.transport.server import Answer, ShmServer

BATCH_WAIT_S = 0.002  # how long a batch waits for the rest of the actors' requests after its first one
KEEP_VERSIONS = 2  # the weights sampled with and, with run.overlap_sampling, the ones sampled with meanwhile
STATS_KEPT = 4096  # batches whose figures are kept for the medians between two reads (a run that never reads them)


class BatchStats:
    """Each batch's rows, forward-pass seconds and queue wait (its first request's) between two reads: what batching
    buys and costs (`dppo bench driver`). Counts and totals are exact; the medians are over the last ``kept``."""

    def __init__(self, kept: int = STATS_KEPT) -> None:
        self.kept = kept
        self._reset()

    def _reset(self) -> None:
        self.batches, self.rows, self.forward_s = 0, 0, 0.0
        self.recent: deque[tuple[int, float, float]] = deque(maxlen=self.kept)  # (rows, forward_s, queue_s)

    def add(self, rows: int, forward_s: float, queue_s: float) -> None:
        self.batches += 1
        self.rows += rows
        self.forward_s += forward_s
        self.recent.append((rows, forward_s, queue_s))

    def take(self) -> dict[str, float]:
        """The figures since the last take (``{"batches": 0}`` when no batch ran); counting starts again at zero."""
        if not self.batches:
            return {"batches": 0}
        taken = {"batches": self.batches, "rows_mean": self.rows / self.batches, "forward_s_total": self.forward_s,
                 "forward_s_median": statistics.median(f for _, f, _ in self.recent),
                 "queue_s_median": statistics.median(q for _, _, q in self.recent)}
        self._reset()
        return taken


def _join(parts: list[np.ndarray | None], axis: int = 0) -> np.ndarray | None:
    if parts[0] is None or len(parts) == 1:  # one request: its own arrays
        return parts[0]
    return np.concatenate(parts, axis=axis)


def _split(heads: Heads, sizes: list[int]) -> list[Heads]:
    """Each request's rows of a batch's heads (views; slicing costs less than np.split for the few requests here)."""
    if len(sizes) == 1:
        return [heads]
    parts, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        memory = None if heads.memory is None else heads.memory[:, rows]
        parts.append(Heads(heads.out[rows], heads.log_std, heads.values[rows], memory))
        start += size
    return parts


class ForwardPasses:
    """The weights of the last KEEP_VERSIONS versions and the batched forward pass (no Ray: tests use it)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig,
                 device: str = "cpu") -> None:
        self.obs_space, self.action_space, self.config, self.device = obs_space, action_space, config, device
        self.runners: dict[int, Agent] = {}  # version -> the Agent with those weights

    @property
    def versions(self) -> list[int]:
        return sorted(self.runners)

    def load(self, weights: Weights, version: int) -> None:
        """Hold ``version`` (the oldest held is dropped beyond KEEP_VERSIONS; its networks are reused)."""
        if version in self.runners:
            return
        if len(self.runners) >= KEEP_VERSIONS:
            agent = self.runners.pop(min(self.runners))
        else:
            agent = Agent(self.obs_space, self.action_space, self.config, seed=0, device=self.device)
        agent.load(weights, version)
        self.runners[version] = agent

    def forward(self, requests: list[Request]) -> list[Reply]:
        """One forward pass per version among ``requests`` over all their rows; replies in request order."""
        replies: list[Reply | None] = [None] * len(requests)
        for version in sorted({r.version for r in requests}):
            if version not in self.runners:
                raise KeyError(f"weights version {version} is not held by the inference service "
                               f"(it holds {self.versions}): the driver loads each broadcast before a round")
            picked = [i for i, r in enumerate(requests) if r.version == version]
            batch = [requests[i] for i in picked]
            obs = Obs(image=_join([r.obs.image for r in batch]), vector=_join([r.obs.vector for r in batch]))
            heads = self.runners[version].heads(obs, _join([r.memory for r in batch], axis=1),
                                                _join([r.starts for r in batch]))
            for i, part in zip(picked, _split(heads, [len(r.obs) for r in batch]), strict=True):
                replies[i] = Reply(version, part)
        return replies  # type: ignore[return-value]


class InferenceService:
    """The Ray actor (asyncio): requests, by Ray call or shared memory, wait for their batch: it runs as one forward
    pass once ``expected`` requests are in, or BATCH_WAIT_S after its first."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, device: str,
                 expected: int, threads: int, import_paths: list[str] | None = None) -> None:
        torch.set_num_threads(threads)
        add_import_paths(import_paths or [])  # a network of one's own (model.entry_point) is imported here
        self.passes = ForwardPasses(obs_space, action_space, config, device)
        self.expected = expected
        self.waiting: list[tuple[Request, Answer]] = []  # the batch being gathered
        self.first_at = 0.0  # when its first request came
        self.due: asyncio.TimerHandle | None = None  # runs it BATCH_WAIT_S after its first request
        self.figures = BatchStats()  # read and reset by stats()
        self.transport = ShmServer(self._layout, self._enqueue)

    def _layout(self, rows: int, regions: int) -> Layout:
        """A same-node actor's regions, for ``rows`` envs."""
        passes = self.passes
        return Layout(*check_spaces(passes.obs_space, passes.action_space, passes.config), passes.config, rows, regions)

    @per_round
    async def act(self, request: Request) -> Reply:
        """A request by Ray call (an actor on another node)."""
        future = asyncio.get_running_loop().create_future()
        self._enqueue(request, lambda answer: future.set_exception(answer) if isinstance(answer, Exception)
                      else future.set_result(answer))
        return await future

    def _enqueue(self, request: Request, answer: Answer) -> None:
        if not self.waiting:
            self.first_at = time.monotonic()
        self.waiting.append((request, answer))
        if len(self.waiting) >= self.expected:
            self._run()
        elif len(self.waiting) == 1:
            self.due = asyncio.get_running_loop().call_later(BATCH_WAIT_S, self._run)

    def _run(self) -> None:
        if self.due is not None:  # a batch that filled before its time
            self.due.cancel()
            self.due = None
        queue_s = time.monotonic() - self.first_at
        items, self.waiting = self.waiting, []
        started = time.perf_counter()
        try:
            replies = self.passes.forward([request for request, _ in items])
        except Exception as err:
            for _, answer in items:
                answer(err)
            return
        self.figures.add(sum(len(request.obs) for request, _ in items), time.perf_counter() - started, queue_s)
        for (_, answer), reply in zip(items, replies, strict=True):
            answer(reply)

    @per_round
    async def load(self, weights: Weights, version: int) -> list[int]:
        self.passes.load(weights, version)
        return self.passes.versions

    async def ready(self) -> Endpoint | None:
        """Where actors on this node reach it through shared memory (None where no Unix socket can be opened: they
        all use Ray calls then)."""
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        try:
            return self.transport.open(asyncio.get_running_loop(), node)
        except OSError:
            return None

    async def close(self) -> None:
        """The shared-memory peers let go and their segments removed (before the run ends it)."""
        self.transport.close()

    async def ping(self) -> None:
        """Answered at once by a service whose event loop runs (the driver's check before it blames its actors)."""

    @per_round
    async def stats(self) -> dict[str, float]:
        """The batches' figures since the last call (:meth:`BatchStats.take`)."""
        return self.figures.take()
