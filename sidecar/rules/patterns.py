"""What a rule's ``match`` section is made of: host patterns and path templates.

Both are parsed once when the rules are loaded; matching a request is then one regular
expression per condition.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from sidecar.rules.templates import PARAM_NAME, TemplateSyntaxError

_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.*]+)\]|(?P<name>[a-z0-9*?._-]+))(?::(?P<port>\d{1,5}))?")


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A case-insensitive glob over the host name, optionally pinned to one port."""

    source: str
    regex: re.Pattern[str]
    port: int | None

    @classmethod
    def parse(cls, source: str) -> HostPattern:
        found = _HOST.fullmatch(source.strip().lower())
        if found is None:
            raise TemplateSyntaxError(
                f"invalid host pattern {source!r}: expected a host name, a glob such as "
                "'*.example.com', optionally with ':PORT'"
            )
        port = int(found["port"]) if found["port"] else None
        if port is not None and not 0 < port < 65536:
            raise TemplateSyntaxError(f"invalid host pattern {source!r}: port out of range")
        host = found["v6"] or found["name"]
        return cls(source, re.compile(fnmatch.translate(host)), port)

    def matches(self, host: str, port: int | None = None) -> bool:
        """Whether ``host`` (lower-case, no brackets) matches; an unknown port matches any."""
        if self.port is not None and port is not None and port != self.port:
            return False
        return self.regex.match(host) is not None


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """``{name}`` takes one non-empty segment, ``{name*}`` one or more; literals match exactly.

    It matches the request path as sent (percent-encoded, without the query), so the
    parameters it captures are in URL form. A trailing slash on the request is tolerated.
    """

    source: str
    params: tuple[str, ...]
    regex: re.Pattern[str]

    @classmethod
    def parse(cls, source: str) -> PathTemplate:
        def bad(why: str) -> TemplateSyntaxError:
            return TemplateSyntaxError(f"invalid path template {source!r}: {why}")

        if not source.startswith("/"):
            raise bad("it must start with '/'")
        if "?" in source or "#" in source:
            raise bad("no query or fragment here (conditions on the query go in match.query)")
        params: list[str] = []
        pieces: list[str] = []
        stars = 0
        body = source.rstrip("/")
        for segment in body.split("/")[1:] if body else []:
            if not segment:
                raise bad("empty segment ('//')")
            if not (segment.startswith("{") and segment.endswith("}")):
                if "{" in segment or "}" in segment:
                    raise bad(f"a parameter must be a whole segment, not {segment!r}")
                pieces.append(re.escape(segment))
                continue
            name = segment[1:-1]
            star = name.endswith("*")
            name = name.removesuffix("*")
            if not PARAM_NAME.fullmatch(name):
                raise bad(f"{segment!r} is not a parameter name (letters, digits, '_')")
            if name in params:
                raise bad(f"parameter {{{name}}} appears twice")
            stars += star
            if stars > 1:
                raise bad("only one {name*} parameter is allowed")
            params.append(name)
            pieces.append(f"(?P<{name}>{'.+?' if star else '[^/]+'})")
        pattern = "^/" + "/".join(pieces) + ("/?$" if pieces else "$")
        return cls(source, tuple(params), re.compile(pattern))

    def match(self, path: str) -> dict[str, str] | None:
        found = self.regex.match(path)
        return None if found is None else found.groupdict()
