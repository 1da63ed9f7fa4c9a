"""One HTTP request as rules see it, normalised once for every producer (the proxy,
probes, ``sidecar rules explain``, tests).

Its own module so that templates render from it without knowing how rules are matched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sidecar.rules.json_text import parse_json

_NOT_PARSED: Any = object()


def rule_host(host: str) -> str:
    """A host as rules see it: lower-case, without an IPv6 address's brackets.  The one
    form for matching a request and for deciding whether to open its TLS (they must
    agree, or a host a rule names could be matched yet never intercepted)."""
    return host.lower().strip("[]")


@dataclass(frozen=True)
class HttpRequestFacts:
    """What the rules may look at in one HTTP request.

    ``host`` is lower-case without port or IPv6 brackets; ``path`` is the path as sent
    (percent-encoded) without the query; ``query`` holds the first (decoded) value of each
    parameter; ``headers`` are keyed by lower-case name.
    """

    method: str
    host: str
    port: int | None
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    _json: Any = field(default=_NOT_PARSED, init=False, repr=False, compare=False)
    _json_finite: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Normalised here so every producer (proxy, tests, probes) compares alike.
        object.__setattr__(self, "method", self.method.upper())
        object.__setattr__(self, "host", rule_host(self.host))
        object.__setattr__(self, "headers", {k.lower(): v for k, v in self.headers.items()})

    def with_body(self, body: bytes | None) -> HttpRequestFacts:
        """These facts with ``body``: the rest is normalised already, so it is not done
        again (``dataclasses.replace`` would, on every matched request)."""
        facts = object.__new__(HttpRequestFacts)
        facts.__dict__.update(self.__dict__, body=body, _json=_NOT_PARSED, _json_finite=False)
        return facts

    @classmethod
    def from_target(
        cls,
        method: str,
        host: str,
        port: int | None,
        target: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> HttpRequestFacts:
        """From a request target as on the request line: ``/path?query``.

        Made for every request to a host with rules, so built normalised here, without
        the frozen constructor's per-field writes and ``__post_init__``'s second pass."""
        path, _, query = target.partition("?")
        first: dict[str, str] = {}
        if query:
            for name, value in parse_qsl(query, keep_blank_values=True):
                first.setdefault(name, value)
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        lowered: dict[str, str] = {}
        for name, value in pairs:
            lowered.setdefault(name.lower(), value)  # the first of repeated headers wins
        facts = object.__new__(cls)
        facts.__dict__.update(
            method=method.upper(),
            host=rule_host(host),
            port=port,
            path=path or "/",
            query=first,
            headers=lowered,
            body=body,
        )  # _json and _json_finite: the class's defaults, as the constructor leaves them
        return facts

    @classmethod
    def from_url(
        cls,
        method: str,
        url: str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
    ) -> HttpRequestFacts:
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return cls.from_target(method, parts.hostname or "", parts.port, target, headers, body)

    def json_body(self) -> Any:
        """The body parsed as JSON, or None when there is none or it is not JSON."""
        if self._json is _NOT_PARSED:
            parsed, finite = _parsed(self.body)
            object.__setattr__(self, "_json", parsed)
            object.__setattr__(self, "_json_finite", finite)
        return self._json

    def json_body_finite(self) -> bool:
        """Whether the parsed body is known to hold no NaN or infinity (False also when
        it is not JSON, or not parsed yet)."""
        return self._json_finite


def _parsed(body: bytes | None) -> tuple[Any, bool]:
    """``body`` parsed as JSON, and whether it is known finite; (None, False) if it is not
    JSON (or there is none)."""
    if not body:
        return None, False
    try:
        return parse_json(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly deep
        return None, False
