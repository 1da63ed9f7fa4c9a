"""What passes between the mitmproxy addon, the effect guard and the upstream client.

Plain values, free of mitmproxy types, so the effect flow is testable without a proxy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from yarl import URL

from sidecar.errors import SidecarError, Unavailable
from sidecar.proxy.upstream import Reply
from sidecar.rules.facts import HttpRequestFacts
from sidecar.runtime.problems import PROBLEM_JSON, error_body

type Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """The agent's request as the guard needs it."""

    facts: HttpRequestFacts
    scheme: str
    target: str  # path and query exactly as sent
    headers: Headers  # as sent, order and case kept

    @property
    def body(self) -> bytes:
        return self.facts.body or b""


# RFC 9110 §5.1: a name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A byte that is not UTF-8, as mitmproxy hands it over (``surrogateescape``): the
# upstream client writes text as UTF-8 and silently leaves such a character out.
_SURROGATES = "\ud800-\udfff"
_NOT_UTF8 = re.compile(f"[{_SURROGATES}]").search
# What a field value cannot hold on its way upstream, in one search per value: a control
# character but HTAB (RFC 9110 §5.5), or a byte that is not UTF-8.
_UNSENDABLE_VALUE = re.compile(f"[\x00-\x08\x0a-\x1f\x7f{_SURROGATES}]").search


def unsendable_header(headers: Headers) -> str | None:
    """Why these header fields cannot be sent upstream as they are, or None.

    mitmproxy accepts some fields an HTTP client library refuses to send (a NUL in a value,
    say) or cannot send as they came (a byte that is not UTF-8, e.g. a Latin-1 value);
    such a request is refused before anything is recorded, instead of failing between
    recording and forwarding, or being forwarded other than it was recorded.
    """
    # All names in one match (each not empty, and together only token characters) and all
    # values in one search (joined by HTAB, which a value may hold), not two per field:
    # fields one by one only if one of those fails, to say which.
    names, values = "".join(n for n, _ in headers), "\t".join(v for _, v in headers)
    if not headers or (
        all(n for n, _ in headers) and _TOKEN.fullmatch(names) and _UNSENDABLE_VALUE(values) is None
    ):
        return None
    for name, value in headers:
        if _TOKEN.fullmatch(name) is None:
            return f"header name {name!r} is not an HTTP token"
        if (bad := _UNSENDABLE_VALUE(value)) is not None:
            if _NOT_UTF8(bad.group()) is not None:
                return f"header {name} has bytes that are not UTF-8 in its value"
            return f"header {name} has a control character in its value"
    return None


def unsendable_target(target: str) -> str | None:
    """Why this request target (path and query) cannot be sent upstream as it came, or
    None: the upstream client would leave its bytes that are not UTF-8 out."""
    if _NOT_UTF8(target) is not None:
        return "the request target has bytes that are not UTF-8"
    return None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the agent gets back; ``disposition`` is the X-Sidecar-Effect value."""

    status: int
    headers: Headers
    body: bytes
    disposition: str


class Sender(Protocol):
    """Where effects and probes are sent (:class:`sidecar.proxy.upstream.Upstream`)."""

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL: ...

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply: ...


def refusal(error: SidecarError) -> Answer:
    """A problem+json answer for a refused effect (nothing was forwarded)."""
    status, body = error_body(error)
    headers: list[tuple[str, str]] = [
        ("Content-Type", PROBLEM_JSON),
        ("X-Sidecar-Effect", "refused"),
    ]
    if isinstance(error, Unavailable) and error.retry_after_s is not None:
        headers.append(("Retry-After", str(max(1, round(error.retry_after_s)))))
    return Answer(status, tuple(headers), body, "refused")
