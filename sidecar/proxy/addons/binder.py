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
from sidecar.runtime.kept import keep

METADATA = "sidecar.bind"
TASK_HEADER = "X-Sidecar-Task"
_AUTHORIZATION, _TASK = b"proxy-authorization", TASK_HEADER.lower().encode()
_OURS = frozenset({_AUTHORIZATION, _TASK})


#: Proxy-Authorization values kept decoded: an agent sends the same one on every request
#: (HTTP) or connection (HTTPS).  Bounded like the hosts kept (``proxy/hosts.py``):
#: values this long or shorter, this many, then the memory starts again (~0.5 MiB).
KEPT, KEPT_LENGTH = 1024, 512
_kept: dict[str, tuple[str, str] | None] = {}


def _credentials(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    if value in _kept:
        return _kept[value]
    found = _decoded(value)
    if len(value) <= KEPT_LENGTH:
        keep(_kept, value, found, KEPT)
    return found


def _decoded(value: str) -> tuple[str, str] | None:
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


def _take_ours(headers: http.Headers) -> tuple[str | None, str | None]:
    """Remove ``Proxy-Authorization`` and ``X-Sidecar-Task`` from ``headers``; their
    values as ``headers.get`` gives them (repeated fields joined by ", "), None if absent.

    One pass over the fields, and a rewrite only when one is there: a ``get`` and a
    ``del`` per name scan the fields four times, on every request (~6 us)."""
    found: dict[bytes, list[bytes]] = {}
    kept: list[tuple[bytes, bytes]] = []
    for field in headers.fields:
        lowered = field[0].lower()
        if lowered in _OURS:
            found.setdefault(lowered, []).append(field[1])
        else:
            kept.append(field)
    if not found:
        return None, None
    headers.fields = tuple(kept)

    def joined(name: bytes) -> str | None:
        values = found.get(name)
        return None if values is None else b", ".join(values).decode("utf-8", "surrogateescape")

    return joined(_AUTHORIZATION), joined(_TASK)


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
        authorization, named = _take_ours(flow.request.headers)
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
