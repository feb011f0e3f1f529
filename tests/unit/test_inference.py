"""The inference service's logic without Ray: when a batch runs, the versions it holds, one forward pass for many
requests, and a Sampler whose policy it computes (two env halves) sampling what the in-actor path samples, in this
process and through the same-node shared-memory transport (the service on a loop thread of its own)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
from test_shm_transport import running_service

import dppo.envs  # noqa: F401 - registers the toy envs
from dppo.config import Config, ConfigError, ModelConfig, load_config
from dppo.config.load import GPU_PRESETS_DIR
from dppo.config.tuned import save, this_machine
from dppo.distributed.broadcast import Broadcast
from dppo.distributed.inference import BATCH_WAIT_S, ForwardPasses, InferenceService
from dppo.distributed.inference_choice import choose_inference, resolve_inference
from dppo.distributed.ray_calls import RayCalls
from dppo.distributed.service_supervisor import ServiceSupervisor
from dppo.errors import RunFailure, UsageError
from dppo.rl.agent import Agent, export_weights
from dppo.rl.build import build_model
from dppo.rl.policy import BackendPolicy, InferenceLost, Reply, Request
from dppo.rl.sampler import Sampler
from dppo.rl.spaces import check_spaces
from dppo.transport.client import ShmClient
from dppo.transport.protocol import Layout

TRANSPORTS = ["in-process", "shared memory"]


class InProcess:
    """A Backend that runs each request through a plain ForwardPasses when its result is asked for."""

    def __init__(self, passes: ForwardPasses) -> None:
        self.passes, self.requests = passes, 0

    def submit(self, request: Request) -> Request:
        self.requests += 1
        return request

    def result(self, ticket: Request) -> Reply:
        return self.passes.forward([ticket])[0]

    def cancel(self, ticket: Request) -> None:
        """Nothing computed before the result is asked for."""


def test_a_batch_runs_when_every_expected_request_is_in_or_its_first_has_waited_long_enough() -> None:
    """The service's class (no Ray) on an asyncio loop: the requests of both expected actors run as one batch at
    once; one alone runs after BATCH_WAIT_S, its wait counted."""
    env = gym.make("CartPole-v1")
    config = ModelConfig()
    service = InferenceService(env.observation_space, env.action_space, config, "cpu", expected=2, threads=1)
    obs = check_spaces(env.observation_space, env.action_space, config)[0].encode(np.zeros((3, 4), np.float32))

    async def rounds() -> tuple[list[Reply], dict, float, dict]:
        await service.load(weights_of(env.observation_space, env.action_space, config, seed=1), 1)
        both = await asyncio.gather(service.act(Request(1, obs)), service.act(Request(1, obs)))
        full = await service.stats()
        asked = time.monotonic()
        await service.act(Request(1, obs))
        return both, full, time.monotonic() - asked, await service.stats()

    both, full, waited, alone = asyncio.run(rounds())
    assert [reply.heads.values.shape for reply in both] == [(3,), (3,)]
    assert full["batches"] == 1 and full["rows_mean"] == 6  # gathered in one turn of the loop, before any timer
    assert alone["batches"] == 1 and alone["rows_mean"] == 3
    assert waited >= alone["queue_s_median"] >= BATCH_WAIT_S * 0.99  # asyncio's timers may fire a clock tick early


def weights_of(obs_space: gym.Space, action_space: gym.Space, config: ModelConfig, seed: int) -> dict:
    torch.manual_seed(seed)
    return export_weights(build_model(obs_space, action_space, config))


def test_the_server_answers_each_request_with_the_version_it_names_and_keeps_the_last_two() -> None:
    env = gym.make("CartPole-v1")
    config = ModelConfig()
    server = ForwardPasses(env.observation_space, env.action_space, config)
    versions = {v: weights_of(env.observation_space, env.action_space, config, seed=v) for v in (1, 2, 3)}
    server.load(versions[1], 1)
    server.load(versions[2], 2)
    rng = np.random.default_rng(0)
    obs = [rng.normal(size=(n, 4)).astype(np.float32) for n in (3, 1, 4)]
    requests = [Request(2, check_spaces(env.observation_space, env.action_space, config)[0].encode(o)) for o in obs]
    requests[1].version = 1
    replies = server.forward(requests)
    assert [r.version for r in replies] == [2, 1, 2]
    for request, reply in zip(requests, replies, strict=True):
        alone = Agent(env.observation_space, env.action_space, config, seed=0)
        alone.load(versions[request.version], request.version)
        np.testing.assert_array_equal(reply.heads.values, alone.value(request.obs))
        assert reply.heads.out.shape == (len(request.obs), 2)
    server.load(versions[3], 3)
    assert server.versions == [2, 3]
    with pytest.raises(KeyError, match="version 1 is not held"):
        server.forward([requests[1]])


@pytest.fixture
def stack() -> ExitStack:
    """Services started by a test, closed after it."""
    with ExitStack() as stack:
        yield stack


def served(policy: BackendPolicy, env: gym.Env, weights: dict, version: int, transport: str, stack: ExitStack
           ) -> InProcess | ShmClient:
    """``policy``'s client: a plain server holding ``weights`` in this process, or a service reached through shared
    memory."""
    if transport == "in-process":
        server = ForwardPasses(env.observation_space, env.action_space, policy.config)
        server.load(weights, version)
        return InProcess(server)
    _, endpoint, _ = stack.enter_context(running_service(env.observation_space, env.action_space, policy.config,
                                                         {version: weights}))
    client = ShmClient(endpoint, Layout(policy.obs_spec, policy.action_spec, policy.config, policy.num_envs))
    stack.callback(client.close)
    return client


def served_sampler(overrides: dict, seed: int = 0, transport: str = "in-process", stack: ExitStack | None = None
                   ) -> tuple[Sampler, InProcess | ShmClient, dict]:
    config = load_config(overrides={"ppo.minibatch_size": 32, **overrides, "run.seed": seed,
                                    "run.inference": "server"})
    env = gym.make(config.env.id, **config.env.kwargs)
    weights = weights_of(env.observation_space, env.action_space, config.model, seed)
    policy = BackendPolicy(env.observation_space, env.action_space, config.model, seed=7, num_envs=config.env.num_envs)
    policy.backend = served(policy, env, weights, 0, transport, stack)
    sampler = Sampler(config, seed=7, policy=policy)
    sampler.set_weights({}, 0)
    return sampler, policy.backend, weights


def in_actor(config: Config) -> Config:
    """``config`` with the policy in the actor (one group of envs)."""
    return config.model_copy(update={"run": config.run.model_copy(update={"inference": "actor"})})


@pytest.mark.parametrize("overrides", [
    {"env.num_envs": 4, "ppo.segment_length": 40},  # two halves
    {"env.num_envs": 1, "ppo.segment_length": 40},  # one env: one half
    {"env.id": "dppo/Counter-v0", "env.num_envs": 2, "ppo.segment_length": 25},  # time limits: V(final obs)
    {"env.id": "Pendulum-v1", "env.num_envs": 2, "ppo.segment_length": 210, "env.normalize_obs": True,
     "env.normalize_reward": True},  # Gaussian actions, normalized observations, truncations
])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_served_mlp_policy_samples_exactly_what_the_in_actor_policy_samples(overrides: dict, transport: str,
                                                                               stack: ExitStack) -> None:
    served, client, weights = served_sampler(overrides, transport=transport, stack=stack)
    local = Sampler(in_actor(served.config), seed=7)
    local.set_weights(weights, 0)
    for _ in range(2):  # env state and episodes carry across segments
        a, b = served.sample(), local.sample()
        for field in dataclasses.fields(a):
            left, right = getattr(a, field.name), getattr(b, field.name)
            if field.name.endswith("_seconds"):  # timings: sample, env, policy
                continue
            if field.name == "obs":
                left, right = left.vector, right.vector
            if isinstance(left, np.ndarray):
                np.testing.assert_array_equal(left, right, err_msg=field.name)
            elif field.name in ("obs_stats", "return_stats") and left is not None:  # RunningStats: arrays inside
                np.testing.assert_equal(dataclasses.asdict(left), dataclasses.asdict(right), err_msg=field.name)
            else:
                assert left == right, field.name
    halves = 2 if served.config.env.num_envs > 1 else 1
    assert len(served.half_envs) == halves
    if transport == "in-process":
        assert client.requests >= 2 * halves * served.config.ppo.segment_length


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_served_cnn_policy_picks_the_in_actor_policys_greedy_actions(transport: str, stack: ExitStack) -> None:
    env = gym.make("dppo/DictMatch-v0")
    config = ModelConfig()
    weights = weights_of(env.observation_space, env.action_space, config, seed=3)
    local = Agent(env.observation_space, env.action_space, config, seed=0)
    local.load(weights, 5)
    remote = BackendPolicy(env.observation_space, env.action_space, config, seed=0, num_envs=16)
    remote.backend, remote.version = served(remote, env, weights, 5, transport, stack), 5
    obs = local.obs_spec.encode_many([env.reset(seed=i)[0] for i in range(16)])
    actions, log_probs, values = remote.act(obs, greedy=True)
    want_actions, want_log_probs, want_values = local.act(obs, greedy=True)
    np.testing.assert_array_equal(actions, want_actions)
    np.testing.assert_allclose(log_probs, want_log_probs, atol=1e-5)
    np.testing.assert_allclose(values, want_values, atol=1e-6)


def columns(x: np.ndarray) -> torch.Tensor:
    """(T, E, ...) -> (E * T, -1), env columns one after another (the update's replay order)."""
    steps, envs = x.shape[:2]
    return torch.as_tensor(np.ascontiguousarray(np.swapaxes(x, 0, 1)).reshape(envs * steps, -1))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_served_lstm_policy_carries_each_envs_memory_as_the_update_replays_it(transport: str,
                                                                               stack: ExitStack) -> None:
    overrides = {"env.id": "dppo/CueCorridor-v0", "env.kwargs": {"length": 3}, "model.recurrent": "lstm",
                 "model.lstm_hidden_size": 16, "env.num_envs": 4, "ppo.segment_length": 16}
    sampler, _, weights = served_sampler(overrides, transport=transport, stack=stack)
    half = sampler.half_envs[0]
    model = build_model(half.single_observation_space, half.single_action_space, sampler.config.model)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
    for _ in range(2):  # the second segment starts mid-episode, from the memory the first left
        seg = sampler.sample()
        steps, envs = seg.log_probs.shape
        assert seg.starts[1:].any()
        memory = tuple(torch.as_tensor(m[None]) for m in seg.initial_memory)
        with torch.no_grad():
            log_probs, _, values = model.evaluate_columns(model.as_obs(columns(seg.obs.vector)),
                                                          columns(seg.actions)[:, 0], columns(seg.starts)[:, 0],
                                                          memory, steps=steps)
        np.testing.assert_allclose(log_probs.reshape(envs, steps).T.numpy(), seg.log_probs, atol=1e-5)
        np.testing.assert_allclose(values.reshape(envs, steps).T.numpy(), seg.values, atol=1e-5)


def test_a_served_masked_policy_never_takes_a_masked_action() -> None:
    sampler, _, _ = served_sampler({"env.id": "dppo/MaskedGrid-v0", "env.num_envs": 4, "ppo.segment_length": 64})
    seg = sampler.sample()
    taken = np.take_along_axis(seg.obs.mask, seg.actions[..., None].astype(np.int64), axis=-1)
    assert taken.all() and not seg.obs.mask.all()  # some actions were masked, none of those taken


@pytest.mark.parametrize("setting, want", [("auto", "actor"), ("server", "server"), ("actor", "actor")])
def test_auto_is_the_actors_until_the_service_is_measured_faster(setting: str, want: str) -> None:
    config = load_config(overrides={"run.inference": setting})
    assert resolve_inference(config).run.inference == want


def test_auto_follows_this_machine_s_tune_result_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result `dppo tune` saved for this env on this machine decides auto; another machine's, another env's or an
    unreadable file do not; actors that run their own policy keep it."""
    monkeypatch.setenv("DPPO_TUNE_DIR", str(tmp_path))
    config = load_config(overrides={"env.id": "CartPole-v1", "run.inference": "auto"})
    path = save("CartPole-v1", {"at": "2026-11-28T10:00:00Z", "settings": {"run.inference": "server"}})
    mode, why = choose_inference(config)
    assert mode == "server" and str(path) in why and "as `dppo tune` measured on this machine" in why
    assert resolve_inference(config).run.inference == "server"
    assert choose_inference(load_config(overrides={"env.id": "Acrobot-v1"}))[0] == "actor"
    halves = load_config(overrides={"env.id": "CartPole-v1", "run.actor_halves": 2})
    assert choose_inference(halves) == ("actor", "auto: the actors run their own policy (a policy map, "
                                                  "run.actor_halves or run.actor_gpus)")
    odd = load_config(overrides={"env.id": "CartPole-v1", "env.num_envs": 3, "ppo.minibatch_size": 32})
    assert choose_inference(odd)[0] == "actor"  # the service needs an even number of envs
    elsewhere = json.loads(path.read_text()) | {"machine": {**this_machine(), "host": "another-host"}}
    path.write_text(json.dumps(elsewhere))
    assert choose_inference(config) == ("actor", "auto: no `dppo tune` result for CartPole-v1 on this machine")
    path.write_text("{not json")
    assert choose_inference(config)[0] == "actor"
    assert choose_inference(load_config(overrides={"run.inference": "server"})) == ("server", "")


@pytest.mark.parametrize("preset", ["breakout", "pong"])
def test_the_gpu_presets_name_the_mode_they_were_measured_with(preset: str) -> None:
    """Issue 42: on one H100 the service with Ray calls sampled Breakout at 0.46x of the actors."""
    config = load_config(GPU_PRESETS_DIR / f"{preset}.yaml")
    assert config.run.inference == "actor"


def test_a_served_policy_needs_an_even_number_of_envs() -> None:
    config = load_config(overrides={"run.inference": "server", "env.num_envs": 3, "ppo.minibatch_size": 32})
    with pytest.raises(UsageError, match=r"env.num_envs must be even \(or 1\), not 3; set env.num_envs=4"):
        resolve_inference(config)
    with pytest.raises(ConfigError, match=r"run\.inference"):
        load_config(overrides={"run.inference": "gpu"})


class FakeService:
    """A service handle whose calls answer at once (``ready`` never, when it cannot be placed) or, once it is
    dead, raise what Ray raises for a dead actor."""

    def __init__(self, placed: bool = True) -> None:
        self.placed, self.dead, self.loaded, self.closed = placed, False, [], False
        self.ready = SimpleNamespace(remote=lambda: ("ready", self))
        self.load = SimpleNamespace(remote=lambda weights, version: ("load", self, weights, version))
        self.close = SimpleNamespace(remote=self._close)

    def _close(self) -> tuple:
        self.closed = True
        return "close", self


class FakeServiceCalls(RayCalls):
    """Ray calls about the service, in-process: which services were started and killed."""

    def __init__(self, placed: bool = True) -> None:
        super().__init__(lambda index, seed: FakeService(placed))
        self.started: list[FakeService] = []
        self.killed: list[FakeService] = []

    def start(self, index: int, seed: int) -> FakeService:
        self.started.append(super().start(index, seed))
        return self.started[-1]

    def wait(self, refs: list, num_returns: int, timeout: float) -> list:
        return [ref for ref in refs if ref[1].placed]

    def get(self, ref: tuple) -> object:
        kind, service, *args = ref
        if service.dead:
            raise ray.exceptions.RayActorError(error_msg="the inference service's process died")
        if kind == "load":
            weights, version = args
            service.loaded.append((version, {k: v.copy() for k, v in weights.items()}))
        return None

    def kill(self, handle: FakeService) -> None:
        self.killed.append(handle)


def driver_side(calls: FakeServiceCalls, max_restarts: int = 10) -> tuple[ServiceSupervisor, list[str]]:
    config = load_config(overrides={"faults.max_actor_restarts": max_restarts})
    env = gym.make("CartPole-v1")
    said: list[str] = []
    return ServiceSupervisor(config, env.observation_space, env.action_space, "cpu", said.append, calls), said


def broadcast(version: int) -> Broadcast:
    return Broadcast({"w": np.full(3, float(version))}, version, None, None)


def test_a_lost_service_is_replaced_once_holding_the_last_two_versions_and_rounds_name_the_new_one() -> None:
    calls = FakeServiceCalls()
    inference, said = driver_side(calls)
    inference.start()
    first = broadcast(1)
    served = inference.serve(first)
    first.weights["w"][:] = -1  # the learner's update changes exported weights in place
    assert served.weights == {} and served.service is calls.started[0] and served.spawns == 1
    inference.serve(broadcast(2))
    calls.started[0].dead = True
    third = inference.serve(broadcast(3))  # the load finds it gone: replaced, then loaded
    assert len(calls.started) == 2 and calls.killed == [calls.started[0]] and inference.losses == 1
    assert [(v, w["w"][0]) for v, w in calls.started[1].loaded] == [(2, 2.0), (3, 3.0)]
    assert third.service is calls.started[1] and third.spawns == 2
    assert len(said) == 1 and "the inference service was lost" in said[0] and "loss 1" in said[0]
    # a round sent to the lost service fails after the replacement: sent again, nothing replaced twice
    again = inference.recover(served, InferenceLost("gone"))
    assert again.service is calls.started[1] and again.version == 1 and len(calls.started) == 2
    calls.started[1].dead = True
    inference.recover(third, InferenceLost("gone"))  # a round of the current service: it is replaced
    assert len(calls.started) == 3 and inference.losses == 2
    inference.shutdown()
    assert calls.killed[-1] is calls.started[2] and calls.started[2].closed  # its shared memory removed first


def test_a_service_that_keeps_dying_ends_the_run_and_one_never_placed_says_what_to_do() -> None:
    calls = FakeServiceCalls()
    inference, _ = driver_side(calls, max_restarts=1)
    inference.start()
    served = inference.serve(broadcast(1))
    inference.recover(served, InferenceLost("gone"))
    with pytest.raises(RunFailure, match=r"faults\.max_actor_restarts=1"):
        inference.recover(inference.again(served), InferenceLost("gone again"))
    inference, _ = driver_side(FakeServiceCalls(placed=False))
    with pytest.raises(RunFailure, match=r"not ready within faults\.actor_start_timeout_s=60 s.*run\.inference=actor"):
        inference.start()
