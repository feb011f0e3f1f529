"""How an actor reaches the inference service: the broadcast that names the service, then shared memory when the
service runs on the actor's node (:mod:`dppo.transport.protocol`: no Ray call per step) or a Ray call per
request from any other node (:class:`RayCallClient`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from dppo.distributed.broadcast import Broadcast
from dppo.errors import first_line
from dppo.rl.policy import Backend, InferenceLost, Reply, Request
from dppo.transport.client import ShmClient
from dppo.transport.protocol import Endpoint, Layout


@dataclass
class ServedBroadcast(Broadcast):
    """What the actors get when the service computes their policy: the version, the normalizer statistics and the
    service to ask, without the weights (the service holds them)."""

    service: Any = None
    spawns: int = 0  # which service it names: the driver's count of services started (ActorGroup.spawns)
    endpoint: Endpoint | None = None  # where actors on the service's node reach it through shared memory


class RayCallClient:
    """An actor's calls to the service from another node: few, large ones (one per half of its envs per step)."""

    def __init__(self, service: ray.actor.ActorHandle) -> None:
        self.service = service

    def submit(self, request: Request) -> ray.ObjectRef:
        return self.service.act.remote(request)

    def result(self, ticket: ray.ObjectRef) -> Reply:
        try:
            return ray.get(ticket)
        except ray.exceptions.RayActorError as err:
            raise InferenceLost(first_line(err)) from None

    def cancel(self, ticket: ray.ObjectRef) -> None:
        """Nothing held here: the reply, when it comes, is dropped with the last reference to it."""


class ServiceBackend:
    """The backend of an actor's policy that the service computes, built once with the actor's Sampler: it asks the
    service each round's broadcast names (:meth:`follow`), through shared memory on the service's node (the
    connection kept while the service is the same) or by Ray calls from any other."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.client: Backend | None = None

    def follow(self, broadcast: ServedBroadcast) -> None:
        """Ask the service ``broadcast`` names from now on: shared memory when it is on this node (the connection kept
        across rounds; a replaced service's closed), else Ray calls. InferenceLost when it cannot be reached."""
        current, endpoint = self.client, broadcast.endpoint
        if isinstance(current, ShmClient):
            if not current.closed and current.endpoint == endpoint:
                return
            current.close()
        if endpoint is None or endpoint.node != ray.get_runtime_context().get_node_id():
            self.client = RayCallClient(broadcast.service)
        else:
            self.client = ShmClient(endpoint, self.layout)

    def submit(self, request: Request) -> Any:
        assert self.client is not None, "each round's broadcast names the service before the actor samples"
        return self.client.submit(request)

    def result(self, ticket: Any) -> Reply:
        assert self.client is not None
        return self.client.result(ticket)

    def cancel(self, ticket: Any) -> None:
        if self.client is not None:
            self.client.cancel(ticket)
