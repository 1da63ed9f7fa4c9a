"""Answer 503 until the sidecar is ready.

mitmproxy starts accepting connections before its ``running`` hook has finished; the
store and rules are ready before the proxy starts, but a request must still never be
handled by a half-started sidecar, so until :meth:`open` is called every request gets
503 and nothing is forwarded.
"""

from __future__ import annotations

from mitmproxy import http

from sidecar.problems import PROBLEM_JSON, problem_body
from sidecar.proxy.body_limit import answer_before_body


class ReadinessGate:
    def __init__(self) -> None:
        self.ready = False

    def open(self) -> None:
        self.ready = True

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not self.ready:
            starting = http.Response.make(
                503,
                problem_body(503, "starting", "Starting", "the sidecar is starting; retry shortly"),
                {"Content-Type": PROBLEM_JSON, "Retry-After": "1", "X-Sidecar-Effect": "refused"},
            )
            answer_before_body(flow, starting)
