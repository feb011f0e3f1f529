"""The driver's side of the policy-inference service (``run.inference: server``): :class:`ServiceSupervisor` starts
the service (:class:`~dppo.distributed.inference.InferenceService`), loads each broadcast into it, and replaces it
when it is lost or hung (counted, said in one line), a group of one actor on the shared lifecycle
(:class:`~dppo.distributed.lifecycle.ActorGroup`). Nothing here runs per env step.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import ray

from dppo.config import Config
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.deadlines import Hangs, Hung, SayHangs
from dppo.distributed.inference import KEEP_VERSIONS, InferenceService
from dppo.distributed.inference_client import ServedBroadcast
from dppo.distributed.lifecycle import ActorGroup
from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.restarts import RestartBudget
from dppo.envs.user_code import driver_import_paths
from dppo.errors import RunFailure, first_line
from dppo.rl.agent import Weights
from dppo.rl.policy import InferenceLost
from dppo.transport.protocol import Endpoint

STATS_TIMEOUT_S = 10.0  # a service too busy to answer within it reports no figures rather than stall the driver
PING_TIMEOUT_S = 10.0  # the most a ping waits (less with a shorter deadline): an asyncio actor answers at once


class ServiceHung(RuntimeError):
    """The inference service missed its deadline: it was said, killed and replaced; the round goes again."""


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

