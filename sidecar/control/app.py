"""The control API's aiohttp application factory."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from sidecar.clock import Clock, SystemClock
from sidecar.control import history, ops, tasks
from sidecar.control.auth import bearer_middleware
from sidecar.control.keys import CLOCK, METRICS, PROXY, STORE, ProxyInfo
from sidecar.control.problems import problem_middleware
from sidecar.metrics import Metrics
from sidecar.store import Store

# 1 MiB of JSON is far more than any checkpoint should carry; larger bodies get a 413.
MAX_BODY_BYTES = 1024 * 1024
APIS = (tasks.api, history.api, ops.api)


def make_app(
    store: Store,
    *,
    metrics: Metrics | None = None,
    clock: Clock | None = None,
    token: str | None = None,
    proxy: ProxyInfo | None = None,
) -> web.Application:
    """The control app over an *open* store (its owner opens and closes it)."""
    middlewares: list[Middleware] = [problem_middleware]
    if token:
        middlewares.append(bearer_middleware(token))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[STORE] = store
    app[CLOCK] = clock or SystemClock()
    app[METRICS] = metrics or Metrics()
    if proxy is not None:
        app[PROXY] = proxy
    app[ops.ENDPOINTS] = tuple(e for api in APIS for e in api.endpoints)
    for api in APIS:
        app.add_routes(api.routes)
    return app
