"""Free ports chosen now for a service that binds them later (a learner group's rendezvous, the bench's and the
tests' Ray nodes and metrics servers).

They lie below the kernel's ephemeral range: a port chosen there can become the local port of any connection opened
in between (a Ray driver opens many), and its bind then fails. They lie above Ray's worker ports (10002-19999,
`ray start --min-worker-port/--max-worker-port`).
"""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

CHOSEN_PORTS_FROM = 20000


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on this machine, from CHOSEN_PORTS_FROM up to the ephemeral range (held
    together while chosen, so none repeats; the kernel's choice where that range is empty)."""
    span = range(CHOSEN_PORTS_FROM, max(CHOSEN_PORTS_FROM, ephemeral_ports()[0]))
    first = random.SystemRandom().randrange(len(span)) if span else 0  # processes choosing at once start apart
    sockets: list[socket.socket] = []
    try:  # port 0 last: the kernel's choice, once the range is used up
        for port in itertools.chain(span[first:], span[:first], [0] * count):
            if len(sockets) == count:
                break
            s = socket.socket()
            try:
                s.bind(("", port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of connections (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
