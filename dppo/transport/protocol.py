"""The protocol of the same-node transport between a sampling actor and the inference service: no Ray call per step.

An actor's requests and the service's replies lie in one shared-memory segment per actor (created by the service
when the actor connects); a 20-byte message on a Unix socket (``multiprocessing.connection``) says which region holds
a request or a reply: Sample Factory's and PufferLib's pattern. A Ray call per env step sent a Breakout batch of
113 KB through the object store and cost 0.46x of the actors' own forward pass on an H100 (issue 42).

Every message is stamped with the protocol and the weights' version; anything else is one :class:`TransportError`.
A lost peer is an end of file (the service gone: :class:`~dppo.rl.policy.InferenceLost` in the actor; an actor gone:
its segment released); a peer that connects and says nothing is dropped after HANDSHAKE_TIMEOUT_S.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import sys
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing import AuthenticationError, resource_tracker
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np
import psutil

from dppo.config import ModelConfig
from dppo.rl.actions import ActionSpec
from dppo.rl.agent import Heads
from dppo.rl.policy import InferenceError, Request
from dppo.rl.spaces import Obs, ObsSpec

PROTOCOL = 1  # raised whenever a message or the segment's layout changes
MAGIC = b"dppo"
HEADER = struct.Struct("<4sHBBqI")  # magic, protocol, kind, region, weights version, rows
HELLO, WELCOME, REQUEST, REPLY, ERROR = 1, 2, 3, 4, 5  # kinds: actor->service, service->actor, ...
KINDS = {HELLO: "hello", WELCOME: "welcome", REQUEST: "request", REPLY: "reply", ERROR: "error"}
REGIONS = 3  # requests an actor has in flight at most: one per half of its envs, and a value query
SEGMENT_PREFIX = "dppo_"  # every segment's name: dppo_<service's pid>_<service token>_<actor's connection>
SHM_DIR = Path("/dev/shm")  # where Linux lists the segments (stale ones are swept from there)
CONNECT_TIMEOUT_S = 60.0  # a service that accepts but never welcomes is lost
HANDSHAKE_TIMEOUT_S = 10.0  # a peer that connects and does not authenticate within it is dropped
ALIGN = 64


class TransportError(InferenceError):
    """A message that breaks the protocol: short, unknown, out of turn, another protocol or weights version."""


@dataclass(frozen=True)
class Endpoint:
    """Where a service listens: a Unix socket's address, the key that admits its actors, its Ray node (only actors
    on that node can share its memory) and the token in its segments' names."""

    address: str
    authkey: bytes
    token: str
    node: str = ""


def new_endpoint(node: str = "") -> Endpoint:
    """A fresh address: in Linux's abstract namespace (nothing on disk to leak), elsewhere a socket file."""
    token = secrets.token_hex(6)
    where = "\0" if sys.platform.startswith("linux") else f"{tempfile.gettempdir()}/"
    return Endpoint(f"{where}dppo-{token}.sock", secrets.token_bytes(16), token, node)


class HandshakeFailed(ConnectionError):
    """The peer did not authenticate: it said nothing within the timeout, hung up, or knew another key."""


