"""RFC 9457 problem details as bytes: the one error format of every sidecar surface.

The control API, the HTTP proxy (409 ``stale_generation``, 503 ``store_unavailable``, ...)
and the CLI all describe a refusal the same way; clients branch on ``code``.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.errors import SidecarError

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:effect-sidecar:problem:"


def problem_body(
    status: int, code: str, title: str, detail: str, *, instance: str | None = None, **ext: Any
) -> bytes:
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(ext)
    return json.dumps(body, default=str).encode()


def error_body(error: SidecarError, instance: str | None = None) -> tuple[int, bytes]:
    """The status and problem body for a SidecarError."""
    return error.status, problem_body(
        error.status,
        error.code,
        error.title,
        error.detail,
        instance=instance,
        **error.extensions(),
    )
