"""``--route HOST=URL`` for traffic mitmproxy relays itself (reads, unmatched requests).

Recorded effects are forwarded by the effect guard, which applies the same routes.
"""

from __future__ import annotations

from mitmproxy import http

from sidecar.proxy.addons.effects import is_guarded
from sidecar.proxy.hosts import request_host
from sidecar.proxy.routes import Routes


class Router:
    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not self.routes.table or is_guarded(flow):
            return
        target = self.routes.target(request_host(flow.request))
        if target is None:
            return
        request = flow.request
        # The fields themselves, then the Host header (or HTTP/2 authority) once: the
        # host and port setters each rewrite that header on the way, three rewrites per
        # routed request for the same end state.
        request.data.scheme = target.scheme.encode()
        request.data.host = target.host
        request.data.port = target.port
        request.host_header = target.authority
