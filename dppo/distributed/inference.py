"""The policy-inference service (``run.inference: server``): one Ray actor on ``run.device`` that answers every
actor's observations in batches, so the forward pass runs once for many actors (Sample Factory, SEED RL, Cleanba).

It returns the networks' outputs, not actions (each actor draws its own, seeded: :class:`dppo.rl.policy.
BackendPolicy`), and a recurrent policy's memory travels with each request, so it holds nothing but the last two
weights versions (with ``run.overlap_sampling`` a round samples with the weights the update is about to replace).

:class:`BatchStats` and :class:`ForwardPasses` are plain classes; :class:`InferenceService` is the asyncio Ray
actor around them, which gathers each batch until every actor's request is in or BATCH_WAIT_S has passed (through
shared memory on its node, :mod:`dppo.transport.server`, and Ray calls from others); :class:`ServiceSupervisor` is
the driver's side, a group of one actor on the shared lifecycle (:class:`~dppo.distributed.lifecycle.ActorGroup`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import ray
import torch

from dppo.config import Config, ModelConfig
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.deadlines import Hangs, Hung, SayHangs
from dppo.distributed.inference_client import ServedBroadcast
from dppo.distributed.lifecycle import ActorGroup
from dppo.distributed.ray_calls import RayCalls, per_round
from dppo.distributed.restarts import RestartBudget
from dppo.envs.user_code import add_import_paths, driver_import_paths
from dppo.errors import RunFailure, first_line
from dppo.rl.agent import Agent, Heads, Weights
from dppo.rl.policy import InferenceLost, Reply, Request
from dppo.rl.spaces import Obs, check_spaces
from dppo.transport.protocol import Endpoint, Layout
from dppo.transport.server import Answer, ShmServer

BATCH_WAIT_S = 0.002  # how long a batch waits for the rest of the actors' requests after its first one
KEEP_VERSIONS = 2  # the weights sampled with and, with run.overlap_sampling, the ones sampled with meanwhile
STATS_KEPT = 4096  # batches whose figures are kept for the medians between two reads (a run that never reads them)
STATS_TIMEOUT_S = 10.0  # a service too busy to answer within it reports no figures rather than stall the driver
PING_TIMEOUT_S = 10.0  # the most a ping waits (less with a shorter deadline): an asyncio actor answers at once


class ServiceHung(RuntimeError):
    """The inference service missed its deadline: it was said, killed and replaced; the round goes again."""


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


def start_service(config: Config, obs_space: gym.Space, action_space: gym.Space, device: str
                  ) -> ray.actor.ActorHandle:
    """The service on ``device``, beside the driver: half a GPU on cuda (the learner has the rest), no reserved CPU
    (the actors keep theirs)."""
    gpus = 0.5 if device.startswith("cuda") else 0
    return ray.remote(InferenceService).options(num_cpus=0, num_gpus=gpus, max_restarts=0).remote(
        obs_space, action_space, config.model, device, config.run.actors, config.run.learner_threads,
        driver_import_paths())


def lost_service(err: BaseException) -> InferenceLost | None:
    """The InferenceLost behind a failed round (an actor's sample found the service gone), or None."""
    cause = err.__cause__
    if isinstance(cause, ray.exceptions.RayTaskError) and isinstance(cause.cause, InferenceLost):
        return cause.cause
    return None


class ServiceSupervisor:
    """The driver's side of the service: start it, load each broadcast, replace it when lost (counted)."""

    def __init__(self, config: Config, obs_space: gym.Space, action_space: gym.Space, device: str,
                 message: Callable[[str], None], calls: RayCalls | None = None, hangs: Hangs | None = None) -> None:
        """``hangs``: the run's (default: said with ``message``, with a budget of their own)."""
        self.message, self.device = message, device
        self.calls = calls or RayCalls(lambda index, seed: start_service(config, obs_space, action_space, device))
        self.hangs = hangs or Hangs(config.faults, SayHangs(message), self.calls.now)
        self.deadline = self.hangs.deadline()  # a load's, from the loads' durations so far
        self.start_timeout_s = config.faults.actor_start_timeout_s
        self.held: dict[int, Weights] = {}  # the versions the service holds, to load into a replacement
        self.endpoint: Endpoint | None = None  # where the current service takes shared-memory actors
        faults = config.faults  # a service that keeps crashing spends the actors' crash-loop budget
        crashes = RestartBudget("actor", faults.max_actor_restarts, faults.restart_window_s, clock=self.calls.now)
        # the n-th service started gets seed n (its spawns count: a round names the one it was sent to)
        self.group = ActorGroup(self.calls, lambda index, spawn: spawn + 1, crashes)

    @property
    def handle(self) -> ray.actor.ActorHandle | None:
        return self.group.slots[0].handle if self.group.slots else None

    @property
    def losses(self) -> int:
        return sum(self.group.losses.values())

    def start(self) -> None:
        """A service, ready, holding the versions its predecessor held."""
        self.group.start(1)
        self._ready()

    def _ready(self) -> None:
        ready = self.group.slots[0].starting  # its ready() call
        if not self.calls.wait([ready], 1, self.start_timeout_s):
            raise RunFailure(f"the inference service was not ready within faults.actor_start_timeout_s="
                             f"{self.start_timeout_s:g} s (on {self.device} it asks Ray for "
                             f"{'half a GPU' if self.device.startswith('cuda') else 'no reserved resources'}); "
                             "free a GPU beside the learner or set run.inference=actor")
        try:
            endpoint = self.calls.get(ready)
        except ray.exceptions.RayActorError as err:
            if err.actor_init_failed:  # its constructor raised: another would too
                raise RunFailure(f"the inference service failed to start: {first_line(err)}") from err
            self.replace(err)  # lost before it was ready (killed, its node gone): another, within the budget
            return
        self.endpoint = endpoint if isinstance(endpoint, Endpoint) else None
        self.group.mark_ready(0, None)  # its node, asked of Ray when it is lost
        try:
            for version, weights in sorted(self.held.items()):
                self._call(self.handle.load.remote(weights, version), "loading its predecessor's weights")
        except ray.exceptions.RayActorError as err:
            self.replace(err)  # lost while loading its predecessor's versions
        except ServiceHung:
            pass  # replaced already

    def _call(self, ref: ray.ObjectRef, doing: str, limit_s: float | None = None) -> object:
        """A call's answer within the service's deadline (``limit_s`` when less); past it the service is hung: said,
        replaced, and ServiceHung."""
        began = self.calls.now()
        limit = self.deadline.seconds if limit_s is None else min(limit_s, self.deadline.seconds)
        if not self.calls.wait([ref], 1, limit):
            waited = self.calls.now() - began
            self.hangs.declare("inference", "the inference service", doing, waited, self.deadline)
            self.group.replace(0, Hung(f"no answer in {waited:.1f} s"), hung=True)
            self._ready()
            raise ServiceHung(f"the inference service hung {doing}; replaced")
        self.deadline.observe(self.calls.now() - began)
        return self.calls.get(ref)

    def check(self) -> None:
        """Before the actors waiting on the service are declared hung: it answers a ping (within PING_TIMEOUT_S or
        its deadline), else it is the one hung: replaced, and ServiceHung sends the round again."""
        self._call(self.handle.ping.remote(), "answering its actors (a ping went unanswered)", PING_TIMEOUT_S)

    def serve(self, broadcast: Broadcast) -> ServedBroadcast:
        """Load the broadcast's weights into the service (a lost one replaced first); what the actors get."""
        # a copy: exported weights are views of the learner's parameters, which the update changes in place
        self.held[broadcast.version] = {k: np.array(v) for k, v in broadcast.weights.items()}
        for version in sorted(self.held)[:-KEEP_VERSIONS]:
            del self.held[version]
        try:
            self._call(self.handle.load.remote(self.held[broadcast.version], broadcast.version), "loading the weights")
        except ray.exceptions.RayActorError as err:
            self.replace(err)
        except ServiceHung:
            pass  # its replacement holds every version held, this one included
        return self.again(broadcast)

    def again(self, broadcast: Broadcast) -> ServedBroadcast:
        """``broadcast`` for the actors, naming the current service (a round sent again after a replacement)."""
        return ServedBroadcast(weights={}, version=broadcast.version, obs_stats=broadcast.obs_stats,
                               return_stats=broadcast.return_stats, opponents=broadcast.opponents,
                               service=self.handle, spawns=self.group.spawns, endpoint=self.endpoint)

    def recover(self, broadcast: ServedBroadcast, err: Exception) -> ServedBroadcast:
        """A round lost with its service: the service replaced (unless it was since), the round's broadcast again."""
        if broadcast.spawns == self.group.spawns:
            self.replace(err)
        return self.again(broadcast)

    def replace(self, err: Exception) -> None:
        """A new service holding the lost one's versions; the loss counted by cause and said in one line."""
        self.group.replace(0, err)
        self.message(f"the inference service was lost ({first_line(err)}); replacing it (loss {self.losses})")
        self._ready()

    def batch_stats(self) -> dict[str, float]:
        """The service's batch figures since the last call; {} without a service or an answer within
        STATS_TIMEOUT_S (figures for a benchmark are not worth failing a run over)."""
        if self.handle is None:
            return {}
        try:
            return ray.get(self.handle.stats.remote(), timeout=STATS_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return {}

    def shutdown(self) -> None:
        """The service closed (its shared memory removed: a killed actor runs no cleanup), then killed."""
        if self.handle is not None:
            self.calls.wait([self.handle.close.remote()], 1, STATS_TIMEOUT_S)
        self.group.shutdown()

