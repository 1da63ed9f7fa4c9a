"""``--route HOST=URL``: send traffic for HOST to URL instead.

An unmodified agent keeps calling ``https://api.github.com`` while the sidecar forwards
to, say, a local emulator.  Rules still see the host the agent asked for; only the
connection goes elsewhere (and the Host header names the target, as if the agent had
called the target itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from sidecar.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int

    @property
    def authority(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Routes:
    table: dict[str, Target]

    @classmethod
    def parse(cls, specs: list[str]) -> Routes:
        table: dict[str, Target] = {}
        for spec in specs:
            host, sep, url = spec.partition("=")
            parts = urlsplit(url)
            if not sep or not host or parts.scheme not in {"http", "https"} or not parts.hostname:
                raise ConfigError(f"--route wants HOST=http(s)://TARGET[:PORT], got {spec!r}")
            if parts.path not in {"", "/"}:
                raise ConfigError(f"--route target must not have a path: {spec!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            table[host.lower()] = Target(parts.scheme, parts.hostname, port)
        return cls(table)

    def target(self, host: str) -> Target | None:
        return self.table.get(host.lower())

    def hosts(self) -> list[str]:
        return sorted(self.table)
