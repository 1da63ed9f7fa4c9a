"""Answer 503 ``not_ready`` until the sidecar is ready.

mitmproxy starts accepting connections before its ``running`` hook has finished; the
store and rules are ready before the proxy starts, but a request must still never be
handled by a half-started sidecar, so until :meth:`open` is called every request gets
the same 503 ``not_ready`` problem as ``/readyz`` and nothing is forwarded.
"""

from __future__ import annotations

from mitmproxy import http

from sidecar.errors import NotReady
from sidecar.proxy.addons.effects import to_response
from sidecar.proxy.body_limit import answer_before_body
from sidecar.proxy.exchange import refusal


class ReadinessGate:
    def __init__(self) -> None:
        self.ready = False

    def open(self) -> None:
        self.ready = True

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not self.ready:
            answer_before_body(
                flow, to_response(refusal(NotReady({"proxy": "the proxy is starting"})))
            )