def _hang_up(conn: Connection, fired: threading.Event) -> None:
    """Wake a thread blocked reading ``conn``: shut the socket down (closing the descriptor alone would not)."""
    fired.set()
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def authenticate(conn: Connection, authkey: bytes, serving: bool, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """``multiprocessing.connection``'s challenge and response on ``conn`` (both ways, the serving side first), with
    the deadline Python's lacks: a peer silent for ``timeout`` is hung up on. HandshakeFailed when it fails."""
    steps = (deliver_challenge, answer_challenge) if serving else (answer_challenge, deliver_challenge)
    fired = threading.Event()
    timer = threading.Timer(timeout, _hang_up, (conn, fired))
    timer.daemon = True
    timer.start()
    try:
        for step in steps:
            step(conn, authkey)
    except (OSError, EOFError, AuthenticationError) as err:
        timer.cancel()
        raise HandshakeFailed(f"said nothing within {timeout:g} s" if fired.is_set()
                              else f"failed its handshake ({type(err).__name__}: {err})") from None
    timer.cancel()
    if fired.is_set():  # done as the deadline passed: the socket was shut down under it
        raise HandshakeFailed(f"said nothing within {timeout:g} s")


def pack(kind: int, region: int = 0, version: int = 0, rows: int = 0, body: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL, kind, region, version, rows) + body


def unpack(message: bytes, sender: str) -> tuple[int, int, int, int, bytes]:
    """(kind, region, version, rows, body) of a message from ``sender``; TransportError unless well formed."""
    if len(message) < HEADER.size:
        raise TransportError(f"malformed message from {sender}: {len(message)} bytes, shorter than a header")
    magic, protocol, kind, region, version, rows = HEADER.unpack_from(message)
    if magic != MAGIC:
        raise TransportError(f"malformed message from {sender}: it does not start with {MAGIC!r}")
    if protocol != PROTOCOL:
        raise TransportError(f"{sender} speaks dppo's shared-memory protocol {protocol}, this process {PROTOCOL}: "
                             "run one dppo version on every node")
    if kind not in KINDS:
        raise TransportError(f"malformed message from {sender}: unknown kind {kind}")
    return kind, region, version, rows, message[HEADER.size:]


@dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # for a full region: ``rows`` leading, or (2, rows, hidden) for a memory
    offset: int  # bytes from the region's start


class Layout:
    """Where each field of a region lies: a request of up to ``rows`` envs and its reply (the heads); both sides
    compute it from the spaces and the model config."""

    def __init__(self, obs_spec: ObsSpec, action_spec: ActionSpec, config: ModelConfig, rows: int,
                 regions: int = REGIONS) -> None:
        self.rows, self.regions = rows, regions
        hidden = config.lstm_hidden_size if config.recurrent == "lstm" else 0
        wanted = [("image", np.uint8, (rows, *obs_spec.image_shape)) if obs_spec.has_image else None,
                  ("vector", np.float32, (rows, obs_spec.vector_dim)) if obs_spec.has_vector else None,
                  ("memory", np.float32, (2, rows, hidden)) if hidden else None,
                  ("starts", np.bool_, (rows,)) if hidden else None,
                  ("out", np.float64, (rows, action_spec.out_dim)),
                  ("log_std", np.float64, (action_spec.out_dim,)) if action_spec.kind == "gaussian" else None,
                  ("values", np.float32, (rows,)),
                  ("memory_after", np.float32, (2, rows, hidden)) if hidden else None]
        self.fields: dict[str, Field] = {}
        offset = 0
        for name, dtype, shape in filter(None, wanted):
            self.fields[name] = Field(name, np.dtype(dtype), shape, offset)
            offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
        self.region_bytes = offset
        self.size = offset * regions

    def views(self, buf: memoryview, region: int) -> dict[str, np.ndarray]:
        """The fields of ``region`` as arrays over ``buf`` (the segment)."""
        start = region * self.region_bytes
        return {f.name: np.ndarray(f.shape, f.dtype, buf, start + f.offset) for f in self.fields.values()}

    def write_request(self, views: dict[str, np.ndarray], request: Request) -> int:
        rows = len(request.obs)
        for name in ("image", "vector"):
            if name in views:
                views[name][:rows] = getattr(request.obs, name)
        if "memory" in views:
            views["memory"][:, :rows] = request.memory
            views["starts"][:rows] = request.starts
        return rows

    def read_request(self, views: dict[str, np.ndarray], version: int, rows: int) -> Request:
        """A copy, so the actor may write its next request while this one waits for its batch."""
        part = {name: views[name][:rows].copy() if name in views else None for name in ("image", "vector")}
        if "memory" not in views:
            return Request(version, Obs(**part))
        return Request(version, Obs(**part), views["memory"][:, :rows].copy(), views["starts"][:rows].copy())

    def write_reply(self, views: dict[str, np.ndarray], heads: Heads) -> None:
        rows = len(heads.values)
        views["out"][:rows], views["values"][:rows] = heads.out, heads.values
        if "log_std" in views:
            views["log_std"][:] = heads.log_std
        if "memory_after" in views:
            views["memory_after"][:, :rows] = heads.memory

    def read_reply(self, views: dict[str, np.ndarray], rows: int) -> Heads:
        """A copy: the region is free for the next request once read."""
        memory = views["memory_after"][:, :rows].copy() if "memory_after" in views else None
        log_std = views["log_std"].copy() if "log_std" in views else None
        return Heads(views["out"][:rows].copy(), log_std, views["values"][:rows].copy(), memory)


_CREATED: set[str] = set()  # the segments this process created (a service's): its resource tracker holds them


def segment_name(token: str, number: int) -> str:
    """Named for this process (the service), so a segment whose service is gone can be told (:func:`sweep_stale`)."""
    return f"{SEGMENT_PREFIX}{os.getpid()}_{token}_{number}"


def create(name: str, size: int) -> SharedMemory:
    """A new segment, left to this process's resource tracker should the process die before removing it."""
    segment = SharedMemory(name, create=True, size=size)
    _CREATED.add(segment.name)
    return segment


def sweep_stale(directory: Path = SHM_DIR) -> list[str]:
    """Remove the segments whose service process is gone, and say which: a driver killed outright has Ray end the
    service and its resource tracker together, and nothing else would (each service sweeps as it starts)."""
    swept = []
    for path in directory.glob(f"{SEGMENT_PREFIX}*_*_*"):
        pid = path.name[len(SEGMENT_PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not runs(int(pid)):
            path.unlink(missing_ok=True)
            swept.append(path.name)
    return swept


def runs(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (killed, not yet reaped) holds no segment open."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to read: it runs
        return True


def attach(name: str) -> SharedMemory:
    """The service's segment, kept from this process's resource tracker, which would unlink it at the actor's exit
    (python/cpython#82300, before Python 3.13)."""
    if name in _CREATED:  # this process's own (a test serving itself): tracked once, as created
        return SharedMemory(name)
    if sys.version_info >= (3, 13):
        return SharedMemory(name, track=False)
    segment = SharedMemory(name)
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    return segment


def remove(segment: SharedMemory, attached: bool) -> None:
    """Close and unlink ``segment`` (gone already: nothing to do); ``attached``: opened with :func:`attach`."""
    segment.close()
    balance = attached and segment.name not in _CREATED and sys.version_info < (3, 13)
    if balance:  # unlink() unregisters it from this process's tracker, which attach() kept it from: register it
        resource_tracker.register(segment._name, "shared_memory")  # type: ignore[attr-defined]
    try:
        segment.unlink()
    except FileNotFoundError:
        if balance:
            resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    _CREATED.discard(segment.name)
