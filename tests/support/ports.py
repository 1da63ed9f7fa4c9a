"""Free ports for the servers the tests start as processes (a sidecar, a PostgreSQL
cluster, an upstream), and for addresses where nothing listens.

They are picked below the kernel's ephemeral range. A port from ``bind(0)`` lies in that
range, so between the pick and the server's own bind any outgoing connection on the
machine (the other test worker makes thousands) may take it as its source port: the
server then cannot listen. That once hung the README's PostgreSQL walkthrough in CI.
Below the range only a listener can hold a port, and the random pick makes two workers
choosing the same one unlikely; the bind check rules out what already listens.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000  # above the well-known and registered ports local services use
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _outside_ephemeral(count: int) -> list[range]:
    """Where ``count`` consecutive ports may start without touching the ephemeral range."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    below = range(_LOWEST, low - count + 1)
    above = range(max(high + 1, _LOWEST), 65536 - count + 1)
    return [window for window in (below, above) if len(window) > 0]


def _all_free(first: int, count: int) -> bool:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for offset, sock in enumerate(sockets):
            sock.bind(("127.0.0.1", first + offset))
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
    return True


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (a sidecar takes PORT, PORT+1, ...)."""
    windows = _outside_ephemeral(count)
    assert windows, "the ephemeral port range covers every port above 20000"
    for _ in range(200):
        first = random.choice(random.choice(windows))
        if _all_free(first, count):
            return first
    raise AssertionError(f"no {count} consecutive free ports outside the ephemeral range")


def free_port() -> int:
    """One free port: for a server to listen on, or an address where nothing listens."""
    return free_ports(1)
