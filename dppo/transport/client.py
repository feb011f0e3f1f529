"""The actor's side of the same-node transport (:mod:`dppo.transport.protocol`): a Backend of
:class:`~dppo.rl.policy.BackendPolicy` whose requests and replies lie in the service's shared-memory segment for this
actor, announced by small messages on a Unix socket. No Ray."""

from __future__ import annotations

from multiprocessing.connection import Client, Connection
from multiprocessing.shared_memory import SharedMemory

from dppo.rl.policy import InferenceError, InferenceLost, Reply, Request
from dppo.transport import protocol as wire


class ShmClient:
    """An actor's side: regions of its segment hold the requests in flight; a region is the ticket."""

    def __init__(self, endpoint: wire.Endpoint, layout: wire.Layout,
                 handshake_timeout_s: float = wire.HANDSHAKE_TIMEOUT_S) -> None:
        self.endpoint, self.layout = endpoint, layout
        self.conn: Connection | None = None
        self.segment: SharedMemory | None = None
        self.asked: dict[int, tuple[int, int]] = {}  # region -> (version, rows) of the request in it
        self.answered: dict[int, tuple[int, int]] = {}  # replies read while waiting for another region's
        self.cancelled: set[int] = set()  # regions whose reply is not wanted: free once it has come
        try:
            self.conn = Client(endpoint.address, family="AF_UNIX")
            wire.authenticate(self.conn, endpoint.authkey, serving=False, timeout=handshake_timeout_s)
            self.conn.send_bytes(wire.pack(wire.HELLO, layout.regions, rows=layout.rows))
            if not self.conn.poll(wire.CONNECT_TIMEOUT_S):
                raise InferenceLost(f"the inference service did not answer within {wire.CONNECT_TIMEOUT_S:g} s")
            kind, _region, _version, _rows, body = self._receive()
            if kind != wire.WELCOME:
                raise wire.TransportError(f"malformed message from the inference service: a {wire.KINDS[kind]} "
                                          "before welcome")
            self.segment = wire.attach(body.decode())  # gone already (the service went while welcoming): OSError
            if self.segment.size < layout.size:
                raise wire.TransportError(f"the inference service's segment holds {self.segment.size} bytes, this "
                                          f"actor's layout needs {layout.size}: run one dppo version on every node")
        except (OSError, EOFError) as err:  # HandshakeFailed among them
            self.close()
            what = f"it {err}" if isinstance(err, wire.HandshakeFailed) else f"{type(err).__name__}: {err}"
            raise InferenceLost(f"the inference service cannot be reached ({what})") from None
        except InferenceError:
            self.close()
            raise
        self.views = [layout.views(self.segment.buf, region) for region in range(layout.regions)]
        self.free = list(range(layout.regions - 1, -1, -1))

    @property
    def closed(self) -> bool:
        return self.conn is None

    def _receive(self) -> tuple[int, int, int, int, bytes]:
        assert self.conn is not None
        message = wire.unpack(self.conn.recv_bytes(), "the inference service")
        if message[0] == wire.ERROR and message[1] not in self.cancelled:
            raise InferenceError(f"the inference service refused a request: {message[4].decode(errors='replace')}")
        return message

    def submit(self, request: Request) -> int:
        """Write ``request`` into a free region and say so; the region is the ticket (with every region held by
        cancelled requests, their replies are awaited first)."""
        if self.conn is None:
            raise InferenceLost("this actor's connection to the inference service is closed")
        while not self.free and self.cancelled:
            self._read_one()
        if not self.free:
            raise wire.TransportError(f"more than {self.layout.regions} requests in flight to the inference service")
        region = self.free.pop()
        rows = self.layout.write_request(self.views[region], request)
        self.asked[region] = (request.version, rows)
        try:
            self.conn.send_bytes(wire.pack(wire.REQUEST, region, request.version, rows))
        except OSError as err:
            self._lost(err)
        return region

    def result(self, region: int) -> Reply:
        """The reply in ``region``, read once the service says it is there (replies of other regions kept meanwhile)."""
        while region not in self.answered:
            self._read_one()
        version, rows = self.answered.pop(region)
        heads = self.layout.read_reply(self.views[region], rows)
        self._release(region)
        return Reply(version, heads)

    def cancel(self, region: int) -> None:
        """The reply in ``region`` is not wanted: the region is free at once if it came, else when it comes."""
        if region in self.answered:
            del self.answered[region]
            self._release(region)
        elif region in self.asked:
            self.cancelled.add(region)

    def _release(self, region: int) -> None:
        del self.asked[region]
        self.cancelled.discard(region)
        self.free.append(region)

    def _read_one(self) -> None:
        """One message of the service: a reply kept for its region (a cancelled region's freed)."""
        if self.conn is None:
            raise InferenceLost("this actor's connection to the inference service is closed")
        try:
            kind, answered, version, rows, _ = self._receive()
        except (EOFError, OSError) as err:
            self._lost(err)
        if kind not in (wire.REPLY, wire.ERROR) or answered not in self.asked or answered in self.answered:
            raise wire.TransportError(f"malformed message from the inference service: a {wire.KINDS[kind]} for region "
                                      f"{answered}, which has no request waiting")
        if answered in self.cancelled:
            self._release(answered)
            return
        if (version, rows) != self.asked[answered]:
            raise wire.TransportError(f"the inference service answered region {answered} with weights version "
                                      f"{version} and {rows} rows, not the {self.asked[answered][0]} and "
                                      f"{self.asked[answered][1]} asked for")
        self.answered[answered] = (version, rows)

    def _lost(self, err: BaseException) -> None:
        self.close()
        raise InferenceLost(f"the inference service closed its connection ({type(err).__name__})") from None

    def close(self) -> None:
        """Hang up and remove the segment (the service does too when it sees this end; whoever is first)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.segment is not None:
            self.views = []
            wire.remove(self.segment, attached=True)
            self.segment = None
