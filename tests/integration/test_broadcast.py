"""How a round's broadcast reaches the actors: small ones by value, large ones through the object store."""

from __future__ import annotations

import ray

from dppo.config import load_config
from dppo.distributed.actor import start_actor
from dppo.distributed.broadcast import INLINE_LIMIT, Broadcast, broadcast_arg, payload_bytes
from dppo.envs.make import make_env
from dppo.rl.agent import export_weights
from dppo.rl.model import ActorCritic


def broadcast_for(hidden: list[int], version: int) -> tuple[Broadcast, object]:
    config = load_config(overrides={"env.num_envs": 2, "ppo.segment_length": 4, "ppo.minibatch_size": 8,
                                    "run.actors": 1, "run.actor_cpus": 0.5})
    config.model.hidden_sizes = hidden
    env = make_env(config.env)
    model = ActorCritic(env.observation_space, env.action_space, config.model)
    env.close()
    return Broadcast(export_weights(model), version, None, None), config


def test_small_broadcasts_go_by_value_large_ones_through_the_object_store(ray_address: str) -> None:
    small, config = broadcast_for([64, 64], 3)
    large, large_config = broadcast_for([1024, 1024], 5)
    assert payload_bytes(small) <= INLINE_LIMIT < payload_bytes(large)
    by_value = broadcast_arg(small)
    assert isinstance(by_value, Broadcast) and by_value.version == 3
    before = {k: v.copy() for k, v in by_value.weights.items()}
    for array in small.weights.values():
        array += 1.0  # what an update does to the parameters the exported weights are views of
    assert all((by_value.weights[k] == before[k]).all() for k in before)  # the round keeps its own copy
    assert isinstance(broadcast_arg(large), ray.ObjectRef)
    for broadcast, cfg in ((small, config), (large, large_config)):
        actor = start_actor(cfg, 0, seed=1)
        try:
            segment = ray.get(actor.sample.remote(broadcast_arg(broadcast)), timeout=60)
        finally:
            ray.kill(actor, no_restart=True)
        assert segment.policy_version == broadcast.version  # the actor acted with the weights it was handed
        assert segment.num_steps == 2 * 4
