"""RFC 9457 problem+json answers, and the middleware that turns every error into one.

Clients branch on the ``code`` member, which is stable (``lease_held``,
``stale_generation``, ``not_found``, ``invalid_request``, ``store_unavailable``,
``unauthorized``, ...); ``title``/``detail`` are for humans.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from sidecar.errors import SidecarError, Unavailable
from sidecar.runtime.problems import PROBLEM_JSON, error_body, problem_body

log = logging.getLogger("sidecar.control")

# aiohttp's own HTTP errors (routing, body size) mapped to our stable codes.
_HTTP_CODES = {
    400: ("invalid_request", "Invalid request"),
    401: ("unauthorized", "Unauthorized"),
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    413: ("payload_too_large", "Payload too large"),
}


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> web.Response:
    body = problem_body(status, code, title, detail, instance=instance, **extensions)
    return web.Response(status=status, body=body, content_type=PROBLEM_JSON, headers=headers)


def from_error(error: SidecarError, instance: str | None = None) -> web.Response:
    status, body = error_body(error, instance)
    headers: dict[str, str] = {}
    if error.code == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(error, Unavailable) and error.retry_after_s is not None:
        # HTTP clients and orchestrators read the header, not the body's member.
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return web.Response(status=status, body=body, content_type=PROBLEM_JSON, headers=headers)


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SidecarError as error:
        return from_error(error, request.path)
    except web.HTTPException as http:
        if http.status < 400:
            raise
        code, title = _HTTP_CODES.get(http.status, ("http_error", http.reason))
        headers = {"Allow": http.headers["Allow"]} if "Allow" in http.headers else None
        return problem(
            http.status,
            code,
            title,
            http.text or http.reason,
            instance=request.path,
            headers=headers,
        )
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem(
            500,
            "internal",
            "Internal error",
            "the sidecar failed; see its log",
            instance=request.path,
        )
