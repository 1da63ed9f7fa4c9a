"""Bearer-token authentication of the control API.

A token is mandatory when the API listens beyond loopback (``serve`` refuses to start
without one there) and enforced whenever one is configured.  Liveness and readiness
stay open so that kubelet probes need no secret; they reveal nothing about tasks.
The console's static files (``/`` and ``/ui/...``) are open too: they hold no data, and
the page asks for the token before it calls any route that does.  Every other route
needs the token, ``POST /v1/shutdown`` included, even from loopback: a ``kubectl
port-forward`` or a mesh proxy delivers outside callers from 127.0.0.1.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from sidecar.control.console import is_console_path
from sidecar.errors import Unauthorized

OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def presents(authorization: str, expected: bytes) -> bool:
    """Whether an Authorization header value carries the expected bearer token.

    The scheme is case-insensitive (RFC 9110 §11.1); the token is compared in constant
    time, as bytes: a value that is not UTF-8 (aiohttp keeps its bytes as surrogate
    escapes) is simply not the token, never an error."""
    scheme, _, presented = authorization.strip().partition(" ")
    raw = presented.strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(raw, expected) and scheme.lower() == "bearer"


def bearer_middleware(token: str) -> Middleware:
    expected = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if (
            path not in OPEN_PATHS
            and not is_console_path(path)
            and not presents(request.headers.get("Authorization", ""), expected)
        ):
            raise Unauthorized("a valid 'Authorization: Bearer <token>' header is required")
        return await handler(request)

    return require_token
