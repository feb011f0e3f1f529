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


def test_each_selfplay_snapshot_is_put_once_and_an_actor_fetches_only_those_it_lacks(ray_address: str) -> None:
    from dppo.config import SelfPlayConfig
    from dppo.distributed.broadcast import SnapshotRefs, fetch_new_snapshots
    from dppo.run.league import League

    large, _config = broadcast_for([1024, 1024], 0)  # a snapshot of 4 MB
    league = League(SelfPlayConfig(pool_size=2))
    refs = SnapshotRefs()
    league.add(large.weights, 0)
    first = refs.view(league.view())
    league.add(large.weights, 10)
    second = refs.view(league.view())
    assert second.weights[0] is first.weights[0]  # the snapshot already in the store is not put again
    round_ = Broadcast(large.weights, 1, None, None, second)
    assert payload_bytes(round_.opponents) == 0 and payload_bytes(Broadcast({}, 1, None, None, second)) == 0
    fetched = fetch_new_snapshots(second, known={0})
    assert fetched.weights[0] is second.weights[0]  # held already: left a ref, never read
    assert all((fetched.weights[1][k] == large.weights[k]).all() for k in large.weights)
    league.add(large.weights, 20)  # the pool of 2 drops snapshot 0: so does the store's list
    assert set(refs.view(league.view()).ids) == set(refs.refs) == {1, 2}
