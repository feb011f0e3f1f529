"""An actor: the process that samples. A Ray actor that is a thin shell around a Sampler."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import ray

from dppo.config import Config
from dppo.distributed.broadcast import Broadcast, PolicyBroadcasts, fetch_new_snapshots
from dppo.distributed.inference_client import ServedBroadcast, ServiceBackend
from dppo.distributed.ray_calls import per_round
from dppo.envs.make import EnvSpec, env_spec, make_vector_env
from dppo.envs.user_code import add_import_paths, driver_import_paths
from dppo.errors import UsageError, first_line
from dppo.rl.agent import Agent
from dppo.rl.opponents import SelfPlayGames
from dppo.rl.policy import BackendPolicy
from dppo.rl.segment import Segment, SegmentSummary
from dppo.rl.worker_thread import own_policy
from dppo.transport.protocol import Layout

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from dppo.rl.joint import JointSampler
    from dppo.rl.sampler import Sampler


def actor_sampler(config: Config, actor_id: int, seed: int, spec: EnvSpec,
                  make_envs: Callable[[Config], VectorEnv] = make_vector_env) -> Sampler | JointSampler:
    """The actor's sampler, built once with its policy where ``config.placement`` (resolved by the driver) puts it:
    the service's (run.inference=server), the actor's own on a worker thread, in two halves or on its GPU share
    (run.actor_halves, run.actor_gpus), or the actor's own on its thread (several policies:
    :class:`dppo.rl.joint.JointSampler`). ``spec``: the env as the driver resolved it (the one policy's spaces);
    ``make_envs``: what makes one policy's vector env (the actor's self-play games wrap
    :func:`dppo.envs.make.make_vector_env`)."""
    from dppo.rl.joint import local_sampler
    from dppo.rl.sampler import Sampler

    placement = config.placement
    if placement.where == "actor":
        return local_sampler(config, actor_id, seed, make_envs)
    name = config.policy_names[0]
    spaces, columns = spec.spaces[name], spec.columns
    if placement.where == "service":
        policy = BackendPolicy(*spaces, config.model, seed, columns)
        policy.backend = ServiceBackend(Layout(policy.obs_spec, policy.action_spec, config.model, columns))
    else:
        policy = own_policy(*spaces, config.model, seed, columns, on_worker=True, device=own_device(config))
    return Sampler(config, actor_id, seed=seed, policy=policy, make_envs=make_envs, policy_name=name)


def own_device(config: Config) -> str:
    """The placement's device for the actor's own networks; cuda only where this actor's torch sees a GPU (bad input
    else)."""
    if config.placement.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"run.actor_gpus={config.run.actor_gpus:g} gave this actor a GPU share, but its torch "
                             "sees no CUDA device; install a CUDA build of torch on the actors' nodes or set "
                             "run.actor_gpus=0")
    return config.placement.device


def summaries_only(config: Config) -> bool:
    """Whether actors return each segment's summary beside it, for the driver to read alone: when the learners are
    processes of their own (run.learners > 1), which fetch the segments by reference (issue 56). With one learner the
    update runs in the driver, which reads the whole segments anyway."""
    return config.run.learners > 1


def load_broadcast(sampler: Sampler, broadcast: Broadcast, games: SelfPlayGames | None = None) -> None:
    """This round's weights and normalizer statistics into one policy's sampler, and (self-play) its opponent
    pool into the actor's ``games``, fetching only the snapshots they do not hold yet."""
    sampler.set_weights(broadcast.weights, broadcast.version, broadcast.obs_stats, broadcast.return_stats)
    if broadcast.opponents is not None and games is not None:
        games.set_pool(fetch_new_snapshots(broadcast.opponents, games.snapshots))


class Actor:
    """What runs in an actor's process (tests and benchmarks use it directly, without Ray)."""

    def __init__(self, config: Config, actor_id: int, seed: int, spec: EnvSpec,
                 import_paths: list[str] | None = None) -> None:
        """``spec``: the env as the driver resolved it (:func:`dppo.envs.make.env_spec`)."""
        warnings.filterwarnings("ignore", module="gymnasium")
        add_import_paths(import_paths or [])
        self.actor_id = actor_id
        self.summaries = summaries_only(config)
        self.problem: str | None = None
        self.games = SelfPlayGames(config, seed)  # self-play's opponents and results, behind the sampler's envs
        try:
            self.sampler = actor_sampler(config, actor_id, seed, spec, self.games.make_envs)
        except Exception as err:  # the user's env cannot be imported, made or reset here
            where = f"actor {actor_id} on node {ray.util.get_node_ip_address()}"
            what = first_line(err) if isinstance(err, UsageError) else (
                f"env {config.env.name!r} raised {type(err).__name__} while starting: {first_line(err)}")
            self.problem = f"{what} [{where}]"  # reported by ready(): bad input, before anything is written
            return
        if any(not agent.fast for agent in map(own_agent, self.samplers) if agent is not None):
            # image policies act with torch; MLP actors, and those the inference service serves, never import it
            import torch

            torch.set_num_threads(config.run.actor_threads)
            torch.manual_seed(seed)

    @property
    def samplers(self) -> list[Sampler]:
        """Each policy's sampler (one without a policy map)."""
        from dppo.rl.joint import JointSampler

        return self.sampler.samplers if isinstance(self.sampler, JointSampler) else [self.sampler]

    @per_round
    def sample(self, broadcast: Broadcast | PolicyBroadcasts) -> Segment | tuple[Segment | SegmentSummary, ...]:
        """One segment; with several policies one per policy, in map order; each preceded by its summary when the
        driver reads summaries only (:func:`summaries_only`). The pool asks for as many
        returns."""
        if isinstance(broadcast, dict):
            for sampler in self.samplers:
                load_broadcast(sampler, broadcast[sampler.policy_name])
            segments = list(self.sampler.sample())
        else:
            if isinstance(broadcast, ServedBroadcast):  # the service named in each round: a replacement's too
                self.sampler.policy.backend.follow(broadcast)
            load_broadcast(self.sampler, broadcast, self.games)
            segments = [self.sampler.sample()]
            segments[0].match_results = self.games.take_results()
        if self.summaries:
            return tuple(part for segment in segments for part in (segment.summary(), segment))
        return segments[0] if len(segments) == 1 else tuple(segments)

    def ready(self) -> tuple[str | None, str]:
        """(None once the envs are made, else the one-line reason this actor cannot sample; this actor's node)."""
        return self.problem, ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()


RemoteActor = ray.remote(Actor)


def start_actor(config: Config, actor_id: int, seed: int, spec: EnvSpec | None = None) -> ray.actor.ActorHandle:
    """One actor with its CPU reservation; restarts are the actor pool's job (it resends the weights). ``spec``: the
    env as the driver resolved it once for all its actors (resolved here when not given)."""
    return RemoteActor.options(num_cpus=config.run.actor_cpus, num_gpus=config.run.actor_gpus, max_restarts=0,
                               name=None).remote(config, actor_id, seed, spec or env_spec(config),
                                                 driver_import_paths())


def own_agent(sampler: Sampler) -> Agent | None:
    """The networks a sampler acts with in this process (None: the inference service's)."""
    agent = getattr(getattr(sampler.policy, "backend", None), "agent", None)
    return agent if isinstance(agent, Agent) else None
