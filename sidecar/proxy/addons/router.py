"""``--route HOST=URL`` for traffic mitmproxy relays itself (reads, unmatched requests).

Recorded effects are forwarded by the effect guard, which applies the same routes.
"""

from __future__ import annotations

from mitmproxy import http

from sidecar.proxy.addons.effects import is_guarded
from sidecar.proxy.routes import Routes


class Router:
    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or is_guarded(flow):
            return
        target = self.routes.target(flow.request.pretty_host)
        if target is not None:
            flow.request.scheme = target.scheme
            flow.request.host = target.host
            flow.request.port = target.port
            flow.request.host_header = target.authority
