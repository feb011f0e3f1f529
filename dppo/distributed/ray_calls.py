"""The Ray calls the driver makes about a group of actors, in one object: start one, wait for and get the results
of its calls, kill it, ask Ray where it stands (placed or not, on which node) and which nodes are alive, and the
clock its deadlines run on.

The actor pool and its membership make no other Ray call, so a test hands them a fake whose calls finish after
fake time, fail, or lose their node (tests/unit/test_actor_pool.py) and their deadlines, floor waits and
replacements are tested in-process without sleeping. Every group of actors (sampling actors, learners, the
evaluation actor, the inference service) starts, classifies and kills its actors through this object, by way of
the shared lifecycle (:class:`~dppo.distributed.lifecycle.ActorGroup`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import ray

NIL_NODE = "f" * 56  # the GCS's node id before the actor was sent to any node

Method = TypeVar("Method", bound=Callable[..., Any])


def per_round(method: Method) -> Method:
    """An actor method called every round or every env step: Ray keeps no task event of its calls. The GCS keeps
    up to 100,000 task events (about 3.5 KiB each here), so these calls alone made a run's GCS grow 54 -> 98 MiB in
    an hour of CartPole (docs/benchmarks.md, the long runs); ``ray list tasks`` no longer lists them."""
    return ray.method(enable_task_events=False)(method)


@dataclass(frozen=True)
class Placement:
    """Where Ray is with an actor: ``placed`` once a worker process on a node was leased for it (its constructor
    runs or has run), False while it waits for room, None when Ray could not say."""

    placed: bool | None
    node: str | None  # the node it runs on, or was sent to (None: unknown)


class RayCalls:
    """The real calls; ``start(index, seed)`` starts one actor of the group (with its resources)."""

    def __init__(self, start: Callable[[int, int], ray.actor.ActorHandle]) -> None:
        self._start = start

    def start(self, index: int, seed: int) -> ray.actor.ActorHandle:
        return self._start(index, seed)

    def wait(self, refs: list[ray.ObjectRef], num_returns: int, timeout: float) -> list[ray.ObjectRef]:
        """The refs ready once ``num_returns`` of them are, or after ``timeout`` seconds (see ``ray.wait``)."""
        ready, _ = ray.wait(refs, num_returns=num_returns, timeout=timeout)
        return ready

    def get(self, ref: ray.ObjectRef) -> Any:
        return ray.get(ref)

    def kill(self, handle: ray.actor.ActorHandle) -> None:
        ray.kill(handle, no_restart=True)

    def alive_nodes(self) -> set[str]:
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}

    def placement(self, handle: ray.actor.ActorHandle) -> Placement:
        """From the GCS's actor table (one local lookup, well under a millisecond). An actor waiting for room is
        PENDING_CREATION with no worker process (pid 0); once the GCS leases a worker on a node for it, that pid is
        set, and the state turns ALIVE when its constructor returns. ``ray.util.state.get_actor`` would say the same
        through the dashboard, which a local run does not start; ``ray._private.state`` is a developer API, so
        anything unexpected reads as "unknown"."""
        try:
            info = ray._private.state.actors(handle._actor_id.hex())
            state, pid, node = info["State"], info["Pid"], info["Address"]["NodeID"]
        except (AttributeError, KeyError, TypeError, RuntimeError):
            return Placement(None, None)
        node = None if not node or node == NIL_NODE else node
        if state == "ALIVE" or (state == "PENDING_CREATION" and pid):
            return Placement(True, node)
        if state in ("DEPENDENCIES_UNREADY", "PENDING_CREATION"):
            return Placement(False, node)
        return Placement(None, node)  # DEAD or RESTARTING: its loss shows in its next call

    def now(self) -> float:
        """Seconds on a monotonic clock: what deadlines and waits are measured with."""
        return time.monotonic()
