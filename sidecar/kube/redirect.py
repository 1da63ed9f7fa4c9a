"""The transparent-mode redirect: the iptables rules an init container installs in a pod.

Pure functions: :func:`nat_rules` builds ``iptables-restore --noflush`` input for the
``nat`` table from a :class:`Redirect`; :func:`ipv6_rules` the IPv6 counterpart;
``sidecar redirect`` validates its flags into a :class:`Redirect` and applies the text.

What is redirected, and why:

* only TCP leaving the pod through ``OUTPUT`` (the agent's own connections); the pod's
  inbound traffic and UDP (DNS) are not touched;
* never the sidecar's own connections (``-m owner --uid-owner UID``, 1337 by default): it
  forwards to the real servers itself, and redirecting those would loop them back into it;
* never loopback (``-o lo``, ``127.0.0.0/8``): the agent may call the sidecar (control
  API, PostgreSQL listener) or other containers of the pod directly;
* PostgreSQL destination ports (5432 by default) to the sidecar's PostgreSQL listener;
* HTTP(S) ports to the proxy: **80 and 443 by default**, not every TCP port. mitmproxy
  reads the original destination (``SO_ORIGINAL_DST``) and the TLS SNI / Host header, so
  HTTP and HTTPS need nothing else; other protocols (SSH, SMTP, MySQL, Redis, ...) would
  only be relayed as raw bytes, at a cost and with the risk of stalling protocols where
  the server speaks first, and no rule can match them anyway. ``--include-ports '*'``
  redirects every TCP port (minus the excluded ones and the PostgreSQL ports) for
  agents that call HTTP APIs on other ports;
* ``--exclude-cidrs`` / ``--exclude-ports`` always win; ``--include-cidrs``, if given,
  restricts redirection to those destinations.

The rules live in two chains of their own, ``EFFECT_SIDECAR_OUTPUT`` (exclusions, hooked
from ``OUTPUT``) and ``EFFECT_SIDECAR_REDIRECT`` (the redirects); both are declared and
flushed on every run, and the ``OUTPUT`` hook is only added when it is not there yet
(``hook=False``), so running the init container twice leaves one copy of everything.

IPv6: the proxy and the PostgreSQL listener listen on IPv4 loopback, so IPv6 traffic is
not redirected; instead :func:`ipv6_rules` makes it fail closed: connections on the
redirected ports are refused with a TCP reset (``filter`` table), so a dual-stack client
falls back to IPv4 (through the sidecar) instead of escaping it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CHAIN = "EFFECT_SIDECAR_OUTPUT"
REDIRECT_CHAIN = "EFFECT_SIDECAR_REDIRECT"
CHAIN6 = "EFFECT_SIDECAR_OUTPUT6"
DEFAULT_PROXY_PORT = 7301
DEFAULT_PG_PORT = 7302
DEFAULT_OWNER_UID = 1337
DEFAULT_PG_PORTS = (5432,)
DEFAULT_HTTP_PORTS = (80, 443)
ALL_PORTS = "*"
MAX_UID = 2**32 - 2  # (uid_t) -1 means "no uid"

type Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class RedirectError(ValueError):
    """A redirect setting that cannot be turned into rules; the message says which."""


@dataclass(frozen=True, slots=True)
class Redirect:
    """What to redirect where. Build it with :meth:`parse` (validates) or directly."""

    proxy_port: int = DEFAULT_PROXY_PORT
    pg_port: int = DEFAULT_PG_PORT
    owner_uid: int = DEFAULT_OWNER_UID
    pg_ports: tuple[int, ...] = DEFAULT_PG_PORTS
    #: ports sent to the proxy; empty means every TCP port (``*``)
    include_ports: tuple[int, ...] = DEFAULT_HTTP_PORTS
    exclude_ports: tuple[int, ...] = ()
    include_cidrs: tuple[Network, ...] = ()
    exclude_cidrs: tuple[Network, ...] = ()

    @classmethod
    def parse(
        cls,
        *,
        proxy_port: int = DEFAULT_PROXY_PORT,
        pg_port: int = DEFAULT_PG_PORT,
        owner_uid: int = DEFAULT_OWNER_UID,
        pg_ports: str | None = None,
        include_cidrs: str | None = None,
        exclude_cidrs: str | None = None,
        include_ports: str | None = None,
        exclude_ports: str | None = None,
    ) -> Redirect:
        """Validate comma-separated flag values (``None``: the default)."""
        _port("--proxy-port", proxy_port)
        _port("--pg-port", pg_port)
        if proxy_port == pg_port:
            raise RedirectError(
                f"--proxy-port and --pg-port are both {proxy_port}: they must differ"
            )
        if not 0 < owner_uid <= MAX_UID:
            raise RedirectError(
                f"--owner-uid {owner_uid}: give the sidecar's own non-root uid (1..{MAX_UID});"
                " uid 0 would exempt every root process of the pod from the redirect"
            )
        pgs = DEFAULT_PG_PORTS if pg_ports is None else _ports("--pg-ports", pg_ports)
        if include_ports is not None and include_ports.strip() == ALL_PORTS:
            http: tuple[int, ...] = ()
        elif include_ports is None:
            http = DEFAULT_HTTP_PORTS
        else:
            http = _ports("--include-ports", include_ports)
            if not http:
                raise RedirectError("--include-ports is empty: give ports, or '*' for all TCP")
        both = sorted(set(pgs) & set(http))
        if both:
            raise RedirectError(
                f"port(s) {','.join(map(str, both))} in both --pg-ports and --include-ports: "
                "a port goes either to the PostgreSQL listener or to the proxy"
            )
        return cls(
            proxy_port=proxy_port,
            pg_port=pg_port,
            owner_uid=owner_uid,
            pg_ports=pgs,
            include_ports=http,
            exclude_ports=_ports("--exclude-ports", exclude_ports or ""),
            include_cidrs=_cidrs("--include-cidrs", include_cidrs or ""),
            exclude_cidrs=_cidrs("--exclude-cidrs", exclude_cidrs or ""),
        )


def _port(flag: str, value: int) -> int:
    if not 0 < value < 65536:
        raise RedirectError(f"{flag}: {value} is not a TCP port (1-65535)")
    return value


def _ports(flag: str, text: str) -> tuple[int, ...]:
    found: list[int] = []
    for item in _items(text):
        if not item.isdigit():
            raise RedirectError(f"{flag}: {item!r} is not a port number")
        port = _port(flag, int(item))
        if port not in found:
            found.append(port)
    return tuple(found)


def _cidrs(flag: str, text: str) -> tuple[Network, ...]:
    found: list[Network] = []
    for item in _items(text):
        try:
            network = ipaddress.ip_network(item, strict=False)
        except ValueError as error:
            raise RedirectError(f"{flag}: {item!r} is not an address or CIDR ({error})") from None
        if network not in found:
            found.append(network)
    return tuple(found)


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _v4(networks: Iterable[Network]) -> list[ipaddress.IPv4Network]:
    return [n for n in networks if isinstance(n, ipaddress.IPv4Network)]


def _v6(networks: Iterable[Network]) -> list[ipaddress.IPv6Network]:
    return [n for n in networks if isinstance(n, ipaddress.IPv6Network)]


def hook_rule(chain: str = CHAIN) -> str:
    """The ``OUTPUT`` rule that sends the pod's TCP through ``chain``."""
    return f"-A OUTPUT -p tcp -j {chain}"


