"""Answering a request before its body is read, and cutting a body off at its limit.

mitmproxy reads a request's whole body into memory before it sends a response an addon
set in ``requestheaders``, and its only body limit (``body_size_limit``) is one number
for every flow, checked before any addon has seen the request.  Ours depends on the
request: a recorded effect's body is bounded by its rule's ``max_body_bytes`` (it is
buffered for the key and the log), an unmatched one streams whatever its size.  So an
8 GiB upload declared on an effect route would be read whole before its 413 (SPEC §7:
"refused before it costs anything").

This module adds the two missing steps to mitmproxy's HTTP stream state machine
(``HttpStream``), keyed on flow metadata only our addons set, so every other flow runs
mitmproxy's code unchanged:

* :func:`answer_before_body` - the answer set in ``requestheaders`` goes out at once,
  without waiting for the body (and without ``100 Continue``); what still arrives of
  the body is dropped, within :data:`DRAIN_BYTES` and :data:`DRAIN_S`, then the
  connection is closed (HTTP/1: the rest must not be parsed as a next request) or the
  stream reset (HTTP/2);
* :func:`limit_body` - a buffered body (chunked, or with a length the client lied
  about) is cut off when it passes the limit: the buffer is dropped and the refusal
  from the given factory is answered the same way.

mitmproxy is pinned to one release (pyproject.toml) because this reaches into it; the
proxy tests that send oversized bodies fail loudly if an upgrade changes the machine.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers.http import HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    ResponseEndOfMessage,
    ResponseProtocolError,
)

# After an early answer, the body that still arrives is read and dropped - a client that
# writes its whole body before reading (requests, httpx, most SDKs) then reads the 413
# instead of hanging on a full socket - but at most this much, for at most this long;
# past either, the connection (HTTP/1) or the stream (HTTP/2) is cut.
DRAIN_BYTES = 64 << 20
DRAIN_S = 10.0

_ANSWERED = "sidecar.answered_before_body"
_LIMIT = "sidecar.body_limit"


@dataclass(frozen=True)
class BodyLimit:
    """At most ``max_bytes`` of body; past that, ``refusal(bytes_seen)`` is the answer."""

    max_bytes: int
    refusal: Callable[[int], http.Response]


def answer_before_body(flow: http.HTTPFlow, response: http.Response) -> None:
    """Answer ``flow`` with ``response`` now (from ``requestheaders``) and never read its body."""
    flow.response = response
    flow.metadata[_ANSWERED] = True
    # A client waiting for "100 Continue" gets the answer instead (RFC 9110 §10.1.1).
    flow.request.headers.pop("expect", None)


def limit_body(flow: http.HTTPFlow, limit: BodyLimit) -> None:
    """Buffer at most ``limit.max_bytes`` of ``flow``'s body (set in ``requestheaders``)."""
    flow.metadata[_LIMIT] = limit


@dataclass
class _Drain:
    """What is still read and dropped after an early answer."""

    bytes_left: int
    until: float


def _answer_and_drain(stream: HttpStream) -> layer.CommandGenerator[None]:
    """Send the flow's response now; read and drop the body that still arrives, within
    bounds, so that a client writing its whole body before it reads gets to read it."""
    assert stream.flow.response is not None
    stream.flow.live = False
    multiplexed = stream.flow.request.is_http2 or stream.flow.request.is_http3
    if not multiplexed:
        # The unread body leaves the connection unusable: the client is told.
        stream.flow.response.headers["connection"] = "close"
    yield from stream.send_response()
    if multiplexed:
        yield SendHttp(ResponseEndOfMessage(stream.stream_id), stream.context.client)
    # HTTP/1: the end of the response is not sent, so mitmproxy's HTTP/1 reader stays in
    # the body and hands it on as RequestData, which _drain drops (sending the end would
    # park that reader, which then buffers whatever arrives).
    drain = _Drain(DRAIN_BYTES, time.monotonic() + DRAIN_S)
    stream.client_state = functools.partial(_drain, stream, drain)


def _drain(stream: HttpStream, drain: _Drain, event: Any) -> layer.CommandGenerator[None]:
    if isinstance(event, RequestData):
        drain.bytes_left -= len(event.data)
        if drain.bytes_left >= 0 and time.monotonic() < drain.until:
            return
    elif not isinstance(event, RequestEndOfMessage):
        return  # trailers
    # The body ended, or it is more or slower than a client that means well sends: close
    # the connection (HTTP/1; the answer is out, so nothing else is sent) or reset the
    # stream (HTTP/2).  This runs in the connection's own task, on data it just read.
    stream.client_state = stream.state_errored
    yield SendHttp(_unread(stream.stream_id), stream.context.client)


def _unread(stream_id: int) -> ResponseProtocolError:
    """After a response was sent, HTTP/1 closes the connection on this, HTTP/2 resets the stream."""
    return ResponseProtocolError(stream_id, "request body not read", ErrorCode.REQUEST_TOO_LARGE)


def install() -> None:
    """Patch ``HttpStream`` once per process (idempotent)."""
    if getattr(HttpStream, "_sidecar_body_limit", False):
        return
    wait_for_headers = HttpStream.state_wait_for_request_headers
    consume_body = HttpStream.state_consume_request_body

    def state_wait_for_request_headers(
        self: HttpStream, event: RequestHeaders
    ) -> layer.CommandGenerator[None]:
        yield from wait_for_headers(self, event)
        waiting_for_body = self.client_state == self.state_consume_request_body
        if self.flow.metadata.get(_ANSWERED) and waiting_for_body and not event.end_stream:
            yield from _answer_and_drain(self)

    def state_consume_request_body(self: HttpStream, event: Any) -> layer.CommandGenerator[None]:
        limit: BodyLimit | None = self.flow.metadata.get(_LIMIT)
        if limit is not None and isinstance(event, RequestData):
            seen = len(self.request_body_buf) + len(event.data)
            if seen > limit.max_bytes:
                self.request_body_buf.clear()  # type: ignore[no-untyped-call]
                self.flow.response = limit.refusal(seen)
                yield from _answer_and_drain(self)
                return
        yield from consume_body(self, event)

    HttpStream.state_wait_for_request_headers = state_wait_for_request_headers  # type: ignore[method-assign]
    HttpStream.state_consume_request_body = state_consume_request_body  # type: ignore[method-assign]
    HttpStream._sidecar_body_limit = True  # type: ignore[attr-defined]
