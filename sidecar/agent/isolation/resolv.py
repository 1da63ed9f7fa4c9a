"""Name resolution inside the namespace: its ``/etc/hosts`` and ``/etc/resolv.conf``.

Names only ``--route`` knows (``api.things.test``) resolve nowhere outside; inside, each
gets an address of its own from 198.18.0.0/15 (reserved for benchmarking, never a real
host), so a client that ignores the proxy variables still connects - and is redirected.
exec maps the address back to the name when it asks the proxy for the connection, as a
proxy-honouring client would have named it. Every other name resolves as on the host:
the host's hosts file follows, and DNS goes to exec's relay on the namespace's loopback,
which asks the host's nameservers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path

ROUTED_BASE = ipaddress.IPv4Address("198.18.0.1")
RELAY_ADDRESS = "127.0.0.1"


def routed_addresses(names: Iterable[str]) -> dict[str, str]:
    """``address -> name`` for each routed name, in a stable order."""
    return {str(ROUTED_BASE + index): name for index, name in enumerate(sorted(set(names)))}


def hosts_text(routed: dict[str, str], host_hosts: str) -> str:
    """The namespace's hosts file: the routed names first (the first match wins), then
    the host's own entries."""
    lines = [f"{address} {name}" for address, name in routed.items()]
    return "\n".join([*lines, host_hosts.rstrip("\n")]) + "\n"


def nameservers(resolv_conf: str) -> list[str]:
    """The IPv4 nameservers a resolv.conf names."""
    found = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                if ipaddress.ip_address(fields[1]).version == 4:
                    found.append(fields[1])
            except ValueError:
                continue
    return found


def resolv_text(resolv_conf: str) -> str:
    """The host's resolv.conf with its nameservers replaced by the relay's address."""
    kept = [line for line in resolv_conf.splitlines() if not line.startswith("nameserver")]
    return "\n".join([f"nameserver {RELAY_ADDRESS}", *kept]) + "\n"


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