def has_hook(listing: str, chain: str = CHAIN) -> bool:
    """Whether ``iptables -t TABLE -S OUTPUT`` output already holds the hook."""
    return any(line.split() == hook_rule(chain).split() for line in listing.splitlines())


def _exclusions(redirect: Redirect, chain: str, networks: Sequence[Network]) -> list[str]:
    rules = [
        f"-A {chain} -o lo -j RETURN",
        f"-A {chain} -m owner --uid-owner {redirect.owner_uid} -j RETURN",
    ]
    rules += [f"-A {chain} -d {network} -j RETURN" for network in networks]
    rules += [f"-A {chain} -p tcp --dport {port} -j RETURN" for port in redirect.exclude_ports]
    return rules


def _restore_input(lines: list[str], hook: str | None) -> str:
    """``lines`` as one table's restore input: the ``OUTPUT`` rule into chain ``hook``
    (if given) after them, then ``COMMIT``."""
    tail = [hook_rule(hook)] if hook is not None else []
    return "\n".join([*lines, *tail, "COMMIT"]) + "\n"


def nat_rules(redirect: Redirect, *, hook: bool = True) -> str:
    """``iptables-restore --noflush`` input for the ``nat`` table (IPv4)."""
    lines = [
        "*nat",
        f":{CHAIN} - [0:0]",
        f":{REDIRECT_CHAIN} - [0:0]",
        f"-F {CHAIN}",
        f"-F {REDIRECT_CHAIN}",
    ]
    lines += _exclusions(redirect, CHAIN, [ipaddress.IPv4Network("127.0.0.0/8")])
    lines += [f"-A {CHAIN} -d {n} -j RETURN" for n in _v4(redirect.exclude_cidrs)]
    if redirect.include_cidrs:
        lines += [f"-A {CHAIN} -d {n} -j {REDIRECT_CHAIN}" for n in _v4(redirect.include_cidrs)]
    else:
        lines.append(f"-A {CHAIN} -j {REDIRECT_CHAIN}")
    lines += [
        f"-A {REDIRECT_CHAIN} -p tcp --dport {port} -j REDIRECT --to-ports {redirect.pg_port}"
        for port in redirect.pg_ports
    ]
    if redirect.include_ports:
        lines += [
            f"-A {REDIRECT_CHAIN} -p tcp --dport {port} -j REDIRECT --to-ports "
            f"{redirect.proxy_port}"
            for port in redirect.include_ports
        ]
    else:
        lines.append(f"-A {REDIRECT_CHAIN} -p tcp -j REDIRECT --to-ports {redirect.proxy_port}")
    return _restore_input(lines, CHAIN if hook else None)


def ipv6_rules(redirect: Redirect, *, hook: bool = True) -> str:
    """``ip6tables-restore --noflush`` input for the ``filter`` table: IPv6 connections
    that IPv4 would redirect are reset instead (fail closed, see the module notes)."""
    lines = ["*filter", f":{CHAIN6} - [0:0]", f"-F {CHAIN6}"]
    lines += _exclusions(redirect, CHAIN6, [ipaddress.IPv6Network("::1/128")])
    lines += [f"-A {CHAIN6} -d {n} -j RETURN" for n in _v6(redirect.exclude_cidrs)]
    reset = "-j REJECT --reject-with tcp-reset"
    ports = [*redirect.pg_ports, *redirect.include_ports] if redirect.include_ports else []
    v6_included = [str(n) for n in _v6(redirect.include_cidrs)]
    targets: list[str | None] = list(v6_included) if redirect.include_cidrs else [None]
    for target in targets:
        where = f" -d {target}" if target else ""
        if ports:
            lines += [f"-A {CHAIN6}{where} -p tcp --dport {port} {reset}" for port in ports]
        else:
            lines.append(f"-A {CHAIN6}{where} -p tcp {reset}")
    return _restore_input(lines, CHAIN6 if hook else None)
