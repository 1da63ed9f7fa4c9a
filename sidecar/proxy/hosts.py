"""The host a request is for, as the rules, routes and inventory name it.

mitmproxy's ``Request.pretty_host`` (the Host header or HTTP/2 authority when there is
one, else the connection's host) parses the authority with a regular expression and
checks the host on every access, and three of the sidecar's addons ask it for every
request.  Agents send the same few Host headers again and again, so the parse is kept
per header value: a dictionary look-up instead of ~6 us of parsing per access.
"""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.net.http import url

from sidecar.runtime.kept import keep

#: Host header values kept parsed; an agent talks to a handful of hosts, and a flood of
#: made-up ones only starts the memory again.
KEPT = 1024
#: Longer values are parsed every time, not kept: the most a name and a port can take
#: (253 + 1 + 5, and brackets), so what is kept stays within ~0.7 MiB.
KEPT_LENGTH = 261

_kept: dict[str, str] = {}


def request_host(request: http.Request) -> str:
    """``request.pretty_host``, the same string, from a parse kept per Host header."""
    authority = _host_header(request)
    if not authority:
        return request.host
    host = _kept.get(authority)
    if host is None:
        host = url.parse_authority(authority, check=False)[0]
        if len(authority) <= KEPT_LENGTH:
            keep(_kept, authority, host, KEPT)
    return host


_MULTIPLEXED = frozenset({b"HTTP/2.0", b"HTTP/3"})


def _host_header(request: http.Request) -> str | None:
    """``request.host_header``, the same string, in one pass over the header fields
    (mitmproxy's goes through two layers of calls per field, ~4 us a request)."""
    data = request.data
    if data.http_version in _MULTIPLEXED and data.authority:
        return request.authority
    values = [value for name, value in data.headers.fields if name.lower() == b"host"]
    # Repeated fields are folded into one, as Headers.get folds them.
    return b", ".join(values).decode("utf-8", "surrogateescape") if values else None
