"""The inference service's side of the same-node transport (:mod:`dppo.transport.protocol`): one shared-memory
segment per connected actor, its requests read into the service's batches and the replies written back. Each
connection is a reader of the service's asyncio loop, so several actors' requests (and Ray calls from other nodes)
meet in one forward pass; each is authenticated on a thread of its own, so a silent peer never stalls the loop.
Segments are removed by whoever sees the end first (a killed service's by its resource tracker). No Ray here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from itertools import count
from multiprocessing.connection import Connection, Listener
from multiprocessing.shared_memory import SharedMemory

from dppo.errors import first_line
from dppo.rl.policy import Reply, Request
from dppo.transport import protocol as wire

MAX_REGIONS = 255  # a region is one byte of the header
BACKLOG = 256  # actors connecting at once (a run's start)
WAKE_TIMEOUT_S = 1.0  # the most a closing service waits to reach its own listener

Answer = Callable[[Reply | Exception], None]
log = logging.getLogger(__name__)


class Peer:
    """One connected actor: its connection, and once it said hello its layout, segment and regions."""

    def __init__(self, conn: Connection, number: int) -> None:
        self.conn: Connection | None = conn
        self.number = number
        self.layout: wire.Layout | None = None
        self.segment: SharedMemory | None = None
        self.views: list = []

    def welcome(self, layout: wire.Layout, token: str) -> None:
        """Its segment, created now, named for the service and this connection, and the welcome naming it."""
        self.layout = layout
        self.segment = wire.create(wire.segment_name(token, self.number), layout.size)
        self.views = [layout.views(self.segment.buf, region) for region in range(layout.regions)]
        assert self.conn is not None
        self.conn.send_bytes(wire.pack(wire.WELCOME, body=self.segment.name.lstrip("/").encode()))


class ShmServer:
    """Serves actors on this node: ``layout(rows, regions)`` sizes an actor's segment; ``enqueue(request, answer)``
    hands a request to the service's batches, which ``answer`` it with its reply or the error that stopped it."""

    def __init__(self, layout: Callable[[int, int], wire.Layout], enqueue: Callable[[Request, Answer], None],
                 handshake_timeout_s: float = wire.HANDSHAKE_TIMEOUT_S) -> None:
        self.layout, self.enqueue, self.handshake_timeout_s = layout, enqueue, handshake_timeout_s
        self.peers: dict[int, Peer] = {}
        self.numbers = count()
        self.endpoint: wire.Endpoint | None = None
        self.listener: Listener | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accepting: threading.Thread | None = None
        self.closing = False

    def open(self, loop: asyncio.AbstractEventLoop, node: str) -> wire.Endpoint:
        """Listen (once) on a fresh address; actors' connections join ``loop``."""
        if self.endpoint is None:
            wire.sweep_stale()  # a killed run's, on this node
            endpoint = wire.new_endpoint(node)
            self.listener = Listener(endpoint.address, "AF_UNIX", backlog=BACKLOG)  # authenticated per connection
            self.loop, self.endpoint = loop, endpoint
            self.accepting = threading.Thread(target=self._accept, name="dppo-shm-accept", daemon=True)
            self.accepting.start()
        return self.endpoint

    def _accept(self) -> None:
        assert self.listener is not None and self.loop is not None
        while not self.closing:
            try:
                conn = self.listener.accept()
            except (EOFError, ConnectionError):
                continue  # an actor gone while connecting
            except OSError:
                return
            # the closing service's own wake-up too: its handshake fails at once, and _join turns any other away
            threading.Thread(target=self._admit, args=(conn,), name="dppo-shm-handshake", daemon=True).start()

    def _admit(self, conn: Connection) -> None:
        """Authenticate one connection (a silent or foreign peer dropped, with one line), then serve it."""
        assert self.endpoint is not None and self.loop is not None
        try:
            wire.authenticate(conn, self.endpoint.authkey, serving=True, timeout=self.handshake_timeout_s)
        except wire.HandshakeFailed as err:
            conn.close()
            if not self.closing:
                log.warning("dppo inference service: dropped a connection that %s", err)
            return
        try:
            self.loop.call_soon_threadsafe(self._join, conn)
        except RuntimeError:  # the service's loop has closed
            conn.close()

    def _join(self, conn: Connection) -> None:
        if self.closing:  # accepted as the service closed
            conn.close()
            return
        peer = Peer(conn, next(self.numbers))
        self.peers[peer.number] = peer
        assert self.loop is not None
        self.loop.add_reader(conn.fileno(), self._readable, peer)

    def _readable(self, peer: Peer) -> None:
        """One message of ``peer``: its hello, or a request into the batches; its end, or a message that breaks the
        protocol (answered with the reason), lets it go."""
        assert peer.conn is not None
        try:
            message = peer.conn.recv_bytes()
        except (EOFError, OSError):
            self.drop(peer)
            return
        try:
            kind, region, version, rows, _ = wire.unpack(message, f"actor connection {peer.number}")
            if peer.layout is None:
                self._hello(peer, kind, region, rows)
                return
            if kind != wire.REQUEST or region >= peer.layout.regions or not 0 < rows <= peer.layout.rows:
                raise wire.TransportError(f"malformed message from actor connection {peer.number}: a "
                                          f"{wire.KINDS[kind]} for region {region} of {peer.layout.regions} with "
                                          f"{rows} rows (at most {peer.layout.rows})")
        except wire.TransportError as err:
            self._refuse(peer, str(err))
            return
        request = peer.layout.read_request(peer.views[region], version, rows)
        self.enqueue(request, lambda answer: self._answer(peer, region, answer))

    def _hello(self, peer: Peer, kind: int, regions: int, rows: int) -> None:
        if kind != wire.HELLO or not 0 < regions <= MAX_REGIONS or rows <= 0:
            raise wire.TransportError(f"malformed message from actor connection {peer.number}: a "
                                      f"{wire.KINDS[kind]} with {regions} regions and {rows} rows before its hello")
        assert self.endpoint is not None
        try:
            peer.welcome(self.layout(rows, regions), self.endpoint.token)
        except OSError:
            self.drop(peer)

    def _answer(self, peer: Peer, region: int, answer: Reply | Exception) -> None:
        if peer.conn is None or peer.layout is None:  # gone while its request waited
            return
        try:
            if isinstance(answer, Exception):
                reason = f"{type(answer).__name__}: {first_line(answer)}"
                peer.conn.send_bytes(wire.pack(wire.ERROR, region, body=reason.encode()))
            else:
                peer.layout.write_reply(peer.views[region], answer.heads)
                peer.conn.send_bytes(wire.pack(wire.REPLY, region, answer.version, len(answer.heads.values)))
        except OSError:
            self.drop(peer)

    def _refuse(self, peer: Peer, reason: str) -> None:
        with contextlib.suppress(OSError):
            assert peer.conn is not None
            peer.conn.send_bytes(wire.pack(wire.ERROR, body=reason.encode()))
        self.drop(peer)

    def drop(self, peer: Peer) -> None:
        """Let ``peer`` go: its connection closed and its segment removed."""
        self.peers.pop(peer.number, None)
        if peer.conn is not None:
            assert self.loop is not None
            self.loop.remove_reader(peer.conn.fileno())
            peer.conn.close()
            peer.conn = None
        if peer.segment is not None:
            peer.views = []
            wire.remove(peer.segment, attached=False)
            peer.segment = None

    def close(self) -> None:
        """Every peer let go, no new ones (the end of a run: the service's segments go before its process)."""
        for peer in list(self.peers.values()):
            self.drop(peer)
        if self.listener is None or self.endpoint is None:
            return
        self.closing = True
        # Wakes the accepting thread with a bare connection: its handshake fails at once, and nothing here waits on
        # it (a multiprocessing Client would wait for a handshake with no timeout, forever if that thread had ended).
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as wake:
            wake.settimeout(WAKE_TIMEOUT_S)
            wake.connect(self.endpoint.address)
        if self.accepting is not None:
            self.accepting.join(timeout=5)
        self.listener.close()
        self.listener = None
