"""The iptables rules inside an isolated agent's network namespace (pure functions).

The namespace is private to one ``sidecar exec``, so the rules live in the built-in
``OUTPUT`` chains: nothing is shared with other execs or with the host, and they vanish
with the namespace.

* ``nat OUTPUT``: TCP to the HTTP(S) ports (80, 443, as ``sidecar redirect`` does) goes
  to exec's transparent HTTP listener, TCP to PostgreSQL ports to its PostgreSQL
  listener, whatever the destination - loopback included, so ``127.0.0.1:5432`` reaches
  the relay too; the loopback ports exec mirrors (the sidecar's own) are left alone;
  every other TCP to a non-loopback address is redirected to a loopback port where
  nothing listens (:data:`REFUSED_PORT`), which refuses it at once. (A ``filter``
  ``REJECT --reject-with tcp-reset`` would be the textbook way, and is kept below, but
  gVisor's netstack drops the packet instead of resetting the local socket, so the
  client would hang until its timeout; a redirect to a closed port fails fast on both.)
* ``filter OUTPUT``: loopback traffic (and the replies of exec's listeners, which leave
  from 127.0.0.1 towards the namespace's veth address) passes, every other packet is
  rejected (UDP, ICMP, TCP that escaped the nat rules).
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.kube.redirect import DEFAULT_HTTP_PORTS, DEFAULT_PG_PORTS

REFUSED_PORT = 1  # tcpmux: nothing listens on it in a fresh namespace
LOOPBACK = "127.0.0.0/8"

__all__ = ["DEFAULT_HTTP_PORTS", "DEFAULT_PG_PORTS", "REFUSED_PORT", "namespace_rules"]


def namespace_rules(
    *,
    http_port: int,
    pg_port: int | None,
    http_ports: Iterable[int] = DEFAULT_HTTP_PORTS,
    pg_ports: Iterable[int] = DEFAULT_PG_PORTS,
    mirrored: Iterable[int] = (),
) -> str:
    """``iptables-restore`` input for the namespace (``nat`` and ``filter``)."""
    lines = ["*nat", ":OUTPUT ACCEPT [0:0]"]
    lines += [
        f"-A OUTPUT -p tcp -d {LOOPBACK} --dport {port} -j RETURN" for port in sorted(set(mirrored))
    ]
    if pg_port is not None:
        lines += [
            f"-A OUTPUT -p tcp --dport {port} -j REDIRECT --to-ports {pg_port}"
            for port in dict.fromkeys(pg_ports)
        ]
    lines += [
        f"-A OUTPUT -p tcp --dport {port} -j REDIRECT --to-ports {http_port}"
        for port in dict.fromkeys(http_ports)
    ]
    lines += [
        f"-A OUTPUT -p tcp ! -d {LOOPBACK} -j REDIRECT --to-ports {REFUSED_PORT}",
        "COMMIT",
        "*filter",
        ":OUTPUT ACCEPT [0:0]",
        f"-A OUTPUT -d {LOOPBACK} -j ACCEPT",
        f"-A OUTPUT -s {LOOPBACK} -j ACCEPT",
        "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
        "-A OUTPUT -j REJECT",
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"
