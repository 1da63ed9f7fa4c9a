"""Bearer-token authentication of the control API.

A token is mandatory when the API listens beyond loopback (``serve`` refuses to start
without one there) and enforced whenever one is configured.  Liveness and readiness
stay open so that kubelet probes need no secret; they reveal nothing about tasks.
``POST /v1/shutdown`` is open to loopback peers only: in a pod those are its own
containers, and an agent image cannot be given the token without editing it; stopping
the sidecar fails closed (nothing passes it unrecorded), so the worst a caller can do is
what SIGTERM does.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from sidecar.errors import Unauthorized

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
LOOPBACK_OPEN_PATHS = frozenset({"/v1/shutdown"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer_middleware(token: str) -> Middleware:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not (
            request.path in LOOPBACK_OPEN_PATHS and is_loopback(request.remote or "")
        ):
            presented = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(presented, expected):
                raise Unauthorized("a valid 'Authorization: Bearer <token>' header is required")
        return await handler(request)

    return require_token
