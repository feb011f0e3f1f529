"""The same-node transport without Ray: the inference service's coroutines on a loop thread of their own (as in its
Ray actor), actors' clients in this process or in a subprocess. A message that breaks the protocol gets one clear
error either way; a peer's end is seen by the other (the service gone is InferenceLost, an actor gone has its
segment removed), and no segment outlives its run (/dev/shm checked). The served policy's differential tests are in
test_inference.py."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Client, Listener
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch

from dppo.config import ModelConfig
from dppo.distributed.inference import InferenceService
from dppo.rl.agent import export_weights
from dppo.rl.build import build_model
from dppo.rl.policy import InferenceError, InferenceLost, Request
from dppo.rl.spaces import check_spaces
from dppo.transport.client import ShmClient
from dppo.transport.protocol import (
    ERROR,
    HEADER,
    HELLO,
    MAGIC,
    PROTOCOL,
    REPLY,
    WELCOME,
    Endpoint,
    Layout,
    TransportError,
    new_endpoint,
    pack,
    segment_name,
    sweep_stale,
    unpack,
)

SHM = Path("/dev/shm")


class LoopThread:
    """An asyncio loop on its own thread, as a Ray asyncio actor's: the service's coroutines run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@contextmanager
def running_service(obs_space: gym.Space, action_space: gym.Space, config: ModelConfig,
                    versions: dict[int, dict] | None = None, expected: int = 1
                    ) -> Iterator[tuple[InferenceService, Endpoint, LoopThread]]:
    """An inference service holding ``versions`` and listening for shared-memory actors; closed after."""
    loop = LoopThread()
    service = InferenceService(obs_space, action_space, config, "cpu", expected, threads=torch.get_num_threads())
    for version, weights in (versions or {}).items():
        loop.run(service.load(weights, version))
    endpoint = loop.run(service.ready())
    try:
        yield service, endpoint, loop
    finally:
        loop.run(service.close())
        loop.stop()


def segments(endpoint: Endpoint) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"dppo_*_{endpoint.token}_*"))


