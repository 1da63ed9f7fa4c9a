"""``sidecar redirect``: install the transparent-mode redirect (what the init container runs).

Validates the flags, prints the ``iptables-restore`` input it applies (IPv4 ``nat``, then
IPv6 ``filter``), and applies it with ``iptables-restore --noflush`` /
``ip6tables-restore --noflush``: only ``CAP_NET_ADMIN`` and ``CAP_NET_RAW`` are needed.
Running it twice leaves one copy of every rule. See :mod:`sidecar.kube.redirect`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.kube.redirect import (
    CHAIN,
    CHAIN6,
    DEFAULT_OWNER_UID,
    DEFAULT_PG_PORT,
    DEFAULT_PROXY_PORT,
    Redirect,
    RedirectError,
    has_hook,
    ipv6_rules,
    nat_rules,
)

IPV6_PROC = Path("/proc/net/if_inet6")


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "redirect",
        help="install the iptables redirect of transparent mode (the init container)",
        description="Redirect the pod's outbound TCP to the sidecar: HTTP(S) ports (80,443 by "
        "default) to the proxy, PostgreSQL ports (5432) to the PostgreSQL listener, except "
        "loopback and the sidecar's own uid. Prints the rules, then applies them with "
        "iptables-restore --noflush (needs NET_ADMIN and NET_RAW); idempotent. IPv6 "
        "connections on those ports are reset (fail closed) rather than redirected.",
    )
    parser.add_argument(
        "--proxy-port", type=int, default=DEFAULT_PROXY_PORT, metavar="PORT",
        help=f"the sidecar's proxy port (default {DEFAULT_PROXY_PORT})",
    )  # fmt: skip
    parser.add_argument(
        "--pg-port", type=int, default=DEFAULT_PG_PORT, metavar="PORT",
        help=f"the sidecar's PostgreSQL listener port (default {DEFAULT_PG_PORT})",
    )  # fmt: skip
    parser.add_argument(
        "--owner-uid", type=int, default=DEFAULT_OWNER_UID, metavar="UID",
        help=f"the uid the sidecar runs as; its traffic is not redirected (default "
        f"{DEFAULT_OWNER_UID})",
    )  # fmt: skip
    parser.add_argument(
        "--pg-ports", metavar="P,Q",
        help="destination ports sent to the PostgreSQL listener (default 5432; '' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--include-cidrs", metavar="A,B",
        help="redirect only connections to these networks (default: every destination)",
    )  # fmt: skip
    parser.add_argument(
        "--exclude-cidrs", metavar="A,B", help="never redirect connections to these networks"
    )
    parser.add_argument(
        "--include-ports", metavar="P,Q",
        help="destination ports sent to the proxy (default 80,443; '*' for every TCP port)",
    )  # fmt: skip
    parser.add_argument("--exclude-ports", metavar="P,Q", help="destination ports never redirected")
    parser.add_argument("--dry-run", action="store_true", help="print the rules, apply nothing")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        redirect = Redirect.parse(
            proxy_port=args.proxy_port,
            pg_port=args.pg_port,
            owner_uid=args.owner_uid,
            pg_ports=args.pg_ports,
            include_cidrs=args.include_cidrs,
            exclude_cidrs=args.exclude_cidrs,
            include_ports=args.include_ports,
            exclude_ports=args.exclude_ports,
        )
    except RedirectError as error:
        raise ConfigError(f"redirect: {error}") from None
    if args.dry_run:
        print(nat_rules(redirect), end="", flush=True)
        print(ipv6_rules(redirect), end="", flush=True)
        return 0
    nat = nat_rules(redirect, hook=not has_hook(_listing("iptables", "nat"), CHAIN))
    print(nat, end="", flush=True)
    _restore("iptables-restore", nat)
    if not IPV6_PROC.exists():
        print("# IPv6 is not enabled here: no IPv6 rules needed", flush=True)
        return 0
    v6 = ipv6_rules(redirect, hook=not has_hook(_listing("ip6tables", "filter"), CHAIN6))
    print(v6, end="", flush=True)
    _restore("ip6tables-restore", v6)
    return 0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"redirect: {name} is not installed (Debian: apt-get install iptables)")
    return path


def _listing(tool: str, table: str) -> str:
    """The table's OUTPUT chain, ``-S`` style (to see whether our hook is there)."""
    # A fixed program with fixed arguments.
    done = subprocess.run(  # noqa: S603
        [_tool(tool), "-w", "-t", table, "-S", "OUTPUT"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(f"redirect: {tool} -t {table} -S OUTPUT failed: {done.stderr.strip()}")
    return done.stdout


def _restore(tool: str, rules: str) -> None:
    # A fixed program; the rules were built from validated settings.
    done = subprocess.run(  # noqa: S603
        [_tool(tool), "-w", "--noflush"], input=rules, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr, end="")
        raise ConfigError(f"redirect: {tool} --noflush refused the rules (see above)")
