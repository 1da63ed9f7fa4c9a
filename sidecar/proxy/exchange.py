"""What passes between the mitmproxy addon, the effect guard and the upstream client.

Plain values, free of mitmproxy types, so the effect flow is testable without a proxy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from yarl import URL

from sidecar.errors import SidecarError, Unavailable
from sidecar.problems import PROBLEM_JSON, error_body
from sidecar.proxy.upstream import Reply
from sidecar.rules.matcher import HttpRequestFacts

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