def wait_until(condition: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def cartpole(seed: int = 0) -> tuple[gym.Env, ModelConfig, dict]:
    env = gym.make("CartPole-v1")
    config = ModelConfig()
    torch.manual_seed(seed)
    return env, config, export_weights(build_model(env.observation_space, env.action_space, config))


def layout_of(env: gym.Env, config: ModelConfig, rows: int) -> Layout:
    return Layout(*check_spaces(env.observation_space, env.action_space, config), config, rows)


def request(env: gym.Env, config: ModelConfig, version: int, rows: int) -> Request:
    obs = np.random.default_rng(rows).normal(size=(rows, 4)).astype(np.float32)
    return Request(version, check_spaces(env.observation_space, env.action_space, config)[0].encode(obs))


def test_requests_of_several_actors_are_answered_in_one_batch_each_with_its_own_rows_and_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One batch whatever the load: the three requests, sent one after another, fill it (``expected``) before its wait
    # ends; with the 2 ms default a loaded CI split them, and a batch of other rows differs in the last bits.
    monkeypatch.setattr("dppo.distributed.inference.BATCH_WAIT_S", 30.0)
    env, config, weights = cartpole()
    other = cartpole(seed=1)[2]
    with running_service(env.observation_space, env.action_space, config, {1: weights, 2: other}, expected=3) as (
            service, endpoint, loop):
        clients = [ShmClient(endpoint, layout_of(env, config, rows=8)) for _ in range(3)]
        assert len(segments(endpoint)) == 3
        asked = [request(env, config, version, rows) for version, rows in ((1, 3), (2, 8), (1, 5))]
        tickets = [client.submit(r) for client, r in zip(clients, asked, strict=True)]
        replies = [client.result(t) for client, t in zip(clients, tickets, strict=True)]
        want = service.passes.forward(asked)
        for reply, expected in zip(replies, want, strict=True):
            assert reply.version == expected.version
            np.testing.assert_array_equal(reply.heads.out, expected.heads.out)
            np.testing.assert_array_equal(reply.heads.values, expected.heads.values)
        assert loop.run(service.stats())["batches"] == 1  # the three actors' requests in one forward pass
        clients[0].close()  # an actor hanging up: its segment goes at once
        assert len(segments(endpoint)) == 2
    assert segments(endpoint) == []  # the service closed: every segment removed


def test_a_malformed_message_or_another_protocol_version_is_answered_with_one_clear_error() -> None:
    env, config, weights = cartpole()
    with running_service(env.observation_space, env.action_space, config, {1: weights}) as (_, endpoint, _loop):
        for message, reason in [
            (b"junk", "malformed message from actor connection 0: 4 bytes, shorter than a header"),
            (HEADER.pack(MAGIC, PROTOCOL + 1, HELLO, 3, 0, 4),
             f"actor connection 1 speaks dppo's shared-memory protocol {PROTOCOL + 1}, this process {PROTOCOL}: "
             "run one dppo version on every node"),
            (pack(HELLO, 3, rows=4) + b"", None),  # well formed: welcomed, then a request for a region it has not
        ]:
            conn = Client(endpoint.address, "AF_UNIX", authkey=endpoint.authkey)
            conn.send_bytes(message)
            if reason is None:
                assert unpack(conn.recv_bytes(), "service")[0] == WELCOME
                conn.send_bytes(pack(REPLY, 7, 1, 2))
                reason = "malformed message from actor connection 2: a reply for region 7 of 3 with 2 rows (at most 4)"
            kind, *_, body = unpack(conn.recv_bytes(), "service")
            assert kind == ERROR and body.decode() == reason
            with pytest.raises(EOFError):  # and the peer let go
                conn.recv_bytes()
        assert wait_until(lambda: segments(endpoint) == [])
        with pytest.raises(InferenceError, match=r"refused a request: KeyError: .*version 9 is not held"):
            client = ShmClient(endpoint, layout_of(env, config, rows=2))
            client.result(client.submit(request(env, config, version=9, rows=2)))


def test_a_silent_connection_is_dropped_and_never_stalls_the_actors_after_it() -> None:
    env, config, weights = cartpole()
    with running_service(env.observation_space, env.action_space, config, {1: weights}) as (service, endpoint, _):
        service.transport.handshake_timeout_s = 1.0
        with socket.socket(socket.AF_UNIX) as silent:
            silent.connect(endpoint.address)  # connects and says nothing
            started = time.monotonic()
            client = ShmClient(endpoint, layout_of(env, config, rows=2))  # served at once, not after the silent one
            client.result(client.submit(request(env, config, version=1, rows=2)))
            assert time.monotonic() - started < 1.0
            silent.settimeout(5)
            while silent.recv(4096):  # the challenge, then the end: the service hung up on it
                pass
            assert time.monotonic() - started >= 1.0
            client.close()


def test_an_actor_gives_up_on_a_service_that_accepts_and_says_nothing() -> None:
    env, config, _ = cartpole()
    endpoint = new_endpoint()
    with socket.socket(socket.AF_UNIX) as mute:
        mute.bind(endpoint.address)
        mute.listen(1)
        with pytest.raises(InferenceLost, match=r"cannot be reached \(it said nothing within 0\.5 s\)"):
            ShmClient(endpoint, layout_of(env, config, rows=2), handshake_timeout_s=0.5)


def test_a_cancelled_request_frees_its_slot_once_its_reply_comes() -> None:
    """Issue 54: a sampler that abandons a segment cancels what it asked; without it, each abandoned segment leaked
    a region and the next one failed with 'more than 3 requests in flight'."""
    env, config, weights = cartpole()
    with running_service(env.observation_space, env.action_space, config, {1: weights}) as (service, endpoint, _):
        client = ShmClient(endpoint, layout_of(env, config, rows=2))
        for _ in range(3):  # three abandoned segments, each with every region in flight
            for region in [client.submit(request(env, config, version=1, rows=2)) for _ in range(3)]:
                client.cancel(region)
        asked = request(env, config, version=1, rows=2)
        reply = client.result(client.submit(asked))
        np.testing.assert_array_equal(reply.heads.values, service.passes.forward([asked])[0].heads.values)
        assert not client.asked and not client.cancelled and len(client.free) == 3
        client.close()


@contextmanager
def scripted_service(answer: Any) -> Iterator[Endpoint]:
    """A service that welcomes one actor and answers its first request with ``answer(conn, region, version, rows)``,
    then hangs up without removing the segment (as a service killed outright)."""
    endpoint = new_endpoint()
    listener = Listener(endpoint.address, "AF_UNIX", authkey=endpoint.authkey)

    def serve() -> None:
        conn = listener.accept()
        _kind, _slots, _version, rows, _ = unpack(conn.recv_bytes(), "actor")
        env, config, _ = cartpole()
        segment = SharedMemory(segment_name(endpoint.token, 0), create=True, size=layout_of(env, config, rows).size)
        conn.send_bytes(pack(WELCOME, body=segment.name.encode()))
        _kind, region, version, rows, _ = unpack(conn.recv_bytes(), "actor")
        answer(conn, region, version, rows)
        conn.close()
        segment.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        thread.join(timeout=10)
        listener.close()


@pytest.mark.parametrize("answer, error, match", [
    (lambda conn, region, version, rows: conn.send_bytes(pack(REPLY, region, version + 1, rows)), TransportError,
     "answered region 0 with weights version 4 and 2 rows, not the 3 and 2 asked for"),
    (lambda conn, region, version, rows: conn.send_bytes(b"dppo"), TransportError,
     "malformed message from the inference service: 4 bytes"),
    (lambda conn, region, version, rows: conn.send_bytes(HEADER.pack(MAGIC, PROTOCOL + 1, REPLY, region, version,
                                                                      rows)),
     TransportError, f"the inference service speaks dppo's shared-memory protocol {PROTOCOL + 1}"),
    (lambda conn, region, version, rows: None, InferenceLost, "closed its connection"),  # the service died
], ids=["wrong version", "short message", "other protocol", "service died"])
def test_an_actor_raises_one_clear_error_for_a_wrong_reply_and_inference_lost_when_the_service_dies(
        answer: Any, error: type, match: str) -> None:
    env, config, _ = cartpole()
    with scripted_service(answer) as endpoint:
        client = ShmClient(endpoint, layout_of(env, config, rows=2))
        ticket = client.submit(request(env, config, version=3, rows=2))
        with pytest.raises(error, match=match):
            client.result(ticket)
        if error is InferenceLost:  # the service is gone: the actor removes the segment it was given
            assert segments(endpoint) == []
        client.close()
    assert segments(endpoint) == []


ACTOR = """
import sys, time
import gymnasium as gym, numpy as np
from dppo.config import ModelConfig
from dppo.transport.client import ShmClient
from dppo.transport.protocol import Endpoint, Layout
from dppo.rl.policy import Request
from dppo.rl.spaces import check_spaces
env, config = gym.make("CartPole-v1"), ModelConfig()
obs_spec, action_spec = check_spaces(env.observation_space, env.action_space, config)
client = ShmClient(Endpoint(sys.argv[1].encode("latin-1").decode("unicode_escape"), bytes.fromhex(sys.argv[2]),
                            sys.argv[3]), Layout(obs_spec, action_spec, config, rows=4))
client.result(client.submit(Request(1, obs_spec.encode(np.zeros((4, 4), np.float32)))))
print("served", flush=True)
time.sleep(600)
"""


def test_an_actor_killed_outright_has_its_segment_removed_by_the_service_which_serves_on() -> None:
    env, config, weights = cartpole()
    with running_service(env.observation_space, env.action_space, config, {1: weights}) as (_, endpoint, _loop):
        address = endpoint.address.encode("unicode_escape").decode("latin-1")
        actor = subprocess.Popen([sys.executable, "-c", ACTOR, address, endpoint.authkey.hex(), endpoint.token],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert actor.stdout.readline().strip() == "served"
            assert len(segments(endpoint)) == 1
            os.kill(actor.pid, signal.SIGKILL)
            actor.wait(timeout=30)
        finally:
            if actor.poll() is None:
                actor.kill()
        assert wait_until(lambda: segments(endpoint) == [])
        client = ShmClient(endpoint, layout_of(env, config, rows=4))  # the service goes on
        assert client.result(client.submit(request(env, config, 1, 4))).version == 1
    assert segments(endpoint) == []


def test_a_segment_whose_service_was_killed_and_not_yet_reaped_is_swept() -> None:
    """A service killed with its node is a zombie until it is reaped: it holds nothing, and a sweep right after the
    kill (a chaos bench stopped by SIGTERM sweeps as its cluster stops) removes its segment."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    stale = SharedMemory(f"dppo_{killed.pid}_feedbeef_0", create=True, size=64)
    try:
        killed.kill()
        deadline = time.monotonic() + 30
        while psutil.Process(killed.pid).status() != psutil.STATUS_ZOMBIE:  # ended, and this test has not reaped it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sweep_stale()  # (a service starting in another test may sweep it first: the same function)
        assert not (SHM / stale.name).exists()
    finally:
        killed.wait()
        stale.close()
        if (SHM / stale.name).exists():
            stale.unlink()


def test_a_segment_whose_service_process_is_gone_is_swept_and_no_other() -> None:
    """A run whose driver was killed outright: Ray ends its service and the service's resource tracker together."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = SharedMemory(f"dppo_{gone.pid}_feedbeef_0", create=True, size=64)
    live = SharedMemory(segment_name("feedbeef", 0), create=True, size=64)
    try:
        assert stale.name in sweep_stale() and not (SHM / stale.name).exists() and (SHM / live.name).exists()
    finally:
        for segment in (stale, live):
            segment.close()
            if (SHM / segment.name).exists():
                segment.unlink()
