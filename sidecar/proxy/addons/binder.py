"""Reading a request's task binding from the sidecar's own credentials and headers.

``sidecar exec`` points the agent at ``http://TASK:ATTEMPT_ID@sidecar:port``; clients send
that as ``Proxy-Authorization: Basic`` on CONNECT (HTTPS) or on each request (HTTP).
It is remembered per client connection, and removed, like ``X-Sidecar-Task``, before
anything is forwarded.  What it names is resolved later, by the effect addon.
"""

from __future__ import annotations

import base64
import binascii

from mitmproxy import connection, http

from sidecar.recording.bindings import BindRequest

METADATA = "sidecar.bind"
TASK_HEADER = "X-Sidecar-Task"


def _credentials(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


class TaskBinder:
    def __init__(self, default_task: str | None) -> None:
        self.default_task = default_task
        self._by_connection: dict[str, tuple[str, str]] = {}

    def http_connect(self, flow: http.HTTPFlow) -> None:
        creds = _credentials(flow.request.headers.get("Proxy-Authorization"))
        if creds is not None:
            self._by_connection[flow.client_conn.id] = creds

    def client_disconnected(self, client: connection.Client) -> None:
        self._by_connection.pop(client.id, None)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        headers = flow.request.headers
        authorization = headers.get("Proxy-Authorization")
        named = headers.get(TASK_HEADER)
        # Removed only when present: a generic pop scans the header fields twice more.
        if authorization is not None:
            del headers["Proxy-Authorization"]
        if named is not None:
            del headers[TASK_HEADER]
        creds = _credentials(authorization) or self._by_connection.get(flow.client_conn.id)
        if creds is not None:
            bind = BindRequest(creds[0], creds[1], "credentials")
        elif named:
            bind = BindRequest(named.strip(), None, "header")
        elif self.default_task:
            bind = BindRequest(self.default_task, None, "default")
        else:
            bind = BindRequest(None, None, "none")
        flow.metadata[METADATA] = bind
