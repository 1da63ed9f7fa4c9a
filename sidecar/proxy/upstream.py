"""The sidecar's own HTTP client: forwards recorded effects and runs probes.

Matched effects are not relayed by mitmproxy: the effect guard sends them itself, so it
controls the timeout (bounded by the lease's time left), sees every transport error, and
holds the whole response to record it before the agent gets it.  Bodies are kept
exactly as the upstream sent them (no decompression), and header values are read as
Latin-1, one character a byte, and written back so (:func:`header_text`,
:func:`header_bytes`), so an answer and its replay are byte for byte what the upstream
sent.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from sidecar.errors import ConfigError
from sidecar.proxy.routes import Routes

# Never forwarded: per-connection framing, proxy credentials, and the sidecar's own.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@functools.lru_cache(maxsize=256)
def _origin(scheme: str, host: str, port: int | None) -> URL:
    """``scheme://host:port``, the host encoded as a URL holds it (IDNA, IPv6 brackets);
    kept, as requests go to the same few."""
    return URL.build(scheme=scheme, host=host, port=port)


def header_text(raw: bytes) -> str:
    """A header field as the sidecar keeps it: Latin-1, one character a byte, so any bytes
    an upstream writes can be stored, and written back unchanged by :func:`header_bytes`."""
    return raw.decode("latin-1")


def header_bytes(value: str) -> bytes:
    """A kept header value as it goes on the wire: the bytes :func:`header_text` read (a
    UTF-8 value too, not encoded a second time into mojibake); UTF-8 for a value Latin-1
    cannot hold (typed by a human settling an effect)."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape")


class UpstreamError(Exception):
    """No definitive answer: connection refused or reset, or the timeout passed.

    ``sent`` is False only when the connection was never established (name not resolved,
    refused, TLS handshake or certificate check failed): the request cannot have reached
    the upstream. Anything later - a reset, a timeout - may have come after it did.
    """

    def __init__(self, message: str, *, timeout: bool = False, sent: bool = True) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.sent = sent


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for n, v in self.headers if n.lower() == lower), None)


def forwardable(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [
        (n, v)
        for n, v in headers
        if n.lower() not in _HOP_BY_HOP and not n.lower().startswith("x-sidecar-")
    ]


class Upstream:
    def __init__(self, routes: Routes, *, extra_ca: Path | None = None) -> None:
        self._routes = routes
        self._extra_ca = extra_ca
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # aiohttp's own verified context (made once, when aiohttp is imported: a new one
        # would load the system roots again, 20-30 ms of start-up), unless a CA is added.
        context: ssl.SSLContext | bool = True
        if self._extra_ca is not None:
            context = ssl.create_default_context()
            try:
                context.load_verify_locations(cafile=str(self._extra_ca))
            except (OSError, ssl.SSLError) as error:
                raise ConfigError(
                    f"--upstream-ca: cannot read CA certificates from {self._extra_ca}: {error}"
                ) from error
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=256),
            auto_decompress=False,
            # Send what the agent sent, nothing aiohttp would add on its own.
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL:
        """Where a request for ``scheme://host:port/path?query`` really goes (routes
        applied), its path and query exactly as the agent sent them.

        Not resolved against the origin as a relative reference (RFC 3986 §5.2) would
        be: that reads ``//other.host/x`` as another host, and drops ``..`` and ``.``
        segments, so the sidecar would send somewhere, or something, other than what it
        recorded and what its rule matched.  A proxy passes the target on as it is."""
        target = self._routes.target(host)
        if target is not None:
            scheme, host, port = target.scheme, target.host, target.port
        origin = _origin(scheme, host, port)
        path, _, query = path_and_query.partition("?")
        return URL.build(
            scheme=origin.scheme,
            authority=origin.raw_authority,
            path=path if path.startswith("/") else f"/{path}",
            query_string=query,
            encoded=True,  # as sent: nothing re-quoted, nothing resolved
        )

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply:
        if self._session is None:
            raise UpstreamError("the upstream client is not started")
        try:
            async with self._session.request(
                method,
                url,
                headers=forwardable(headers),
                data=body or None,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as response:
                payload = await response.read()
                return Reply(
                    response.status,
                    tuple((header_text(k), header_text(v)) for k, v in response.raw_headers),
                    payload,
                )
        except TimeoutError as exc:
            raise UpstreamError(
                f"{method} {url}: no answer within {timeout_s:.1f}s", timeout=True
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            # Raised by the connector, before a byte of the request is written (a pooled
            # connection that breaks mid-request raises ServerDisconnectedError instead).
            raise UpstreamError(
                f"{method} {url}: not sent, {type(exc).__name__}: {exc}", sent=False
            ) from exc
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            raise UpstreamError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
